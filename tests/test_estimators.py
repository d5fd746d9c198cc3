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
from anisotropy_core.transforms import fit_abtt, fit_center, fit_whitening
from anisotropy_spark.estimators import (AllButTheTopEstimator, CenterEstimator, CorrectionModel,
                                         WhiteningEstimator)

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


@pytest.mark.parametrize("estimator,numpy_fit", [
    (CenterEstimator(), fit_center),
    (AllButTheTopEstimator(D=2), lambda s: fit_abtt(s, D=2)),
    (WhiteningEstimator(k=5, shrinkage=0.05), lambda s: fit_whitening(s, k=5, shrinkage=0.05)),
])
def test_spark_matches_numpy(spark, data, frame, estimator, numpy_fit):
    model = estimator.fit(frame)
    reference = numpy_fit(Moments.of_batch(data))
    for name, array in reference.arrays().items():
        got = model.transform_.arrays()[name]
        if name in ("components", "matrix"):       # eigenvectors only up to sign: compare per column/row
            axis = 1 if name == "components" else 0
            signs = np.sign(np.sum(got * array, axis=axis, keepdims=True))
            got = got * signs
        assert np.allclose(got, array, rtol=1e-9, atol=1e-9), name
    out = model.transform(frame)
    assert out.columns == ["id", "title", "vector", "corrected"]
    actual = long_format(out, "corrected")
    expected = expected_frame(spark, np.arange(N), model.transform_.apply(data))   # Spark path vs numpy
    assert_approx_df_equality(actual, expected, precision=1e-9, ignore_row_order=True, ignore_nullable=True)
    assert np.allclose(model.transform_.apply(data), reference.apply(data), rtol=1e-9, atol=1e-9)


def test_abtt_auto_d_reports_rule(frame):
    model = AllButTheTopEstimator(maxD=3).fit(frame)
    assert model.transform_.d_rule in ("marchenko_pastur", "marchenko_pastur_capped")
    assert 0 <= model.transform_.D <= 3


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
    with pytest.raises(ArtifactError, match="dimension 3 but the center transform was fitted on dimension 12"):
        model.transform(other)


def test_non_finite_row_is_named(spark, frame):
    model = CenterEstimator().fit(frame)
    bad = spark.createDataFrame([(7, "x", [float("nan")] + [1.0] * (D - 1))],
                                "id long, title string, vector array<double>")
    with pytest.raises(Exception, match=r"non-finite input value at row 0, column 0.*'id': 7"):
        model.transform(bad).collect()


def test_pipeline_fit_transform_save_load(spark, frame, tmp_path):
    pipeline = Pipeline(stages=[AllButTheTopEstimator(D=1, outputCol="abtt"),
                                WhiteningEstimator(inputCol="abtt", outputCol="white", k=6)])
    fitted = pipeline.fit(frame)
    out = fitted.transform(frame)
    assert out.columns == ["id", "title", "vector", "abtt", "white"]
    z = np.array([r["white"] for r in out.select("white").collect()])
    assert np.allclose(np.cov(z.T, bias=True), np.eye(6), atol=1e-9)
    fitted.write().overwrite().save(str(tmp_path / "pm"))
    reloaded = PipelineModel.load(str(tmp_path / "pm"))
    assert [type(s).__name__ for s in reloaded.stages] == ["CorrectionModel", "CorrectionModel"]
    assert_approx_df_equality(long_format(reloaded.transform(frame), "white"), long_format(out, "white"),
                              precision=1e-12, ignore_row_order=True, ignore_nullable=True)
    pipeline.write().overwrite().save(str(tmp_path / "p"))
    stages = Pipeline.load(str(tmp_path / "p")).getStages()
    assert stages[0].getOrDefault("D") == 1 and stages[1].getOrDefault("k") == 6
