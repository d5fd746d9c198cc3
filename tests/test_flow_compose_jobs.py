"""flow and abtt_pca_abtt through the fit/apply CLIs on Delta; the n < d estimator route; alignment and
uniformity in the diagnosis job."""

import json

import numpy as np
import pytest
from test_apply_job import cli_args, cone_corpus

from anisotropy_core import synthetic
from anisotropy_core.artifact import load_artifact
from anisotropy_core.flow import FlowTransform
from anisotropy_core.isotropy_measures import alignment
from anisotropy_core.transforms import fit_abtt
from anisotropy_spark.estimators import AllButTheTopEstimator
from jobs import diagnose as diagnose_job
from jobs.apply import main as apply_main
from jobs.fit import main as fit_main

N, D = 500, 8


@pytest.fixture(scope="module")
def corpus(spark, tmp_path_factory):
    return cone_corpus(spark, tmp_path_factory.mktemp("flowjobs"), N, D, seed=5)


def fit_and_apply(spark, root, capsys, method, **settings):
    artifact, output = str(root / f"{method}-artifact"), str(root / f"{method}-out")
    assert (
        fit_main(
            ["--conf", "conf/fit.yaml"]
            + cli_args(input=root / "corpus", artifact=artifact, method=method, on_invalid="error", **settings)
        )
        == 0
    )
    manifest = json.loads(capsys.readouterr().out)
    assert (
        apply_main(
            ["--conf", "conf/apply.yaml"]
            + cli_args(input=root / "corpus", artifact=artifact, output=output, on_invalid="error")
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["status"] == "written"
    rows = spark.read.format("delta").load(output).orderBy("id").collect()
    assert {r["transform_version"] for r in rows} == {manifest["transform_version"]}
    return manifest, load_artifact(artifact).transform, np.array([r["vector"] for r in rows])


def test_flow_fit_apply_end_to_end(spark, corpus, capsys):
    root, data = corpus
    manifest, transform, out = fit_and_apply(
        spark, root, capsys, "flow", sample_size=400, steps=300, couplings=3, hidden=8, seed=2
    )
    assert manifest["method"] == "flow" and manifest["n"] == 400 and manifest["d_out"] == D
    assert manifest["params"]["sample_size"] == 400 and manifest["params"]["couplings"] == 3
    assert isinstance(transform, FlowTransform)
    np.testing.assert_allclose(out, transform.apply(data), rtol=1e-12, atol=1e-12)  # same Arrow-batch map
    assert np.abs(transform.inverse(out) - data).max() <= 1e-9 * np.abs(data).max()  # exact inverse
    cov = np.cov(out.T, bias=True)
    assert np.abs(cov - np.eye(D)).max() < 0.25  # trained on 400 sampled rows, checked on all 500
    assert manifest["params"]["final_nll"] < manifest["params"]["initial_nll"]


def test_composition_fit_apply_end_to_end(spark, corpus, capsys):
    root, data = corpus
    manifest, transform, out = fit_and_apply(spark, root, capsys, "abtt_pca_abtt", D=1, k=4, D2=1)
    assert manifest["d_out"] == 4 and manifest["params"] == {
        "D": 1,
        "k": 4,
        "D2": 1,
        "d_rule": "explicit",
        "d2_rule": "explicit",
    }
    np.testing.assert_allclose(out, transform.apply(data), rtol=1e-12, atol=1e-12)
    spectrum = np.sort(np.linalg.eigvalsh(np.cov(out.T, bias=True)))
    assert spectrum[0] < 1e-10 * spectrum[-1] and spectrum[1] > 1e-3 * spectrum[-1]  # exactly one removed again


def test_estimator_takes_the_gram_route_when_n_below_d(spark):
    x = synthetic.cone(6, 20, offset=2.0, alpha=1.0, seed=3)
    df = spark.createDataFrame(
        [(i, [float(v) for v in row]) for i, row in enumerate(x)], "id long, vector array<double>"
    )
    model = AllButTheTopEstimator(D=2).fit(df.repartition(2))
    np.testing.assert_allclose(model.transform_.apply(x), fit_abtt(x, D=2).apply(x), atol=1e-10)
    assert model.n == 6


def test_diagnosis_reports_uniformity_and_pair_alignment(spark, corpus, tmp_path):
    root, data = corpus
    pairs = [(i, i + 1) for i in range(0, 40, 2)] + [(3, 99999)]
    spark.createDataFrame(pairs, "id_a long, id_b long").write.format("delta").save(str(tmp_path / "pairs"))
    args = [
        "--input",
        str(root / "corpus"),
        "--pairs",
        str(tmp_path / "pairs"),
        "--sample-size",
        "300",
        "--metadata-cols",
        "[]",
        "--cluster-k",
        "null",
        "--output-dir",
        str(tmp_path / "out"),
        "--metrics-table",
        "null",
        "--on-invalid",
        "error",
    ]
    assert diagnose_job.main(args) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["sample_size"] == 300 and -4.0 < report["metrics"]["uniformity"] < 0.0
    expected = alignment(data[0:40:2], data[1:40:2])["alignment"]
    assert report["alignment"] == {
        "alignment": pytest.approx(expected, abs=1e-12),
        "alpha": 2.0,
        "pairs": 20,
        "unmatched_pairs": 1,
    }
    summary = (tmp_path / "out" / "report.md").read_text()
    assert "use 300 random vectors" in summary and "over 20 positive pairs" in summary
