"""Duplicate ids and the quarantine table.

Ids are the key every published table is MERGEd and gated on, so an id carried by more than one otherwise-valid
row violates the input contract (reason ``duplicate_id``): every copy is quarantined, or the job stops (exit 5)
naming sample ids. Which copy is "right" is not ours to guess.

The quarantine is a Delta table of the input's columns plus ``invalid_reason``, ``quarantined_at``, ``run_id``,
``input_version`` and ``row_hash`` (SHA-256 of the row's JSON). It is written with one MERGE that inserts only
rows whose (``row_hash``, ``invalid_reason``) is not there yet, so a row that stays invalid night after night
is quarantined once, stamped with the run and input version that first saw it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .contract import REASON_COLUMN, SAMPLE_IDS, InvalidRowsError, Tally
from .rows import one_row
from .session import local_cores, session_conf

DUPLICATE_ID = "duplicate_id"
MAX_DUPLICATE_IDS = 1_000_000  # duplicated ids kept on the driver (8 bytes each for long ids) and broadcast
ROW_HASH = "row_hash"
# the id scan reads only the id column, so its splits may span 16x Spark's default 128 MiB of file bytes
# (Spark still cuts a small table into about one split per core: its bytes-per-core bound)
ID_SCAN_CONF = {"spark.sql.files.maxPartitionBytes": str(2 << 30)}


@dataclass
class Duplicates:
    """Ids of ``id_col`` held by more than one row: ``ids`` (a broadcastable DataFrame of that one column),
    ``tally`` (reason ``duplicate_id``: rows involved and up to five sample ids, smallest first)."""

    id_col: str
    ids: DataFrame
    tally: Tally

    def rows_of(self, df: DataFrame) -> DataFrame:
        """The rows of ``df`` whose id is duplicated, with ``invalid_reason`` = ``duplicate_id``."""
        return (
            df.join(F.broadcast(self.ids), self.id_col, "left_semi")
            .select(*df.columns)
            .withColumn(REASON_COLUMN, F.lit(DUPLICATE_ID))
        )

    def drop_from(self, df: DataFrame) -> DataFrame:
        """``df`` without any row whose id is duplicated (``df`` itself when there are none)."""
        if not self.tally.total:
            return df
        return df.join(F.broadcast(self.ids), self.id_col, "left_anti").select(*df.columns)


def id_scan_conf(master: str | None) -> dict[str, str]:
    """Session confs of the duplicate-id aggregate in a session on ``master``: :data:`ID_SCAN_CONF`, and in a
    ``local`` session one shuffle partition per local core. Only the ids are shuffled (8 MB for 1,000,000 long
    ids), and on one machine Spark's default 200 shuffle partitions only add tiny tasks and blocks. Off ``local``
    the session's own setting stays."""
    cores = local_cores(master)
    return {**ID_SCAN_CONF, **({"spark.sql.shuffle.partitions": str(cores)} if cores else {})}


def find_duplicates(df: DataFrame, id_col: str) -> Duplicates:
    """One aggregate over ``id_col`` only (a shuffle of the ids, not the vectors): the non-null ids of ``df``
    that occur more than once, collected with their counts in the same action. More than
    :data:`MAX_DUPLICATE_IDS` of them means the table is not keyed by ``id_col`` at all: :class:`InvalidRowsError`
    (with their exact number, counted by a second aggregate on that error path only).

    The scan uses splits of up to 2 GiB of files (:func:`id_scan_conf`): Spark sizes splits by whole-file bytes,
    so reading only the ids of a vector table would otherwise run one tiny task per 128 MiB of vectors."""
    repeated = df.where(F.col(id_col).isNotNull()).groupBy(id_col).count().where(F.col("count") > 1)
    spark, field = df.sparkSession, df.select(id_col).schema
    with session_conf(spark, id_scan_conf(spark.sparkContext.master)):
        found = repeated.limit(MAX_DUPLICATE_IDS + 1).collect()
        if len(found) > MAX_DUPLICATE_IDS:
            summary = one_row(repeated.agg(F.count("*").alias("ids"), F.sum("count").alias("rows")))
            raise InvalidRowsError(
                f"{summary['ids']} ids of column {id_col!r} occur more than once "
                f"({summary['rows']} rows): the table is not keyed by {id_col!r}"
            )
    if not found:
        return Duplicates(id_col, spark.createDataFrame([], field), Tally())
    ids = [row[id_col] for row in found]
    sample = sorted(ids, key=lambda v: (str(type(v)), v))[:SAMPLE_IDS]
    return Duplicates(
        id_col,
        spark.createDataFrame([(i,) for i in ids], field),
        Tally({DUPLICATE_ID: sum(row["count"] for row in found)}, {DUPLICATE_ID: sample}),
    )


def write_quarantine(rows: DataFrame, path: str, run_id: str | None, input_version: int | None) -> None:
    """Add ``rows`` (input columns + ``invalid_reason``) to the quarantine Delta table at ``path``, stamped with
    the provenance columns; rows already there (same ``row_hash`` and reason) are not added again. A table
    written before ``row_hash`` existed gets the new columns with one plain append (schema merge)."""
    data_cols = [c for c in rows.columns if c != REASON_COLUMN]
    stamped = (
        rows.withColumn("quarantined_at", F.current_timestamp())
        .withColumn("run_id", F.lit(run_id).cast("string"))
        .withColumn("input_version", F.lit(input_version).cast("long"))
        .withColumn(ROW_HASH, F.sha2(F.to_json(F.struct(*[F.col(c) for c in data_cols])), 256))
    )
    spark = rows.sparkSession
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path) or ROW_HASH not in spark.read.format("delta").load(path).columns:
        stamped.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
        return
    with session_conf(spark, {"spark.databricks.delta.schema.autoMerge.enabled": "true"}):
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(stamped.alias("s"), f"t.{ROW_HASH} = s.{ROW_HASH} AND t.{REASON_COLUMN} = s.{REASON_COLUMN}")
            .whenNotMatchedInsertAll()
            .execute()
        )
