"""Distributed k-means and cluster-wise recentering on Spark (seed chapter 7, "the mean belongs to nobody").

Design (issue 9: within 2× faiss, never worse than pyspark.ml; issue 12: per-task memory independent of n):

1. **Sample pass** — one read of the table on the JVM: every row gets a uniform key, a hash of its seed and
   place (:mod:`anisotropy_core.row_keys`), and only the rows under a bound that holds the ``sample_size``
   smallest keys (about ``sample_size`` + 8·√``sample_size``) reach the driver, where they become a
   :class:`~anisotropy_core.kmeans.KeyedSample`. No vector enters a Python worker in this pass.
2. **Sample fit** — k-means|| and Lloyd on the sample in the driver process (numpy BLAS, float32 GEMM for
   float32 rows), as faiss trains on a sample by default. When the table has at most ``sample_size`` rows
   the sample *is* the table and this is the exact fit; nothing else runs.
3. **Refinement** — full Lloyd passes over the table (float32 distance GEMM, float64 sums and inertia), so
   the returned centroids, sizes and inertia are those of the whole table. Two ways:

   * **in memory** (:func:`in_memory_refine`, opt-in: when ``task_memory`` > 0 and each task's share of the
     table fits it): the table is repartitioned (round-robin) into one partition per task slot and read
     once into a *barrier* stage (``mapInArrow(barrier=True)``); each task keeps its rows as numpy blocks
     and every Lloyd pass merges the tasks' states with ``BarrierTaskContext.allGather``, so
     ``IN_MEMORY_REFINE_PASSES`` passes cost little more than the math. A task holds n / slots rows: that is
     why the path runs only when that share fits. It is not the default: the repartition and the read into
     the barrier stage cost about twice a plain read, and each ``allGather`` costs about as much as the
     pass's math, because Spark's ``BarrierTaskContext`` polls for the sync's completion with
     ``Thread.sleep(1000)``. The result beats pyspark.ml's inertia but takes longer than streaming
     (docs/design.md, timings in bench/RESULTS.md).
   * **streaming** (:func:`assignment_pass`, the default): ``DEFAULT_REFINE_PASSES`` passes that each re-read
     the input (Arrow batches → numpy, one state per task slot, states merged with ``treeReduce``); a task
     holds one Arrow batch plus its O(k·d) state whatever n is. Between two passes the driver runs
     ``DEFAULT_CORRECTED_ITER`` Lloyd updates on the sample corrected by the sample's bias measured at the
     pass (:func:`~anisotropy_core.kmeans.sample_corrected_step`): the full pass is what costs here, and
     the corrected updates carry the table's Lloyd path further than its single update would.

``array<float>`` columns reach numpy as float32 without an ``array<double>`` copy on the JVM side. The driver
loops are those of :mod:`anisotropy_core.kmeans` (:func:`sampled_kmeans`, :func:`lloyd`), so
:func:`fit_kmeans` computes what the numpy reference ``anisotropy_core.kmeans.kmeans`` computes on the same
partitions (the in-memory passes merge the same rows in another grouping: equal up to rounding), and a fit is
deterministic given the seed and the input's partitioning (Spark sorts before a round-robin repartition so
that the rows a partition gets are deterministic; the in-memory passes are bit-identical from run to run
when the shuffle serves the map outputs in the same order, as in local mode).
"""

from __future__ import annotations

import base64
import functools
import math
import pickle
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
from pyspark import RDD, BarrierTaskContext, SparkContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, FloatType, IntegerType, StructField

