"""Spark Estimators/Model vs the numpy core, persistence, errors and Pipeline use."""

import json

import numpy as np
import pytest
from chispa import assert_approx_df_equality
from pyspark.ml import Pipeline, PipelineModel
from pyspark.sql import functions as F

from anisotropy_core import synthetic
from anisotropy_core.artifact import ArtifactError, load_artifact
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import APPLY_BLOCK_ROWS, fit_abtt, fit_center, fit_whitening
from anisotropy_spark.estimators import (
    AbttPcaAbttEstimator,
    AllButTheTopEstimator,
    CenterEstimator,
    CorrectionModel,
    FlowEstimator,
    WhiteningEstimator,
)
from anisotropy_spark.kmeans import ClusterRecenterEstimator
from anisotropy_spark.moments import corpus_moments

N, D = 400, 12


@pytest.fixture(scope="module")
def data():
    return synthetic.cone(N, D, offset=4.0, alpha=1.0, seed=11)


@pytest.fixture(scope="module")
def frame(spark, data):
    rows = [(i, f"doc{i}", [float(v) for v in row]) for i, row in enumerate(data)]
    return spark.createDataFrame(rows, "id long, title string, vector array<double>").repartition(3).cache()


def long_format(df, col):
    """(id, pos, value) rows of an array column, so chispa compares every coordinate approximately."""
    return df.select("id", F.posexplode(col).alias("pos", "value"))


def expected_frame(spark, ids, matrix):
    rows = [(int(i), p, float(v)) for i, row in zip(ids, matrix) for p, v in enumerate(row)]
    return spark.createDataFrame(rows, "id long, pos int, value double")


@pytest.mark.parametrize(
    "estimator,numpy_fit",
    [
        (CenterEstimator(), fit_center),
        (AllButTheTopEstimator(D=2), lambda s: fit_abtt(s, D=2)),
        (WhiteningEstimator(k=5, shrinkage=0.05), lambda s: fit_whitening(s, k=5, shrinkage=0.05)),
    ],
)
def test_spark_matches_numpy(spark, data, frame, estimator, numpy_fit):
    model = estimator.fit(frame)
    reference = numpy_fit(Moments.of_batch(data))
    for name, array in reference.arrays().items():
        got = model.transform_.arrays()[name]
        if name in ("components", "matrix"):  # eigenvectors only up to sign: compare per column/row
            axis = 1 if name == "components" else 0
            signs = np.sign(np.sum(got * array, axis=axis, keepdims=True))
            got = got * signs
        assert np.allclose(got, array, rtol=1e-9, atol=1e-9), name
    out = model.transform(frame)
    assert out.columns == ["id", "title", "vector", "corrected"]
    actual = long_format(out, "corrected")
    expected = expected_frame(spark, np.arange(N), model.transform_.apply(data))  # Spark path vs numpy
    assert_approx_df_equality(actual, expected, precision=1e-9, ignore_row_order=True, ignore_nullable=True)
    assert np.allclose(model.transform_.apply(data), reference.apply(data), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "estimator",
    [
        CenterEstimator(),
        AllButTheTopEstimator(D=2),
        WhiteningEstimator(k=5, shrinkage=0.05),
        AbttPcaAbttEstimator(D=1, k=6),
    ],
)
def test_fit_moments_is_fit_without_the_pass(frame, estimator):
    """The nightly fits from its diagnosis's moments: the same transform, array for array, and the same Params."""
    by_rows = estimator.copy().setOutputCol("out").fit(frame)
    by_moments = estimator.copy().setOutputCol("out").fitMoments(corpus_moments(frame, "vector", D))
    assert by_moments.transform_.params() == by_rows.transform_.params()
    for name, array in by_rows.transform_.arrays().items():
        assert np.array_equal(by_moments.transform_.arrays()[name], array), name
    assert (by_moments.n, by_moments.getOutputCol(), type(by_moments)) == (by_rows.n, "out", type(by_rows))
    assert by_moments.transform_version == by_rows.transform_version


def test_fit_moments_refuses_what_moments_do_not_determine(data):
    with pytest.raises(ValueError, match="ClusterRecenterEstimator does not fit from moments"):
        ClusterRecenterEstimator(k=2).fitMoments(Moments.of_batch(data))
    with pytest.raises(ValueError, match="FlowEstimator does not fit from moments"):
        FlowEstimator().fitMoments(Moments.of_batch(data))
    with pytest.raises(ValueError, match=r"needs n >= d \(got n=5, d=12\)"):
        AllButTheTopEstimator(D=1).fitMoments(Moments.of_batch(data[:5]))


