"""Distributed k-means and ClusterRecenter on Spark against the numpy reference and pyspark.ml KMeans."""

import numpy as np
import pytest
from pyspark.ml.clustering import KMeans
from pyspark.ml.functions import array_to_vector
from pyspark.sql import functions as F

from anisotropy_core.artifact import Artifact, ArtifactError, build_manifest, load_artifact
from anisotropy_core.cluster_diagnostics import cluster_diagnostics, cluster_moments
from anisotropy_core.cluster_recenter import fit_cluster_recenter
from anisotropy_core.kmeans import kmeans, sample_partitions
from anisotropy_core.moments import Moments
from anisotropy_core.row_keys import row_keys, split_row_ids
from anisotropy_core.synthetic import mixture
from anisotropy_core.transforms import fit_center
from anisotropy_spark.estimators import CorrectionModel, model_class_for
from anisotropy_spark.kmeans import (
    ClusterRecenterEstimator,
    ClusterRecenterModel,
    cluster_moments_pass,
    fit_kmeans,
    fits_in_memory,
    partition_states,
    sample_key,
    sample_pass,
    spark_cluster_diagnostics,
    task_slots,
)

PARTITIONS = 2
TASK_MEMORY = 1 << 30  # fit_kmeans(task_memory=…): refine in a barrier stage holding the rows


def frame(spark, X, labels=None):
    """DataFrame ``id long, vector array<double>[, label int]`` of X (n, d) in PARTITIONS partitions."""
    if labels is None:
        return spark.createDataFrame(
            [(i, v.tolist()) for i, v in enumerate(X)], "id long, vector array<double>"
        ).coalesce(PARTITIONS)
    return spark.createDataFrame(
        [(i, v.tolist(), int(c)) for i, (v, c) in enumerate(zip(X, labels))], "id long, vector array<double>, label int"
    ).coalesce(PARTITIONS)


def partitions(df):
    """The (n_p, d) numpy matrices of ``df``'s vector column, partition by partition, in row order."""
    return [
        np.array([row["vector"] for row in part], dtype=np.float64) for part in df.select("vector").rdd.glom().collect()
    ]


@pytest.mark.parametrize("metric, use_init, max_iter", [("euclidean", False, 50), ("cosine", True, 4)])
def test_spark_kmeans_equals_numpy_reference(spark, metric, use_init, max_iter):
    # euclidean: k-means|| start, runs to convergence (5 passes); cosine: given start, stopped by max_iter
    # (it would converge after 7), so both ways a fit ends are compared with the reference
    X, _ = mixture(2000, 8, (0.4, 0.3, 0.2, 0.1), separation=6.0, spread=0.6, seed=2)
    df = frame(spark, X).cache()
    parts = partitions(df)
    assert len(parts) == PARTITIONS and sum(len(p) for p in parts) == len(X)
    init = X[[0, 1, 2, 3]] if use_init else None
    ours = fit_kmeans(df, "vector", 4, metric, seed=5, init=init, max_iter=max_iter)
    reference = kmeans(parts, 4, metric, seed=5, init=init, max_iter=max_iter)
    assert ours.n_iter == reference.n_iter and ours.converged == reference.converged == (max_iter == 50)
    assert np.array_equal(ours.counts, reference.counts)
    assert np.allclose(ours.centroids, reference.centroids, rtol=0, atol=1e-12)
    assert ours.inertia == pytest.approx(reference.inertia, rel=1e-12)
    df.unpersist()


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_inertia_within_one_percent_of_spark_ml(spark, metric):
    # clusters separated point-wise (within-cluster distances ≈ 0.3·√32 = 1.7 < separation 5), so both
    # implementations can reach the optimum from their k-means|| starts and the costs are comparable
    X, _ = mixture(4000, 16, (0.25, 0.2, 0.2, 0.15, 0.1, 0.1), separation=5.0, spread=0.3, seed=3)
    df = frame(spark, X).cache()
    ours = fit_kmeans(df, "vector", 6, metric, seed=1, max_iter=40, tol=1e-6, init_steps=2)
    engine = KMeans(
        k=6,
        seed=1,
        maxIter=40,
        tol=1e-6,
        initMode="k-means||",
        initSteps=2,
        distanceMeasure=metric,
        featuresCol="features",
    )
    model = engine.fit(df.select(array_to_vector("vector").alias("features")))
    theirs = model.summary.trainingCost
    assert ours.inertia == pytest.approx(theirs, rel=0.01)
    df.unpersist()