from anisotropy_core.cluster_diagnostics import (
    ClusterTable,
    cluster_diagnostics,
    cluster_moments,
    merge_cluster_moments,
)
from anisotropy_core.cluster_recenter import ClusterRecenter, kmeans_info
from anisotropy_core.kmeans import (
    DEFAULT_CORRECTED_ITER,
    DEFAULT_INIT_STEPS,
    DEFAULT_MAX_ITER,
    DEFAULT_OVERSAMPLING,
    DEFAULT_REFINE_PASSES,
    DEFAULT_SAMPLE_SIZE,
    DEFAULT_TOL,
    ClusterState,
    KeyedSample,
    KMeansResult,
    Refine,
    Step,
    assign,
    blocks_state,
    check_metric,
    lloyd,
    prepare,
    row_norms_squared,
    sample_threshold,
    sampled_kmeans,
)
from anisotropy_core.moments import Moments
from anisotropy_core.row_keys import KEY_BITS, split_row_ids

from .arrow import batch_matrix
from .estimators import (
    BatchOutputs,
    CorrectionEstimator,
    CorrectionModel,
    read_only,
    register_estimator,
    register_model_class,
)
from .io import as_vector_array, infer_dimension
from .keyed import coalesce_to_slots, fold_by_key, merge_moments_bytes
from .params import _ClusterRecenterParams
from .tree_reduce import tree_reduce

STATE_SCHEMA = pa.schema([("state", pa.binary())])
ROW_ID_COL, KEY_COL, VECTOR_COL = "row_id", "key", "vector"  # the sample pass's columns (vectors renamed)
IN_MEMORY_REFINE_PASSES = 10  # full Lloyd passes when the table is refined in memory
ALL_GATHER_BYTES = 64 << 20  # largest allGather answer (all tasks' states; Spark's RPC limit is 128 MiB)

Fold = Callable[[Iterator[np.ndarray]], Any]


