"""Distributed k-means and cluster-wise recentering on Spark (seed chapter 7, "the mean belongs to nobody").

Every pass is one ``mapInArrow`` over the vector column: each partition folds its Arrow batches with numpy
BLAS into one serialised state (no per-row Python), and the states are combined with ``rdd.treeReduce``
(never Spark Accumulators, which double-count on task retry). The algorithms themselves — k-means||
initialisation, Lloyd iterations, empty-cluster re-seeding, convergence — are the numpy driver loops of
:mod:`anisotropy_core.clustering`, so :func:`fit_kmeans` computes exactly what the numpy reference
``anisotropy_core.clustering.kmeans`` computes on the same partitions.

Randomness (k-means|| sampling) comes from one generator per (seed, round, partition id), so a fit is
deterministic given the seed and the input's partitioning.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel, TaskContext, keyword_only
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.sql import DataFrame
from pyspark.sql.types import IntegerType, StructField

from anisotropy_core.clustering import (DEFAULT_INIT_STEPS, DEFAULT_MAX_ITER, DEFAULT_OVERSAMPLING, DEFAULT_TOL,
                                        ClusterRecenter, ClusterState, KMeansResult, assign, check_metric,
                                        cluster_diagnostics, cluster_moments, first_centre_candidate,
                                        kmeans_info, kmeans_parallel_init, lloyd, merge_cluster_moments,
                                        oversample, partition_rng, prepare)
from anisotropy_core.moments import Moments

from .arrow import batch_matrix
from .estimators import BatchOutputs, CorrectionEstimator, CorrectionModel, register_model_class
from .io import infer_dimension

PAYLOAD_SCHEMA = pa.schema([("partition", pa.int64()), ("payload", pa.binary())])
PAYLOAD_DDL = "partition long, payload binary"
PACKED_SCHEMA = pa.schema([("packed", pa.binary())])
TREE_DEPTH = 2

Fold = Callable[[Iterator[np.ndarray], int], bytes]


def pack_vectors(df: DataFrame, vector_col: str, dimension: int) -> DataFrame:
    """``packed binary`` DataFrame: each Arrow batch of ``vector_col`` (array<double>, length ``dimension``)
    becomes one row holding its (B, d) float64 matrix as raw bytes, in the same partitions and row order.

    Iterative passes read these blobs with ``np.frombuffer`` instead of converting every array element from
    Spark rows to Arrow again; persist the result when it is read more than once.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                payload = batch_matrix(batch, vector_col, dimension).tobytes()
                yield pa.RecordBatch.from_pydict({"packed": [payload]}, schema=PACKED_SCHEMA)

    return df.select(vector_col).mapInArrow(run, "packed binary")


def _unpacked(batches: Iterator[pa.RecordBatch], dimension: int) -> Iterator[np.ndarray]:
    """The (B, d) matrices stored by :func:`pack_vectors` (read-only views of the Arrow buffers)."""
    for batch in batches:
        for blob in batch.column(0):
            yield np.frombuffer(blob.as_buffer(), dtype=np.float64).reshape(-1, dimension)


