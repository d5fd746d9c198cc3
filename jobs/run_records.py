"""Nightly run records: every run (published, noop, rejected, failed, rolled back, killed) as
``runs_dir/<run_id>.json`` (through :mod:`anisotropy_core.storage`, so any path or URI) and one row per run of
the Delta ``runs_table`` (upserted on ``run_id``): the recommendation, what was applied, counts, metrics, stage
timings, and (with an ``evaluation:`` block) every candidate's scores, the chosen one, raw and the quality gate
(``evaluation``).

A run writes its record twice: ``started`` before its first stage (:func:`start_record`), and its final status
when it ends (:func:`write_record`). A run killed in between (kill -9, a lost driver) leaves its ``started``
record; the next run marks it ``killed`` (:func:`dead_runs`: its process on this host is gone, or it started more
than ``stale_run_hours`` ago), in both places.

A record is a :class:`RunRecord`, filled in stage by stage; :meth:`RunRecord.to_json` is its one serialisation
(:func:`write_records` writes it) and :meth:`RunRecord.from_json` reads one back.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import logging
import math
import os
import random
import socket
import time
import uuid
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from anisotropy_core import storage
from anisotropy_core.decision import ArtefactEvidence, Recommendation
from anisotropy_spark.io import is_delta_table
from anisotropy_spark.publish import is_delta_conflict
from anisotropy_spark.session import session_conf
from jobs.nightly_config import NightlyConfig, nightly_config_hash

log = logging.getLogger("anisotropy.nightly")

RUNS_SCHEMA = (
    "run_id string, started_at timestamp, finished_at timestamp, status string, mode string, "
    "reason string, input_path string, input_version long, output_path string, output_version long, "
    "method_recommended string, method_applied string, transform_version string, evaluation string, "
    "record string"
)
WRITE_ATTEMPTS = 5  # concurrent runs' upserts of the runs_table conflict; each retry re-reads the table
STARTED, KILLED = "started", "killed"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


@dataclasses.dataclass
class InputVersion:
    """The input table of a run: ``path`` and the Delta ``version`` it pinned (None before the read stage)."""

    path: str
    version: int | None = None


@dataclasses.dataclass
class OutputVersions:
    """The output table of a run: ``path``, its ``previous_version`` when the run read it (None: no table yet, or
    not read) and the ``version`` the run left it at (published, restored, or the current one of a no-op)."""

    path: str
    previous_version: int | None = None
    version: int | None = None


@dataclasses.dataclass
class Counts:
    """Row counts, each None until the stage that counts it ran: ``invalid_rows`` / ``invalid_by_reason`` (the
    validation), ``valid_rows`` (the diagnosis; the gate counts it again), ``rows_written`` (the rows the publish
    writes), ``output_files`` (a full rebuild's data files) and the gate's counts of the would-be output
    (:func:`jobs.gate.gate`: ``output_rows``, ``missing_ids``, ``unexpected_ids``, ``wrong_dimension``,
    ``non_finite``)."""

    invalid_rows: int | None = None
    invalid_by_reason: dict[str, int] | None = None
    valid_rows: int | None = None
    rows_written: int | None = None
    output_files: int | None = None
    output_rows: int | None = None
    missing_ids: int | None = None
    unexpected_ids: int | None = None
    wrong_dimension: int | None = None
    non_finite: int | None = None

    def update(self, **counts: Any) -> None:
        """Set the named counts (a name that is no field is a TypeError)."""
        for name, value in counts.items():
            if name not in self.__dataclass_fields__:
                raise TypeError(f"Counts has no count {name!r}")
            setattr(self, name, value)


@dataclasses.dataclass
class ServingArtifact:
    """The check of the artifact the output is served with (:func:`jobs.nightly_stages.check_serving`): its
    ``path``, the ``transform_version`` the published rows carry, whether it ``verified`` and, if not, the
    ``problem``."""

    path: str
    transform_version: str | None
    verified: bool
    problem: str | None = None


@dataclasses.dataclass
class Applied:
    """What the fit stage applied: ``method`` and its ``params``, the ``transform_version`` and ``artifact`` (None:
    method none), whether it was ``refitted`` and why (``fit_reason``), the evaluation ``candidate`` chosen (None:
    no evaluation chose), whether it ``follows_recommendation``, and whether the gate ``rejected`` its fit."""

    method: str
    params: dict[str, Any]
    transform_version: str
    artifact: str | None
    refitted: bool
    fit_reason: str
    candidate: str | None
    follows_recommendation: bool
    rejected: bool = False


@dataclasses.dataclass
class NeighbourOverlap:
    """The neighbour gate: the ``mean`` share of each sampled row's raw top-``k`` kept by the correction over
    ``rows`` sampled rows, the ``min`` it must reach, and whether it ``passes``."""

    mean: float
    k: int
    rows: int
    min: float
    passes: bool


@dataclasses.dataclass
class OutputSums:
    """What a published output's moments need beyond the input's (:mod:`anisotropy_core.output_facts`): its
    ``rows``, the sum of its rows' lengths ``sum_norm`` and of their unit vectors ``sum_unit`` (d_out floats). An
    incremental night adds its new rows' sums to the last publish's instead of reading the published rows again."""

    rows: int
    sum_norm: float
    sum_unit: list[float]


@dataclasses.dataclass
class RunRecord:
    """The record of one nightly run (or rollback), filled in stage by stage.

    ``run_id``; ``started_at`` / ``finished_at`` (ISO-8601, UTC; None until the run ends); ``status`` (``started``,
    then ``published``, ``noop``, ``kept``, ``rolled_back``, ``killed``, ``failed`` or a :data:`jobs.cli.EXIT`
    status); ``mode`` (``full``, ``incremental``, ``noop``, ``kept``, ``rollback``) and ``mode_reason`` (why not
    incremental); ``reason``; ``host`` and ``pid`` of the process (how a later run tells it is alive);
    ``config_hash``; ``input`` and ``output``; ``counts``; ``stages`` (one timing record per stage);
    ``serving_artifact`` (None: nothing served yet); ``input_metrics`` / ``output_metrics`` (scalar diagnosis of the
    valid input / the would-be output); ``artefact`` (the artefact test, None without metadata or label columns);
    ``clusters`` (the mixture check, or why it was skipped); ``recommendation``; ``evidence`` (``labelled`` |
    ``label_free``); ``evaluation`` (the held-out evaluation or the quality gate's record); ``applied``;
    ``neighbour_overlap``; ``neighbour_overlap_from`` (the run that measured it, when an incremental night with the
    same transform and only appended rows carries it over; None: measured by this run); ``output_sums`` (:class:`OutputSums` of the would-be output); ``index`` (:func:`jobs.index.index_stage`'s record); ``found_by`` (a killed run: the run
    that found it dead).
    """

    run_id: str
    started_at: str
    host: str
    pid: int
    config_hash: str
    input: InputVersion
    output: OutputVersions
    finished_at: str | None = None
    status: str = STARTED
    mode: str | None = None
    mode_reason: str | None = None
    reason: str | None = None
    counts: Counts = dataclasses.field(default_factory=Counts)
    stages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    serving_artifact: ServingArtifact | None = None
    input_metrics: dict[str, int | float] | None = None
    output_metrics: dict[str, int | float] | None = None
    artefact: ArtefactEvidence | None = None
    clusters: dict[str, Any] | None = None
    recommendation: Recommendation | None = None
    evidence: str | None = None
    evaluation: dict[str, Any] | None = None
    applied: Applied | None = None
    neighbour_overlap: NeighbourOverlap | None = None
    neighbour_overlap_from: str | None = None
    output_sums: OutputSums | None = None
    index: dict[str, Any] | None = None
    found_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready record: every field (nested records as objects), NaN/Inf replaced by None
        (:func:`json_safe`)."""
        return json_safe(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        """The record :meth:`to_json` gave (a missing key takes its default; an unknown key is a TypeError)."""
        fields = dict(data)
        for key, kind in NESTED.items():
            if fields.get(key) is not None:
                fields[key] = kind(**fields[key])
        return cls(**fields)


NESTED = {
    "input": InputVersion,
    "output": OutputVersions,
    "counts": Counts,
    "serving_artifact": ServingArtifact,
    "recommendation": Recommendation,
    "applied": Applied,
    "neighbour_overlap": NeighbourOverlap,
    "output_sums": OutputSums,
}


def new_record(config: NightlyConfig) -> RunRecord:
    """The record of a run that is starting (status ``started``; ``host`` and ``pid`` of this process, by which a
    later run tells whether it is still alive)."""
    return RunRecord(
        run_id=uuid.uuid4().hex,
        started_at=now(),
        host=socket.gethostname(),
        pid=os.getpid(),
        config_hash=nightly_config_hash(config),
        input=InputVersion(config.input),
        output=OutputVersions(config.output),
    )


def json_safe(value: Any) -> Any:
    """``value`` with every NaN/Inf float (an undefined metric) replaced by None, so the record is valid JSON, and
    every enum member (a :class:`~anisotropy_core.methods.Method`) as its plain value."""
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def start_record(spark: SparkSession, config: NightlyConfig, rec: RunRecord) -> list[RunRecord]:
    """Write ``rec`` (status ``started``) and mark every earlier run that never finished and is dead
    (:func:`dead_runs`) ``killed``, with the reason; returns those records."""
    dead = dead_runs(config, rec)
    for old in dead:
        log.warning("run %s: %s", old.run_id, old.reason)
    write_records(spark, config, [rec, *dead])
    return dead


def write_record(spark: SparkSession, config: NightlyConfig, rec: RunRecord) -> None:
    """The final record of a run (``finished_at`` now) in ``runs_dir`` and the ``runs_table``."""
    rec.finished_at = now()
    write_records(spark, config, [rec])


def dead_runs(config: NightlyConfig, current: RunRecord) -> list[RunRecord]:
    """The records in ``runs_dir`` still ``started`` (other than ``current``'s) whose run is dead, each as it is to
    be written: status ``killed``, ``finished_at`` = now (when it was found dead), ``reason`` saying why, and
    ``found_by`` = ``current``'s run id. Dead: started on this host by a process that no longer exists, or started
    more than ``stale_run_hours`` ago (a run on another host, or a reused process id)."""
    found, moment = [], datetime.datetime.fromisoformat(current.started_at)
    for path in storage.list_files(config.runs_dir):
        name = path.rsplit("/", 1)[-1]
        if not name.endswith(".json") or name.startswith(".tmp-"):
            continue
        try:
            rec = RunRecord.from_json(json.loads(storage.read_text(path)))
        except (OSError, ValueError, TypeError) as exc:
            log.warning("run record %s unreadable (%s): skipped", path, exc)
            continue
        if rec.status != STARTED or rec.run_id == current.run_id:
            continue
        why = why_dead(rec, current.host, moment, config.stale_run_hours)
        if why is not None:
            found.append(
                dataclasses.replace(
                    rec,
                    status=KILLED,
                    finished_at=now(),
                    found_by=current.run_id,
                    reason=f"no final record: {why}; marked killed by run {current.run_id}",
                )
            )
    return found


def why_dead(rec: RunRecord, host: str, moment: datetime.datetime, stale_hours: float) -> str | None:
    """Why the ``started`` run ``rec`` cannot still be running at ``moment`` (seen from ``host``), or None."""
    if rec.host == host and isinstance(rec.pid, int) and not process_exists(rec.pid):
        return f"its process {rec.pid} on {host} has ended"
    hours = (moment - datetime.datetime.fromisoformat(rec.started_at)).total_seconds() / 3600
    if hours > stale_hours:
        return f"it started {hours:.1f} h ago (stale_run_hours: {stale_hours:g}) on {rec.host}"
    return None


def process_exists(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (signal 0: nothing is sent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def runs_row(rec: dict, text: str) -> tuple:
    """The ``runs_table`` row (:data:`RUNS_SCHEMA`) of a record's :meth:`RunRecord.to_json` ``rec``, written as
    ``text``."""
    stamp = datetime.datetime.fromisoformat
    return (
        rec["run_id"],
        stamp(rec["started_at"]),
        rec["finished_at"] and stamp(rec["finished_at"]),
        rec["status"],
        rec["mode"],
        rec["reason"],
        rec["input"]["path"],
        rec["input"]["version"],
        rec["output"]["path"],
        rec["output"].get("version"),
        (rec["recommendation"] or {}).get("method"),
        (rec["applied"] or {}).get("method"),
        (rec["applied"] or {}).get("transform_version"),
        json.dumps(rec["evaluation"], sort_keys=True) if rec.get("evaluation") else None,
        text,
    )


def read_record(config: NightlyConfig, run_id: str) -> RunRecord | None:
    """The record of run ``run_id`` in ``runs_dir``; None when it is missing or unreadable."""
    try:
        return RunRecord.from_json(json.loads(storage.read_text(storage.join(config.runs_dir, f"{run_id}.json"))))
    except (OSError, ValueError, TypeError):
        return None


def write_records(spark: SparkSession, config: NightlyConfig, records: list[RunRecord]) -> None:
    """Each record as ``runs_dir/<run_id>.json`` (replacing the run's earlier record) and, with a ``runs_table``,
    upserted on ``run_id`` in ONE Delta commit (a MERGE, or the append that creates the table); a concurrent run's
    commit is retried."""
    rows = []
    for rec in records:
        data = rec.to_json()
        text = json.dumps(data, indent=2, sort_keys=True, default=str, allow_nan=False)
        storage.write_atomic(storage.join(config.runs_dir, f"{rec.run_id}.json"), text)
        rows.append(runs_row(data, text))
    if not config.runs_table:
        return
    for attempt in range(WRITE_ATTEMPTS):
        try:
            upsert_runs(spark, config.runs_table, rows)
            return
        except Exception as exc:  # noqa: BLE001
            if attempt == WRITE_ATTEMPTS - 1 or not is_delta_conflict(exc):
                raise
            time.sleep(random.uniform(0.2, 1.0) * (attempt + 1))


def upsert_runs(spark: SparkSession, path: str, rows: list[tuple]) -> None:
    """MERGE ``rows`` into the runs table on ``run_id`` (new columns of :data:`RUNS_SCHEMA` are added), or create it."""
    source = spark.createDataFrame(rows, RUNS_SCHEMA)
    if not is_delta_table(spark, path):
        source.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
        return
    with session_conf(spark, {"spark.databricks.delta.schema.autoMerge.enabled": "true"}):
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(source.alias("s"), "t.run_id = s.run_id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )


def applied_summary(rec: RunRecord) -> dict:
    """What a run applied and the evidence behind it, from its record: ``{"status", "method", "candidate", "params",
    "evidence" ("labelled" | "label_free"), "metric", "delta_vs_raw" ({mean, low, high} of the selection metric on
    held-out queries or pairs, None label-free), "neighbour_overlap" (mean share of raw top-k kept, or None),
    "reason"}``."""
    applied, evaluation = rec.applied, rec.evaluation or {}
    metric, chosen = evaluation.get("metric"), evaluation.get("chosen") or ("applied" if evaluation else None)
    delta = ((evaluation.get("intervals") or {}).get(chosen) or {}).get("delta_vs_raw") or {}
    return {
        "status": rec.status,
        "method": applied and applied.method,
        "candidate": (applied and applied.candidate) or chosen,
        "params": applied and applied.params,
        "evidence": rec.evidence,
        "metric": metric,
        "delta_vs_raw": delta.get(metric),
        "neighbour_overlap": rec.neighbour_overlap and rec.neighbour_overlap.mean,
        "reason": rec.reason,
    }


def applied_text(summary: dict) -> str:
    """One line: what was applied, its Δ ± interval against raw and its neighbour overlap (or "unverified")."""
    delta = summary["delta_vs_raw"]
    evidence = (
        f"Δ {summary['metric']} vs raw {delta['mean']:+.4f} [95 % CI {delta['low']:+.4f}, {delta['high']:+.4f}] "
        "on held-out queries"
        if delta
        else "unverified: no labelled queries or pairs"
    )
    overlap = summary["neighbour_overlap"]
    return f"applied {summary['candidate'] or summary['method']} (method {summary['method']}): {evidence}" + (
        f"; neighbour overlap {overlap:.3f}" if overlap is not None else ""
    )
