"""Distributed k-means and cluster-wise recentering on Spark (seed chapter 7, "the mean belongs to nobody").

The vectors are converted once into an RDD of numpy blocks (:func:`vector_blocks`: each partition's rows,
in order, as one or a few (B, d) float64 matrices with their prepared rows and ‖x‖²) and persisted for the
whole fit. Every pass then maps the blocks with numpy BLAS into one small state per partition (no per-row
Python, no Arrow conversion: the cached blocks reach the reused Python workers as pickled arrays) and
combines the states with ``rdd.treeReduce`` (never Spark Accumulators, which double-count on task retry).
The algorithms themselves — k-means|| initialisation, Lloyd iterations, empty-cluster re-seeding,
convergence — are the numpy driver loops of :mod:`anisotropy_core.clustering`, so :func:`fit_kmeans`
computes exactly what the numpy reference ``anisotropy_core.clustering.kmeans`` computes on the same
partitions.

Randomness (k-means|| sampling) comes from one generator per (seed, round, partition id), so a fit is
deterministic given the seed and the input's partitioning.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import pyarrow as pa
from pyspark import RDD, StorageLevel, keyword_only
from pyspark.sql import DataFrame
from pyspark.sql.types import IntegerType, StructField

from anisotropy_core.clustering import (DEFAULT_INIT_STEPS, DEFAULT_MAX_ITER, DEFAULT_OVERSAMPLING, DEFAULT_TOL,
                                        ClusterRecenter, ClusterState, KMeansResult, assign, check_metric,
                                        cluster_diagnostics, cluster_moments, first_centre_candidate,
                                        kmeans_info, kmeans_parallel_init, lloyd, merge_cluster_moments,
                                        oversample, partition_rng, prepare, row_norms_squared)
from anisotropy_core.moments import Moments

from .arrow import batch_matrix
from .estimators import BatchOutputs, CorrectionEstimator, CorrectionModel, register_estimator, register_model_class
from .io import infer_dimension
from .params import _ClusterRecenterParams

PACKED_SCHEMA = pa.schema([("packed", pa.binary())])
TREE_DEPTH = 2
BLOCK_BYTES = 1 << 26       # a partition's rows are kept as blocks of at most 64 MiB (one block if smaller)


def pack_vectors(df: DataFrame, vector_col: str, dimension: int) -> DataFrame:
    """``packed binary`` DataFrame: each Arrow batch of ``vector_col`` (array<double>, length ``dimension``)
    becomes one row holding its (B, d) float64 matrix as raw bytes, in the same partitions and row order."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                payload = batch_matrix(batch, vector_col, dimension).tobytes()
                yield pa.RecordBatch.from_pydict({"packed": [payload]}, schema=PACKED_SCHEMA)

    return df.select(vector_col).mapInArrow(run, "packed binary")


class Block(NamedTuple):
    """Some consecutive rows of one partition, ready for passes.

    * ``raw``  — (B, d) float64 vectors as read (what per-cluster moments are taken of),
    * ``x``    — (B, d) prepared rows (:func:`~anisotropy_core.clustering.prepare`; ``raw`` itself for
      Euclidean, unit rows for cosine),
    * ``x_sq`` — (B,) ‖x‖², computed once instead of once per Lloyd pass.
    """

    raw: np.ndarray
    x: np.ndarray
    x_sq: np.ndarray

    @classmethod
    def of(cls, raw: np.ndarray, metric: str) -> "Block":
        """Block of (B, d) vectors; raises InvalidVectorsError on NaN/Inf (or a zero row for cosine)."""
        x = prepare(raw, metric)
        return cls(x if metric == "euclidean" else np.asarray(raw, dtype=np.float64), x, row_norms_squared(x))


