"""Faults of the nightly job, each run in a separate Spark application (subprocess; 5 in all):

1. a task that fails once is retried (``local[2,2]``) and the published numbers are identical;
2. a kill between apply and publish (through ``spark-submit``) leaves the published table unchanged and the
   next run completes;
3. a real multi-process Spark (``local-cluster[2,1,1024]``: two executor JVMs) gives the same numbers as
   ``local[2]``;
4. two concurrent runs against the same output: one publishes, the other exits 4; no corruption.

The in-process reference run uses the session's ``local[2]`` fixture.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pyspark
import pytest
from test_nightly import N, corpus, history, job_config, table, write_input

from anisotropy_core.moments import Moments
from anisotropy_core.transforms import fit_center
from anisotropy_spark.session import DELTA_CATALOG, DELTA_EXTENSION, delta_jars
from jobs import nightly

REPO = pathlib.Path(__file__).resolve().parent.parent
TIMEOUT = 900
FAULT_SCRIPT = "tests/nightly_with_faults.py"


def job_env(**extra) -> dict:
    """Environment of a job subprocess: this interpreter for Python workers, the repo importable."""
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_HOME=os.path.dirname(pyspark.__file__),
    )
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.update(extra)
    return env


def launch(conf: str, *flags: str, submit: bool = False, **env) -> subprocess.Popen:
    """Start the nightly job with the test-only fault seam (``python tests/nightly_with_faults.py``, or under
    ``spark-submit``) with ``conf`` and ``flags``; ``env`` names the faults (see that script)."""
    if submit:
        command = [
            str(pathlib.Path(sys.executable).parent / "spark-submit"),
            "--master",
            "local[2]",
            "--jars",
            ",".join(delta_jars()),
            "--conf",
            f"spark.sql.extensions={DELTA_EXTENSION}",
            "--conf",
            f"spark.sql.catalog.spark_catalog={DELTA_CATALOG}",
            FAULT_SCRIPT,
            "--conf",
            conf,
        ]
    else:
        command = [sys.executable, FAULT_SCRIPT, "--conf", conf]
    return subprocess.Popen(
        command + list(flags), cwd=REPO, env=job_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    out, _ = process.communicate(timeout=TIMEOUT)
    return process.returncode, out


def summary(out: str) -> dict:
    """The one-line JSON summary the job prints last."""
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def assert_same_output(spark, left: str, right: str) -> float:
    """Both tables hold the same ids and vectors (≤ 1e-12); returns the largest difference."""
    a, b = table(spark, left), table(spark, right)
    assert sorted(a) == sorted(b)
    worst = max(float(np.abs(a[i] - b[i]).max()) for i in a)
    assert worst <= 1e-12, worst
    return worst


def records(runs_dir: pathlib.Path) -> list[dict]:
    """Every run record in ``runs_dir``."""
    return [json.loads(p.read_text()) for p in runs_dir.iterdir()]


def published_metrics(runs_dir: pathlib.Path) -> dict:
    (record,) = [json.loads(p.read_text()) for p in runs_dir.iterdir()]
    assert record["status"] == "published"
    return record


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    """An input table and its nightly output published in-process on local[2]: (folder, run record)."""
    base = tmp_path_factory.mktemp("reference")
    ids, X, tokens = corpus()
    write_input(spark, str(base / "input"), ids, X, tokens)
    assert nightly.main(["--conf", job_config(base)]) == 0
    return base, published_metrics(base / "runs")


def elsewhere(tmp_path, reference_dir, **overrides) -> str:
    """A config reading the reference input but writing everything under ``tmp_path``."""
    return job_config(tmp_path, input=str(reference_dir / "input"), **overrides)


@pytest.mark.parametrize(
    "master,env",
    [
        ("local[2,2]", "fail_once"),  # fault 1: task retried, identical result
        ("local-cluster[2,1,1024]", None),  # fault 3: two executor processes, same numbers
    ],
)
def test_other_masters_give_identical_numbers(spark, reference, tmp_path, master, env):
    base, expected = reference
    marker = tmp_path / "marker"
    marker.mkdir()
    extra = {"FAIL_TASK_ONCE": str(marker)} if env else {}
    code, out = finish(launch(elsewhere(tmp_path, base), "--master", master, **extra))
    assert code == 0, out[-4000:]
    if env:
        assert (marker / "failed-once").read_text().startswith("stage ")  # the failure did happen
    got = published_metrics(tmp_path / "runs")
    for key, value in expected["input_metrics"].items():
        same = value if value is None else pytest.approx(value, rel=1e-12, abs=1e-14)  # None: undefined in both
        assert got["input_metrics"][key] == same, key
    assert got["applied"]["transform_version"] == expected["applied"]["transform_version"]
    assert_same_output(spark, str(base / "output"), str(tmp_path / "output"))


def test_kill_between_apply_and_publish_leaves_table_unchanged(spark, tmp_path):
    ids, X, tokens = corpus()
    write_input(spark, str(tmp_path / "input"), ids, X, tokens)
    conf = job_config(tmp_path)
    assert nightly.main(["--conf", conf]) == 0
    before_history, before = history(spark, str(tmp_path / "output")), table(spark, str(tmp_path / "output"))
    new_ids, X_new, tokens_new = corpus(n=20, seed=1, start=1000)
    write_input(spark, str(tmp_path / "input"), new_ids, X_new, tokens_new, mode="append", invalid=False)

    code, out = finish(launch(conf, submit=True, FAIL_AFTER_STAGE="apply"))
    assert code == 137, out[-4000:]
    assert "simulating a kill" in out
    assert history(spark, str(tmp_path / "output")) == before_history
    after_kill = table(spark, str(tmp_path / "output"))
    assert sorted(after_kill) == sorted(before) and all(np.array_equal(after_kill[i], before[i]) for i in before)
    (killed,) = [r for r in records(tmp_path / "runs") if r["status"] == "started"]  # the killed run's trace

    assert nightly.main(["--conf", conf]) == 0
    assert len(table(spark, str(tmp_path / "output"))) == N + 20
    assert [h["operation"] for h in history(spark, str(tmp_path / "output"))] == ["WRITE", "MERGE"]
    marked = {r["run_id"]: r for r in records(tmp_path / "runs")}[killed["run_id"]]
    assert marked["status"] == "killed" and f"its process {killed['pid']}" in marked["reason"]
    rows = spark.read.format("delta").load(str(tmp_path / "runs_table")).collect()
    assert sorted(r["status"] for r in rows) == ["killed", "published", "published"]
    assert {r["run_id"]: r["status"] for r in rows}[killed["run_id"]] == "killed"


def test_concurrent_runs_one_publishes_the_other_fails_cleanly(spark, reference, tmp_path):
    base, _ = reference
    shutil.copytree(base / "output", tmp_path / "output")  # an established deployment: the output
    shutil.copytree(base / "quarantine", tmp_path / "quarantine")  # and quarantine tables already exist
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    conf = elsewhere(tmp_path, base, method="center")
    runs = [launch(conf, "--master", "local[1]", PUBLISH_BARRIER=f"{barrier}:2") for _ in range(2)]
    results = [finish(p) for p in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 4], [out[-3000:] for _, out in results]
    loser = summary(next(out for code, out in results if code == 4))
    winner = summary(next(out for code, out in results if code == 0))
    assert loser["status"] == "concurrent_publish" and "concurrent" in loser["reason"].lower()
    versions = history(spark, str(tmp_path / "output"))
    assert [h["version"] for h in versions] == [0, 1]
    assert json.loads(versions[1]["userMetadata"])["run_id"] == winner["run_id"]
    ids, X, _ = corpus()
    published = table(spark, str(tmp_path / "output"))
    expected = fit_center(Moments.of_batch(X)).apply(X)
    assert sorted(published) == list(ids)
    assert max(np.abs(published[i] - expected[i]).max() for i in ids) < 1e-10