def test_cluster_recenter_fit_transform_save_load(spark, tmp_path):
    X, labels = mixture(1200, 6, (0.8, 0.2), separation=6.0, spread=0.5, seed=4)  # no overlap
    df = frame(spark, X, labels)
    model = ClusterRecenterEstimator(k=2, D=1, seed=3, predictionCol="cluster").fit(df)
    assert isinstance(model, ClusterRecenterModel)
    transform = model.transform_
    assert transform.method == "cluster_recenter" and transform.k == 2 and transform.n_directions == 1
    assert sorted(transform.sizes.tolist()) == sorted(np.bincount(labels).tolist())

    out = model.transform(df).orderBy("id").collect()
    assert out[0].asDict().keys() == {"id", "vector", "label", "corrected", "cluster"}
    corrected = np.array([r["corrected"] for r in out])
    ids = np.array([r["cluster"] for r in out])
    expected, expected_ids = transform.apply_with_clusters(X)
    assert np.array_equal(ids, expected_ids)
    assert np.allclose(corrected, expected, rtol=0, atol=1e-12)
    assert np.array_equal(ids == ids[0], labels == labels[0])  # clusters are the populations

    path = str(tmp_path / "cluster_recenter")
    model.save(path)
    loaded = ClusterRecenterModel.load(path)
    assert loaded.getOrDefault(loaded.predictionCol) == "cluster" and loaded.getOutputCol() == "corrected"
    assert loaded.transform_version == model.transform_version
    again = loaded.transform(df).orderBy("id").collect()
    assert np.array_equal(np.array([r["corrected"] for r in again]), corrected)
    assert np.array_equal(np.array([r["cluster"] for r in again]), ids)
    served = load_artifact(path, expected_dimension=6).transform  # plain numpy, no Spark
    assert np.allclose(served.apply(X), expected, rtol=0, atol=1e-12)

    # the generic entry points (jobs/apply.py, jobs/nightly.py) pick the registered model class
    generic = CorrectionModel.load(path)
    assert type(generic) is ClusterRecenterModel and generic.getPredictionCol() == "cluster"
    from_artifact = CorrectionModel.from_artifact(load_artifact(path), "vector", "fixed")
    assert type(from_artifact) is ClusterRecenterModel
    rows = from_artifact.transform(df).orderBy("id").collect()
    assert rows[0].asDict().keys() == {"id", "vector", "label", "fixed", "cluster_id"}
    assert np.array_equal(np.array([r["cluster_id"] for r in rows]), ids)
    assert np.array_equal(np.array([r["fixed"] for r in rows]), corrected)


def test_estimator_hands_its_task_memory_to_the_kmeans_fit(spark, monkeypatch):
    import anisotropy_spark.kmeans as kmeans_module

    seen = {}
    real_fit = kmeans_module.fit_kmeans

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(kmeans_module, "fit_kmeans", spy)
    assert ClusterRecenterEstimator().getTaskMemory() == 0  # streaming by default
    X, _ = mixture(600, 4, (0.5, 0.5), separation=6.0, seed=8)
    model = ClusterRecenterEstimator(k=2, seed=3).setTaskMemory(TASK_MEMORY).fit(frame(spark, X))
    assert seen["task_memory"] == TASK_MEMORY
    assert model.transform_.fit_info["refinement"] == "local"  # 600 rows: the sample is the table, fitted exactly