def partition_states(vectors: DataFrame, vector_col: str, dimension: int, fold: Fold) -> RDD:
    """One state per task slot: ``fold(the (B, d) batch matrices of the slot's partitions, in row order)``.

    ``vector_col`` is ``array<float>`` (batches arrive as float32) or ``array<double>`` (float64); the
    batches come straight from Arrow, one at a time, and only the state leaves the task. The input is
    coalesced (no shuffle) to one partition per task slot (:func:`~anisotropy_spark.keyed.coalesce_to_slots`):
    a task's memory is still one batch plus its state, and the states to merge are as many as the slots, not
    as the input's partitions."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        state = fold(batch_matrix(b, vector_col, dimension, dtype=None) for b in batches if b.num_rows)
        yield pa.RecordBatch.from_pydict({"state": [pickle.dumps(state)]}, schema=STATE_SCHEMA)

    states = coalesce_to_slots(vectors.select(vector_col)).mapInArrow(run, "state binary")
    return states.rdd.map(lambda row: pickle.loads(row[0]))


def sample_key(seed: int, row_id: Column) -> Column:
    """The uniform key in [0, 1) of the row whose ``monotonically_increasing_id()`` is ``row_id``, for ``seed``:
    what :func:`anisotropy_core.row_keys.row_keys` computes in numpy, bit for bit."""
    hashed = F.xxhash64(F.lit(seed).cast("long"), row_id)
    return F.shiftrightunsigned(hashed, 64 - KEY_BITS).cast("double") * F.lit(2.0**-KEY_BITS)


def sample_pass(
    vectors: DataFrame, vector_col: str, dimension: int, seed: int, size: int, n: int | None = None
) -> KeyedSample:
    """Uniform :class:`KeyedSample` of at most ``size`` rows of the table (the ``size`` smallest keys).

    ``n``: the row count (default: ``vectors.count()``, a JVM-side pass). The keys are computed on the JVM
    (:func:`sample_key` of each row's ``monotonically_increasing_id``) and only the rows with keys under
    :func:`sample_threshold` (about ``size`` + 8·√``size`` of them) leave it, collected with ``toArrow``: no
    vector is shipped into Python just to be dropped. Should the bound miss (probability
    < 1e-15, or a wrong ``n``), the rows are counted, the bound raised (to that count's, or twice the last) and
    the pass repeated, so the result is always the exact sample, and the driver gets about 2 · ``size`` rows at
    most."""
    n = vectors.count() if n is None else n
    with_ids = vectors.select(F.monotonically_increasing_id().alias(ROW_ID_COL), F.col(vector_col).alias(VECTOR_COL))
    keyed = with_ids.select(sample_key(seed, F.col(ROW_ID_COL)).alias(KEY_COL), ROW_ID_COL, VECTOR_COL)
    below = sample_threshold(n, size)
    while True:
        table = keyed.where(F.col(KEY_COL) < below).toArrow()
        sample = KeyedSample.of_candidates(
            table.column(KEY_COL).to_numpy(),
            batch_matrix(table, VECTOR_COL, dimension, dtype=None),
            split_row_ids(table.column(ROW_ID_COL).to_numpy()),
            n,
            size,
        )
        if sample.complete or below >= 1.0:
            return sample
        n = vectors.count()  # a wrong n, or the < 1e-15 miss: then twice the bound (≈ 2 · size rows)
        below = min(1.0, max(2.0 * below, sample_threshold(n, size)))


def assignment_pass(
    vectors: DataFrame, vector_col: str, dimension: int, centroids: np.ndarray, metric: str
) -> ClusterState:
    """One full Lloyd pass: per-cluster sums, counts, inertia and farthest points of every row against
    ``centroids`` (k, d)."""
    centroids = np.asarray(centroids, dtype=np.float64)

    def fold(batches: Iterator[np.ndarray]) -> ClusterState:
        state = ClusterState.empty(*centroids.shape)
        for x in batches:
            state = state.merge(ClusterState.of_batch(prepare(x, metric), centroids, metric))
        return state

    return tree_reduce(partition_states(vectors, vector_col, dimension, fold), ClusterState.merge)


def streaming_refine(vectors: DataFrame, vector_col: str, dimension: int, metric: str) -> Refine:
    """:data:`~anisotropy_core.kmeans.Refine` whose every Lloyd pass re-reads the table
    (:func:`assignment_pass`)."""

    def refine(start: np.ndarray, passes: int, tol: float, step: Step | None) -> KMeansResult:
        result = lloyd(
            lambda c: assignment_pass(vectors, vector_col, dimension, c, metric), start, metric, passes, tol, step
        )
        result.refinement = "streaming"
        return result

    return refine


def in_memory_refine(vectors: DataFrame, vector_col: str, dimension: int, metric: str, slots: int) -> Refine:
    """:data:`~anisotropy_core.kmeans.Refine` run in one barrier stage over ``slots`` partitions (one per
    task slot, round-robin ``repartition``): each task reads its rows once into prepared numpy blocks and runs
    :func:`~anisotropy_core.kmeans.lloyd`, every pass merging all tasks' states in partition order
    (``allGather``), so every task takes the same steps; task 0 returns the result.

    Memory per task: its rows (about n / slots × d × itemsize bytes, see :func:`fits_in_memory`, which also
    counts the sample rows a step carries) plus one block's temporaries. A ``step`` between passes
    (:func:`~anisotropy_core.kmeans.sample_corrected_step`) travels with the task, sample rows included
    (PySpark broadcasts a large closure), and every task runs it on the same state. If a task fails, Spark
    reruns the whole barrier stage."""

    def refine(start: np.ndarray, passes: int, tol: float, step: Step | None) -> KMeansResult:
        def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            context = BarrierTaskContext.get()
            blocks = [
                prepare(batch_matrix(b, vector_col, dimension, dtype=None), metric) for b in batches if b.num_rows
            ]
            squares = [row_norms_squared(block) for block in blocks]

            def full_pass(centroids: np.ndarray) -> ClusterState:
                local = blocks_state(blocks, squares, centroids, metric)
                gathered = context.allGather(base64.b64encode(local.to_bytes()).decode("ascii"))
                return functools.reduce(
                    ClusterState.merge, (ClusterState.from_bytes(base64.b64decode(state)) for state in gathered)
                )

            result = lloyd(full_pass, start, metric, passes, tol, step)
            if context.partitionId() == 0:
                yield pa.RecordBatch.from_pydict({"state": [pickle.dumps(result)]}, schema=STATE_SCHEMA)

        rows = vectors.select(vector_col).repartition(slots)
        result = pickle.loads(rows.mapInArrow(run, "state binary", barrier=True).collect()[0][0])
        result.refinement = "in_memory"
        return result

    return refine


def task_slots(context: SparkContext) -> int:
    """Tasks the cluster runs at once (the default resource profile's slots: what a barrier stage may use;
    not ``defaultParallelism``, which ``spark.default.parallelism`` overrides). The JVM call is the one
    ``xgboost.spark`` makes for its barrier stage."""
    jvm_context = context._jsc.sc()
    return int(jvm_context.maxNumConcurrentTasks(jvm_context.resourceProfileManager().resourceProfileFromId(0)))


def fits_in_memory(
    n: int, dimension: int, itemsize: int, k: int, slots: int, task_memory: int, sample_rows: int = 0
) -> bool:
    """True when the in-memory refinement may run: each of ``slots`` tasks holds ⌈n / slots⌉ rows of
    ``dimension`` × ``itemsize`` bytes, plus ``sample_rows`` sample rows when a corrected step travels with
    every task, within ``task_memory``, and one allGather of all tasks' k-cluster states (base64) stays within
    ``ALL_GATHER_BYTES``."""
    share = (math.ceil(n / slots) + sample_rows) * dimension * itemsize
    gathered = slots * ClusterState.max_wire_bytes(k, dimension) * 4 / 3
    return 0 < share <= task_memory and gathered <= ALL_GATHER_BYTES


def fit_kmeans(
    df: DataFrame,
    vector_col: str,
    k: int,
    metric: str = "euclidean",
    seed: int = 0,
    max_iter: int = DEFAULT_MAX_ITER,
    tol: float = DEFAULT_TOL,
    init_steps: int = DEFAULT_INIT_STEPS,
    oversampling: float = DEFAULT_OVERSAMPLING,
    init: np.ndarray | None = None,
    dimension: int | None = None,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    refine_passes: int | None = None,
    task_memory: int = 0,
    corrected_iter: int | None = None,
) -> KMeansResult:
    """Distributed k-means (module docstring: sample pass, sample fit, full refinement passes) of the valid
    vector column ``vector_col`` (``array<float>``, ``array<double>`` or VectorUDT).

    ``metric``: ``"euclidean"`` or ``"cosine"`` (spherical; centroids are unit vectors). ``init``: optional
    (k, d) starting centroids (skips k-means||). ``max_iter``: Lloyd updates on the sample (the refinement
    passes over the table follow them). ``task_memory``: bytes of rows one task may hold for the in-memory
    refinement (default 0: always stream). ``refine_passes``: full passes (default
    ``IN_MEMORY_REFINE_PASSES`` in memory, ``DEFAULT_REFINE_PASSES`` streaming). ``corrected_iter``:
    bias-corrected sample updates between two full passes (default ``DEFAULT_CORRECTED_ITER`` streaming, 0 in
    memory, where full passes are cheap and every task would repeat them). Returns a
    :class:`KMeansResult` (centroids (k, d), sizes, inertia of the whole table, iterations, convergence flag,
    the full passes' inertia history, ``refinement``).
    """
    check_metric(metric)
    vectors = as_vector_array(df.select(vector_col), vector_col)
    d = dimension if dimension is not None else infer_dimension(vectors, vector_col)
    n = vectors.count()
    slots = task_slots(vectors.sparkSession.sparkContext)
    data_type = vectors.schema[vector_col].dataType  # array<float> or array<double> (as_vector_array)
    itemsize = 4 if isinstance(data_type, ArrayType) and isinstance(data_type.elementType, FloatType) else 8
    held_sample = min(sample_size, n) if corrected_iter else 0  # in memory the default is 0: no sample held
    if fits_in_memory(n, d, itemsize, k, slots, task_memory, held_sample):
        refine = in_memory_refine(vectors, vector_col, d, metric, slots)
        passes, corrected = IN_MEMORY_REFINE_PASSES, 0
    else:
        refine = streaming_refine(vectors, vector_col, d, metric)
        passes, corrected = DEFAULT_REFINE_PASSES, DEFAULT_CORRECTED_ITER
    sample = sample_pass(vectors, vector_col, d, seed, sample_size, n)
    return sampled_kmeans(
        sample,
        vectors.rdd.getNumPartitions(),
        refine,
        k,
        metric,
        seed,
        max_iter,
        tol,
        init,
        init_steps,
        oversampling,
        passes if refine_passes is None else refine_passes,
        corrected if corrected_iter is None else corrected_iter,
    )


def cluster_moments_pass(
    vectors: DataFrame, vector_col: str, dimension: int, centroids: np.ndarray, metric: str
) -> list[Moments]:
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
                states = merge_cluster_moments(
                    states, cluster_moments(x, assign(prepare(x, metric), centroids, metric)[0], k)
                )
        return {_cluster_key(c): s.to_bytes() for c, s in enumerate(states) if s.n}

    merged = fold_by_key(vectors.select(vector_col), fold, merge_moments_bytes)
    return [
        Moments.from_bytes(merged[_cluster_key(c)]) if _cluster_key(c) in merged else Moments.empty(d) for c in range(k)
    ]


def _cluster_key(cluster: int) -> bytes:
    return cluster.to_bytes(4, "little")


def spark_fit_cluster_recenter(
    vectors: DataFrame,
    vector_col: str,
    dimension: int,
    k: int,
    n_directions: int = 0,
    metric: str = "euclidean",
    seed: int = 0,
    max_iter: int = DEFAULT_MAX_ITER,
    tol: float = DEFAULT_TOL,
    init_steps: int = DEFAULT_INIT_STEPS,
    task_memory: int = 0,
) -> tuple[ClusterRecenter, list[Moments]]:
    """The Spark counterpart of :func:`anisotropy_core.cluster_recenter.fit_cluster_recenter` (same parameter
    names): k-means of the valid ``vector_col`` (:func:`fit_kmeans`, ``task_memory`` as there), then one pass for
    the k per-cluster :class:`Moments`; returns the fitted :class:`ClusterRecenter` (``n_directions`` — the
    estimator's ``D`` — within-cluster directions removed per cluster) and those states (what
    :func:`~anisotropy_core.cluster_diagnostics.cluster_diagnostics` reads)."""
    metric = check_metric(metric)
    result = fit_kmeans(
        vectors, vector_col, k, metric, seed, max_iter, tol, init_steps, dimension=dimension, task_memory=task_memory
    )
    states = cluster_moments_pass(
        as_vector_array(vectors.select(vector_col), vector_col), vector_col, dimension, result.centroids, metric
    )
    return (ClusterRecenter.from_moments(result.centroids, states, n_directions, metric, kmeans_info(result)), states)


def spark_cluster_diagnostics(
    df: DataFrame, vector_col: str, centroids: np.ndarray, metric: str = "euclidean", dimension: int | None = None
) -> ClusterTable:
    """Per-cluster diagnosis table of ``df`` for the clusters of ``centroids`` (k, d): one pass, then
    :func:`anisotropy_core.cluster_diagnostics.cluster_diagnostics` (see there for the returned dict)."""
    vectors = as_vector_array(df.select(vector_col), vector_col)
    d = dimension if dimension is not None else infer_dimension(vectors, vector_col)
    return cluster_diagnostics(cluster_moments_pass(vectors, vector_col, d, centroids, metric))


@register_model_class(ClusterRecenter.method)
class ClusterRecenterModel(CorrectionModel, _ClusterRecenterParams):
    """Fitted cluster recentering: ``transform(df)`` writes ``outputCol`` (the corrected vector, element type per
    ``outputDtype`` as for every :class:`CorrectionModel`)
    and ``predictionCol`` (int, the cluster the vector landed in; default ``cluster_id``), keeping every other
    column. Saves and loads as the shared artifact (method ``cluster_recenter``) plus pyspark.ml metadata;
    registered for that method, so ``CorrectionModel.from_artifact`` / ``CorrectionModel.load`` of such an
    artifact return this class."""

    @property
    def clusterCenters(self) -> np.ndarray:
        """(k, d) the assignment centroids (unit rows for cosine; read-only)."""
        return read_only(self.fitted(ClusterRecenter).centroids)

    @property
    def clusterMeans(self) -> np.ndarray:
        """(k, d) each cluster's mean of the raw vectors, what is subtracted (read-only)."""
        return read_only(self.fitted(ClusterRecenter).means)

    @property
    def clusterSizes(self) -> np.ndarray:
        """(k,) int64 fitting rows per cluster (read-only)."""
        return read_only(self.fitted(ClusterRecenter).sizes)

    def extra_output_fields(self) -> list[StructField]:
        return [StructField(self.getPredictionCol(), IntegerType(), True)]

    def batch_outputs(self) -> BatchOutputs:
        return cluster_outputs(self.fitted(ClusterRecenter))


def cluster_outputs(transform: ClusterRecenter) -> BatchOutputs:
    """Batch function of :meth:`ClusterRecenterModel.batch_outputs`: ((B, d) raw vectors, dtype) →
    ((B, d) corrected of dtype, [(B,) int32 cluster ids])."""

    def run(x: np.ndarray, dtype: type) -> tuple[np.ndarray, list[pa.Array]]:
        corrected, ids = transform.apply_with_clusters(x, dtype)
        return corrected, [pa.array(ids.astype(np.int32))]

    return run


@register_estimator(ClusterRecenter.method)
class ClusterRecenterEstimator(CorrectionEstimator, _ClusterRecenterParams):
    """Cluster-wise recentering (seed chapter 7): k-means with modest ``k``, then one mean — and optionally
    the top ``D`` within-cluster directions — per cluster. ``fit`` returns a :class:`ClusterRecenterModel`.
    Params: see :class:`~anisotropy_core.methods.ClusterRecenterSettings`.

    Examples
    --------
    >>> df = spark.createDataFrame([(i, [1 + 10.0 * (i % 2) + (i % 5) / 10, 1 + (i % 3) / 10]) for i in range(40)],
    ...                            "id long, vector array<double>")
    >>> model = ClusterRecenterEstimator(k=2, seed=1, outputCol="recentred").fit(df)
    >>> sorted(model.clusterSizes.tolist()), model.clusterCenters.shape
    ([20, 20], (2, 2))
    >>> model.transform(df).columns
    ['id', 'vector', 'recentred', 'cluster_id']
    >>> model.save(temp_path + "/clusters")
    >>> ClusterRecenterModel.load(temp_path + "/clusters").getK()
    2
    """

    model_class = ClusterRecenterModel
    moment_based = False
    _input_kwargs: dict[str, Any]  # set by pyspark's @keyword_only

    def _fit_transform(self, vectors: DataFrame, col: str, d: int) -> tuple[ClusterRecenter, int]:
        transform, _ = spark_fit_cluster_recenter(
            vectors,
            col,
            d,
            self.getK(),
            n_directions=self.getD(),
            metric=self.getDistanceMeasure(),
            seed=self.getSeed(),
            max_iter=self.getMaxIter(),
            tol=self.getTol(),
            init_steps=self.getInitSteps(),
            task_memory=self.getTaskMemory(),
        )
        return transform, int(transform.sizes.sum())
