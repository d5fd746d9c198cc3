"""Distributed moments: each partition's Arrow batches become one :class:`Moments` state with numpy BLAS,
and states are combined by ``treeReduce`` (:mod:`.tree_reduce`: never Spark Accumulators, which double-count on task
retry; the driver's share bounded in n).

The same pass checks the input contract (:func:`~anisotropy_spark.contract.check_batch`): invalid rows are
left out of the moments and counted in a :class:`~anisotropy_spark.contract.Tally`, so a job that reads
every vector for its moments validates them without a pass of its own. The same pass sketches the valid rows'
lengths (:class:`~anisotropy_core.norms.LengthSketch`), the median of the norm-outlier rule. It can also draw the
random sample of valid rows that diagnose needs (:mod:`.row_sample`), so diagnose reads the vectors once. ``array<float>`` vectors reach the
workers as float32 and are cast to float64 one batch at a time.

The batches come from Spark's scan (``mapInArrow``) or, given the table's data files, from pyarrow reading each file
in a Spark task of its own (:mod:`.table_files`: no row → Arrow conversion on the JVM); the fold is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark import RDD
from pyspark.sql import DataFrame, SparkSession

from anisotropy_core.moments import Moments
from anisotropy_core.norms import LengthSketch

from .contract import InvalidRowsError, Tally, check_batch
from .row_sample import PartitionSampler, RowSample, lowest_by_hash, lowest_payload, rows_of_payloads, table_of_payload
from .session import conf_int, task_partition
from .table_files import TableFiles, pyarrow_or_spark
from .tree_reduce import tree_reduce

STATE_SCHEMA = "n long, payload binary, tally string, partition int, sample binary, lengths binary, lowest binary"
_ARROW_STATE_SCHEMA = pa.schema(
    [
        ("n", pa.int64()),
        ("payload", pa.binary()),
        ("tally", pa.string()),
        ("partition", pa.int32()),
        ("sample", pa.binary()),
        ("lengths", pa.binary()),
        ("lowest", pa.binary()),
    ]
)


def fold_partition(
    batches: Iterator[pa.RecordBatch],
    vector_col: str,
    id_col: str | None,
    dimension: int,
    sample: RowSample | None = None,
) -> dict:
    """One partition's Arrow batches → one state row (:data:`STATE_SCHEMA`): its valid rows' Moments, the Tally of
    its invalid rows (``id_col`` None: no ``null_id`` check and no sample ids), the LengthSketch of its valid rows
    and, with ``sample``, the valid rows it drew (:class:`~.row_sample.PartitionSampler`), with its partition index."""
    state, tally, partition = Moments.empty(dimension), Tally(), task_partition()
    lengths = LengthSketch.empty()
    sampler = PartitionSampler(sample, vector_col, partition) if sample else None
    for batch in batches:
        if batch.num_rows:
            checked = check_batch(batch, vector_col, id_col, dimension)
            tally.add(checked, batch.column(batch.schema.get_field_index(id_col)) if id_col else None)
            state = state.merge(Moments.of_batch(checked.matrix))
            lengths = lengths.merge(LengthSketch.of(checked.lengths))
            if sampler:
                sampler.add(batch, checked.valid)
    return {
        "n": state.n,
        "payload": state.to_bytes(),
        "tally": tally.to_json(),
        "partition": partition,
        "sample": sampler.payload() if sampler else None,
        "lengths": lengths.to_bytes(),
        "lowest": lowest_payload(sampler),
    }


def partition_moments(vector_col: str, id_col: str | None, dimension: int, sample: RowSample | None = None):
    """Return a ``mapInArrow`` function folding a partition into one row (:func:`fold_partition`)."""

    def fold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist(
            [fold_partition(batches, vector_col, id_col, dimension, sample)], schema=_ARROW_STATE_SCHEMA
        )

    return fold


@dataclass(frozen=True)
class CheckedPass:
    """What one checked moments pass gathered: the valid rows' ``moments``, the ``tally`` of the others, the
    ``drawn`` sample rows (or None), the ``reader`` that ran and the ``lengths`` sketch of the valid rows."""

    moments: Moments
    tally: Tally
    drawn: pa.Table | None
    reader: str
    lengths: LengthSketch
    lowest: pa.Table | None = None


def checked_pass(
    df: DataFrame,
    vector_col: str,
    id_col: str | None,
    dimension: int,
    sample: RowSample | None = None,
    files: TableFiles | None = None,
) -> CheckedPass:
    """One pass over ``df`` (vectors ``array<float|double>``) → :class:`CheckedPass`; the drawn rows are the
    valid rows drawn for ``sample`` — its vector and ``columns`` — or None without ``sample`` or when none was drawn.

    ``files``: ``df``'s data files (:func:`~.table_files.table_files`): pyarrow reads them in one task per row
    group where it can (:func:`~.table_files.pyarrow_or_spark`; reader ``"pyarrow"``), else Spark's scan reads ``df``
    (``"spark (<why>)"``; ``"spark"`` without ``files``). Either way the batches have Spark's Arrow batch size.

    The drawn rows come in partition order: ``treeReduce``'s shuffled levels combine states in the order their
    blocks arrive, so each task's rows travel with its partition index and are sorted by it on the driver."""
    columns = list(dict.fromkeys([vector_col] + ([id_col] if id_col else []) + list(sample.columns if sample else [])))

    def read_spark():
        return _merged(
            df.select(*columns).mapInArrow(partition_moments(vector_col, id_col, dimension, sample), STATE_SCHEMA).rdd,
            sample,
        )

    if files is None:
        state, tally, drawn, lengths, lowest = read_spark()
        return CheckedPass(state, tally, drawn, "spark", lengths, lowest)

    def read_files(found: TableFiles):
        spark = df.sparkSession
        rows = arrow_batch_rows(spark, dimension, found.item_bytes(vector_col))
        return _merged(
            found.fold(
                spark, columns, rows, lambda batches: fold_partition(batches, vector_col, id_col, dimension, sample)
            ),
            sample,
        )

    (state, tally, drawn, lengths, lowest), reader = pyarrow_or_spark(
        files, columns, read_files, read_spark, lambda result: result[0].n + result[1].total
    )
    return CheckedPass(state, tally, drawn, reader, lengths, lowest)


