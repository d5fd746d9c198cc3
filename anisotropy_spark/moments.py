"""Distributed moments: each partition's Arrow batches become one :class:`Moments` state with numpy BLAS,
and states are combined by ``treeReduce`` (never Spark Accumulators, which double-count on task retry).
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame

from anisotropy_core.moments import Moments

from .arrow import batch_matrix

STATE_SCHEMA = "n long, payload binary"
TREE_DEPTH = 2


def partition_moments(vector_col: str, dimension: int):
    """Return a ``mapInArrow`` function folding a partition into one serialised Moments row."""

    def fold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        state = Moments.empty(dimension)
        for batch in batches:
            if batch.num_rows:
                state = state.merge(Moments.of_batch(batch_matrix(batch, vector_col, dimension)))
        yield pa.RecordBatch.from_pydict({"n": [state.n], "payload": [state.to_bytes()]},
                                         schema=pa.schema([("n", pa.int64()), ("payload", pa.binary())]))

    return fold


def corpus_moments(df: DataFrame, vector_col: str, dimension: int) -> Moments:
    """One pass over ``df`` (valid rows, ``array<double>`` vectors) → merged Moments on the driver."""
    states = df.select(vector_col).mapInArrow(partition_moments(vector_col, dimension), STATE_SCHEMA)
    return (states.rdd.map(lambda row: Moments.from_bytes(bytes(row["payload"])))
            .treeReduce(Moments.merge, depth=TREE_DEPTH))
