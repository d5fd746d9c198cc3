"""Issue 45's failures, each a clean exit with its documented code, and its gaps: a missing named column (exit 2,
before any pass), a value that overflows float32 after the cast (the gate's exit 3 naming the id, or quarantined as a
norm outlier), a squared length that overflows float64 (invalid in both jobs), the norm-outlier rule, stderr ending
with the error, and the version a concurrent first publish's loser reports."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from anisotropy_core.artifact import save_artifact
from anisotropy_core.diagnostics import diagnose
from anisotropy_core.moments import Moments
from anisotropy_core.norms import MEDIAN_ERROR
from anisotropy_core.transforms import fit_center
from anisotropy_spark.contract import InvalidRowsError
from anisotropy_spark.io import read_table, validate
from anisotropy_spark.publish import output_state
from jobs import apply as apply_job
from jobs import fit as fit_job
from jobs import nightly, nightly_stages
from tests.test_exit_codes import assert_one_line, run_job
from tests.test_nightly import corpus, job_config, record, write_input
from tests.test_nightly_faults import job_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUGE = [5, 6, 7]  # the ids of the rows made huge


def with_huge_rows(spark, tmp_path, value):
    """The nightly test corpus (300 × 8, valid) with rows ``HUGE`` set to ``value`` everywhere, as the nightly's
    input; returns (its path, the healthy rows' matrix)."""
    ids, X, tokens = corpus()
    healthy = np.delete(X, HUGE, axis=0)
    X = X.copy()
    X[HUGE] = value
    write_input(spark, str(tmp_path / "input"), ids, X, tokens, invalid=False)
    return str(tmp_path / "input"), healthy


def center_artifact(tmp_path, healthy):
    path = str(tmp_path / "center")
    save_artifact(path, fit_center(Moments.of_batch(healthy)), len(healthy))
    return path


def apply_args(tmp_path, source, artifact, *flags):
    return [
        "--input",
        source,
        "--artifact",
        artifact,
        "--output",
        str(tmp_path / "applied"),
        "--quarantine-path",
        str(tmp_path / "applied_quarantine"),
        *flags,
    ]


def quarantined(spark, path):
    return {(r["id"], r["invalid_reason"]) for r in spark.read.format("delta").load(path).collect()}


def test_a_missing_named_column_exits_2_before_any_pass(spark, tmp_path, caplog, capsys, monkeypatch):
    """Failure 1 and the late configuration errors: nightly, apply and fit name the missing vector, id, metadata or
    label column (exit 2, one line) before a pass over the table starts."""
    source, healthy = with_huge_rows(spark, tmp_path, 1.0)

    def no_pass(*args, **kwargs):
        raise AssertionError("a pass over the table started")

    monkeypatch.setattr(nightly_stages, "table_files", no_pass)
    monkeypatch.setattr(apply_job, "table_files", no_pass)
    conf = job_config(tmp_path)
    for flags, fragment in [
        (["--vector-col", "nope"], "vector column 'nope' not found"),
        (["--id-col", "key"], "id column 'key' not found"),
        (["--metadata-cols", "[clicks, token_count]"], "metadata column 'clicks' not found"),
        (["--label-col", "topic"], "label column 'topic' not found"),
    ]:
        assert nightly.main(["--conf", conf, *flags]) == 2
        assert record(tmp_path)["status"] == "config_error" and fragment in record(tmp_path)["reason"]
    artifact = center_artifact(tmp_path, healthy)
    code, errors, _ = run_job(apply_job, apply_args(tmp_path, source, artifact, "--vector-col", "nope"), caplog, capsys)
    assert code == 2
    assert_one_line(errors, "SchemaError", "vector column 'nope' not found")
    fit_args = ["--input", source, "--method", "center", "--artifact", str(tmp_path / "fitted"), "--id-col", "key"]
    code, errors, _ = run_job(fit_job, fit_args, caplog, capsys)
    assert code == 2
    assert_one_line(errors, "SchemaError", "id column 'key' not found")


def test_a_value_that_overflows_float32_after_the_cast(spark, tmp_path, caplog, capsys):
    """Failure 2: array<double> rows of 1e39, output_dtype float32, method center. With the norm-outlier rule off
    the nightly's gate refuses (exit 3) naming the row's id and apply exits 5 naming it, nothing committed; with the
    rule on (the default) the nightly quarantines those rows (norm_outlier) and publishes the others."""
    source, healthy = with_huge_rows(spark, tmp_path, 1e39)
    conf = job_config(tmp_path, method="center", output_dtype="float32", metadata_cols=[])
    assert nightly.main(["--conf", conf, "--max-norm-ratio", "0"]) == 3
    refused = record(tmp_path)
    assert refused["status"] == "gate_rejected" and "after the cast to float32" in refused["reason"]
    assert any(f"'id': {i}" in refused["reason"] for i in HUGE), refused["reason"]
    assert output_state(spark, str(tmp_path / "output")).version is None
    assert nightly.main(["--conf", conf]) == 0
    published = record(tmp_path)
    assert published["counts"]["invalid_by_reason"] == {"norm_outlier": 3}
    assert published["counts"]["output_rows"] == len(healthy)
    assert quarantined(spark, str(tmp_path / "quarantine")) == {(i, "norm_outlier") for i in HUGE}
    artifact = center_artifact(tmp_path, healthy)
    code, errors, _ = run_job(
        apply_job, apply_args(tmp_path, source, artifact, "--output-dtype", "float32"), caplog, capsys
    )
    assert code == 5
    assert_one_line(errors, "TransformRowError", "non-finite output value after the cast to float32", "'id': ")
    assert any(f"'id': {i}" in errors[0].getMessage() for i in HUGE)
    assert output_state(spark, str(tmp_path / "applied")).version is None


def test_a_squared_length_that_overflows_float64_is_invalid_in_both_jobs(spark, tmp_path, caplog, capsys):
    """Failure 3: rows of 1e300 (finite, but their squared length is Inf) are invalid rows, reason norm_overflow, in
    the nightly and in apply alike: quarantined under on_invalid: quarantine, refused (exit 5) under error."""
    source, healthy = with_huge_rows(spark, tmp_path, 1e300)
    assert nightly.main(["--conf", job_config(tmp_path, method="center")]) == 0
    assert record(tmp_path)["counts"]["invalid_by_reason"] == {"norm_overflow": 3}
    assert quarantined(spark, str(tmp_path / "quarantine")) == {(i, "norm_overflow") for i in HUGE}
    artifact = center_artifact(tmp_path, healthy)
    code, _, _ = run_job(
        apply_job, apply_args(tmp_path, source, artifact, "--on-invalid", "quarantine"), caplog, capsys
    )
    assert code == 0
    written = read_table(spark, str(tmp_path / "applied"))[0]
    assert written.count() == len(healthy) and written.where(written.id.isin(HUGE)).count() == 0
    assert quarantined(spark, str(tmp_path / "applied_quarantine")) == {(i, "norm_overflow") for i in HUGE}
    code, errors, _ = run_job(
        apply_job,
        apply_args(tmp_path, source, artifact, "--on-invalid", "error", "--output", str(tmp_path / "strict")),
        caplog,
        capsys,
    )
    assert code == 5
    assert_one_line(errors, "InvalidRowError", "norm_overflow in column 'vector'")
    assert output_state(spark, str(tmp_path / "strict")).version is None


def test_norm_outliers_are_quarantined_and_the_rule_can_be_turned_off(spark, tmp_path):
    """Three rows of 1e39 in a 16-d table collapse the second moment to rank 1 unless the norm-outlier rule sets them
    aside: quarantined with reason norm_outlier, the moments recomputed without them, the full rank kept."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, 16)) + 1.0
    X[[1, 2, 3]] = 1e39
    path = str(tmp_path / "t")
    spark.createDataFrame(
        [(i, [float(v) for v in x]) for i, x in enumerate(X)], "id long, vector array<double>"
    ).write.format("delta").save(path)
    df = read_table(spark, path)[0]
    quarantine = str(tmp_path / "q")
    checked = validate(
        df, "vector", "id", on_invalid="quarantine", quarantine_path=quarantine, with_moments=True, max_norm_ratio=1e3
    )
    assert checked.invalid_by_reason == {"norm_outlier": 3} and checked.moments.n == 397
    assert diagnose(checked.moments)["numerical_rank"] == 16
    lower_median = np.sort(np.linalg.norm(X, axis=1))[(len(X) + 1) // 2 - 1]  # of the pass's valid rows
    assert abs(checked.median_length / lower_median - 1) <= MEDIAN_ERROR
    assert checked.max_norm == pytest.approx(1e3 * checked.median_length)
    assert checked.reader.endswith("the moments again through Spark, without the norm outliers")
    assert np.allclose(checked.moments.mean, np.delete(X, [1, 2, 3], axis=0).mean(axis=0), rtol=1e-12, atol=0)
    assert quarantined(spark, quarantine) == {(1, "norm_outlier"), (2, "norm_outlier"), (3, "norm_outlier")}
    for off in (None, 0):
        unchecked = validate(df, "vector", "id", with_moments=True, max_norm_ratio=off)
        assert unchecked.invalid_count == 0 and unchecked.max_norm is None
        assert diagnose(unchecked.moments)["numerical_rank"] == 1
    with pytest.raises(InvalidRowsError, match=r"'norm_outlier': 3.*sample id values: \[1, 2, 3\]"):
        validate(df, "vector", "id", with_moments=True, max_norm_ratio=1e3)


def test_stderr_ends_with_the_error(spark, tmp_path):
    """A failing job run as a command: its last line on stderr names the problem (no py4j INFO line after it)."""
    source, _ = with_huge_rows(spark, tmp_path, 1.0)
    conf = job_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "nightly", "--conf", conf, "--vector-col", "nope"],
        cwd=REPO,
        env=job_env(ANISOTROPY_SPARK_MASTER="local[1]"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    last = [line for line in done.stderr.splitlines() if line.strip()][-1]
    assert "vector column 'nope' not found" in last, done.stderr[-3000:]


def test_the_loser_of_a_first_publish_sees_the_winners_version(spark, tmp_path):
    """The session caches "no table at this path"; a table another process then creates there is seen at its
    version (the concurrent loser's message said "the output is at version None")."""
    spark.range(3).write.format("delta").save(str(tmp_path / "winner"))
    (tmp_path / "output" / "_delta_log").mkdir(parents=True)  # what the loser's own attempt left
    assert output_state(spark, str(tmp_path / "output")).version is None
    shutil.rmtree(tmp_path / "output")
    shutil.copytree(tmp_path / "winner", tmp_path / "output")  # the winner's commit, made elsewhere
    assert output_state(spark, str(tmp_path / "output")).version == 0
