"""Nightly rebuild: diagnose → decide → fit (or reuse) → apply → diagnose output → gate → publish, one command.

    python -m jobs.nightly --conf conf/nightly.yaml [--key-name VALUE ...] [--rollback-to VERSION]
    spark-submit --jars "$(ls .jars/*.jar | paste -sd,)" jobs/nightly.py --conf conf/nightly.yaml

Stages (each logged with row counts and seconds; long Spark stages log task progress every 15 s):

1. **read** the input Delta table pinned to its latest version at start.
   **no-op check**: if the output's current state (its latest commit, or the version a RESTORE went back to)
   was built from this input version with this config (hash), the run stops here: status ``noop``.
2. **validate** (invalid rows quarantined with a reason, or an error — see ``anisotropy_spark.io``).
3. **diagnose** the valid rows (one moments pass, tree-reduced) + the u1 artefact test; optionally k-means
   per-cluster diagnostics (``mixture_check``).
4. **decide**: :func:`anisotropy_core.decision.recommend`. ``method: auto`` applies it; an explicit method is
   applied as configured and the recommendation is still recorded.
5. **fit** the transform, or **reuse** the last published artifact when ``refit: on_drift`` and the input's
   diagnosis moved by no more than ``drift`` (per metric, absolute) since that artifact's fit, with the same
   method, dimension and fit parameters. Artifacts live in ``artifacts_dir/<transform_version>/``.
6. **apply** (Arrow batches through numpy). Full mode: all valid rows. **Incremental** mode — the transform is
   reused, the output holds the previous input version, and every input commit since is an append — only
   the appended rows are transformed and MERGEd on id.
7. **diagnose_output**, then the **gate**: the (would-be) output holds exactly the input's valid rows (count,
   unique ids, same id set), every vector finite with the transform's output dimension, and every
   ``output_bounds`` metric inside its [low, high]. Otherwise nothing is published and the job exits 3.
8. **publish** as ONE Delta commit (overwrite, or MERGE in incremental mode) whose ``userMetadata`` holds
   the run id, input path + version, transform version, artifact, method, config hash and a publish
   sequence number; the commit is also an idempotent write (``txnAppId`` = ``app_id``, ``txnVersion`` =
   sequence), so of two concurrent runs exactly one commits and the other exits 4. Earlier versions stay
   readable by time travel; ``--rollback-to VERSION`` RESTOREs one (recorded in its commit metadata).

Every run (published, noop, rejected, failed, rolled back) is recorded as ``runs_dir/<run_id>.json`` and a
row of the Delta ``runs_table``: the recommendation, what was applied, counts, metrics, stage timings.

Exit codes: 0 published / no-op / rolled back; 2 config error; 3 gate rejected; 4 lost a concurrent
publish; 5 invalid input rows (``on_invalid: error``); 1 anything else.

Fault-injection hooks (tests only; environment variables read on the driver):
``ANISOTROPY_FAIL_TASK_ONCE=DIR`` — the first attempt of partition 0 of the input-diagnosis pass writes a
marker in DIR and raises (Spark must retry it); ``ANISOTROPY_FAIL_AFTER_STAGE=NAME`` — ``os._exit(137)``
right after stage NAME (a kill); ``ANISOTROPY_PUBLISH_BARRIER=DIR:N`` — wait before publishing until N runs
have reached that point (forces two runs to race for the commit).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import sys
import threading
import time
import uuid
from typing import Any, Iterator, Literal

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa
from pyspark import StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from anisotropy_core.artifact import Artifact, load_artifact, save_artifact
from anisotropy_core.diagnostics import plain_scalar
from anisotropy_core.decision import DecisionThresholds, Recommendation, recommend
from anisotropy_spark.diagnostics import diagnose_dataframe, u1_artefact_test
from anisotropy_spark.estimators import CorrectionModel
from anisotropy_spark.io import InvalidRowsError, TableRef, as_vector_array, is_delta_table, read_table, validate
from anisotropy_spark.kmeans import ClusterRecenterEstimator, fit_kmeans, spark_cluster_diagnostics
from anisotropy_spark.session import get_spark
from jobs.apply import VERSION_COLUMN
from jobs.config import ConfigError, config_hash, parse_args, quarantine_problems
from jobs.fit import FitConfig, estimator_for

log = logging.getLogger("anisotropy.nightly")

# the scalar numbers of anisotropy_core.diagnose (what drift thresholds and output bounds may name)
CORE_METRICS = ("n", "d", "offset_ratio", "anisotropy_A", "isotropic_sd", "top1_var", "top10_var",
                "effective_rank", "erank_frac", "mean_norm_ratio", "raw_top1_share", "numerical_rank",
                "mp_lower", "mp_upper", "mp_above_upper", "power_law_alpha")

METHODS = ("auto", "none", "center", "abtt", "whitening", "cluster_recenter")
CLUSTER_COLUMN = "cluster_id"
FIT_REPORT = "fit_report.json"
PROGRESS_SECONDS = 15.0
EXIT = {"published": 0, "noop": 0, "rolled_back": 0, "config_error": 2, "gate_rejected": 3,
        "concurrent_publish": 4, "invalid_input": 5, "failed": 1}


class GateError(RuntimeError):
    """The would-be output failed the publication gate; ``problems`` lists every failed check."""

    def __init__(self, problems: list[str]):
        super().__init__("gate rejected the output: " + "; ".join(problems))
        self.problems = problems


class ConcurrentPublishError(RuntimeError):
    """Another run published to the output while this one was running; this run published nothing."""


@dataclasses.dataclass
class NightlyConfig:
    """Settings of the nightly job (conf/nightly.yaml); see that file for what each key means."""

    input: str
    output: str
    vector_col: str = "vector"
    id_col: str = "id"
    output_vector_col: str | None = None
    output_dtype: Literal["same", "float32", "float64"] = "same"
    dimension: int | None = None
    metadata_cols: list[str] = dataclasses.field(default_factory=list)
    label_col: str | None = None
    on_invalid: Literal["error", "quarantine"] = "quarantine"
    quarantine_path: str | None = None
    method: Literal["auto", "none", "center", "abtt", "whitening", "cluster_recenter"] = "auto"
    abtt_D: int | None = None
    whitening_k: int | None = None
    whitening_shrinkage: float = 0.0
    whitening_normalize: bool = False
    cluster_k: int = 8
    cluster_D: int = 0
    cluster_metric: Literal["euclidean", "cosine"] = "euclidean"
    mixture_check: bool = False
    seed: int = 0
    decision: DecisionThresholds = dataclasses.field(default_factory=DecisionThresholds)
    refit: Literal["always", "on_drift"] = "on_drift"
    drift: dict[str, float] = dataclasses.field(default_factory=lambda: {
        "offset_ratio": 0.05, "anisotropy_A": 0.05, "top1_var": 0.05, "erank_frac": 0.05})
    incremental: bool = True
    output_bounds: dict[str, list] = dataclasses.field(default_factory=dict)
    artifacts_dir: str = "out/nightly/transforms"
    runs_dir: str = "out/nightly/runs"
    runs_table: str | None = "out/nightly/runs_table"
    app_id: str = "anisotropy-nightly"
    master: str | None = None

    @property
    def out_col(self) -> str:
        return self.output_vector_col or self.vector_col

    def check(self) -> list[str]:
        """Static problems (no data needed); :func:`check_against_data` adds k ≤ n, D < d, k ≤ d."""
        problems = []
        if os.path.abspath(self.input) == os.path.abspath(self.output):
            problems.append("output must differ from input")
        problems += quarantine_problems(self)
        if self.dimension is not None and self.dimension < 1:
            problems.append(f"dimension must be >= 1, got {self.dimension}")
        if self.abtt_D is not None and (self.abtt_D < 0 or self.dimension and self.abtt_D >= self.dimension):
            problems.append(f"abtt_D={self.abtt_D} must satisfy 0 <= abtt_D < dimension={self.dimension}")
        if self.whitening_k is not None and (self.whitening_k < 1 or self.dimension and self.whitening_k > self.dimension):
            problems.append(f"whitening_k={self.whitening_k} must satisfy 1 <= whitening_k <= dimension={self.dimension}")
        if not 0.0 <= self.whitening_shrinkage <= 1.0:
            problems.append(f"whitening_shrinkage must be in [0, 1], got {self.whitening_shrinkage}")
        if self.cluster_k < 1 or self.cluster_D < 0:
            problems.append(f"cluster_k must be >= 1 and cluster_D >= 0, got {self.cluster_k}, {self.cluster_D}")
        if self.out_col in (VERSION_COLUMN, CLUSTER_COLUMN, self.id_col):
            problems.append(f"output_vector_col may not be {self.out_col!r}")
        for key, value in self.drift.items():
            if key not in CORE_METRICS or not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                problems.append(f"drift.{key}: expected a metric of {CORE_METRICS} with a number >= 0, got {value!r}")
        for key, bounds in self.output_bounds.items():
            if key not in CORE_METRICS:
                problems.append(f"output_bounds.{key}: unknown metric; known: {CORE_METRICS}")
            elif not _valid_bounds(bounds):
                problems.append(f"output_bounds.{key}: expected [low, high] (numbers or null, low <= high), got {bounds!r}")
        return problems


def _valid_bounds(bounds: Any) -> bool:
    if not isinstance(bounds, list) or len(bounds) != 2:
        return False
    if any(b is not None and (isinstance(b, bool) or not isinstance(b, (int, float))) for b in bounds):
        return False
    return None in bounds or bounds[0] <= bounds[1]


def check_against_data(config: NightlyConfig, n: int, d: int, method: str) -> None:
    """Raise :class:`ConfigError` naming the key when a setting is impossible for n valid rows of dimension d."""
    problems = []
    if config.abtt_D is not None and not config.abtt_D < min(d, n):
        problems.append(f"abtt_D={config.abtt_D} must be < d={d} and < n={n}")
    if config.whitening_k is not None and config.whitening_k > d:
        problems.append(f"whitening_k={config.whitening_k} exceeds the dimension d={d}")
    if (method == "cluster_recenter" or config.mixture_check) and config.cluster_k > n:
        problems.append(f"cluster_k={config.cluster_k} exceeds the number of valid rows n={n}")
    if problems:
        raise ConfigError(f"{config.input}: " + "; ".join(problems))


# ----------------------------------------------------------------------------------------- the output's state


@dataclasses.dataclass
class OutputState:
    """The output table as this job sees it: latest ``version`` (None: no table), the job metadata of the
    state that version shows (``meta``: the latest publish, or the publish a RESTORE went back to; None if
    unknown), and the highest publish sequence number ever committed (``max_seq``, -1 if none)."""

    version: int | None
    meta: dict | None
    max_seq: int


def _parse_meta(text: str | None) -> dict | None:
    try:
        meta = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return meta if isinstance(meta, dict) and ("run_id" in meta) else None


def state_meta(meta: dict | None) -> dict | None:
    """The publish metadata describing the table state a commit left: a RESTORE commit carries it as ``restored``."""
    if meta and "rollback_to" in meta:
        return meta.get("restored")
    return meta


def output_state(spark: SparkSession, path: str) -> OutputState:
    """Read the output's Delta history (userMetadata of every commit)."""
    if not is_delta_table(path):
        return OutputState(None, None, -1)
    from delta.tables import DeltaTable

    rows = DeltaTable.forPath(spark, path).history().select("version", "userMetadata").collect()
    rows.sort(key=lambda r: r["version"], reverse=True)
    metas = [_parse_meta(r["userMetadata"]) for r in rows]
    seqs = [m["seq"] for m in metas if m and isinstance(m.get("seq"), int)]
    return OutputState(int(rows[0]["version"]), state_meta(metas[0]), max(seqs, default=-1))