def test_model_registry():
    transform = fit_center(Moments.of_batch(np.eye(3)))
    center = Artifact(transform, build_manifest(transform, 3))
    assert model_class_for("cluster_recenter") is ClusterRecenterModel
    assert model_class_for("center") is CorrectionModel
    assert type(CorrectionModel.from_artifact(center)) is CorrectionModel
    with pytest.raises(ArtifactError, match="center artifact loads as CorrectionModel, not as ClusterRecenterModel"):
        ClusterRecenterModel.from_artifact(center)


def test_cluster_recenter_model_set_params_takes_the_params_of_every_model():
    X, _ = mixture(200, 4, (0.5, 0.5), separation=6.0, seed=8)
    transform, _ = fit_cluster_recenter(X, 2, seed=0)
    model = ClusterRecenterModel.from_artifact(Artifact(transform, build_manifest(transform, X.shape[0])))
    model.setParams(outputCol="fixed", outputDtype="float32", predictionCol="cluster")
    assert (model.getOutputCol(), model.getOutputDtype(), model.getPredictionCol()) == ("fixed", "float32", "cluster")
    with pytest.raises(ValueError, match="outputDtype must be one of"):
        model.setParams(outputDtype="int8")


def test_spark_cluster_diagnostics_equals_numpy(spark):
    X, labels = mixture(1000, 5, (0.7, 0.3), separation=6.0, seed=6)
    centroids = np.stack([X[labels == c].mean(axis=0) for c in range(2)])
    table = spark_cluster_diagnostics(frame(spark, X), "vector", centroids)
    ids = np.argmin(((X[:, None, :] - centroids) ** 2).sum(axis=2), axis=1)
    reference = cluster_diagnostics(cluster_moments(X, ids, 2))
    assert table["locally_isotropic"] == reference["locally_isotropic"]
    for row, ref in zip(table["clusters"] + [table["global"]], reference["clusters"] + [reference["global"]]):
        assert row.keys() == ref.keys()
        for key, value in ref.items():
            assert row[key] == pytest.approx(value, rel=1e-9), key


