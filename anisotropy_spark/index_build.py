"""The corpus index on Spark: train on a driver sample, add the vectors in Spark tasks (one shard each), merge the
shards on the driver, verify against the distributed exact top-k (:mod:`anisotropy_core.index` holds the index
itself, its artifact and its query side).

* **Train** (:func:`train_on_sample`): a uniform sample of ``train_size`` rows
  (:func:`anisotropy_spark.diagnostics.sample_rows`) trains the empty index on the driver: the coarse quantizer,
  plus PQ/SQ codebooks where the factory string asks for them.
* **Add** (:func:`build_index`): the trained empty index travels to the tasks as broadcast bytes; each task
  deserialises it, ``add_with_ids`` its partition's L2-normalised vectors one Arrow batch at a time, and writes
  the filled copy (its shard) through :mod:`anisotropy_core.storage`. Task memory: one shard plus one Arrow batch.
* **Merge**: the driver reads the shards one at a time in partition order and moves their inverted lists into
  the trained index (:func:`anisotropy_core.index.merge_shards`, faiss's ``merge_from``), so the result equals a
  single-process build that adds the rows in the same order. Driver memory: the sample, the index, one shard.
* **Verify** (:func:`verify_index`): recall@k of the index against the exact top-k
  (:func:`anisotropy_spark.evaluation.distributed_top_k`) of sampled rows used as queries (a query's own row
  excluded), for nprobe 1, 2, 4, …; the default nprobe is the smallest reaching the target.
* **Raw against corrected** (:func:`space_quality`): the same factory and nprobe built on the raw vectors and on
  the corrected ones, with imbalance, recall and search time of each.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import faiss
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame

from anisotropy_core import index as core
from anisotropy_core import storage
from anisotropy_core.transforms import FittedTransform

from .arrow import batch_matrix
from .diagnostics import sample_rows
from .evaluation import distributed_top_k, require_integral
from .session import task_partition

SHARDS_DIR = "_shards"


@dataclass(frozen=True)
class Sample:
    """Rows drawn on the driver: ``vectors`` (m, d) float64 as stored, ``ids`` (m,) int64."""

    vectors: np.ndarray
    ids: np.ndarray


def draw(df: DataFrame, vector_col: str, id_col: str, dimension: int, size: int, seed: int,
         total: int) -> Sample:
    """A uniform sample of about ``size`` rows of ``df`` (``total`` rows) with their ids."""
    vectors, columns = sample_rows(df, vector_col, dimension, [id_col], size, seed, total)
    return Sample(vectors, core.integral_ids(columns[id_col], f"id column {id_col!r}"))


def space_of(vectors: np.ndarray, transform: FittedTransform | None) -> np.ndarray:
    """``vectors`` in the index's space: ``transform`` applied (None: as they are)."""
    return transform.apply(vectors) if transform is not None else vectors


def train_on_sample(factory: str, sample: Sample, total: int, transform: FittedTransform | None = None
                    ) -> tuple[faiss.Index, str]:
    """(the trained empty index, its factory string): ``{nlist}`` sized from ``total`` (the corpus rows, not the
    sample's), trained on ``sample`` mapped by ``transform``."""
    resolved = core.factory_for(factory, total)
    return core.train_index(resolved, space_of(sample.vectors, transform)), resolved


