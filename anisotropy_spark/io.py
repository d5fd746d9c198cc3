"""Reading embedding tables and checking them against the input contract (:mod:`.contract`).

Input contract: a Delta or Parquet table with an id column and a vector column of type
``array<float>``, ``array<double>`` or Spark ML ``VectorUDT``; every other column is metadata.

Validation never drops a row silently and never caches the table: the rows are checked in numpy inside an
Arrow pass (:func:`~anisotropy_spark.contract.check_batch`), which yields a :class:`Tally` of reasons. The
caller then either raises :class:`InvalidRowsError` (naming the reason counts and sample ids) or quarantines
the invalid rows with their reason into a Delta table (a second pass, only when some exist). Later passes
read the valid rows through :func:`valid_rows`, which is the table itself when nothing was invalid.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, FloatType, StringType, StructField, StructType

from anisotropy_core.moments import Moments

from .contract import REASON_COLUMN, InvalidRowsError, SchemaError, Tally, check_batch, require_columns
from .moments import checked_moments, corpus_moments
from .quarantine import Duplicates, find_duplicates, write_quarantine
from .row_sample import RowSample
from .table_files import TableFiles
from .tree_reduce import tree_reduce

INFER_ROWS = 10_000


@dataclass(frozen=True)
class TableRef:
    """A table read at a pinned version: ``path``, ``format`` (delta|parquet), Delta ``version`` or None."""

    path: str
    format: str
    version: int | None


def is_delta_table(spark: SparkSession, path: str) -> bool:
    """True when ``path`` (local or any URI Hadoop resolves: ``file://``, ``s3a://``, ``gs://``, ``hdfs://``)
    is the root of a Delta table, asked of Delta itself (``DeltaTable.isDeltaTable``)."""
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def read_table(spark: SparkSession, path: str, version: int | None = None) -> tuple[DataFrame, TableRef]:
    """Read a Delta (pinned to ``version``, default the latest at call time) or Parquet table."""
    if is_delta_table(spark, path):
        pinned = version if version is not None else latest_delta_version(spark, path)
        df = spark.read.format("delta").option("versionAsOf", pinned).load(path)
        return df, TableRef(path, "delta", pinned)
    if version is not None:
        raise ValueError(f"{path} is not a Delta table: a version cannot be pinned")
    return spark.read.parquet(path), TableRef(path, "parquet", None)


def latest_delta_version(spark: SparkSession, path: str) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history(1).select("version").first()[0])


def as_vector_array(df: DataFrame, vector_col: str) -> DataFrame:
    """Return ``df`` with ``vector_col`` as an array column: ``array<float>``/``array<double>`` unchanged (float32
    stays float32 all the way into the Arrow batches), ``VectorUDT`` → ``array<double>``; else ValueError."""
    require_column(df, vector_col, "vector")
    dtype = df.schema[vector_col].dataType
    if isinstance(dtype, VectorUDT):
        return df.withColumn(vector_col, vector_to_array(F.col(vector_col), "float64"))
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, (FloatType, DoubleType)):
        return df
    raise SchemaError(
        f"vector column {vector_col!r} has type {dtype.simpleString()}; expected array<float>, "
        "array<double> or VectorUDT"
    )


def infer_dimension(df: DataFrame, vector_col: str, rows: int = INFER_ROWS) -> int:
    """Most common length among the first ``rows`` non-null vectors, the larger on a tie (the corpus dimension when
    none is configured); reads only that many rows, not the table, and counts their lengths on the driver (an
    aggregate in Spark would add a shuffle stage)."""
    lengths = df.where(F.col(vector_col).isNotNull()).select(F.size(vector_col).alias("d")).limit(rows).toArrow()
    if not lengths.num_rows:
        raise InvalidRowsError(f"no non-null vectors in column {vector_col!r}: the table is empty")
    values, counts = np.unique(lengths.column("d").to_numpy(), return_counts=True)
    return int(values[counts == counts.max()].max())


def count_invalid(df: DataFrame, vector_col: str, id_col: str, dimension: int) -> Tally:
    """One Arrow pass over ``id_col`` and ``vector_col`` only → the merged :class:`Tally` of invalid rows."""

    def tally(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        state = Tally()
        for batch in batches:
            state.add(check_batch(batch, vector_col, id_col, dimension), batch.column(0))
        yield pa.RecordBatch.from_pydict({"tally": [state.to_json()]})

    return tree_reduce(df.select(id_col, vector_col).mapInArrow(tally, "tally string").rdd
                       .map(lambda row: Tally.from_json(row["tally"])), Tally.merge)


def _filtered(df: DataFrame, vector_col: str, id_col: str, dimension: int, keep_valid: bool) -> DataFrame:
    """``df`` restricted to its valid rows (``keep_valid``) or to its invalid rows plus ``invalid_reason``."""
    fields = list(df.schema.fields) + ([] if keep_valid else [StructField(REASON_COLUMN, StringType(), False)])

    def split(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            checked = check_batch(batch, vector_col, id_col, dimension)
            if checked.reasons is None:
                if keep_valid:
                    yield batch
                continue
            mask = checked.valid if keep_valid else ~checked.valid
            kept = batch.filter(pa.array(mask))
            if not keep_valid:
                kept = kept.append_column(REASON_COLUMN, pa.array(checked.reasons[mask], pa.string()))
            yield kept

    return df.mapInArrow(split, StructType(fields))


def valid_rows(df: DataFrame, vector_col: str, id_col: str, dimension: int, tally: Tally) -> DataFrame:
    """The valid rows of ``df`` for a later pass: ``df`` itself when ``tally`` (of the same pinned input) found
    no invalid row, else a filtering Arrow pass."""
    return df if tally.total == 0 else _filtered(df, vector_col, id_col, dimension, keep_valid=True)


def settle_invalid(df: DataFrame, tally: Tally, vector_col: str, id_col: str, dimension: int,
                   on_invalid: str, quarantine_path: str | None, *, duplicates: Duplicates | None = None,
                   run_id: str | None = None, input_version: int | None = None) -> None:
    """Act on the invalid rows ``tally`` counted in ``df`` and the ``duplicates`` among its valid rows: raise
    :class:`InvalidRowsError` with reason counts and sample ids (``'error'``), or add them with
    ``invalid_reason`` to the quarantine table ``quarantine_path`` (``'quarantine'``; see
    :func:`anisotropy_spark.quarantine.write_quarantine`; one extra pass, only when some exist)."""
    found = tally if duplicates is None else tally.merge(duplicates.tally)
    if not found.total:
        return
    if on_invalid == "error":
        raise InvalidRowsError(
            f"{found.total} invalid row(s) in column {vector_col!r} (expected dimension {dimension}) or sharing an "
            f"{id_col!r} value: {dict(sorted(found.counts.items()))}; sample {id_col} values: "
            f"{found.sample_ids()}. Fix the input or set on_invalid: quarantine."
        )
    if not quarantine_path:
        raise ValueError("on_invalid: quarantine needs a quarantine_path")
    parts = [_filtered(df, vector_col, id_col, dimension, keep_valid=False)] if tally.total else []
    if duplicates is not None and duplicates.tally.total:
        parts.append(duplicates.rows_of(valid_rows(df, vector_col, id_col, dimension, tally)))
    rows = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    write_quarantine(rows, quarantine_path, run_id, input_version)


@dataclass
class ValidatedInput:
    """Result of :func:`validate`: the valid rows, the dimension, and what was set aside."""

    valid: DataFrame
    dimension: int
    invalid_count: int
    invalid_by_reason: dict[str, int]
    moments: Moments | None = None     # the valid rows' merged moments (``with_moments``), else None
    drawn: pa.Table | None = None      # valid rows drawn in the moments pass for ``sample`` (see :func:`validate`)
    reader: str | None = None          # what read the moments pass (``with_moments``): "pyarrow" or "spark (…)"


def require_column(df: DataFrame, column: str, role: str) -> None:
    """:class:`SchemaError` naming ``column`` (the ``role`` column, e.g. "id") when ``df`` does not have it."""
    require_columns(df.columns, [column], role)


def validate(df: DataFrame, vector_col: str, id_col: str, dimension: int | None = None,
             on_invalid: str = "error", quarantine_path: str | None = None, *, run_id: str | None = None,
             input_version: int | None = None, with_moments: bool = False,
             sample: RowSample | None = None, files: TableFiles | None = None) -> ValidatedInput:
    """Count the invalid rows of ``df`` (one pass over id + vector, nothing cached) and the duplicated ids among
    the others (one aggregate over the ids), act on them (:func:`settle_invalid`) and return the valid rows:
    neither invalid nor sharing an id.

    ``with_moments``: the counting pass is the moments pass (:func:`~anisotropy_spark.moments.checked_moments`),
    so a job that needs the valid rows' moments (diagnose, nightly, a moment-based fit) reads the vectors once;
    the result's ``moments`` holds them, recomputed in one more pass only when duplicated ids were set aside.
    ``sample`` (with ``with_moments``): that pass also draws a random sample of the valid rows (:mod:`.row_sample`),
    the result's ``drawn``; None when duplicated ids were set aside (the rows drawn may hold them).
    ``files`` (with ``with_moments``): ``df``'s data files, which pyarrow then reads for that pass where it can
    (:func:`~anisotropy_spark.moments.checked_moments`); the result's ``reader`` says which reader ran.
    """
    if on_invalid not in ("error", "quarantine"):
        raise ValueError(f"on_invalid must be 'error' or 'quarantine', got {on_invalid!r}")
    require_column(df, id_col, "id")
    d = dimension if dimension is not None else infer_dimension(df, vector_col)
    state, tally, drawn, reader = checked_moments(df, vector_col, id_col, d, sample, files) if with_moments else \
        (None, count_invalid(df, vector_col, id_col, d), None, None)
    valid = valid_rows(df, vector_col, id_col, d, tally)
    duplicates = find_duplicates(valid, id_col)
    settle_invalid(df, tally, vector_col, id_col, d, on_invalid, quarantine_path, duplicates=duplicates,
                   run_id=run_id, input_version=input_version)
    valid = duplicates.drop_from(valid)
    found = tally.merge(duplicates.tally)
    if state is not None and duplicates.tally.total:
        state, drawn = corpus_moments(valid, vector_col, d), None
        reader += "; the moments again through Spark, without the duplicated ids"
    if valid.isEmpty() if state is None else state.n == 0:
        raise InvalidRowsError(f"no valid rows left in column {vector_col!r} after validation ({found.counts})")
    return ValidatedInput(valid=valid, dimension=d, invalid_count=found.total, invalid_by_reason=found.counts,
                          moments=state, drawn=drawn, reader=reader)
