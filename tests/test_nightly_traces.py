"""What a run leaves behind (issue 45): run records of killed runs, rejected fits, a corrupt serving artifact on a
night with nothing new, and VACUUM of the unreferenced files.

The run-record and fit-report checks need no Spark session; the last two tests run the nightly / VACUUM on a
small table."""

import dataclasses
import datetime
import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_nightly import corpus, job_config, record, table, write_input

from anisotropy_core.artifact import ArtifactError, load_artifact, save_artifact
from anisotropy_core.decision import Recommendation
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import fit_center
from anisotropy_spark.publish import output_state
from jobs import cli, nightly
from jobs.fit_or_reuse import FIT_REPORT, mark_rejected, reusable, serving_artifact
from jobs.nightly_config import NightlyConfig
from jobs.run_records import (
    Applied,
    Counts,
    NeighbourOverlap,
    RunRecord,
    ServingArtifact,
    new_record,
    start_record,
    write_records,
)


def ended_pid() -> int:
    """The id of a process of this host that has ended (started, waited for)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def leftover(config, hours_ago, **fields) -> RunRecord:
    """A ``started`` record of a run that began ``hours_ago`` hours ago, written to ``runs_dir``."""
    began = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=hours_ago)
    rec = dataclasses.replace(new_record(config), started_at=began.isoformat(), **fields)
    write_records(None, config, [rec])
    return rec


def test_a_run_marks_earlier_unfinished_runs_killed_only_when_they_are_dead(tmp_path):
    config = NightlyConfig(
        input="in", output="out", runs_dir=str(tmp_path / "runs"), runs_table=None, stale_run_hours=24
    )
    gone = leftover(config, 1, pid=ended_pid())  # this host, process ended
    alive = leftover(config, 1, pid=os.getpid())  # this host, process alive
    remote_old = leftover(config, 30, host="elsewhere", pid=1)  # another host, over stale_run_hours
    remote_new = leftover(config, 2, host="elsewhere", pid=1)  # another host, may still run
    finished = leftover(config, 3, pid=ended_pid(), status="published")  # ended with a final record

    current = new_record(config)
    marked = start_record(None, config, current)

    def on_disk(rec):
        return json.loads((tmp_path / "runs" / f"{rec.run_id}.json").read_text())

    assert sorted(r.run_id for r in marked) == sorted([gone.run_id, remote_old.run_id])
    assert {on_disk(r)["status"] for r in (alive, remote_new)} == {"started"}
    assert on_disk(finished)["status"] == "published"
    dead = on_disk(gone)
    assert dead["status"] == "killed" and dead["found_by"] == current.run_id and dead["finished_at"]
    assert f"its process {gone.pid} on {socket.gethostname()} has ended" in dead["reason"]
    stale = on_disk(remote_old)
    assert stale["status"] == "killed" and "started 30.0 h ago (stale_run_hours: 24) on elsewhere" in stale["reason"]
    assert on_disk(current)["status"] == "started" and on_disk(current)["finished_at"] is None


def test_a_run_record_round_trips_through_its_json_file(tmp_path):
    """Issue 44: the typed run record is serialised in one place (RunRecord.to_json, written by write_records) under
    the run-record keys readers know, and reads back equal; NaN (an undefined metric) is written as null."""
    config = NightlyConfig(input="in", output="out", runs_dir=str(tmp_path / "runs"), runs_table=None)
    rec = new_record(config)
    rec.input.version, rec.output.previous_version, rec.output.version = 3, 1, 2
    rec.status, rec.mode, rec.reason, rec.evidence = "published", "full", "because", "label_free"
    rec.counts.update(invalid_rows=2, invalid_by_reason={"norm_outlier": 2}, output_rows=40, rows_written=40)
    rec.stages.append({"name": "read", "seconds": 0.5, "rows": 42})
    rec.serving_artifact = ServingArtifact("fit/a", "center-0", verified=False, problem="unreadable")
    rec.input_metrics = {"n": 40, "top1_var": 0.5}
    rec.recommendation = Recommendation("center", reasons=["the offset dominates"], verified=True)
    rec.applied = Applied(
        method="center",
        params={},
        transform_version="center-1",
        artifact="fit/b",
        refitted=True,
        fit_reason="no previous fit",
        candidate=None,
        follows_recommendation=True,
    )
    rec.neighbour_overlap = NeighbourOverlap(mean=0.9, k=10, rows=50, min=0.5, passes=True)
    rec.evaluation = {"metric": "ndcg@5", "score": float("nan")}
    write_records(None, config, [rec])
    on_disk = json.loads((tmp_path / "runs" / f"{rec.run_id}.json").read_text())
    assert {
        "run_id",
        "started_at",
        "finished_at",
        "status",
        "mode",
        "reason",
        "host",
        "pid",
        "config_hash",
        "input",
        "output",
        "counts",
        "recommendation",
        "applied",
        "stages",
    } <= set(on_disk)
    assert on_disk["input"] == {"path": "in", "version": 3}
    assert on_disk["output"] == {"path": "out", "previous_version": 1, "version": 2}
    assert on_disk["counts"]["invalid_by_reason"] == {"norm_outlier": 2} and on_disk["counts"]["output_rows"] == 40
    assert on_disk["applied"]["artifact"] == "fit/b" and on_disk["recommendation"]["method"] == "center"
    assert on_disk["neighbour_overlap"]["mean"] == 0.9 and on_disk["serving_artifact"]["verified"] is False
    assert on_disk["evaluation"] == {"metric": "ndcg@5", "score": None}
    back = RunRecord.from_json(on_disk)
    assert back == dataclasses.replace(rec, evaluation={"metric": "ndcg@5", "score": None})
    assert back.to_json() == on_disk
    with pytest.raises(TypeError):
        Counts().update(no_such_count=1)


def saved_center(path) -> dict:
    """A center artifact with its fit report at ``path``; returns the publish metadata that serves it."""
    X = np.random.default_rng(3).normal(size=(50, 4)) + 2.0
    manifest = save_artifact(str(path), fit_center(Moments.of_batch(X)), 50)
    (path / FIT_REPORT).write_text(json.dumps({"method": "center", "params": {}, "metrics": {}}))
    return {"artifact": str(path), "transform_version": manifest["transform_version"]}


def test_a_rejected_fit_is_kept_but_never_reused(tmp_path):
    previous = saved_center(tmp_path / "fit")
    config = NightlyConfig(input="in", output="out", drift={})
    reused, why = reusable(config, previous, "center", {}, 4, {})
    assert reused is not None and reused.transform_version == previous["transform_version"], why
    mark_rejected(previous["artifact"], "run-7", "gate rejected the output: output top1_var = 0.95 outside")
    reused, why = reusable(config, previous, "center", {}, 4, {})
    assert reused is None
    assert why == (
        f"previous artifact {previous['artifact']} is marked rejected (run run-7: gate rejected the "
        "output: output top1_var = 0.95 outside)"
    )
    assert load_artifact(previous["artifact"]).transform_version == previous["transform_version"]  # kept, valid


def test_the_serving_artifact_must_verify_and_match_the_published_version(tmp_path):
    previous = saved_center(tmp_path / "fit")
    assert serving_artifact(previous).transform_version == previous["transform_version"]
    assert serving_artifact({"artifact": None}) is None and serving_artifact(None) is None
    with pytest.raises(ArtifactError, match="holds transform center-.*, but the published rows carry center-0"):
        serving_artifact({**previous, "transform_version": "center-000000000000"})
    npz = tmp_path / "fit" / "arrays.npz"
    npz.write_bytes(npz.read_bytes()[:64])
    with pytest.raises(ArtifactError, match="arrays.npz: unreadable arrays"):
        serving_artifact(previous)
    assert reusable(NightlyConfig(input="in", output="out"), previous, "center", {}, 4, {})[1].startswith(
        "previous artifact unusable ("
    )


def test_a_corrupt_serving_artifact_is_refit_and_republished_on_a_night_with_nothing_new(spark, tmp_path):
    ids, X, tokens = corpus()
    write_input(spark, str(tmp_path / "input"), ids, X, tokens)
    conf = job_config(tmp_path)
    assert nightly.main(["--conf", conf]) == 0
    first = record(tmp_path)
    assert first["serving_artifact"] is None
    npz = pathlib.Path(first["applied"]["artifact"]) / "arrays.npz"
    npz.write_bytes(npz.read_bytes()[:64])  # the input is unchanged: a no-op night

    assert nightly.main(["--conf", conf]) == 0
    second = record(tmp_path)
    assert (second["status"], second["mode"]) == ("published", "full") and second["applied"]["refitted"]
    assert second["serving_artifact"]["verified"] is False and "arrays.npz" in second["serving_artifact"]["problem"]
    assert (
        second["reason"].startswith(
            "not a no-op: output version 0 already holds input version 0, but its artifact failed the check ("
        )
        and "refit and republish" in second["reason"]
    )
    assert "previous artifact unusable" in second["applied"]["fit_reason"]
    assert second["output"]["version"] == 1
    republished = load_artifact(second["applied"]["artifact"])  # a valid artifact again, the one served
    assert republished.transform_version == output_state(spark, str(tmp_path / "output")).meta["transform_version"]
    published = table(spark, str(tmp_path / "output"))
    expected = republished.transform.apply(X)
    assert max(float(np.abs(published[i] - expected[i]).max()) for i in ids) < 1e-12

    assert nightly.main(["--conf", conf]) == 0  # verified: a no-op again
    third = record(tmp_path)
    assert third["status"] == "noop" and third["serving_artifact"]["verified"] is True


def test_vacuum_deletes_unreferenced_files_with_deltas_retention_check(spark, tmp_path):
    output = tmp_path / "output"
    rows = spark.createDataFrame([(i, [float(i), 1.0]) for i in range(20)], "id long, vector array<double>")
    meta = json.dumps({"run_id": "r1", "seq": 0})
    rows.repartition(4).write.format("delta").option("userMetadata", meta).save(str(output))
    rows.coalesce(1).write.format("delta").mode("overwrite").option("userMetadata", meta).save(str(output))
    stray = output / "part-killed-run.snappy.parquet"  # written by a run killed before its commit
    pq.write_table(pa.table({"id": [99]}), stray)
    conf = job_config(tmp_path, runs_table=None)

    assert cli.main(["vacuum", "--conf", conf, "--retain-hours", "1"]) == 2  # below 168 h: refused
    assert cli.main(["vacuum", "--conf", conf]) == 0  # 168 h: nothing old enough
    assert stray.exists() and len(list(output.glob("*.parquet"))) == 6
    assert cli.main(["vacuum", "--conf", conf, "--retain-hours", "0", "--allow-short-retention"]) == 0
    assert not stray.exists() and len(list(output.glob("*.parquet"))) == 1
    assert sorted(r["id"] for r in spark.read.format("delta").load(str(output)).collect()) == list(range(20))
    state = output_state(spark, str(output))  # the VACUUM commits are no change of the output
    assert state.meta == {"run_id": "r1", "seq": 0} and state.version == 5
    assert spark.conf.get("spark.databricks.delta.retentionDurationCheck.enabled", None) is None