def _partition_payloads(dimension: int, fold: Fold):
    """``mapInArrow`` function: the partition's packed matrices → ``fold(matrices, partition id)`` → one row."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = TaskContext.get().partitionId()
        payload = fold(_unpacked(batches, dimension), partition)
        yield pa.RecordBatch.from_pydict({"partition": [partition], "payload": [payload]}, schema=PAYLOAD_SCHEMA)

    return run


def _payloads(packed: DataFrame, dimension: int, fold: Fold) -> DataFrame:
    return packed.mapInArrow(_partition_payloads(dimension, fold), PAYLOAD_DDL)


def _reduce(packed: DataFrame, dimension: int, fold: Fold, decode: Callable[[bytes], Any],
            merge: Callable[[Any, Any], Any]) -> Any:
    """One pass: per-partition ``fold`` → ``decode`` → ``treeReduce(merge)`` on the driver."""
    rows = _payloads(packed, dimension, fold).rdd.map(lambda row: decode(bytes(row["payload"])))
    return rows.treeReduce(merge, depth=TREE_DEPTH)


def assignment_pass(packed: DataFrame, dimension: int, centroids: np.ndarray, metric: str) -> ClusterState:
    """One Lloyd pass: per-cluster sums, counts, inertia and farthest points of the :func:`pack_vectors`
    frame ``packed`` against ``centroids`` (k, d)."""
    centroids = np.asarray(centroids, dtype=np.float64)

    def fold(matrices: Iterator[np.ndarray], _partition: int) -> bytes:
        state = ClusterState.empty(*centroids.shape)
        for x in matrices:
            state = state.merge(ClusterState.of_batch(prepare(x, metric), centroids, metric))
        return state.to_bytes()

    return _reduce(packed, dimension, fold, ClusterState.from_bytes, ClusterState.merge)


def _collect_rows(packed: DataFrame, dimension: int, fold: Fold, width: int) -> np.ndarray:
    """(m, width) float64 rows produced by ``fold`` in every partition, concatenated in partition order
    (small results only: k-means|| candidates)."""
    rows = sorted(_payloads(packed, dimension, fold).collect(), key=lambda r: r["partition"])
    return np.concatenate([np.frombuffer(bytes(r["payload"]), dtype=np.float64).reshape(-1, width)
                           for r in rows])


def first_centre(packed: DataFrame, dimension: int, metric: str, seed: int) -> np.ndarray:
    """(d,) a uniformly random prepared row: the smallest per-row uniform key over all partitions."""

    def fold(matrices: Iterator[np.ndarray], partition: int) -> bytes:
        rng = partition_rng(seed, -1, partition)
        best = (np.inf, np.zeros(dimension))
        for x in matrices:
            key, row = first_centre_candidate(prepare(x, metric), rng)
            best = min(best, (key, row), key=lambda kv: kv[0])
        return np.concatenate([[best[0]], best[1]]).tobytes() if np.isfinite(best[0]) else b""

    keyed = _collect_rows(packed, dimension, fold, dimension + 1)
    if keyed.shape[0] == 0:
        raise ValueError("k-means needs at least one vector: the input is empty")
    return keyed[int(np.argmin(keyed[:, 0])), 1:]


def oversample_pass(packed: DataFrame, dimension: int, centroids: np.ndarray, scale: float, round_: int,
                    metric: str, seed: int) -> np.ndarray:
    """k-means|| round: (m, d) prepared rows kept with probability min(1, scale · distance to centroids)."""
    centroids = np.asarray(centroids, dtype=np.float64)

    def fold(matrices: Iterator[np.ndarray], partition: int) -> bytes:
        rng = partition_rng(seed, round_, partition)
        kept = [oversample(prepare(x, metric), centroids, metric, scale, rng) for x in matrices]
        return np.concatenate(kept).tobytes() if kept else b""

    return _collect_rows(packed, dimension, fold, dimension)


def fit_kmeans(df: DataFrame, vector_col: str, k: int, metric: str = "euclidean", seed: int = 0,
               max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL, init_steps: int = DEFAULT_INIT_STEPS,
               oversampling: float = DEFAULT_OVERSAMPLING, init: np.ndarray | None = None,
               dimension: int | None = None) -> KMeansResult:
    """Distributed k-means (k-means|| init + Lloyd) of the valid ``array<double>`` column ``vector_col``.

    ``metric``: ``"euclidean"`` or ``"cosine"`` (spherical; centroids are unit vectors). ``init``: optional
    (k, d) starting centroids (skips k-means||). The vectors are packed (:func:`pack_vectors`) and persisted
    for the duration of the fit. Returns a :class:`KMeansResult` (centroids (k, d), sizes, inertia,
    iterations, convergence flag, inertia history).
    """
    check_metric(metric)
    d = dimension if dimension is not None else infer_dimension(df, vector_col)
    packed = pack_vectors(df, vector_col, d).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return fit_kmeans_packed(packed, d, k, metric, seed, max_iter, tol, init_steps, oversampling, init)
    finally:
        packed.unpersist()


def fit_kmeans_packed(packed: DataFrame, dimension: int, k: int, metric: str, seed: int, max_iter: int,
                      tol: float, init_steps: int, oversampling: float, init: np.ndarray | None) -> KMeansResult:
    """:func:`fit_kmeans` on an already packed (and preferably persisted) frame, see :func:`pack_vectors`."""
    if init is None:
        start = kmeans_parallel_init(
            lambda: first_centre(packed, dimension, metric, seed),
            lambda c: assignment_pass(packed, dimension, c, metric),
            lambda c, scale, round_: oversample_pass(packed, dimension, c, scale, round_, metric, seed),
            k, metric, seed, init_steps, oversampling)
    else:
        start = prepare(init, metric)
    if start.shape != (k, dimension):
        raise ValueError(f"initial centroids have shape {start.shape}, expected {(k, dimension)}")
    return lloyd(lambda c: assignment_pass(packed, dimension, c, metric), start, metric, max_iter, tol)


def cluster_moments_pass(packed: DataFrame, dimension: int, centroids: np.ndarray, metric: str) -> list[Moments]:
    """One pass over a :func:`pack_vectors` frame: the k :class:`Moments` states (raw vectors) of the
    clusters of ``centroids`` (k, d)."""
    centroids = np.asarray(centroids, dtype=np.float64)
    k = centroids.shape[0]
    size = len(Moments.empty(dimension).to_bytes())

    def fold(matrices: Iterator[np.ndarray], _partition: int) -> bytes:
        states = [Moments.empty(dimension)] * k
        for x in matrices:
            ids = assign(prepare(x, metric), centroids, metric)[0]
            states = merge_cluster_moments(states, cluster_moments(x, ids, k))
        return b"".join(s.to_bytes() for s in states)

    def decode(payload: bytes) -> list[Moments]:
        return [Moments.from_bytes(payload[c * size:(c + 1) * size]) for c in range(k)]

    return _reduce(packed, dimension, fold, decode, merge_cluster_moments)


def spark_cluster_diagnostics(df: DataFrame, vector_col: str, centroids: np.ndarray, metric: str = "euclidean",
                              dimension: int | None = None) -> dict:
    """Per-cluster diagnosis table of ``df`` for the clusters of ``centroids`` (k, d): one pass, then
    :func:`anisotropy_core.clustering.cluster_diagnostics` (see there for the returned dict)."""
    d = dimension if dimension is not None else infer_dimension(df, vector_col)
    return cluster_diagnostics(cluster_moments_pass(pack_vectors(df, vector_col, d), d, centroids, metric))


@register_model_class(ClusterRecenter.method)
class ClusterRecenterModel(CorrectionModel):
    """Fitted cluster recentering: ``transform(df)`` writes ``outputCol`` (array<double>, corrected vector)
    and ``clusterCol`` (int, the cluster the vector landed in), keeping every other column. Saves and loads
    as the shared artifact (method ``cluster_recenter``) plus pyspark.ml metadata; registered for that method,
    so ``CorrectionModel.from_artifact`` / ``CorrectionModel.load`` of such an artifact return this class."""

    clusterCol = Param(Params._dummy(), "clusterCol", "output column of cluster ids",
                       typeConverter=TypeConverters.toString)

    def __init__(self, transform: ClusterRecenter | None = None, n: int = 0, fitted_on: dict | None = None):
        super().__init__(transform, n, fitted_on)
        self._setDefault(clusterCol="cluster_id")

    def setClusterCol(self, value: str) -> "ClusterRecenterModel":
        return self._set(clusterCol=value)

    def getClusterCol(self) -> str:
        return self.getOrDefault(self.clusterCol)

    def extra_output_fields(self) -> list[StructField]:
        return [StructField(self.getClusterCol(), IntegerType(), True)]

    def batch_outputs(self) -> BatchOutputs:
        return cluster_outputs(self.transform_)


def cluster_outputs(transform: ClusterRecenter) -> BatchOutputs:
    """Batch function of :meth:`ClusterRecenterModel.batch_outputs`: (B, d) raw vectors →
    ((B, d) corrected, [(B,) int32 cluster ids])."""

    def run(x: np.ndarray) -> tuple[np.ndarray, list[pa.Array]]:
        corrected, ids = transform.apply_with_clusters(x)
        return corrected, [pa.array(ids.astype(np.int32))]

    return run


class ClusterRecenterEstimator(CorrectionEstimator):
    """Cluster-wise recentering (seed chapter 7): k-means with modest ``k``, then one mean — and optionally
    the top ``D`` within-cluster directions — per cluster. ``fit`` returns a :class:`ClusterRecenterModel`.

    Params: ``k`` (default 8), ``D`` directions removed per cluster (default 0), ``distanceMeasure``
    (``euclidean`` | ``cosine``), ``seed``, ``maxIter``, ``tol`` (relative inertia change), ``initSteps``
    (k-means|| rounds), ``clusterCol`` (output cluster-id column of the model, default ``cluster_id``).
    """

    k = Param(Params._dummy(), "k", "number of clusters", typeConverter=TypeConverters.toInt)
    D = Param(Params._dummy(), "D", "top within-cluster directions removed per cluster",
              typeConverter=TypeConverters.toInt)
    distanceMeasure = Param(Params._dummy(), "distanceMeasure", "euclidean | cosine",
                            typeConverter=TypeConverters.toString)
    seed = Param(Params._dummy(), "seed", "random seed of the k-means|| initialisation",
                 typeConverter=TypeConverters.toInt)
    maxIter = Param(Params._dummy(), "maxIter", "maximum Lloyd iterations", typeConverter=TypeConverters.toInt)
    tol = Param(Params._dummy(), "tol", "relative inertia change that stops Lloyd",
                typeConverter=TypeConverters.toFloat)
    initSteps = Param(Params._dummy(), "initSteps", "k-means|| rounds", typeConverter=TypeConverters.toInt)
    clusterCol = Param(Params._dummy(), "clusterCol", "output column of cluster ids",
                       typeConverter=TypeConverters.toString)
    model_class = ClusterRecenterModel

    @keyword_only
    def __init__(self, *, inputCol: str | None = None, outputCol: str | None = None, k: int = 8, D: int = 0,
                 distanceMeasure: str = "euclidean", seed: int = 0, maxIter: int = DEFAULT_MAX_ITER,
                 tol: float = DEFAULT_TOL, initSteps: int = DEFAULT_INIT_STEPS, clusterCol: str = "cluster_id"):
        super().__init__()
        self._setDefault(k=8, D=0, distanceMeasure="euclidean", seed=0, maxIter=DEFAULT_MAX_ITER, tol=DEFAULT_TOL,
                         initSteps=DEFAULT_INIT_STEPS, clusterCol="cluster_id")
        self._set(**self._input_kwargs)

    def _fit_transform(self, vectors: DataFrame, col: str, d: int) -> tuple[ClusterRecenter, int]:
        get = self.getOrDefault
        metric = check_metric(get(self.distanceMeasure))
        packed = pack_vectors(vectors, col, d).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            result = fit_kmeans_packed(packed, d, get(self.k), metric, get(self.seed), get(self.maxIter),
                                       get(self.tol), get(self.initSteps), DEFAULT_OVERSAMPLING, None)
            states = cluster_moments_pass(packed, d, result.centroids, metric)
        finally:
            packed.unpersist()
        transform = ClusterRecenter.from_moments(result.centroids, states, get(self.D), metric,
                                                 kmeans_info(result))
        return transform, int(transform.sizes.sum())