def meta_at(spark: SparkSession, path: str, version: int) -> dict | None:
    """The publish metadata describing the table state at ``version``."""
    from delta.tables import DeltaTable

    row = (DeltaTable.forPath(spark, path).history().where(F.col("version") == version)
           .select("userMetadata").first())
    if row is None:
        raise ConfigError(f"--rollback-to {version}: {path} has no version {version}")
    return state_meta(_parse_meta(row["userMetadata"]))


def only_appends(spark: SparkSession, path: str, after: int, upto: int) -> bool:
    """True when every commit of the Delta table ``path`` in (after, upto] only appended rows."""
    from delta.tables import DeltaTable

    rows = (DeltaTable.forPath(spark, path).history()
            .where((F.col("version") > after) & (F.col("version") <= upto))
            .select("version", "operation", "operationParameters").collect())
    if len(rows) != upto - after:
        return False   # history truncated (log retention): cannot prove append-only
    return all(r["operation"] in ("WRITE", "STREAMING UPDATE")
               and (r["operationParameters"] or {}).get("mode", r["operationParameters"].get("outputMode")) == "Append"
               for r in rows)


# ---------------------------------------------------------------------------------------------- stage helpers


class Run:
    """Per-run bookkeeping: the JSON-ready ``record`` and the :meth:`stage` timer/logger."""

    def __init__(self, spark: SparkSession, config: NightlyConfig, run_id: str | None = None):
        self.spark = spark
        self.config = config
        self.record: dict[str, Any] = {
            "run_id": run_id or uuid.uuid4().hex, "started_at": _now(), "status": "running", "mode": None,
            "reason": None, "config_hash": nightly_config_hash(config),
            "input": {"path": config.input, "version": None}, "output": {"path": config.output},
            "counts": {}, "recommendation": None, "applied": None, "stages": []}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[dict]:
        """Time a stage; the body may set ``info["rows"]``. Logs start/end and Spark task progress."""
        info: dict[str, Any] = {"name": name}
        log.info("stage %s: start", name)
        start = time.perf_counter()
        stop = threading.Event()
        watcher = threading.Thread(target=_progress, args=(self.spark, name, stop), daemon=True)
        watcher.start()
        try:
            yield info
        finally:
            stop.set()
            info["seconds"] = round(time.perf_counter() - start, 3)
            self.record["stages"].append(info)
            log.info("stage %s: done in %.2fs%s", name, info["seconds"],
                     f" ({info['rows']} rows)" if "rows" in info else "")
        _fault_after(name)