def test_fit_with_moments_takes_the_moments_only_where_they_determine_the_fit(frame, data):
    """``fitWithMoments``: the moments when ``canFitMoments``, else the rows (no moments, a rows-based method, or
    n < d) — the model ``fit`` gives either way."""
    state = corpus_moments(frame, "vector", D)
    abtt = AllButTheTopEstimator(D=2)
    assert np.array_equal(
        abtt.fitWithMoments(frame, state).transform_.arrays()["components"],
        abtt.fitMoments(state).transform_.arrays()["components"],
    )
    assert abtt.fitWithMoments(frame, None).transform_version == abtt.fit(frame).transform_version
    few = frame.limit(5)
    assert abtt.fitWithMoments(few, corpus_moments(few, "vector", D)).n == 5  # n < d: the Gram route, no raise
    recenter = ClusterRecenterEstimator(k=2, seed=1)
    assert recenter.fitWithMoments(frame, state).transform_version == recenter.fit(frame).transform_version


def test_abtt_auto_d_reports_rule(frame):
    """Issue 43: no D → the textbook's starting point max(1, round(d/100)), recorded unverified; maxD caps it."""
    model = AllButTheTopEstimator(maxD=3).fit(frame)
    assert model.transform_.d_rule == "rule_of_thumb_d/100 (unverified)"
    assert model.transform_.D == max(1, round(D / 100)) == 1 and model.getD() == 1
    assert AllButTheTopEstimator(maxD=0).fit(frame).transform_.D == 0


def test_save_load_roundtrip_and_tamper(spark, frame, tmp_path):
    model = WhiteningEstimator(k=4, outputCol="white", normalize=True).fit(frame)
    path = str(tmp_path / "model")
    model.save(path)
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    assert manifest["method"] == "whitening" and manifest["params"]["k"] == 4 and manifest["n"] == N
    assert manifest["transform_version"] == model.transform_version
    loaded = CorrectionModel.load(path)
    assert loaded.getOutputCol() == "white" and loaded.uid == model.uid
    a = model.transform(frame).select("id", "white").orderBy("id").collect()
    b = loaded.transform(frame).select("id", "white").orderBy("id").collect()
    assert a == b
    # plain numpy (query side) gives the same numbers
    query = np.array(a[0]["white"])
    raw = np.array(frame.where("id = 0").first()["vector"])
    assert np.allclose(load_artifact(path).transform.apply(raw), query, atol=1e-12)
    arrays = dict(np.load(tmp_path / "model" / "arrays.npz"))
    arrays["matrix"][0, 0] += 1e-6
    np.savez(tmp_path / "model" / "arrays.npz", **arrays)
    with pytest.raises(ArtifactError, match="hash mismatch"):
        CorrectionModel.load(path)


def test_dimension_mismatch_is_refused(spark, frame):
    model = CenterEstimator().fit(frame)
    other = spark.createDataFrame([(1, [1.0, 2.0, 3.0])], "id long, vector array<double>")
    planned = model.transform(other)  # lazy: fails when an action runs
    with pytest.raises(Exception, match="has length 3, expected 12"):
        planned.collect()


def test_non_finite_row_is_named(spark, frame):
    model = CenterEstimator().fit(frame)
    bad = spark.createDataFrame(
        [(7, "x", [float("nan")] + [1.0] * (D - 1))], "id long, title string, vector array<double>"
    )
    with pytest.raises(Exception, match=r"non-finite input value at row 0, column 0.*'id': 7"):
        model.transform(bad).collect()


def test_pipeline_fit_transform_save_load(spark, frame, tmp_path):
    pipeline = Pipeline(
        stages=[
            AllButTheTopEstimator(D=1, outputCol="abtt"),
            WhiteningEstimator(inputCol="abtt", outputCol="white", k=6),
        ]
    )
    fitted = pipeline.fit(frame)
    out = fitted.transform(frame)
    assert out.columns == ["id", "title", "vector", "abtt", "white"]
    z = np.array([r["white"] for r in out.select("white").collect()])
    assert np.allclose(np.cov(z.T, bias=True), np.eye(6), atol=1e-9)
    fitted.write().overwrite().save(str(tmp_path / "pm"))
    reloaded = PipelineModel.load(str(tmp_path / "pm"))
    assert [type(s).__name__ for s in reloaded.stages] == ["AllButTheTopModel", "WhiteningModel"]
    assert_approx_df_equality(
        long_format(reloaded.transform(frame), "white"),
        long_format(out, "white"),
        precision=1e-12,
        ignore_row_order=True,
        ignore_nullable=True,
    )
    pipeline.write().overwrite().save(str(tmp_path / "p"))
    stages = Pipeline.load(str(tmp_path / "p")).getStages()
    assert stages[0].getOrDefault("D") == 1 and stages[1].getOrDefault("k") == 6