def add_in_tasks(df: DataFrame, vector_col: str, id_col: str, dimension: int, trained: faiss.Index,
                 shard_dir: str, transform: FittedTransform | None = None) -> list[str]:
    """Add every row of ``df`` to a copy of ``trained`` per partition (one shard each, written under
    ``shard_dir``); returns the shards' paths in partition order (partitions without rows write none).
    A task's retry rewrites the same shard path atomically."""
    require_integral(df, id_col, "index id")
    shared = df.sparkSession.sparkContext.broadcast(core.to_bytes(trained))

    def add(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        index = core.from_bytes(shared.value)
        partition = task_partition()
        for batch in batches:
            if not batch.num_rows:
                continue
            ids = batch.column(batch.schema.get_field_index(id_col))
            if ids.null_count:
                raise ValueError(f"null id in column {id_col!r} at batch row {ids.is_null().index(True).as_py()} "
                                 f"of partition {partition}: every indexed row needs an id")
            vectors = space_of(batch_matrix(batch, vector_col, dimension), transform)
            core.add_vectors(index, ids.to_numpy(zero_copy_only=False), vectors)
        if not index.ntotal:
            return
        path = storage.join(shard_dir, f"shard-{partition:06d}.faiss")
        storage.write_atomic(path, core.to_bytes(index))
        yield pa.RecordBatch.from_pydict({"partition": [partition], "path": [path]})

    try:
        rows = df.select(vector_col, id_col).mapInArrow(add, "partition long, path string").collect()
    finally:
        shared.unpersist()
    return [row["path"] for row in sorted(rows, key=lambda row: row["partition"])]


def build_index(df: DataFrame, vector_col: str, id_col: str, dimension: int, factory: str, work_dir: str,
                sample: Sample, total: int, transform: FittedTransform | None = None) -> tuple[faiss.Index, str]:
    """(the index of every row of ``df``, its factory string): trained on ``sample`` (driver), filled in Spark
    tasks (shards under ``work_dir/_shards/<build id>``, removed after the merge), merged on the driver.
    ``transform``: vectors are indexed as ``transform.apply(v)`` (None: as stored); always L2-normalised."""
    trained, resolved = train_on_sample(factory, sample, total, transform)
    shard_dir = storage.join(work_dir, SHARDS_DIR, uuid.uuid4().hex)
    try:
        paths = add_in_tasks(df, vector_col, id_col, dimension, trained, shard_dir, transform)
        index = core.merge_shards(trained, (storage.read_bytes(path) for path in paths))
    finally:
        storage.remove_tree(shard_dir)
    return index, resolved


def exact_ids(df: DataFrame, vector_col: str, id_col: str, dimension: int, queries: Sample, k: int,
              spaces: dict[str, FittedTransform | None]) -> dict[str, np.ndarray]:
    """{space: (m, k) exact top-k ids of the ``queries`` over ``df`` (a query's own row excluded)} in each space
    (None: the vectors as stored), in one distributed pass."""
    top = distributed_top_k(df, vector_col, id_col, dimension, spaces, queries.vectors, k, queries.ids)
    return {name: ids for name, (_, ids) in top.items()}


def verify_index(index: faiss.Index, queries: Sample, exact: np.ndarray, k: int, target: float,
                 nprobe: int | None = None, transform: FittedTransform | None = None) -> dict:
    """Recall of ``index`` against the ``exact`` (m, k) ids of ``queries`` (mapped by ``transform``):
    {"queries", "k", "target", "nprobe_curve", "nprobe", "recall@k", "passed"}. ``nprobe`` None: the smallest of
    the curve reaching ``target`` (else the largest tried, and not passed); an int: that one."""
    x = space_of(queries.vectors, transform)
    curve = core.nprobe_curve(index, x, exact, k, queries.ids)
    chosen = nprobe if nprobe is not None else core.pick_nprobe(curve, target)
    if chosen is None:
        chosen = curve[-1]["nprobe"]
    at = [point["recall"] for point in curve if point["nprobe"] == chosen]
    if not at:
        core.set_nprobe(index, chosen)
        at = [core.recall_against(core.search_excluding(index, x, k, queries.ids)[1], exact)]
    return {"queries": int(len(queries.ids)), "k": int(k), "target": float(target), "nprobe_curve": curve,
            "nprobe": int(chosen), f"recall@{k}": float(at[0]), "passed": bool(at[0] >= target)}


def space_quality(df: DataFrame, vector_col: str, id_col: str, dimension: int, factory: str, nprobe: int,
                  transform: FittedTransform, work_dir: str, sample: Sample, queries: Sample, total: int,
                  k: int = 10) -> dict:
    """What the correction does to the index: {"raw": …, "corrected": …} (each
    :func:`anisotropy_core.index.index_quality`: imbalance factor, recall@k against exact search in that space,
    seconds to search the queries), both indexes of ``factory`` searched at ``nprobe``, built from the raw rows
    of ``df`` as stored and as ``transform`` maps them, with the same training ``sample`` and ``queries``."""
    spaces = {"raw": None, "corrected": transform}
    exact = exact_ids(df, vector_col, id_col, dimension, queries, k, spaces)
    report: dict[str, Any] = {}     # space → its index_quality, and the factory
    for name, mapping in spaces.items():
        index, _ = build_index(df, vector_col, id_col, dimension, factory, work_dir, sample, total, mapping)
        report[name] = core.index_quality(index, space_of(queries.vectors, mapping), exact[name], k, nprobe,
                                          queries.ids)
    report["factory"] = factory
    return report
