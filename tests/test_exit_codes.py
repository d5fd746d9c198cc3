"""Every job's exit codes per the README (issue 12, item 4): a config or contract error exits 2 and an invalid
input exits 5, each with one line naming the path or column and no traceback; ``--verbose`` adds it."""

import logging

import numpy as np
import pytest

from jobs import cli
from jobs import diagnose as diagnose_job
from jobs import fit as fit_job


def table(spark, tmp_path, rows, schema="id long, vector array<double>, token_count double", name="t"):
    path = str(tmp_path / name)
    spark.createDataFrame(rows, schema).write.format("delta").save(path)
    return path


def healthy_rows(n=40, d=4):
    X = np.random.default_rng(0).normal(size=(n, d)) + 2.0
    return [(i, [float(v) for v in x], float(i)) for i, x in enumerate(X)]


def diagnose(tmp_path, table_path, *flags):
    return [
        "--input",
        table_path,
        "--metadata-cols",
        "[token_count]",
        "--output-dir",
        str(tmp_path / "out"),
        "--metrics-table",
        "null",
        *flags,
    ]


def run_job(job, argv, caplog, capsys):
    """(exit code, the error log lines, stderr) of ``cli.run(job.main, argv)``."""
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="anisotropy"):
        code = cli.run(job.main, argv)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "anisotropy"]
    return code, errors, capsys.readouterr().err


def assert_one_line(errors, *fragments, traceback=False):
    assert len(errors) == 1
    message = errors[0].getMessage()
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert (errors[0].exc_info is not None) == traceback


def test_fewer_than_two_rows_and_zero_spread_exit_5(spark, tmp_path, caplog, capsys):
    one = table(spark, tmp_path, [(1, [1.0, 2.0], 1.0)], name="one")
    code, errors, _ = run_job(diagnose_job, diagnose(tmp_path, one), caplog, capsys)
    assert code == 5
    assert_one_line(errors, "InvalidVectorsError", "at least 2 vectors, got n=1")
    same = table(spark, tmp_path, [(i, [1.0, 2.0, 3.0], float(i)) for i in range(10)], name="same")
    code, errors, _ = run_job(diagnose_job, diagnose(tmp_path, same), caplog, capsys)
    assert code == 5
    assert_one_line(errors, "all 10 valid vectors are identical (zero spread)")
    fit_args = ["--input", same, "--method", "center", "--artifact", str(tmp_path / "a")]
    code, errors, _ = run_job(fit_job, fit_args, caplog, capsys)
    assert code == 5
    assert_one_line(errors, "identical (zero spread)")


def test_missing_path_column_and_conf_exit_2(spark, tmp_path, caplog, capsys):
    good = table(spark, tmp_path, healthy_rows())
    missing = str(tmp_path / "nowhere")
    code, errors, _ = run_job(diagnose_job, diagnose(tmp_path, missing), caplog, capsys)
    assert code == 2
    assert_one_line(errors, "AnalysisException", "nowhere")
    code, errors, _ = run_job(diagnose_job, diagnose(tmp_path, good, "--vector-col", "embedding"), caplog, capsys)
    assert code == 2
    assert_one_line(errors, "SchemaError", "vector column 'embedding' not found")
    code, errors, _ = run_job(diagnose_job, diagnose(tmp_path, good, "--id-col", "key"), caplog, capsys)
    assert code == 2
    assert_one_line(errors, "id column 'key' not found")
    code, errors, _ = run_job(
        diagnose_job, diagnose(tmp_path, good, "--metadata-cols", "[clicks, token_count]"), caplog, capsys
    )
    assert code == 2
    assert_one_line(errors, "metadata column 'clicks' not found")
    code, errors, _ = run_job(diagnose_job, ["--conf", str(tmp_path / "absent.yaml")], caplog, capsys)
    assert code == 2
    assert_one_line(errors, "ConfigError", "absent.yaml not found")


def test_string_vector_column_exits_2(spark, tmp_path, caplog, capsys):
    text = table(
        spark,
        tmp_path,
        [(1, "[1.0, 2.0]", 1.0), (2, "[2.0, 1.0]", 2.0)],
        "id long, vector string, token_count double",
        name="text",
    )
    code, errors, _ = run_job(diagnose_job, diagnose(tmp_path, text), caplog, capsys)
    assert code == 2
    assert_one_line(errors, "vector column 'vector' has type string")


def test_verbose_adds_the_traceback(spark, tmp_path, caplog, capsys):
    good = table(spark, tmp_path, healthy_rows())
    code, errors, _ = run_job(diagnose_job, diagnose(tmp_path, good, "--id-col", "key", "--verbose"), caplog, capsys)
    assert code == 2
    assert_one_line(errors, "id column 'key' not found", traceback=True)


def test_unclassified_errors_keep_their_traceback(tmp_path):
    def broken(argv):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        cli.run(broken, [])
