"""The nightly's output pass: ONE read of the pinned input that keeps the valid rows (the input contract, the
norm-outlier limit and the duplicated ids the validation pass found), maps them through the transform as the write
will, and folds them into :class:`~anisotropy_core.output_facts.OutputFacts` — row count, output unit-vector and
length sums, the full output moments of a correction that is not affine, and the neighbour-overlap top-k lists.
Nothing is written: the gate decides on these facts before the one transforming write commits.

pyarrow reads the data files in the Spark tasks where it can (:mod:`.table_files`), else Spark's scan does; the fold
is the same. Partition states are merged by ``treeReduce`` (:mod:`.tree_reduce`, never Accumulators). A row the
transform cannot map raises :class:`~.contract.TransformRowError` naming it, as the write would.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql import DataFrame

from anisotropy_core.output_facts import OutputFacts, OverlapQueries
from anisotropy_core.row_keys import row_ids
from anisotropy_core.transforms import FittedTransform

from .contract import check_batch
from .estimators import mapped_rows
from .moments import arrow_batch_rows
from .table_files import TableFiles, pyarrow_or_spark
from .tree_reduce import tree_reduce
from .worker_errors import raised_in_workers

_STATE_SCHEMA = pa.schema([("read", pa.int64()), ("payload", pa.binary())])


@dataclasses.dataclass(frozen=True)
class OutputPass:
    """What the pass needs besides the rows: the ``transform`` (None: the vectors as they are) and the output's
    numpy element type ``output_dtype``; the validation's ``max_norm`` (None: off) and ``duplicate_ids`` (an Arrow
    array of the ids whose every copy is left out, or None); the ``overlap`` queries with ``overlap_ids``, the ids of
    the corpus rows they are (an Arrow array, each query's own row never retrieved), or None."""

    vector_col: str
    id_col: str
    dimension: int
    transform: FittedTransform | None
    output_dtype: type
    max_norm: float | None = None
    duplicate_ids: pa.Array | None = None
    overlap: OverlapQueries | None = None
    overlap_ids: pa.Array | None = None

    @property
    def d_out(self) -> int:
        return self.transform.d_out if self.transform is not None else self.dimension

    def fold(self, batches: Iterable[pa.RecordBatch], partition: int) -> tuple[int, OutputFacts]:
        """(rows read, the facts of the valid rows) of one partition's raw Arrow batches."""
        transform = self.transform
        full_moments = transform is not None and transform.linear_map() is None
        facts, read = OutputFacts.empty(self.d_out, full_moments, self.overlap), 0
        for batch in batches:
            if not batch.num_rows:
                continue
            checked = check_batch(batch, self.vector_col, self.id_col, self.dimension, self.max_norm)
            valid, matrix = checked.valid, checked.matrix
            ids = batch.column(batch.schema.get_field_index(self.id_col))
            if self.duplicate_ids is not None:
                kept = ~pc.is_in(ids, value_set=self.duplicate_ids).to_numpy(zero_copy_only=False)
                matrix, valid = matrix[kept[valid]], valid & kept
            output: np.ndarray
            if transform is None:
                output = matrix.astype(self.output_dtype, copy=False)
            else:
                output = mapped_rows(
                    lambda x, dtype: (transform.apply(x, dtype), []),
                    matrix,
                    self.output_dtype,
                    batch,
                    valid,
                    self.vector_col,
                )[0]
            rows = np.flatnonzero(valid)
            keys = (  # integer ids name the rows (ties by id, as the evaluation's top-k), else their place in the pass
                ids.to_numpy(zero_copy_only=False)[rows].astype(np.int64)
                if pa.types.is_integer(ids.type)
                else row_ids(partition, read + rows)
            )
            own = None
            if self.overlap is not None:
                own = pc.index_in(ids.take(pa.array(rows)), value_set=self.overlap_ids).fill_null(-1)
                own = own.to_numpy(zero_copy_only=False).astype(np.int64)
            facts = facts.add(matrix, output, keys, self.overlap, own)
            read += batch.num_rows
        return read, facts


def output_facts(df: DataFrame, files: TableFiles | None, spec: OutputPass) -> tuple[OutputFacts, str]:
    """(the merged facts of ``df``'s valid rows, the reader that ran): one pass over the pinned input ``df`` (its
    data files ``files`` read by pyarrow where they can serve, else Spark's scan; :func:`~.table_files.pyarrow_or_spark`
    checks the rows read against the version's)."""
    spark = df.sparkSession
    shared = spark.sparkContext.broadcast(spec)
    columns = [spec.vector_col, spec.id_col]

    def fold_to_row(batches: Iterable[pa.RecordBatch]) -> dict:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("output_facts: fold_to_row runs only inside a Spark task")
        read, facts = shared.value.fold(batches, context.partitionId())
        return {"read": read, "payload": facts.to_bytes()}

    @raised_in_workers
    def fold_scan(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist([fold_to_row(batches)], schema=_STATE_SCHEMA)

    def merged(states) -> tuple[int, OutputFacts]:
        return tree_reduce(
            states.map(lambda row: (int(row["read"]), OutputFacts.from_bytes(bytes(row["payload"])))),
            lambda a, b: (a[0] + b[0], a[1].merge(b[1])),
        )

    def read_spark() -> tuple[int, OutputFacts]:
        return merged(df.select(*columns).mapInArrow(fold_scan, "read long, payload binary").rdd)

    def read_files(found: TableFiles) -> tuple[int, OutputFacts]:
        rows = arrow_batch_rows(spark, spec.dimension, found.item_bytes(spec.vector_col))
        return merged(found.fold(spark, columns, rows, fold_to_row))

    try:
        if files is None:
            return read_spark()[1], "spark"
        (_, facts), reader = pyarrow_or_spark(files, columns, read_files, read_spark, lambda result: result[0])
        return facts, reader
    finally:
        shared.unpersist()