def _progress(spark: SparkSession, name: str, stop: threading.Event) -> None:
    """Log running Spark stages' completed/total tasks every PROGRESS_SECONDS until ``stop``."""
    tracker = spark.sparkContext.statusTracker()
    while not stop.wait(PROGRESS_SECONDS):
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                log.info("stage %s: Spark stage %d %s — %d/%d tasks done", name, stage_id, info.name,
                         info.numCompletedTasks, info.numTasks)


def _fault_after(stage: str) -> None:
    if os.environ.get("ANISOTROPY_FAIL_AFTER_STAGE") == stage:
        log.error("ANISOTROPY_FAIL_AFTER_STAGE=%s: simulating a kill (exit 137)", stage)
        logging.shutdown()
        os._exit(137)


def fail_task_once(df: DataFrame) -> DataFrame:
    """``df`` unchanged, except that with ``ANISOTROPY_FAIL_TASK_ONCE=DIR`` the first attempt of partition 0
    writes ``DIR/failed-once`` and raises inside the task (fused into the next pass's Spark stage)."""
    marker_dir = os.environ.get("ANISOTROPY_FAIL_TASK_ONCE")
    if not marker_dir:
        return df

    def passthrough(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            with open(os.path.join(marker_dir, "failed-once"), "a", encoding="utf-8") as handle:
                handle.write(f"stage {ctx.stageId()} partition 0 attempt 0\n")
            raise RuntimeError("ANISOTROPY_FAIL_TASK_ONCE: injected failure of the first task attempt")
        yield from batches

    return df.mapInArrow(passthrough, df.schema)


def _barrier() -> None:
    spec = os.environ.get("ANISOTROPY_PUBLISH_BARRIER")
    if not spec:
        return
    folder, count = spec.rsplit(":", 1)
    with open(os.path.join(folder, uuid.uuid4().hex), "w", encoding="utf-8"):
        pass
    deadline = time.time() + 300
    while len(os.listdir(folder)) < int(count) and time.time() < deadline:
        time.sleep(0.2)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


# settings that say where things go or how a run is gated, not what the published vectors are
NON_CONTENT_KEYS = ("master", "runs_dir", "runs_table", "artifacts_dir", "quarantine_path", "app_id", "output_bounds")


def nightly_config_hash(config: NightlyConfig) -> str:
    """Hash of the settings that determine the published content (``NON_CONTENT_KEYS`` left out), so moving
    the run records or tightening the gate does not turn a no-op night into a rebuild."""
    return config_hash(dataclasses.replace(config, **{k: None for k in NON_CONTENT_KEYS}))


def metrics_of(report: dict) -> dict:
    """The CORE_METRICS of a diagnose() report as plain Python numbers."""
    return {k: plain_scalar(report[k]) for k in CORE_METRICS}


# ---------------------------------------------------------------------------------------------- fit / reuse


def fit_params(config: NightlyConfig, method: str, rec: Recommendation) -> dict:
    """The hyper-parameters a fit of ``method`` uses: config values, else the recommendation's D / k."""
    if method == "abtt":
        D = config.abtt_D if config.abtt_D is not None else (rec.D if rec.method == "abtt" else None)
        return {"D": D, "max_D": config.decision.max_D}
    if method == "whitening":
        k = config.whitening_k if config.whitening_k is not None else (rec.k if rec.method == "whitening" else None)
        return {"k": k, "shrinkage": config.whitening_shrinkage, "normalize": config.whitening_normalize}
    if method == "cluster_recenter":
        return {"k": config.cluster_k, "D": config.cluster_D, "metric": config.cluster_metric, "seed": config.seed}
    return {}


def fit_model(config: NightlyConfig, method: str, params: dict, valid: DataFrame,
              ref: TableRef) -> CorrectionModel:
    """Fit ``method`` with ``params`` on the valid rows (adapter over jobs.fit / the ClusterRecenter estimator)."""
    if method == "cluster_recenter":
        estimator = ClusterRecenterEstimator(inputCol=config.vector_col, k=params["k"], D=params["D"],
                                             distanceMeasure=params["metric"], seed=params["seed"])
    else:
        fit_config = FitConfig(input=config.input, artifact="", method=method, vector_col=config.vector_col,
                               D=params.get("D"), max_D=params.get("max_D"), k=params.get("k"),
                               shrinkage=params.get("shrinkage", 0.0), normalize=params.get("normalize", False))
        estimator = estimator_for(fit_config)
    return estimator.fit(valid).setFittedOn(ref)


def model_from(artifact: Artifact, config: NightlyConfig) -> CorrectionModel:
    """The Spark model of ``artifact`` (its method's model class: cluster recentering also writes cluster ids)."""
    return CorrectionModel.from_artifact(artifact, config.vector_col, config.out_col)


def drift_from(config: NightlyConfig, previous: dict | None, method: str, params: dict, d: int,
               metrics: dict) -> tuple[Artifact | None, str]:
    """(the artifact to reuse or None, why). Reuse needs ``refit: on_drift``, a previously published artifact
    of the same method, dimension and fit parameters, and every ``drift`` metric within its threshold."""
    if config.refit == "always":
        return None, "refit: always"
    if not previous or not previous.get("artifact"):
        return None, "no previously published transform"
    try:
        artifact = load_artifact(previous["artifact"], expected_dimension=d)
        with open(os.path.join(previous["artifact"], FIT_REPORT), encoding="utf-8") as handle:
            fitted = json.load(handle)
    except (OSError, ValueError) as exc:
        return None, f"previous artifact unusable ({exc})"
    if fitted.get("method") != method or fitted.get("params") != params:
        return None, f"method/params changed ({fitted.get('method')} {fitted.get('params')} → {method} {params})"
    moved = {k: abs(metrics[k] - fitted["metrics"][k]) for k in config.drift}
    over = {k: v for k, v in moved.items() if v > config.drift[k]}
    if over:
        return None, "diagnosis drifted beyond thresholds: " + ", ".join(f"{k} moved {v:.4g} > {config.drift[k]}"
                                                                         for k, v in over.items())
    return artifact, "diagnosis within drift thresholds: " + ", ".join(f"{k} moved {v:.4g}" for k, v in moved.items())


def save_fit(config: NightlyConfig, model: CorrectionModel, method: str, params: dict, metrics: dict) -> str:
    """Save the fitted transform (artifact + fit_report.json) under artifacts_dir; returns its directory."""
    path = os.path.join(config.artifacts_dir, model.transform_version)
    save_artifact(path, model.transform_, model.n, model.fitted_on)
    with open(os.path.join(path, FIT_REPORT), "w", encoding="utf-8") as handle:
        json.dump({"method": method, "params": params, "metrics": metrics}, handle, indent=2, sort_keys=True)
    return path


# ---------------------------------------------------------------------------------------------- apply / gate


def apply_transform(model: CorrectionModel | None, df: DataFrame, config: NightlyConfig, version: str) -> DataFrame:
    """Output rows of ``df``: every input column, ``out_col`` = corrected vector (element type per
    ``output_dtype``), the ``transform_version`` column (and ``cluster_id`` for cluster recentering).
    ``model`` None = method none (the vectors as they are, cast when ``output_dtype`` is not ``same``)."""
    if model is None:
        vectors = F.col(config.vector_col)
        if config.output_dtype != "same":
            vectors = vectors.cast(f"array<{'float' if config.output_dtype == 'float32' else 'double'}>")
        out = df.withColumn(config.out_col, vectors)
    else:
        out = model.setOutputDtype(config.output_dtype).transform(df)
    if config.out_col != config.vector_col:
        out = out.drop(config.vector_col)
    return out.withColumn(VERSION_COLUMN, F.lit(version))


def gate(candidate: DataFrame, valid: DataFrame, config: NightlyConfig, d_out: int, out_metrics: dict | None,
         diagnose_error: str | None) -> dict:
    """Check the would-be output against the valid input rows; raise :class:`GateError` listing every failure.

    ``candidate``: the full would-be output table; ``valid``: the validated input rows. Returns the counts.
    """
    idc, vec = config.id_col, F.col(config.out_col)
    bad = F.exists(vec, lambda x: x.isNull() | F.isnan(x) | (F.abs(x) == float("inf")))
    row = candidate.agg(F.count(F.lit(1)).alias("rows"), F.countDistinct(idc).alias("ids"),
                        F.sum(F.when(vec.isNull() | (F.size(vec) != d_out), 1).otherwise(0)).alias("wrong_dim"),
                        F.sum(F.when(bad, 1).otherwise(0)).alias("non_finite")).first()
    expected = valid.count()
    missing = valid.select(idc).join(candidate.select(idc), idc, "left_anti").count()
    extra = candidate.select(idc).join(valid.select(idc), idc, "left_anti").count()
    counts = {"output_rows": int(row["rows"]), "valid_rows": int(expected), "missing_ids": missing,
              "unexpected_ids": extra, "wrong_dimension": int(row["wrong_dim"] or 0),
              "non_finite": int(row["non_finite"] or 0)}
    problems = []
    if counts["output_rows"] != expected:
        problems.append(f"output has {counts['output_rows']} rows, the input has {expected} valid rows")
    if int(row["ids"]) != counts["output_rows"]:
        problems.append(f"duplicate ids: {counts['output_rows'] - int(row['ids'])} rows share an id")
    if missing or extra:
        problems.append(f"id set differs from the input's valid rows: {missing} missing, {extra} unexpected")
    if counts["wrong_dimension"]:
        problems.append(f"{counts['wrong_dimension']} vectors do not have the transform's dimension {d_out}")
    if counts["non_finite"]:
        problems.append(f"{counts['non_finite']} vectors contain NaN/Inf")
    if diagnose_error:
        problems.append(f"output diagnosis failed: {diagnose_error}")
    for key, (low, high) in config.output_bounds.items():
        value = None if out_metrics is None else out_metrics[key]
        if value is not None and (low is not None and value < low or high is not None and value > high):
            problems.append(f"output {key} = {value:.6g} outside the bounds [{low}, {high}]")
    if problems:
        raise GateError(problems)
    return counts


# --------------------------------------------------------------------------------------------------- publish


def _commit_conf(spark: SparkSession, settings: dict[str, str]):
    """Set session confs for one Delta commit (userMetadata, idempotent-DML txn ids); unset afterwards."""

    @contextlib.contextmanager
    def scope():
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key in settings:
                spark.conf.unset(key)

    return scope()


def is_delta_conflict(exc: BaseException) -> bool:
    """True for Delta's optimistic-concurrency failures (ConcurrentAppend/Transaction/…, ProtocolChanged)."""
    text = f"{type(exc).__name__} {exc}"
    return any(marker in text for marker in ("io.delta.exceptions.Concurrent", "DELTA_CONCURRENT",
                                             "DELTA_PROTOCOL_CHANGED", "ConcurrentPublishError"))


def publish(spark: SparkSession, config: NightlyConfig, candidate: DataFrame, new_rows: DataFrame | None,
            meta: dict, start_version: int | None) -> int:
    """Commit the output once (overwrite ``candidate``, or MERGE ``new_rows`` on id); returns the new version.

    Raises :class:`ConcurrentPublishError` when the output moved since ``start_version``, when Delta reports a
    concurrent-modification conflict, or when Delta skipped the idempotent write because a concurrent run
    already committed this sequence number.
    """
    before = output_state(spark, config.output)
    if before.version != start_version:
        raise ConcurrentPublishError(f"{config.output} moved from version {start_version} to {before.version} "
                                     "while this run was computing; nothing published")
    text = json.dumps(meta, sort_keys=True, default=str)
    try:
        if new_rows is None:
            (candidate.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
             .option("txnAppId", config.app_id).option("txnVersion", meta["seq"]).option("userMetadata", text)
             .save(config.output))
        else:
            from delta.tables import DeltaTable

            with _commit_conf(spark, {"spark.databricks.delta.commitInfo.userMetadata": text,
                                      "spark.databricks.delta.write.txnAppId": config.app_id,
                                      "spark.databricks.delta.write.txnVersion": str(meta["seq"])}):
                (DeltaTable.forPath(spark, config.output).alias("t")
                 .merge(new_rows.alias("s"), f"t.`{config.id_col}` = s.`{config.id_col}`")
                 .whenNotMatchedInsertAll().execute())
    except Exception as exc:  # noqa: BLE001 — only Delta's concurrency conflicts are translated
        if is_delta_conflict(exc):
            raise ConcurrentPublishError(f"a concurrent run committed to {config.output} first: "
                                         f"{str(exc).splitlines()[0]}") from exc
        raise
    after = output_state(spark, config.output)
    if not after.meta or after.meta.get("run_id") != meta["run_id"]:
        raise ConcurrentPublishError(f"publish sequence {meta['seq']} was already committed to {config.output} by "
                                     f"run {after.meta and after.meta.get('run_id')}; Delta skipped this write")
    return int(after.version)


# ----------------------------------------------------------------------------------------------------- the job


def run_nightly(spark: SparkSession, config: NightlyConfig, run: Run | None = None) -> dict:
    """Run every stage; returns the run record (status ``published`` or ``noop``). Raises GateError,
    ConcurrentPublishError, ConfigError or InvalidRowsError (the record in ``run.record`` says how far it got)."""
    run = run or Run(spark, config)
    rec = run.record
    with run.stage("read"):
        df, ref = read_table(spark, config.input)
        if ref.format != "delta":
            raise ConfigError(f"input: {config.input} is not a Delta table (the nightly job pins a Delta version)")
        rec["input"]["version"] = ref.version
        state = output_state(spark, config.output)
        rec["output"]["previous_version"] = state.version
        previous = state.meta
    if previous and previous.get("input_path") == config.input and previous.get("input_version") == ref.version \
            and previous.get("config_hash") == rec["config_hash"]:
        rec.update(status="noop", mode="noop", reason=(
            f"output version {state.version} already holds input version {ref.version} with this config "
            f"(run {previous['run_id']}, transform {previous.get('transform_version')})"))
        rec["output"]["version"] = state.version
        log.info("no-op: %s", rec["reason"])
        return rec

    with run.stage("validate"):
        checked = validate(as_vector_array(df, config.vector_col), config.vector_col, config.id_col,
                           config.dimension, config.on_invalid, config.quarantine_path)
    return _after_validation(spark, config, run, ref, state, checked)


def _after_validation(spark, config, run, ref, state, checked) -> dict:
    rec, previous = run.record, state.meta
    valid, d = checked.valid, checked.dimension
    with run.stage("diagnose") as info:
        report = diagnose_dataframe(fail_task_once(valid), config.vector_col, d)
        artefact = u1_artefact_test(valid, config.vector_col, report, config.metadata_cols, config.label_col)
        n = int(report["n"])
        info["rows"] = n
        rec["counts"].update(valid_rows=n, invalid_rows=checked.invalid_count,
                             invalid_by_reason=checked.invalid_by_reason)
        rec["input_metrics"], rec["artefact"] = metrics_of(report), artefact
        method_hint = config.method
        check_against_data(config, n, d, method_hint)
        clusters = None
        if config.mixture_check:
            centroids = fit_kmeans(valid, config.vector_col, config.cluster_k, config.cluster_metric,
                                   seed=config.seed, dimension=d).centroids
            clusters = spark_cluster_diagnostics(valid, config.vector_col, centroids, config.cluster_metric, d)
            rec["clusters"] = {"locally_isotropic": clusters["locally_isotropic"],
                               "clusters": clusters["clusters"]}
    with run.stage("decide"):
        recommendation = recommend(report, clusters, artefact, config.decision)
        method = recommendation.method if config.method == "auto" else config.method
        rec["recommendation"] = recommendation.to_dict()
        for warning in recommendation.warnings:
            log.warning("decision: %s", warning)
        log.info("decision: recommend %s (%s); applying %s", recommendation.method,
                 "; ".join(recommendation.reasons), method)
        check_against_data(config, n, d, method)

    with run.stage("fit"):
        params = fit_params(config, method, recommendation)
        model, artifact_path, refitted, why = None, None, False, "method none: vectors published unchanged"
        if method != "none":
            reused, why = drift_from(config, previous, method, params, d, rec["input_metrics"])
            if reused is not None:
                model, artifact_path = model_from(reused, config), previous["artifact"]
            else:
                model = fit_model(config, method, params, valid, ref)
                artifact_path, refitted = save_fit(config, model, method, params, rec["input_metrics"]), True
                model.setInputCol(config.vector_col).setOutputCol(config.out_col)
        version = model.transform_version if model is not None else "none"
        d_out = model.transform_.d_out if model is not None else d
        rec["applied"] = {"method": method, "params": params, "transform_version": version,
                          "artifact": artifact_path, "refitted": refitted, "fit_reason": why,
                          "follows_recommendation": method == recommendation.method}
        log.info("fit: %s %s (%s)", "refitted" if refitted else "reused", version, why)

    incremental = _incremental_reason(spark, config, ref, previous, refitted, version)
    rec["mode"] = "incremental" if incremental else "full"
    with run.stage("apply") as info:
        if incremental:
            old_ids = read_table(spark, config.input, previous["input_version"])[0].select(config.id_col)
            new_valid = valid.join(old_ids, config.id_col, "left_anti")
            new_rows = apply_transform(model, new_valid, config, version).persist(StorageLevel.MEMORY_AND_DISK)
            existing = read_table(spark, config.output, state.version)[0]
            candidate = existing.unionByName(new_rows, allowMissingColumns=False)
            info["rows"] = new_rows.count()
        else:
            new_rows = None
            candidate = apply_transform(model, valid, config, version).persist(StorageLevel.MEMORY_AND_DISK)
            info["rows"] = candidate.count()
        rec["counts"]["rows_written"] = info["rows"]
    try:
        return _gate_and_publish(spark, config, run, ref, state, valid, candidate, new_rows, d_out, version,
                                 artifact_path, method)
    finally:
        (new_rows if new_rows is not None else candidate).unpersist()


def _incremental_reason(spark, config, ref, previous, refitted, version) -> bool:
    """Incremental mode applies when the same transform is reused on an input that only gained appended rows."""
    if not (config.incremental and previous and not refitted):
        return False
    same = (previous.get("transform_version") == version and previous.get("input_path") == config.input
            and previous.get("config_hash") == nightly_config_hash(config)
            and isinstance(previous.get("input_version"), int) and previous["input_version"] < ref.version)
    return bool(same and only_appends(spark, config.input, previous["input_version"], ref.version))


def _gate_and_publish(spark, config, run, ref, state, valid, candidate, new_rows, d_out, version,
                      artifact_path, method) -> dict:
    rec = run.record
    with run.stage("diagnose_output") as info:
        out_metrics, error = None, None
        try:
            out_metrics = metrics_of(diagnose_dataframe(candidate, config.out_col, d_out))
        except ValueError as exc:      # e.g. a non-finite or zero-length output vector
            error = str(exc).splitlines()[0]
        rec["output_metrics"] = out_metrics
    with run.stage("gate") as info:
        rec["counts"].update(gate(candidate, valid, config, d_out, out_metrics, error))
        info["rows"] = rec["counts"]["output_rows"]
    _barrier()
    with run.stage("publish"):
        meta = {"run_id": rec["run_id"], "input_path": config.input, "input_version": ref.version,
                "transform_version": version, "artifact": artifact_path, "method": method,
                "config_hash": rec["config_hash"], "seq": state.max_seq + 1, "mode": rec["mode"]}
        rec["output"]["version"] = publish(spark, config, candidate, new_rows, meta, state.version)
    rec["status"] = "published"
    log.info("published %s version %d (%s, %s)", config.output, rec["output"]["version"], rec["mode"], version)
    return rec


def rollback(spark: SparkSession, config: NightlyConfig, version: int, run: Run) -> dict:
    """RESTORE the output to ``version`` (one commit whose userMetadata records the rollback and the restored
    publish, so the next nightly treats the restored state as current)."""
    rec = run.record
    state = output_state(spark, config.output)
    if state.version is None:
        raise ConfigError(f"--rollback-to: {config.output} is not a Delta table")
    if not 0 <= version < state.version:
        raise ConfigError(f"--rollback-to {version}: must be an earlier version, 0..{state.version - 1}")
    restored = meta_at(spark, config.output, version)
    meta = {"rollback_to": version, "run_id": rec["run_id"], "restored": restored, "from_version": state.version}
    from delta.tables import DeltaTable

    with run.stage("rollback"):
        with _commit_conf(spark, {"spark.databricks.delta.commitInfo.userMetadata": json.dumps(meta, default=str)}):
            DeltaTable.forPath(spark, config.output).restoreToVersion(version)
    after = output_state(spark, config.output)
    rec.update(status="rolled_back", mode="rollback",
               reason=f"restored version {version} (was {state.version}) as version {after.version}")
    rec["output"].update(previous_version=state.version, version=after.version)
    return rec


# ------------------------------------------------------------------------------------------------ run records


RUNS_SCHEMA = ("run_id string, started_at timestamp, finished_at timestamp, status string, mode string, "
               "reason string, input_path string, input_version long, output_path string, output_version long, "
               "method_recommended string, method_applied string, transform_version string, record string")


def write_record(spark: SparkSession, config: NightlyConfig, rec: dict) -> None:
    """The run record as ``runs_dir/<run_id>.json`` and one appended row of the Delta ``runs_table``."""
    rec["finished_at"] = _now()
    os.makedirs(config.runs_dir, exist_ok=True)
    text = json.dumps(rec, indent=2, sort_keys=True, default=str)
    with open(os.path.join(config.runs_dir, f"{rec['run_id']}.json"), "w", encoding="utf-8") as handle:
        handle.write(text)
    if not config.runs_table:
        return
    stamp = datetime.datetime.fromisoformat
    row = (rec["run_id"], stamp(rec["started_at"]), stamp(rec["finished_at"]), rec["status"], rec["mode"],
           rec["reason"], rec["input"]["path"], rec["input"]["version"], rec["output"]["path"],
           rec["output"].get("version"), (rec["recommendation"] or {}).get("method"),
           (rec["applied"] or {}).get("method"), (rec["applied"] or {}).get("transform_version"), text)
    for attempt in range(3):      # blind appends conflict only while two runs create the table at once
        try:
            spark.createDataFrame([row], RUNS_SCHEMA).write.format("delta").mode("append").save(config.runs_table)
            return
        except Exception as exc:  # noqa: BLE001
            if attempt == 2 or not is_delta_conflict(exc):
                raise


def parse_cli(argv: list[str] | None) -> tuple[NightlyConfig, int | None]:
    """``--rollback-to VERSION`` plus the config flags of :func:`jobs.config.parse_args`."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--rollback-to", type=int, default=None, metavar="VERSION",
                     help="RESTORE the output table to this Delta version and exit")
    known, rest = pre.parse_known_args(argv)
    config, _ = parse_args(NightlyConfig, rest, "Nightly rebuild of the corrected embedding table "
                                                "(--rollback-to VERSION restores an earlier output version)")
    return config, known.rollback_to


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config, rollback_to = parse_cli(argv)
    except ConfigError as exc:
        log.error("config error: %s", exc)
        return EXIT["config_error"]
    spark = get_spark("anisotropy-nightly", master=config.master)
    run = Run(spark, config)
    status = "failed"
    try:
        record = rollback(spark, config, rollback_to, run) if rollback_to is not None else run_nightly(spark, config, run)
        status = record["status"]
    except ConfigError as exc:
        status, run.record["reason"] = "config_error", str(exc)
    except GateError as exc:
        status, run.record["reason"] = "gate_rejected", str(exc)
    except ConcurrentPublishError as exc:
        status, run.record["reason"] = "concurrent_publish", str(exc)
    except InvalidRowsError as exc:
        status, run.record["reason"] = "invalid_input", str(exc)
    except Exception as exc:  # noqa: BLE001 — recorded, then re-raised for the traceback
        if not is_delta_conflict(exc):
            run.record.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
            write_record(spark, config, run.record)
            raise
        # e.g. two first runs creating the quarantine table at once: the other run won; nothing published
        status, run.record["reason"] = "concurrent_publish", f"a concurrent run won: {str(exc).splitlines()[0]}"
    run.record["status"] = status
    write_record(spark, config, run.record)
    (log.info if EXIT[status] == 0 else log.error)("nightly %s: %s", status, run.record["reason"] or "")
    print(json.dumps({k: run.record[k] for k in ("run_id", "status", "mode", "reason", "input", "output")},
                     default=str))
    return EXIT[status]


if __name__ == "__main__":
    sys.exit(main())
