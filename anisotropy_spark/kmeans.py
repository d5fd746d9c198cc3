"""Distributed k-means and cluster-wise recentering on Spark (seed chapter 7, "the mean belongs to nobody").

Design (issue 9: within 2× faiss; issue 12: per-task memory independent of n):

1. **Sample pass** — one read of the table: each partition keeps the rows with the smallest uniform keys
   (:class:`~anisotropy_core.clustering.RowSample`, at most ``sample_size`` × d per task) and counts its
   rows; the partition samples are merged with ``treeReduce`` into a uniform sample on the driver.
2. **Sample fit** — k-means|| and Lloyd on the sample in the driver process (numpy BLAS, float32 GEMM for
   float32 rows), as faiss trains on a sample by default. When the table has at most ``sample_size`` rows
   the sample *is* the table and this is the exact fit; nothing else runs.
3. **Refinement** — ``refine_passes`` full Lloyd passes over the table (Arrow batches → numpy, float32
   distance GEMM, float64 sums and inertia, states merged with ``treeReduce``), so the returned centroids,
   sizes and inertia are those of the whole table.

Nothing is cached: every pass re-reads the input (for Parquet/Delta a read is cheaper than keeping a
float copy in the JVM and re-shipping it), so a task holds one Arrow batch plus its O(k·d + sample_size·d)
state whatever n is. ``array<float>`` columns reach numpy as float32 without an ``array<double>`` copy on the
JVM side. The driver loops are those of :mod:`anisotropy_core.clustering` (:func:`sampled_kmeans`), so
:func:`fit_kmeans` computes exactly what the numpy reference ``anisotropy_core.clustering.kmeans`` computes
on the same partitions, and a fit is deterministic given the seed and the input's partitioning.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
from pyspark import RDD, TaskContext, keyword_only
from pyspark.sql import DataFrame
from pyspark.sql.types import IntegerType, StructField

from anisotropy_core.clustering import (DEFAULT_INIT_STEPS, DEFAULT_MAX_ITER, DEFAULT_OVERSAMPLING,
                                        DEFAULT_REFINE_PASSES, DEFAULT_SAMPLE_SIZE, DEFAULT_TOL, SAMPLE_ROUND,
                                        ClusterRecenter, ClusterState, KMeansResult, RowSample, assign,
                                        check_metric, cluster_diagnostics, cluster_moments, kmeans_info,
                                        merge_cluster_moments, partition_rng, prepare, sample_threshold,
                                        sampled_kmeans)
from anisotropy_core.moments import Moments

from .arrow import batch_matrix, matrix_column
from .estimators import BatchOutputs, CorrectionEstimator, CorrectionModel, register_estimator, register_model_class
from .io import as_vector_array, infer_dimension
from .keyed import fold_by_key, merge_moments_bytes
from .params import _ClusterRecenterParams
from .tree_reduce import tree_reduce

STATE_SCHEMA = pa.schema([("state", pa.binary())])

Fold = Callable[[Iterator[np.ndarray], int], Any]


def partition_states(vectors: DataFrame, vector_col: str, dimension: int, fold: Fold) -> RDD:
    """One state per partition: ``fold(the partition's (B, d) batch matrices in row order, partition id)``.

    ``vector_col`` is ``array<float>`` (batches arrive as float32) or ``array<double>`` (float64); the
    batches come straight from Arrow, one at a time, and only the state leaves the task."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        matrices = (batch_matrix(b, vector_col, dimension, dtype=None) for b in batches if b.num_rows)
        state = fold(matrices, TaskContext.get().partitionId())
        yield pa.RecordBatch.from_pydict({"state": [pickle.dumps(state)]}, schema=STATE_SCHEMA)

    return vectors.select(vector_col).mapInArrow(run, "state binary").rdd.map(lambda row: pickle.loads(row[0]))


def sample_pass(vectors: DataFrame, vector_col: str, dimension: int, seed: int, size: int,
                n: int | None = None) -> RowSample:
    """Uniform :class:`RowSample` of at most ``size`` rows of the table (the ``size`` smallest keys).

    ``n``: the row count (default: ``vectors.count()``, a JVM-side pass). Each task keeps only its rows with
    keys under :func:`sample_threshold` (at most ``size`` of them) and returns them as Arrow rows
    (key, partition, row, vector in its own element type), collected with ``toArrow``: little more than
    ``size`` rows travel in all. Should the bound miss (probability < 1e-15, or a wrong ``n``), the pass is
    repeated without it, so the result is always the exact sample."""
    n = vectors.count() if n is None else n
    element = vectors.schema[vector_col].dataType.elementType.simpleString()      # float | double
    dtype = np.float32 if element == "float" else np.float64

    def draw(below: float) -> RowSample:
        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            partition = TaskContext.get().partitionId()
            rng = partition_rng(seed, SAMPLE_ROUND, partition)
            sample = RowSample.of_rows(np.zeros((0, dimension), dtype), rng, partition, 0, size)
            for batch in batches:
                x = batch_matrix(batch, vector_col, dimension, dtype=None)
                sample = sample.merge(RowSample.of_rows(x, rng, partition, sample.n, size, below))
            yield pa.RecordBatch.from_pydict({
                "key": sample.keys, "partition": sample.origin[:, 0].astype(np.int32), "row": sample.origin[:, 1],
                vector_col: matrix_column(sample.rows, dtype)})

        table = vectors.select(vector_col).mapInArrow(
            run, f"key double, partition int, row long, {vector_col} array<{element}>").toArrow()
        origin = np.stack([table.column("partition").to_numpy(), table.column("row").to_numpy()], axis=1)
        return RowSample.of_candidates(table.column("key").to_numpy(), batch_matrix(table, vector_col, dimension,
                                                                                      dtype=None), origin, n, size)

    sample = draw(sample_threshold(n, size))
    return sample if sample.complete else draw(1.0)


def assignment_pass(vectors: DataFrame, vector_col: str, dimension: int, centroids: np.ndarray,
                    metric: str) -> ClusterState:
    """One full Lloyd pass: per-cluster sums, counts, inertia and farthest points of every row against
    ``centroids`` (k, d)."""
    centroids = np.asarray(centroids, dtype=np.float64)

    def fold(batches: Iterator[np.ndarray], _partition: int) -> ClusterState:
        state = ClusterState.empty(*centroids.shape)
        for x in batches:
            state = state.merge(ClusterState.of_batch(prepare(x, metric), centroids, metric))
        return state

    return tree_reduce(partition_states(vectors, vector_col, dimension, fold), ClusterState.merge)


def fit_kmeans(df: DataFrame, vector_col: str, k: int, metric: str = "euclidean", seed: int = 0,
               max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL, init_steps: int = DEFAULT_INIT_STEPS,
               oversampling: float = DEFAULT_OVERSAMPLING, init: np.ndarray | None = None,
               dimension: int | None = None, sample_size: int = DEFAULT_SAMPLE_SIZE,
               refine_passes: int = DEFAULT_REFINE_PASSES) -> KMeansResult:
    """Distributed k-means (module docstring: sample pass, sample fit, full refinement passes) of the valid
    vector column ``vector_col`` (``array<float>``, ``array<double>`` or VectorUDT).

    ``metric``: ``"euclidean"`` or ``"cosine"`` (spherical; centroids are unit vectors). ``init``: optional
    (k, d) starting centroids (skips k-means||). ``max_iter`` Lloyd iterations in all (sample updates plus
    full passes). Returns a :class:`KMeansResult` (centroids (k, d), sizes, inertia of the whole table,
    iterations, convergence flag, the full passes' inertia history).
    """
    check_metric(metric)
    vectors = as_vector_array(df.select(vector_col), vector_col)
    d = dimension if dimension is not None else infer_dimension(vectors, vector_col)
    sample = sample_pass(vectors, vector_col, d, seed, sample_size)
    return sampled_kmeans(sample, vectors.rdd.getNumPartitions(),
                          lambda c: assignment_pass(vectors, vector_col, d, c, metric), k, metric, seed, max_iter,
                          tol, init, init_steps, oversampling, refine_passes)


def cluster_moments_pass(vectors: DataFrame, vector_col: str, dimension: int, centroids: np.ndarray,
                         metric: str) -> list[Moments]:
    """One pass: the k :class:`Moments` states (raw vectors, float64) of the clusters of ``centroids`` (k, d).

    A task (one per slot, :func:`~anisotropy_spark.keyed.fold_by_key`) holds its k states (k·d²·8 bytes,
    independent of n) and emits them keyed by cluster (:mod:`~anisotropy_spark.keyed`), so no record is larger
    than one (d, d) state and the driver receives k states. A cluster no row reached comes back as
    :meth:`Moments.empty`."""
    centroids = np.asarray(centroids, dtype=np.float64)
    k, d = centroids.shape

    def fold(batches: Iterator[pa.RecordBatch]) -> dict[bytes, bytes]:
        states = [Moments.empty(d)] * k
        for batch in batches:
            if batch.num_rows:
                x = batch_matrix(batch, vector_col, dimension, dtype=None)
                states = merge_cluster_moments(states, cluster_moments(x, assign(prepare(x, metric), centroids,
                                                                                 metric)[0], k))
        return {_cluster_key(c): s.to_bytes() for c, s in enumerate(states) if s.n}

    merged = fold_by_key(vectors.select(vector_col), fold, merge_moments_bytes)
    return [Moments.from_bytes(merged[_cluster_key(c)]) if _cluster_key(c) in merged else Moments.empty(d)
            for c in range(k)]


def _cluster_key(cluster: int) -> bytes:
    return cluster.to_bytes(4, "little")


def fit_cluster_recenter(vectors: DataFrame, vector_col: str, dimension: int, k: int, D: int, metric: str,
                         seed: int = 0, max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL,
                         init_steps: int = DEFAULT_INIT_STEPS) -> tuple[ClusterRecenter, list[Moments]]:
    """k-means of the valid ``vector_col`` (:func:`fit_kmeans`), then one pass for the k per-cluster
    :class:`Moments`; returns the fitted :class:`ClusterRecenter` (``D`` within-cluster directions removed per
    cluster) and those states (what :func:`~anisotropy_core.clustering.cluster_diagnostics` reads)."""
    metric = check_metric(metric)
    result = fit_kmeans(vectors, vector_col, k, metric, seed, max_iter, tol, init_steps, dimension=dimension)
    states = cluster_moments_pass(as_vector_array(vectors.select(vector_col), vector_col), vector_col, dimension,
                                  result.centroids, metric)
    return ClusterRecenter.from_moments(result.centroids, states, D, metric, kmeans_info(result)), states


def spark_cluster_diagnostics(df: DataFrame, vector_col: str, centroids: np.ndarray, metric: str = "euclidean",
                              dimension: int | None = None) -> dict:
    """Per-cluster diagnosis table of ``df`` for the clusters of ``centroids`` (k, d): one pass, then
    :func:`anisotropy_core.clustering.cluster_diagnostics` (see there for the returned dict)."""
    vectors = as_vector_array(df.select(vector_col), vector_col)
    d = dimension if dimension is not None else infer_dimension(vectors, vector_col)
    return cluster_diagnostics(cluster_moments_pass(vectors, vector_col, d, centroids, metric))


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
    moment_based = False

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
        transform, _ = fit_cluster_recenter(vectors, col, d, self.getK(), self.getD(), self.getDistanceMeasure(),
                                            self.getSeed(), self.getMaxIter(), self.getTol(), self.getInitSteps())
        return transform, int(transform.sizes.sum())
