"""Keyed partial states merged by key: how a pass whose state is large (k per-cluster (d, d) moments, one
state per word or sentence) leaves its tasks without ever forming one huge record.

:func:`fold_by_key` is the whole mechanism. Each task folds its Arrow batches into ``{key: payload bytes}``
and emits them with :func:`keyed_batches` as
``(key binary, payload binary)`` rows in Arrow batches of at most :data:`EMIT_BATCH_BYTES` (a single state may
exceed it; it then travels alone). :func:`merge_by_key` merges the payloads with ``reduceByKey`` (combined
in the Python workers, never Spark Accumulators), so every record crossing the JVM is one state, a reducer
holds one state per key it owns, and the driver receives one state per key — whatever the number of rows or
partitions. The folding input is first coalesced to one partition per task slot (:func:`coalesce_to_slots`):
the shuffle then carries slots × keys states, not input partitions × keys (one (d, d) float64 state per key,
4.7 MB at d = 768: 232 input partitions × 64 keys would be ≈ 69 GB of shuffle files, 2 slots × 64 keys 0.6 GB).
A single record holding all k states of a task (k·d²·8 bytes: 302 MB for 64 clusters × 768²) exhausts the JVM
heap when the JVM pickles it for Python.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame

from anisotropy_core.moments import Moments

KEYED_SCHEMA = "key binary, payload binary"
_ARROW_KEYED_SCHEMA = pa.schema([("key", pa.binary()), ("payload", pa.binary())])
EMIT_BATCH_BYTES = 16 << 20


def coalesce_to_slots(df: DataFrame) -> DataFrame:
    """``df`` coalesced (no shuffle) to at most ``defaultParallelism`` partitions, one per task slot."""
    slots = df.sparkSession.sparkContext.defaultParallelism
    return df.coalesce(slots) if df.rdd.getNumPartitions() > slots else df


def keyed_batches(states: Mapping[bytes, bytes]) -> Iterator[pa.RecordBatch]:
    """``states`` as Arrow batches ``(key, payload)`` of at most :data:`EMIT_BATCH_BYTES` each (or one state)."""
    chunk: dict[bytes, bytes] = {}
    size = 0
    for key, payload in states.items():
        if chunk and size + len(key) + len(payload) > EMIT_BATCH_BYTES:
            yield _keyed_batch(chunk)
            chunk, size = {}, 0
        chunk[key] = payload
        size += len(key) + len(payload)
    if chunk:
        yield _keyed_batch(chunk)


def _keyed_batch(chunk: Mapping[bytes, bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(list(chunk), pa.binary()), pa.array(list(chunk.values()), pa.binary())], schema=_ARROW_KEYED_SCHEMA
    )


def fold_by_key(
    df: DataFrame,
    fold: Callable[[Iterator[pa.RecordBatch]], Mapping[bytes, bytes]],
    merge: Callable[[bytes, bytes], bytes],
) -> dict[bytes, bytes]:
    """``{key: merged payload}``: ``fold(a partition's Arrow batches of df) -> {key: payload}`` on each partition
    of ``df`` coalesced to the task slots, the payloads of one key then combined with ``merge(a, b) -> bytes``."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from keyed_batches(fold(iter(batches)))

    return merge_by_key(coalesce_to_slots(df).mapInArrow(run, KEYED_SCHEMA), merge)


def merge_by_key(partials: DataFrame, merge: Callable[[bytes, bytes], bytes]) -> dict[bytes, bytes]:
    """``{key: merged payload}`` of ``partials`` (:data:`KEYED_SCHEMA` rows, several per key), payloads of one
    key combined pairwise with ``merge(a, b) -> bytes`` by ``reduceByKey``."""
    pairs = partials.rdd.map(lambda row: (bytes(row["key"]), bytes(row["payload"])))
    return dict(pairs.reduceByKey(merge).collect())


def merge_moments_bytes(a: bytes, b: bytes) -> bytes:
    """:meth:`Moments.merge` of two :meth:`Moments.to_bytes` payloads."""
    return Moments.from_bytes(a).merge(Moments.from_bytes(b)).to_bytes()