def checked_moments(
    df: DataFrame,
    vector_col: str,
    id_col: str | None,
    dimension: int,
    sample: RowSample | None = None,
    files: TableFiles | None = None,
) -> tuple[Moments, Tally, pa.Table | None, str]:
    """(moments, tally, drawn, reader) of :func:`checked_pass`."""
    found = checked_pass(df, vector_col, id_col, dimension, sample, files)
    return found.moments, found.tally, found.drawn, found.reader


def arrow_batch_rows(spark: SparkSession, dimension: int, item_bytes: int) -> int:
    """The rows per Arrow batch Spark's own scan would send: ``maxRecordsPerBatch`` (≤ 0: no limit), at most
    ``maxBytesPerBatch`` of vector data (``dimension`` elements of ``item_bytes`` each)."""
    records = conf_int(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", 10000)
    budget = conf_int(spark, "spark.sql.execution.arrow.maxBytesPerBatch", 2**31 - 1)
    by_bytes = max(1, budget // max(1, dimension * item_bytes))
    return min(records, by_bytes) if records > 0 else by_bytes


def _merged(
    states: RDD, sample: RowSample | None = None
) -> tuple[Moments, Tally, pa.Table | None, LengthSketch, pa.Table | None]:
    """The state rows of :func:`fold_partition` (Rows or dicts) merged by ``treeReduce`` → (Moments, Tally, the
    drawn rows in partition order or None, LengthSketch, the ``sample.lowest`` rows of smallest id hash or None:
    merged at every level, so the driver holds at most that many)."""
    size, id_col = (sample.lowest, sample.id_col) if sample is not None and sample.id_col else (0, "")

    def lowest(a: pa.Table | None, b: pa.Table | None) -> pa.Table | None:
        return lowest_by_hash([a, b], size, id_col) if size else None

    state, tally, drawn, lengths, kept = tree_reduce(
        states.map(
            lambda row: (
                Moments.from_bytes(bytes(row["payload"])),
                Tally.from_json(row["tally"]),
                [(row["partition"], bytes(row["sample"]))] if row["sample"] is not None else [],
                LengthSketch.from_bytes(bytes(row["lengths"])),
                table_of_payload(None if row["lowest"] is None else bytes(row["lowest"])),
            )
        ),
        lambda a, b: (a[0].merge(b[0]), a[1].merge(b[1]), a[2] + b[2], a[3].merge(b[3]), lowest(a[4], b[4])),
    )
    return state, tally, rows_of_payloads([payload for _, payload in sorted(drawn)]), lengths, kept


def corpus_moments(df: DataFrame, vector_col: str, dimension: int) -> Moments:
    """Moments of ``df``'s vectors; raises :class:`InvalidRowsError` (with the reason counts) if any is invalid."""
    state, tally, _, _ = checked_moments(df, vector_col, None, dimension)
    if tally.total:
        raise InvalidRowsError(
            f"{tally.total} invalid vector(s) in column {vector_col!r} (dimension {dimension}): "
            f"{dict(sorted(tally.counts.items()))}"
        )
    return state