def test_params_by_pyspark_conventions(frame):
    assert AllButTheTopEstimator(inputCol="v").setD(3).getD() == 3
    abtt = AllButTheTopEstimator().setParams(inputCol="vector", D=2, maxD=4)
    assert (abtt.getInputCol(), abtt.getD(), abtt.getMaxD(), abtt.getOutputCol()) == ("vector", 2, 4, "corrected")
    white = WhiteningEstimator().setK(5).setShrinkage(0.1).setZca(True).setNormalize(True).setEps(1e-9)
    assert (white.getK(), white.getShrinkage(), white.getZca(), white.getNormalize(), white.getEps()) == (
        5,
        0.1,
        True,
        True,
        1e-9,
    )
    model = abtt.fit(frame)
    assert type(model).__name__ == "AllButTheTopModel" and model.getD() == 2 and model.getMaxD() == 4
    assert model.setParams(outputCol="fixed").getOutputCol() == "fixed"
    reloaded = CorrectionModel.from_artifact(load_artifact_of(model))
    assert reloaded.getD() == 2  # the fitted D, read back from the artifact


def load_artifact_of(model):
    from anisotropy_core.artifact import Artifact, build_manifest

    return Artifact(model.transform_, build_manifest(model.transform_, model.n))


def test_estimator_for_builds_registered_methods_from_config_keys():
    from anisotropy_spark.estimators import estimator_for, registered_methods

    assert {"center", "abtt", "whitening", "cluster_recenter"} <= set(registered_methods())
    abtt = estimator_for("abtt", {"D": 3, "max_D": None}, "v")
    assert isinstance(abtt, AllButTheTopEstimator) and (abtt.getInputCol(), abtt.getD(), abtt.getMaxD()) == (
        "v",
        3,
        None,
    )
    cluster = estimator_for("cluster_recenter", {"k": 2, "D": 1, "distance_measure": "cosine", "seed": 5})
    assert (cluster.getK(), cluster.getD(), cluster.getDistanceMeasure(), cluster.getSeed()) == (2, 1, "cosine", 5)
    assert cluster.getPredictionCol() == "cluster_id"
    assert cluster.getTaskMemory() == 0
    assert estimator_for("cluster_recenter", {"task_memory": 1 << 30}).getTaskMemory() == 1 << 30
    with pytest.raises(ValueError, match="unknown correction method 'nope'"):
        estimator_for("nope", {})
    with pytest.raises(ValueError, match="abtt: unknown parameter 'k'"):
        estimator_for("abtt", {"k": 2})


def test_transform_builds_a_plan_and_starts_no_job(spark, frame):
    models = [CenterEstimator().fit(frame), WhiteningEstimator(k=3).fit(frame)]
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    planned = [m.transform(frame) for m in models]
    assert set(tracker.getJobIdsForGroup(None)) == before  # no Spark job yet
    assert all(p.count() == N for p in planned)
    assert set(tracker.getJobIdsForGroup(None)) != before  # the action ran them


def test_whitening_eigenvectors_are_sign_canonical(data):
    from anisotropy_core.diagnostics import canonical_sign

    white = fit_whitening(Moments.of_batch(data), k=D)
    u = white.matrix * np.sqrt(np.maximum(white.eigenvalues[:D], white.eps * white.eigenvalues[0]))
    assert all(np.array_equal(canonical_sign(u[:, j]), u[:, j]) for j in range(D))


@pytest.mark.parametrize("estimator", [AllButTheTopEstimator(D=2), ClusterRecenterEstimator(k=3, D=1)])
def test_float32_batches_spanning_apply_blocks_equal_the_numpy_apply(spark, estimator):
    """Issue 9: the workers transform each Arrow batch in blocks (float64 inside, float32 out, no float64 copy of
    the batch); a batch of several blocks gives exactly the numpy core's ``apply(x, float32)`` for every id."""
    x = synthetic.cone(2 * APPLY_BLOCK_ROWS + 300, D, offset=4.0, alpha=1.0, seed=5).astype(np.float32)
    table = spark.createDataFrame([(i, row.tolist()) for i, row in enumerate(x)], "id long, vector array<float>")
    model = estimator.copy().setInputCol("vector").setOutputCol("out").fit(table.coalesce(1))
    out = model.transform(table.coalesce(1))
    assert out.schema["out"].dataType.elementType.simpleString() == "float"
    assert out.schema["out"].dataType.containsNull is False  # whole vectors: no null elements declared
    got = dict((r["id"], r["out"]) for r in out.select("id", "out").collect())
    want = model.transform_.apply(x, np.float32)
    np.testing.assert_array_equal(np.array([got[i] for i in range(len(x))], dtype=np.float32), want)