def vector_blocks(df: DataFrame, vector_col: str, dimension: int, metric: str,
                  max_block_bytes: int = BLOCK_BYTES) -> RDD:
    """RDD of :class:`Block` of the valid ``array<double>`` column ``vector_col`` (length ``dimension``):
    per partition, its rows in order, cut into blocks of at most ``max_block_bytes`` of (B, d) float64 (one
    block per partition when it fits, so passes see exactly the partition matrices the numpy reference
    gets). Same partitions as ``df``; persist it when it is read more than once."""
    check_metric(metric)
    cap = max(1, max_block_bytes // (8 * dimension))

    def to_blocks(rows: Iterator[Any]) -> Iterator[Block]:
        pending: list[np.ndarray] = []
        count = 0
        for row in rows:
            matrix = np.frombuffer(row[0], dtype=np.float64).reshape(-1, dimension)
            pending.append(matrix)
            count += matrix.shape[0]
            if count >= cap:
                joined = np.concatenate(pending)
                full = (count // cap) * cap
                for start in range(0, full, cap):
                    yield Block.of(joined[start:start + cap], metric)
                pending, count = ([joined[full:]] if full < count else []), count - full
        if count:
            yield Block.of(np.concatenate(pending), metric)

    return pack_vectors(df, vector_col, dimension).rdd.mapPartitions(to_blocks, preservesPartitioning=True)


def _per_partition(blocks: RDD, fold: Callable[[Iterator[Block], int], Any]) -> RDD:
    """One element per partition: ``fold(the partition's blocks, partition id)``."""
    return blocks.mapPartitionsWithIndex(lambda partition, it: [fold(it, partition)])


def assignment_pass(blocks: RDD, centroids: np.ndarray, metric: str) -> ClusterState:
    """One Lloyd pass: per-cluster sums, counts, inertia and farthest points of the :func:`vector_blocks`
    ``blocks`` against ``centroids`` (k, d)."""
    centroids = np.asarray(centroids, dtype=np.float64)

    def fold(it: Iterator[Block], _partition: int) -> ClusterState:
        state = ClusterState.empty(*centroids.shape)
        for block in it:
            state = state.merge(ClusterState.of_batch(block.x, centroids, metric, x_sq=block.x_sq))
        return state

    return _per_partition(blocks, fold).treeReduce(ClusterState.merge, depth=TREE_DEPTH)


def first_centre(blocks: RDD, metric: str, seed: int) -> np.ndarray:
    """(d,) a uniformly random prepared row: the smallest per-row uniform key over all partitions."""

    def fold(it: Iterator[Block], partition: int) -> tuple[float, np.ndarray] | None:
        rng = partition_rng(seed, -1, partition)
        best = None
        for block in it:
            key, row = first_centre_candidate(block.x, rng)
            if best is None or key < best[0]:
                best = (key, row)
        return best

    keyed = [kv for kv in _per_partition(blocks, fold).collect() if kv is not None]
    if not keyed:
        raise ValueError("k-means needs at least one vector: the input is empty")
    return min(keyed, key=lambda kv: kv[0])[1]


def oversample_pass(blocks: RDD, centroids: np.ndarray, scale: float, round_: int, metric: str,
                    seed: int) -> np.ndarray:
    """k-means|| round: (m, d) prepared rows kept with probability min(1, scale · distance to centroids),
    in partition order."""
    centroids = np.asarray(centroids, dtype=np.float64)
    d = centroids.shape[1]

    def fold(it: Iterator[Block], partition: int) -> np.ndarray:
        rng = partition_rng(seed, round_, partition)
        return np.concatenate([np.zeros((0, d))] + [oversample(b.x, centroids, metric, scale, rng) for b in it])

    return np.concatenate(_per_partition(blocks, fold).collect())


def fit_kmeans(df: DataFrame, vector_col: str, k: int, metric: str = "euclidean", seed: int = 0,
               max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL, init_steps: int = DEFAULT_INIT_STEPS,
               oversampling: float = DEFAULT_OVERSAMPLING, init: np.ndarray | None = None,
               dimension: int | None = None) -> KMeansResult:
    """Distributed k-means (k-means|| init + Lloyd) of the valid ``array<double>`` column ``vector_col``.

    ``metric``: ``"euclidean"`` or ``"cosine"`` (spherical; centroids are unit vectors). ``init``: optional
    (k, d) starting centroids (skips k-means||). The vectors are converted to :func:`vector_blocks` once and
    persisted for the duration of the fit (unpersisted at the end). Returns a :class:`KMeansResult`
    (centroids (k, d), sizes, inertia, iterations, convergence flag, inertia history).
    """
    check_metric(metric)
    d = dimension if dimension is not None else infer_dimension(df, vector_col)
    blocks = vector_blocks(df, vector_col, d, metric).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return fit_kmeans_blocks(blocks, d, k, metric, seed, max_iter, tol, init_steps, oversampling, init)
    finally:
        blocks.unpersist()


def fit_kmeans_blocks(blocks: RDD, dimension: int, k: int, metric: str, seed: int, max_iter: int,
                      tol: float, init_steps: int, oversampling: float, init: np.ndarray | None) -> KMeansResult:
    """:func:`fit_kmeans` on :func:`vector_blocks` (built for ``metric``, preferably persisted)."""
    if init is None:
        start = kmeans_parallel_init(
            lambda: first_centre(blocks, metric, seed),
            lambda c: assignment_pass(blocks, c, metric),
            lambda c, scale, round_: oversample_pass(blocks, c, scale, round_, metric, seed),
            k, metric, seed, init_steps, oversampling)
    else:
        start = prepare(init, metric)
    if start.shape != (k, dimension):
        raise ValueError(f"initial centroids have shape {start.shape}, expected {(k, dimension)}")
    return lloyd(lambda c: assignment_pass(blocks, c, metric), start, metric, max_iter, tol)


def cluster_moments_pass(blocks: RDD, centroids: np.ndarray, metric: str) -> list[Moments]:
    """One pass over :func:`vector_blocks`: the k :class:`Moments` states (raw vectors) of the clusters of
    ``centroids`` (k, d)."""
    centroids = np.asarray(centroids, dtype=np.float64)
    k, d = centroids.shape

    def fold(it: Iterator[Block], _partition: int) -> list[Moments]:
        states = [Moments.empty(d)] * k
        for block in it:
            ids = assign(block.x, centroids, metric, block.x_sq)[0]
            states = merge_cluster_moments(states, cluster_moments(block.raw, ids, k))
        return states

    return _per_partition(blocks, fold).treeReduce(merge_cluster_moments, depth=TREE_DEPTH)


def spark_cluster_diagnostics(df: DataFrame, vector_col: str, centroids: np.ndarray, metric: str = "euclidean",
                              dimension: int | None = None) -> dict:
    """Per-cluster diagnosis table of ``df`` for the clusters of ``centroids`` (k, d): one pass, then
    :func:`anisotropy_core.clustering.cluster_diagnostics` (see there for the returned dict)."""
    d = dimension if dimension is not None else infer_dimension(df, vector_col)
    return cluster_diagnostics(cluster_moments_pass(vector_blocks(df, vector_col, d, metric), centroids, metric))


@register_model_class(ClusterRecenter.method)
class ClusterRecenterModel(CorrectionModel, _ClusterRecenterParams):
    """Fitted cluster recentering: ``transform(df)`` writes ``outputCol`` (array<double>, corrected vector)
    and ``predictionCol`` (int, the cluster the vector landed in; default ``cluster_id``), keeping every other
    column. Saves and loads as the shared artifact (method ``cluster_recenter``) plus pyspark.ml metadata;
    registered for that method, so ``CorrectionModel.from_artifact`` / ``CorrectionModel.load`` of such an
    artifact return this class."""

    def setPredictionCol(self, value: str) -> "ClusterRecenterModel":
        return self._set(predictionCol=value)

    @keyword_only
    def setParams(self, *, inputCol: str | None = None, outputCol: str | None = None,
                  predictionCol: str | None = None) -> "ClusterRecenterModel":
        """The model's settable Params: its columns (the fitted Params are read-only on a model)."""
        return self._set(**self._input_kwargs)

    def extra_output_fields(self) -> list[StructField]:
        return [StructField(self.getPredictionCol(), IntegerType(), True)]

    def batch_outputs(self) -> BatchOutputs:
        return cluster_outputs(self.transform_)


def cluster_outputs(transform: ClusterRecenter) -> BatchOutputs:
    """Batch function of :meth:`ClusterRecenterModel.batch_outputs`: (B, d) raw vectors →
    ((B, d) corrected, [(B,) int32 cluster ids])."""

    def run(x: np.ndarray) -> tuple[np.ndarray, list[pa.Array]]:
        corrected, ids = transform.apply_with_clusters(x)
        return corrected, [pa.array(ids.astype(np.int32))]

    return run


@register_estimator(ClusterRecenter.method)
class ClusterRecenterEstimator(CorrectionEstimator, _ClusterRecenterParams):
    """Cluster-wise recentering (seed chapter 7): k-means with modest ``k``, then one mean — and optionally
    the top ``D`` within-cluster directions — per cluster. ``fit`` returns a :class:`ClusterRecenterModel`.
    Params: see :class:`~anisotropy_spark.params._ClusterRecenterParams`.
    """

    model_class = ClusterRecenterModel

    @keyword_only
    def __init__(self, *, inputCol: str | None = None, outputCol: str | None = None, k: int = 8, D: int = 0,
                 distanceMeasure: str = "euclidean", seed: int = 0, maxIter: int = DEFAULT_MAX_ITER,
                 tol: float = DEFAULT_TOL, initSteps: int = DEFAULT_INIT_STEPS, predictionCol: str = "cluster_id"):
        super().__init__()
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, inputCol: str | None = None, outputCol: str | None = None, k: int = 8, D: int = 0,
                  distanceMeasure: str = "euclidean", seed: int = 0, maxIter: int = DEFAULT_MAX_ITER,
                  tol: float = DEFAULT_TOL, initSteps: int = DEFAULT_INIT_STEPS,
                  predictionCol: str = "cluster_id") -> "ClusterRecenterEstimator":
        return self._set(**self._input_kwargs)

    def setK(self, value: int) -> "ClusterRecenterEstimator":
        return self._set(k=value)

    def setD(self, value: int) -> "ClusterRecenterEstimator":
        return self._set(D=value)

    def setDistanceMeasure(self, value: str) -> "ClusterRecenterEstimator":
        return self._set(distanceMeasure=value)

    def setSeed(self, value: int) -> "ClusterRecenterEstimator":
        return self._set(seed=value)

    def setMaxIter(self, value: int) -> "ClusterRecenterEstimator":
        return self._set(maxIter=value)

    def setTol(self, value: float) -> "ClusterRecenterEstimator":
        return self._set(tol=value)

    def setInitSteps(self, value: int) -> "ClusterRecenterEstimator":
        return self._set(initSteps=value)

    def setPredictionCol(self, value: str) -> "ClusterRecenterEstimator":
        return self._set(predictionCol=value)

    def _fit_transform(self, vectors: DataFrame, col: str, d: int) -> tuple[ClusterRecenter, int]:
        metric = check_metric(self.getDistanceMeasure())
        blocks = vector_blocks(vectors, col, d, metric).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            result = fit_kmeans_blocks(blocks, d, self.getK(), metric, self.getSeed(), self.getMaxIter(),
                                       self.getTol(), self.getInitSteps(), DEFAULT_OVERSAMPLING, None)
            states = cluster_moments_pass(blocks, result.centroids, metric)
        finally:
            blocks.unpersist()
        transform = ClusterRecenter.from_moments(result.centroids, states, self.getD(), metric,
                                                 kmeans_info(result))
        return transform, int(transform.sizes.sum())
