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
  When the shards together exceed ``merge_memory_mb``, faiss's on-disk merge instead
  (:func:`anisotropy_core.index.merge_shards_ondisk`): the shards are memory-mapped from local files (copied
  from an object store first) and the lists written to an ``.ivfdata`` file in a local workspace —
  ``<work_dir>/_merge/<build id>/`` when ``work_dir`` is local (the index's own disk), else a temporary folder
  (``TMPDIR``; put it on a disk, not a tmpfs). Driver memory: the sample and the trained index; the lists are
  searched through the page cache. :meth:`BuiltIndex.close` removes the workspace.
* **Verify** (:func:`verify_index`): recall@k of the index against the exact top-k
  (:func:`anisotropy_spark.evaluation.distributed_top_k`) of sampled rows used as queries (a query's own row
  excluded), for nprobe 1, 2, 4, …; the default nprobe is the smallest reaching the target. With labelled
  queries (:func:`verify_ndcg`): nDCG@k of the index at that nprobe (the raw queries through the transform, as
  the Searcher searches) against that of the exact top-k over the same rows, found in the same distributed pass
  as the recall's (:func:`exact_ids_and_labelled`).
* **Raw against corrected** (:func:`space_quality`): the same factory and nprobe built on the raw vectors and on
  the corrected ones, with imbalance, recall and search time of each.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import faiss
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame

from anisotropy_core import index as core
from anisotropy_core import storage
from anisotropy_core.evaluation import ndcg_at_k
from anisotropy_core.transforms import FittedTransform

from .arrow import batch_matrix
from .diagnostics import sample_rows
from .evaluation import distributed_top_k, require_integral
from .session import task_partition

SHARDS_DIR = "_shards"
MERGE_DIR = "_merge"
MIB = 1 << 20


@dataclass(frozen=True)
class Sample:
    """Rows drawn on the driver: ``vectors`` (m, d) float64 as stored, ``ids`` (m,) int64."""

    vectors: np.ndarray
    ids: np.ndarray


def draw(df: DataFrame, vector_col: str, id_col: str, dimension: int, size: int, seed: int, total: int) -> Sample:
    """A uniform sample of about ``size`` rows of ``df`` (``total`` rows) with their ids."""
    vectors, columns = sample_rows(df, vector_col, dimension, [id_col], size, seed, total)
    return Sample(vectors, core.integral_ids(columns[id_col], f"id column {id_col!r}"))


def space_of(vectors: np.ndarray, transform: FittedTransform | None) -> np.ndarray:
    """``vectors`` in the index's space: ``transform`` applied (None: as they are)."""
    return transform.apply(vectors) if transform is not None else vectors


def train_on_sample(
    factory: str, sample: Sample, total: int, transform: FittedTransform | None = None
) -> tuple[faiss.Index, str]:
    """(the trained empty index, its factory string): ``{nlist}`` sized from ``total`` (the corpus rows, not the
    sample's), trained on ``sample`` mapped by ``transform``."""
    resolved = core.factory_for(factory, total)
    return core.train_index(resolved, space_of(sample.vectors, transform)), resolved


def add_in_tasks(
    df: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    trained: faiss.Index,
    shard_dir: str,
    transform: FittedTransform | None = None,
) -> list[str]:
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
                raise ValueError(
                    f"null id in column {id_col!r} at batch row {ids.is_null().index(True).as_py()} "
                    f"of partition {partition}: every indexed row needs an id"
                )
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


class MergeBudgetError(ValueError):
    """The shards exceed the driver's merge budget and the index cannot be merged on disk."""


@dataclass
class BuiltIndex:
    """An index :func:`build_index` built: the ``index``, its resolved ``factory``, how it was merged (``merge``:
    {"mode": "memory" | "on_disk", "shards", "shard_bytes", "merge_memory_mb"}) and, for an on-disk merge, the
    local ``workspace`` folder holding its ``.ivfdata`` file (which the index maps: keep it until the index is
    saved; :meth:`close` removes it)."""

    index: faiss.Index
    factory: str
    merge: dict = field(default_factory=dict)
    workspace: str | None = None

    def close(self) -> None:
        """Remove the on-disk merge's workspace (the in-process index keeps its mapping; nothing for an in-memory
        index)."""
        if self.workspace is not None:
            shutil.rmtree(self.workspace, ignore_errors=True)
            self.workspace = None


def merge_workspace(work_dir: str, build: str) -> str:
    """A new local folder for an on-disk merge: ``<work_dir>/_merge/<build>`` when ``work_dir`` is on the local
    filesystem, else a temporary folder."""
    local = storage.local_path(work_dir)
    if local is None:
        return tempfile.mkdtemp(prefix=f"anisotropy-index-merge-{build}-")
    folder = os.path.join(local, MERGE_DIR, build)
    os.makedirs(folder)
    return folder


def merge_on_disk(trained: faiss.Index, paths: list[str], workspace: str) -> faiss.Index:
    """:func:`anisotropy_core.index.merge_shards_ondisk` of the shards at ``paths`` (storage paths) into
    ``workspace/index.ivfdata``; shards that are not local files are copied into the workspace first (and removed
    after the merge)."""
    local = [storage.local_path(path) for path in paths]
    copies = []
    for i, (path, name) in enumerate(zip(paths, local)):
        if name is None:
            name = os.path.join(workspace, f"shard-{i:06d}.faiss")
            storage.download_file(path, name)
            copies.append(name)
            local[i] = name
    try:
        return core.merge_shards_ondisk(
            trained, [name for name in local if name is not None], os.path.join(workspace, core.IVFDATA_FILE)
        )
    finally:
        for name in copies:
            os.unlink(name)


def build_index(
    df: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    factory: str,
    work_dir: str,
    sample: Sample,
    total: int,
    transform: FittedTransform | None = None,
    merge_memory_mb: float | None = None,
) -> BuiltIndex:
    """The index of every row of ``df`` (:class:`BuiltIndex`): trained on ``sample`` (driver), filled in Spark
    tasks (shards under ``work_dir/_shards/<build id>``, removed after the merge), merged on the driver — in
    memory, or on disk (module docstring) when the shards hold more than ``merge_memory_mb`` MiB (None: always in
    memory). ``transform``: vectors are indexed as ``transform.apply(v)`` (None: as stored); always
    L2-normalised. Raises :class:`MergeBudgetError` when the shards exceed the budget and the factory has no
    inverted lists to put on disk."""
    trained, resolved = train_on_sample(factory, sample, total, transform)
    build = uuid.uuid4().hex
    shard_dir = storage.join(work_dir, SHARDS_DIR, build)
    workspace = None
    try:
        paths = add_in_tasks(df, vector_col, id_col, dimension, trained, shard_dir, transform)
        shard_bytes = sum(storage.size(path) for path in paths)
        on_disk = merge_memory_mb is not None and shard_bytes > merge_memory_mb * MIB
        merge = {
            "mode": "on_disk" if on_disk else "memory",
            "shards": len(paths),
            "shard_bytes": int(shard_bytes),
            "merge_memory_mb": merge_memory_mb,
        }
        if on_disk and (not core.is_ivf(trained) or isinstance(core.ivf_of(trained), faiss.IndexIVFPQR)):
            raise MergeBudgetError(
                f"the shards of {resolved!r} hold {shard_bytes / MIB:.1f} MiB, more than merge_memory_mb "
                f"{merge_memory_mb}, but only an IVF index (other than IVFPQR) can be merged on disk: "
                f"raise merge_memory_mb or use an IVF factory"
            )
        if on_disk:
            workspace = merge_workspace(work_dir, build)
            index = merge_on_disk(trained, paths, workspace)
        else:
            index = core.merge_shards(trained, (storage.read_bytes(path) for path in paths))
    except BaseException:
        if workspace is not None:
            shutil.rmtree(workspace, ignore_errors=True)
        raise
    finally:
        storage.remove_tree(shard_dir)
    return BuiltIndex(index, resolved, merge, workspace)


def exact_ids(
    df: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    queries: Sample,
    k: int,
    spaces: dict[str, FittedTransform | None],
) -> dict[str, np.ndarray]:
    """{space: (m, k) exact top-k ids of the ``queries`` over ``df`` (a query's own row excluded)} in each space
    (None: the vectors as stored), in one distributed pass."""
    top = distributed_top_k(df, vector_col, id_col, dimension, spaces, queries.vectors, k, queries.ids)
    return {name: ids for name, (_, ids) in top.items()}


def exact_ids_and_labelled(
    df: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    queries: Sample,
    k: int,
    labelled: np.ndarray,
    labelled_ids: np.ndarray,
    exclude_self: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(exact top-k ids (m, k) of the sampled ``queries`` (own row excluded), exact top-k ids (l, k) of the
    ``labelled`` query vectors (l, d), already in the index's space) over ``df``, in ONE distributed pass.
    ``exclude_self``: the labelled queries are corpus rows and never retrieve the row with their own id."""
    m, count = len(queries.ids), len(labelled_ids)
    stacked = np.concatenate([np.asarray(queries.vectors, dtype=np.float64), np.asarray(labelled, dtype=np.float64)])
    ids = np.concatenate([queries.ids, np.asarray(labelled_ids, dtype=np.int64)])
    own = np.concatenate([np.ones(m, dtype=bool), np.full(count, bool(exclude_self))])
    top = distributed_top_k(
        df,
        vector_col,
        id_col,
        dimension,
        {"sample": None, "labelled": None},
        stacked,
        k,
        ids,
        rows={"sample": np.arange(m), "labelled": np.arange(m, m + count)},
        corpus_rows=own,
    )
    return top["sample"][1], top["labelled"][1]


def verify_ndcg(
    index: faiss.Index,
    transform: FittedTransform | None,
    raw_queries: np.ndarray,
    query_ids: np.ndarray,
    relevant: list[np.ndarray],
    exact: np.ndarray,
    k: int,
    nprobe: int,
    max_drop: float,
    exclude_self: bool = False,
) -> dict:
    """nDCG@k of ``index`` at ``nprobe`` on labelled raw queries (searched as :class:`anisotropy_core.index.Searcher`
    does: :func:`anisotropy_core.index.search_raw` with ``transform``) and of the ``exact`` (l, k) top-k ids of the
    same queries in the same space: {"queries", "k", "nprobe", "index", "exact", "drop" (exact − index),
    "max_ndcg_drop", "passed" (drop ≤ max_drop)}."""
    found, _ = core.search_raw(index, transform, raw_queries, k, nprobe, query_ids if exclude_self else None)
    measured, best = ndcg_at_k(found, relevant), ndcg_at_k(exact, relevant)
    return {
        "queries": int(len(query_ids)),
        "k": int(k),
        "nprobe": int(nprobe),
        "index": measured,
        "exact": best,
        "drop": best - measured,
        "max_ndcg_drop": float(max_drop),
        "passed": bool(best - measured <= max_drop),
    }


def verify_index(
    index: faiss.Index,
    queries: Sample,
    exact: np.ndarray,
    k: int,
    target: float,
    nprobe: int | None = None,
    transform: FittedTransform | None = None,
) -> dict:
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
    return {
        "queries": int(len(queries.ids)),
        "k": int(k),
        "target": float(target),
        "nprobe_curve": curve,
        "nprobe": int(chosen),
        f"recall@{k}": float(at[0]),
        "passed": bool(at[0] >= target),
    }


def space_quality(
    df: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    factory: str,
    nprobe: int,
    transform: FittedTransform,
    work_dir: str,
    sample: Sample,
    queries: Sample,
    total: int,
    k: int = 10,
    merge_memory_mb: float | None = None,
) -> dict:
    """What the correction does to the index: {"raw": …, "corrected": …} (each
    :func:`anisotropy_core.index.index_quality`: imbalance factor, recall@k against exact search in that space,
    seconds to search the queries), both indexes of ``factory`` searched at ``nprobe``, built from the raw rows
    of ``df`` as stored and as ``transform`` maps them, with the same training ``sample`` and ``queries``
    (merged as :func:`build_index` with ``merge_memory_mb``)."""
    spaces = {"raw": None, "corrected": transform}
    exact = exact_ids(df, vector_col, id_col, dimension, queries, k, spaces)
    report: dict[str, Any] = {}  # space → its index_quality, and the factory
    for name, mapping in spaces.items():
        built = build_index(
            df, vector_col, id_col, dimension, factory, work_dir, sample, total, mapping, merge_memory_mb
        )
        try:
            report[name] = core.index_quality(
                built.index, space_of(queries.vectors, mapping), exact[name], k, nprobe, queries.ids
            )
        finally:
            built.close()
    report["factory"] = factory
    return report