def test_cluster_moments_pass_returns_every_cluster_including_an_unreached_one(spark):
    # the states leave the tasks keyed by cluster; a centroid no row is nearest to comes back empty (n = 0),
    # and the reached clusters equal the numpy moments
    X, labels = mixture(600, 4, (0.5, 0.5), separation=6.0, seed=8)
    centroids = np.stack([X[labels == 0].mean(axis=0), X[labels == 1].mean(axis=0), np.full(4, 1e6)])
    states = cluster_moments_pass(frame(spark, X), "vector", 4, centroids, "euclidean")
    ids = np.argmin(((X[:, None, :] - centroids[:2]) ** 2).sum(axis=2), axis=1)
    reference = cluster_moments(X, ids, 2)
    assert [s.n for s in states] == [r.n for r in reference] + [0]
    for got, want in zip(states, reference):
        np.testing.assert_allclose(got.covariance(), want.covariance(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got.mean, want.mean, rtol=1e-12)


def float32_frame(spark, X):
    """DataFrame ``vector array<float>`` of X (n, d) rounded to float32, in PARTITIONS partitions."""
    return spark.createDataFrame([(v.tolist(),) for v in X.astype(np.float32)], "vector array<float>").coalesce(
        PARTITIONS
    )


@pytest.mark.parametrize(
    "metric, task_memory, refinement, corrected_iter",
    [
        ("euclidean", TASK_MEMORY, "in_memory", 0),
        ("cosine", TASK_MEMORY, "in_memory", 2),
        ("euclidean", 0, "streaming", None),
        ("cosine", 0, "streaming", None),
    ],
)
def test_sampled_kmeans_on_float32_equals_numpy_reference(spark, metric, task_memory, refinement, corrected_iter):
    # 3000 rows > sample_size 700: sample pass + driver fit (8 Lloyd updates) + 2 full refinement passes, on
    # float32 vectors read without an array<double> copy, the passes either in a barrier stage holding the rows
    # (repartitioned: the same rows merged in another grouping) or re-reading them; the numpy reference gets the
    # same float32 partitions. Between the passes: the defaults' bias-corrected sample updates (streaming: both
    # sides' default, DEFAULT_CORRECTED_ITER), none, or 2 run inside the barrier tasks
    X, _ = mixture(3000, 8, (0.4, 0.3, 0.2, 0.1), separation=6.0, spread=0.6, seed=7)
    df = float32_frame(spark, X).cache()
    parts = [p.astype(np.float32) for p in partitions(df)]
    options = dict(seed=3, max_iter=8, tol=0.0, sample_size=700, refine_passes=2)
    if corrected_iter is not None:
        options["corrected_iter"] = corrected_iter
    ours = fit_kmeans(df, "vector", 4, metric, task_memory=task_memory, **options)
    reference = kmeans(parts, 4, metric, **options)
    assert ours.refinement == refinement and reference.refinement == "local"
    assert len(ours.history) == len(reference.history) == 2 and ours.n_iter == reference.n_iter <= 8 + 2
    assert np.array_equal(ours.counts, reference.counts) and ours.counts.sum() == len(X)  # whole table
    assert np.allclose(ours.centroids, reference.centroids, rtol=0, atol=1e-12)
    assert ours.inertia == pytest.approx(reference.inertia, rel=1e-12)
    # the inertia is that of the returned centroids over every row (float64 recomputation)
    x = np.concatenate(parts).astype(np.float64)
    if metric == "cosine":
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        exact = (1.0 - x @ ours.centroids.T).min(axis=1).sum()
    else:
        exact = ((x[:, None, :] - ours.centroids[None]) ** 2).sum(axis=2).min(axis=1).sum()
    assert ours.inertia == pytest.approx(exact, rel=1e-6)
    df.unpersist()


@pytest.mark.parametrize("task_memory", [TASK_MEMORY, 0])
def test_sampled_kmeans_is_deterministic_for_a_seed_and_partitioning(spark, task_memory):
    X, _ = mixture(2500, 6, (0.5, 0.3, 0.2), separation=5.0, seed=8)
    df = float32_frame(spark, X)
    first, second = (
        fit_kmeans(df, "vector", 3, seed=4, max_iter=6, sample_size=500, task_memory=task_memory) for _ in range(2)
    )
    assert np.array_equal(first.centroids, second.centroids) and first.history == second.history
    other_seed = fit_kmeans(df, "vector", 3, seed=5, max_iter=6, sample_size=500, task_memory=task_memory)
    assert not np.array_equal(first.centroids, other_seed.centroids)


def test_in_memory_refinement_runs_only_when_asked_and_each_task_share_fits(spark):
    # the test session sets spark.default.parallelism 4, but a barrier stage may only use the 2 task slots
    assert task_slots(spark.sparkContext) == 2
    # 1M × 384 float32 on 2 slots: 768 MiB per task (fits 1 GiB); 2M rows: 1.5 GiB (streams)
    assert fits_in_memory(1_000_000, 384, 4, 64, 2, TASK_MEMORY)
    assert not fits_in_memory(2_000_000, 384, 4, 64, 2, TASK_MEMORY)
    assert not fits_in_memory(1_000_000, 384, 8, 64, 2, TASK_MEMORY)  # array<double>: twice the bytes
    assert not fits_in_memory(1000, 768, 4, 4096, 4, TASK_MEMORY)  # 4 tasks' states exceed one allGather
    X, _ = mixture(2500, 6, (0.5, 0.3, 0.2), separation=5.0, seed=8)
    df = float32_frame(spark, X)
    share = (len(X) + 1) // 2 * 6 * 4
    assert not fits_in_memory(len(X), 6, 4, 3, 2, 0)
    assert fit_kmeans(df, "vector", 3, max_iter=3, sample_size=500).refinement == "streaming"  # the default
    assert fit_kmeans(df, "vector", 3, max_iter=3, sample_size=500, task_memory=share).refinement == "in_memory"
    assert fit_kmeans(df, "vector", 3, max_iter=3, sample_size=500, task_memory=share - 1).refinement == "streaming"
    # an explicit corrected step makes every task also hold the sample (500 rows here): counted
    assert not fits_in_memory(1_300_000, 384, 4, 64, 2, TASK_MEMORY, sample_rows=131_072)
    assert fits_in_memory(1_300_000, 384, 4, 64, 2, TASK_MEMORY)
    held = 500 * 6 * 4
    assert (
        fit_kmeans(df, "vector", 3, max_iter=3, sample_size=500, task_memory=share, corrected_iter=2).refinement
        == "streaming"
    )
    assert (
        fit_kmeans(df, "vector", 3, max_iter=3, sample_size=500, task_memory=share + held, corrected_iter=2).refinement
        == "in_memory"
    )


def test_sample_pass_is_the_exact_uniform_sample_even_when_the_bound_misses(spark):
    X, _ = mixture(2000, 4, (0.5, 0.5), separation=4.0, seed=9)
    df = float32_frame(spark, X).cache()
    parts = [p.astype(np.float32) for p in partitions(df)]
    reference = sample_partitions(parts, seed=2, size=300)
    for n in (len(X), 10**9):  # the true count, and a wrong one whose key bound keeps too few rows
        sample = sample_pass(df, "vector", 4, seed=2, size=300, n=n)
        assert sample.complete and sample.rows.dtype == np.float32 and sample.n == len(X)  # a miss recounts
        assert np.array_equal(sample.keys, reference.keys) and np.array_equal(sample.rows, reference.rows)
        assert np.array_equal(sample.origin, reference.origin)
    # a vector column named like one of the pass's own columns draws the same sample
    renamed = sample_pass(df.withColumnRenamed("vector", "key"), "key", 4, seed=2, size=300)
    assert np.array_equal(renamed.keys, reference.keys) and np.array_equal(renamed.rows, reference.rows)
    df.unpersist()


@pytest.mark.parametrize("seed", [0, 2, -7, 2**40])
def test_sample_keys_drawn_on_the_jvm_equal_the_numpy_keys(spark, seed):
    # rows in 3 partitions: the keys hash the partition index (upper bits of the id) and the row index alike
    ids = spark.range(0, 3000, numPartitions=3).select(F.monotonically_increasing_id().alias("id"))
    table = ids.select("id", sample_key(seed, F.col("id")).alias("key")).toArrow()
    row_id = table.column("id").to_numpy()
    assert set(split_row_ids(row_id)[:, 0]) == {0, 1, 2}
    assert np.array_equal(table.column("key").to_numpy(), row_keys(seed, row_id))


def test_streaming_passes_over_more_partitions_than_slots_equal_the_numpy_reference(spark):
    # 6 input partitions: the sample keys come from 6 partitions' row ids, and each full pass folds them in
    # the 4 coalesced tasks of the test session (spark.default.parallelism 4); the reference merges the 6
    # partitions one by one, so the two agree up to rounding
    X, _ = mixture(3000, 8, (0.4, 0.3, 0.2, 0.1), separation=6.0, spread=0.6, seed=11)
    df = spark.createDataFrame([(v.tolist(),) for v in X.astype(np.float32)], "vector array<float>").repartition(6)
    df = df.cache()
    parts = [p.astype(np.float32) for p in partitions(df)]
    assert len(parts) == 6 and partition_states(df, "vector", 8, lambda batches: 0).getNumPartitions() == 4
    options = dict(seed=2, max_iter=6, tol=0.0, sample_size=900, refine_passes=2)
    ours, reference = fit_kmeans(df, "vector", 4, **options), kmeans(parts, 4, **options)
    assert ours.refinement == "streaming" and len(ours.history) == 2
    assert np.array_equal(ours.counts, reference.counts) and ours.counts.sum() == len(X)
    assert np.allclose(ours.centroids, reference.centroids, rtol=0, atol=1e-12)
    assert ours.inertia == pytest.approx(reference.inertia, rel=1e-12)
    df.unpersist()
