"""Distributed moments: each partition's Arrow batches become one :class:`Moments` state with numpy BLAS,
and states are combined by ``treeReduce`` (:mod:`.tree_reduce`: never Spark Accumulators, which double-count on task
retry; the driver's share bounded in n).

The same pass checks the input contract (:func:`~anisotropy_spark.contract.check_batch`): invalid rows are
left out of the moments and counted in a :class:`~anisotropy_spark.contract.Tally`, so a job that reads
every vector for its moments validates them without a pass of its own. ``array<float>`` vectors reach the
workers as float32 and are cast to float64 one batch at a time.
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame

from anisotropy_core.moments import Moments

from .contract import InvalidRowsError, Tally, check_batch
from .tree_reduce import tree_reduce

STATE_SCHEMA = "n long, payload binary, tally string"
_ARROW_STATE_SCHEMA = pa.schema([("n", pa.int64()), ("payload", pa.binary()), ("tally", pa.string())])


def partition_moments(vector_col: str, id_col: str | None, dimension: int):
    """Return a ``mapInArrow`` function folding a partition into one row: its valid rows' Moments and the
    Tally of its invalid rows (``id_col`` None: no ``null_id`` check and no sample ids)."""

    def fold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        state, tally = Moments.empty(dimension), Tally()
        for batch in batches:
            if batch.num_rows:
                checked = check_batch(batch, vector_col, id_col, dimension)
                tally.add(checked, batch.column(batch.schema.get_field_index(id_col)) if id_col else None)
                state = state.merge(Moments.of_batch(checked.matrix))
        yield pa.RecordBatch.from_pydict({"n": [state.n], "payload": [state.to_bytes()],
                                          "tally": [tally.to_json()]}, schema=_ARROW_STATE_SCHEMA)

    return fold


def checked_moments(df: DataFrame, vector_col: str, id_col: str | None, dimension: int) -> tuple[Moments, Tally]:
    """One pass over ``df`` (vectors ``array<float|double>``) → (Moments of the valid rows, Tally of the rest)."""
    columns = [vector_col] + ([id_col] if id_col else [])
    states = df.select(*columns).mapInArrow(partition_moments(vector_col, id_col, dimension), STATE_SCHEMA)
    return tree_reduce(states.rdd.map(lambda row: (Moments.from_bytes(bytes(row["payload"])),
                                                  Tally.from_json(row["tally"]))),
                       lambda a, b: (a[0].merge(b[0]), a[1].merge(b[1])))


def corpus_moments(df: DataFrame, vector_col: str, dimension: int) -> Moments:
    """Moments of ``df``'s vectors; raises :class:`InvalidRowsError` (with the reason counts) if any is invalid."""
    state, tally = checked_moments(df, vector_col, None, dimension)
    if tally.total:
        raise InvalidRowsError(f"{tally.total} invalid vector(s) in column {vector_col!r} (dimension {dimension}): "
                               f"{dict(sorted(tally.counts.items()))}")
    return state
