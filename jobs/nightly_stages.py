"""The stages of the nightly job. Each is a function of the one :class:`NightlyContext`, reading what earlier
stages left there and adding its own results; :mod:`jobs.nightly` runs them in order.

read → validate → diagnose → decide → evaluate → fit (or reuse) → apply → diagnose_output → gate → publish.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from anisotropy_core.artifact import ArtifactError
from anisotropy_core.clustering import ClusterRecenter, cluster_diagnostics
from anisotropy_core.decision import Recommendation, recommend
from anisotropy_core.diagnostics import Diagnosis, diagnose as diagnose_moments
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import FittedTransform
from anisotropy_spark.diagnostics import diagnose_dataframe, u1_artefact_test
from anisotropy_spark.estimators import CorrectionModel
from anisotropy_spark.io import TableRef, ValidatedInput, as_vector_array, read_table, validate
from anisotropy_spark.kmeans import fit_cluster_recenter
from anisotropy_spark.output_files import file_count, scan_bytes
from anisotropy_spark.publish import OutputState, PublishTarget, only_appends, output_state, publish
from anisotropy_spark.quarantine import DUPLICATE_ID
from anisotropy_spark.table_files import table_files
from jobs import evaluation
from jobs.apply import VERSION_COLUMN
from jobs.config import ConfigError
from jobs.fit_or_reuse import (candidate_fit, fit_model, fit_params, mark_rejected, model_from, model_of, reusable,
                               save_fit, serving_artifact)
from jobs.gate import GateError, gate
from jobs.nightly_config import NightlyConfig, check_against_data
from jobs.run_records import json_safe

log = logging.getLogger("anisotropy.nightly")


@dataclasses.dataclass
class NightlyContext:
    """Everything one run knows, filled in stage by stage. ``record`` is the JSON-ready run record;
    ``cleanup`` releases cached data when the run ends; ``finished`` stops the run early (no-op)."""

    spark: SparkSession
    config: NightlyConfig
    record: dict[str, Any]
    cleanup: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)
    finished: bool = False
    ref: TableRef | None = None
    input_df: DataFrame | None = None
    state: OutputState | None = None
    checked: ValidatedInput | None = None
    valid: DataFrame | None = None
    moments: Moments | None = None
    report: Diagnosis | None = None
    artefact: dict | None = None
    clusters: dict | None = None
    cluster_recenter: ClusterRecenter | None = None
    recommendation: Recommendation | None = None
    evaluation: dict | None = None
    chosen: str | None = None
    chosen_transform: FittedTransform | None = None
    method: str = "none"
    model: CorrectionModel | None = None
    transform_version: str = "none"
    d_out: int = 0
    refitted: bool = False
    candidate: DataFrame | None = None
    new_rows: DataFrame | None = None
    output_metrics: dict | None = None
    output_error: str | None = None
    output_files: int | None = None

    @property
    def previous(self) -> dict | None:
        """The publish metadata of the output's current state (None: nothing published yet)."""
        return self.state.meta if self.state else None


def read(ctx: NightlyContext, info: dict) -> None:
    """Pin the input's latest Delta version and verify the artifact the output is served with
    (:func:`check_serving`); stop (no-op) when the output already holds that input version with this config and
    its artifact passed the check. A failed check is no no-op: the run refits (the fit stage cannot reuse the
    artifact) and republishes, the record saying why."""
    config, rec = ctx.config, ctx.record
    ctx.input_df, ctx.ref = read_table(ctx.spark, config.input)
    if ctx.ref.format != "delta":
        raise ConfigError(f"input: {config.input} is not a Delta table (the nightly job pins a Delta version)")
    rec["input"]["version"] = ctx.ref.version
    ctx.state = output_state(ctx.spark, config.output)
    rec["output"]["previous_version"] = ctx.state.version
    previous = ctx.previous
    problem = check_serving(ctx)
    if previous and previous.get("input_path") == config.input and previous.get("input_version") == ctx.ref.version \
            and previous.get("config_hash") == rec["config_hash"]:
        if problem is not None:
            rec["reason"] = (f"not a no-op: output version {ctx.state.version} already holds input version "
                             f"{ctx.ref.version}, but its artifact failed the check ({problem}): refit and republish")
            log.warning("%s", rec["reason"])
            return
        rec.update(status="noop", mode="noop", reason=(
            f"output version {ctx.state.version} already holds input version {ctx.ref.version} with this config "
            f"(run {previous['run_id']}, transform {previous.get('transform_version')}, artifact verified)"))
        rec["output"]["version"] = ctx.state.version
        ctx.finished = True


def check_serving(ctx: NightlyContext) -> str | None:
    """Load and verify the artifact of the output's current state (:func:`jobs.fit_or_reuse.serving_artifact`:
    its content hash, and the transform version its rows carry); record the result as ``serving_artifact``
    ({path, transform_version, verified[, problem]}; None when the state has no artifact). Returns the problem,
    or None."""
    previous = ctx.previous or {}
    if not previous.get("artifact"):
        ctx.record["serving_artifact"] = None
        return None
    checked = {"path": previous["artifact"], "transform_version": previous.get("transform_version")}
    try:
        serving_artifact(previous)
    except ArtifactError as exc:
        ctx.record["serving_artifact"] = {**checked, "verified": False, "problem": str(exc)}
        return str(exc)
    ctx.record["serving_artifact"] = {**checked, "verified": True}
    return None


def validate_input(ctx: NightlyContext, info: dict) -> None:
    """Quarantine (with a reason, the run id and the input version) or refuse the invalid rows and every copy
    of a duplicated id, in the pass that also merges the valid rows' moments for :func:`diagnose` (read by pyarrow
    from the data files where it can: ``vector_reader``, :mod:`anisotropy_spark.table_files`); see
    :func:`anisotropy_spark.io.validate`."""
    config = ctx.config
    files, planned = table_files(ctx.spark, ctx.input_df, ctx.ref.path, ctx.ref.format, config.vector_col, None,
                                 config.vector_reader)
    ctx.checked = validate(as_vector_array(ctx.input_df, config.vector_col), config.vector_col, config.id_col,
                           config.dimension, config.on_invalid, config.quarantine_path,
                           run_id=ctx.record["run_id"], input_version=ctx.ref.version, with_moments=True, files=files)
    ctx.valid, ctx.moments = ctx.checked.valid, ctx.checked.moments
    info["rows"], info["reader"] = ctx.moments.n + ctx.checked.invalid_count, ctx.checked.reader if files else planned
    ctx.record["counts"].update(invalid_rows=ctx.checked.invalid_count,
                                invalid_by_reason=ctx.checked.invalid_by_reason)


def diagnose(ctx: NightlyContext, info: dict) -> None:
    """The diagnosis of the validation pass's moments + the per-direction artefact test; with ``mixture_check``,
    k-means, the per-cluster diagnostics and (from the same pass) the cluster_recenter candidate."""
    config, rec, d = ctx.config, ctx.record, ctx.checked.dimension
    ctx.report = diagnose_moments(ctx.moments)
    ctx.artefact = u1_artefact_test(ctx.valid, config.vector_col, ctx.report, config.metadata_cols, config.label_col,
                                    config.artefact_directions)
    info["rows"] = ctx.report.n
    rec["counts"]["valid_rows"] = ctx.report.n
    rec["input_metrics"], rec["artefact"] = ctx.report.scalars(), ctx.artefact
    check_against_data(config, ctx.report.n, d, config.method)
    if config.mixture_check:
        ctx.cluster_recenter, states = fit_cluster_recenter(ctx.valid, config.vector_col, d, config.cluster_k,
                                                            config.cluster_D, config.cluster_distance_measure,
                                                            config.seed, task_memory=config.cluster_task_memory)
        ctx.clusters = cluster_diagnostics(states)
        rec["clusters"] = {k: ctx.clusters[k] for k in ("locally_isotropic", "clusters")}


def decide(ctx: NightlyContext, info: dict) -> None:
    """``method: auto`` applies the recommendation (or, with an ``evaluation:`` block, the best-scoring
    candidate: see :func:`evaluate`); an explicit method is applied, the recommendation recorded."""
    rec = ctx.record
    recommendation = ctx.recommendation = recommend(ctx.report, ctx.clusters, ctx.artefact, ctx.config.decision)
    ctx.method = recommendation.method if ctx.config.method == "auto" else ctx.config.method
    rec["recommendation"] = recommendation.to_dict()
    for warning in recommendation.warnings:
        log.warning("decision: %s", warning)
    log.info("decision: recommend %s (%s); applying %s", recommendation.method,
             "; ".join(recommendation.reasons), ctx.method)
    check_against_data(ctx.config, ctx.report.n, ctx.report.d, ctx.method)


def evaluate(ctx: NightlyContext, info: dict) -> None:
    """With an ``evaluation:`` block: fit every candidate from the diagnosis's moments state (plus
    cluster_recenter under ``mixture_check``), score them all in one distributed pass
    (:func:`jobs.evaluation.score_candidates`) and, with ``method: auto``, apply the best one."""
    config = ctx.config
    if config.evaluation is None:
        return
    candidates = evaluation.fit_for_evaluation(ctx.moments, ctx.recommendation, config.decision, ctx.cluster_recenter)
    record = evaluation.score_candidates(ctx.spark, ctx.valid, config.vector_col, config.id_col, ctx.report.d,
                                         candidates, config.evaluation)
    ctx.evaluation, ctx.record["evaluation"] = record, json_safe(record)
    info["rows"] = record["queries"] or 0
    log.info("evaluation: %s by %s; raw %s", record["chosen"], record["metric"], record["raw"])
    if config.method == "auto":
        ctx.chosen, ctx.chosen_transform = record["chosen"], candidates[record["chosen"]]
        directions = evaluation.candidate_directions(ctx.moments, ctx.recommendation)
        ctx.method, _ = candidate_fit(ctx.chosen, ctx.chosen_transform, directions, config, ctx.recommendation)


def fit(ctx: NightlyContext, info: dict) -> None:
    """Reuse the last published transform when allowed (:func:`jobs.fit_or_reuse.reusable`), else fit (from the
    diagnosis's moments when the method is moment-based: no second pass) and save.
    An evaluation candidate chosen by :func:`evaluate` is already fitted: it is saved, not fitted again."""
    config, method = ctx.config, ctx.method
    if ctx.chosen is not None:
        directions = evaluation.candidate_directions(ctx.moments, ctx.recommendation)
        _, params = candidate_fit(ctx.chosen, ctx.chosen_transform, directions, config, ctx.recommendation)
    else:
        params = fit_params(config, method, ctx.recommendation)
    artifact_path, why = None, "method none: vectors published unchanged"
    if method != "none":
        reused, why = reusable(config, ctx.previous, method, params, ctx.report.d, ctx.record["input_metrics"])
        if reused is not None:
            ctx.model, artifact_path = model_from(reused, config), ctx.previous["artifact"]
        else:
            ctx.model = model_of(ctx.chosen_transform, ctx.report.n, config, ctx.ref) \
                if ctx.chosen_transform is not None \
                else fit_model(config, method, params, ctx.valid, ctx.ref, ctx.moments)
            artifact_path = save_fit(config, ctx.model, method, params, ctx.record["input_metrics"])
            ctx.refitted = True
    ctx.transform_version = ctx.model.transform_version if ctx.model is not None else "none"
    ctx.d_out = ctx.model.transform_.d_out if ctx.model is not None else ctx.report.d
    ctx.record["applied"] = {"method": method, "params": params, "transform_version": ctx.transform_version,
                             "artifact": artifact_path, "refitted": ctx.refitted, "fit_reason": why,
                             "candidate": ctx.chosen,
                             "follows_recommendation": method == ctx.recommendation.method}
    log.info("fit: %s %s (%s)", "refitted" if ctx.refitted else "reused", ctx.transform_version, why)


def full_rebuild_reason(ctx: NightlyContext) -> str | None:
    """Why this run must rewrite the whole output, or None when the incremental MERGE applies: the same
    transform, reused, on an input that since the last publish only gained appended rows of the same schema,
    and no duplicated id (a repeated id means a published row must leave the output)."""
    previous, config = ctx.previous, ctx.config
    if not config.incremental:
        return "incremental: false"
    if not previous:
        return "no previous publish"
    if ctx.refitted:
        return "the transform was refitted"
    if (previous.get("transform_version"), previous.get("input_path"), previous.get("config_hash")) != \
            (ctx.transform_version, config.input, ctx.record["config_hash"]):
        return "transform, input path or config changed since the last publish"
    before = previous.get("input_version")
    if not isinstance(before, int) or before >= ctx.ref.version:
        return f"input version {ctx.ref.version} does not follow the published input version {before}"
    if not only_appends(ctx.spark, config.input, before, ctx.ref.version):
        return f"input commits after version {before} are not all appends (delete, update or overwrite)"
    old_schema = read_table(ctx.spark, config.input, before)[0].schema
    if old_schema != ctx.input_df.schema:
        added = sorted(set(ctx.input_df.columns) - set(old_schema.fieldNames()))
        return f"input schema changed since version {before}" + (f" (added columns {added})" if added else "")
    if ctx.checked.invalid_by_reason.get(DUPLICATE_ID):
        return f"{ctx.checked.invalid_by_reason[DUPLICATE_ID]} input rows share an id"
    return None


def transformed(ctx: NightlyContext, df: DataFrame) -> DataFrame:
    """Output rows of ``df``: every input column, ``out_col`` = corrected vector (element type per
    ``output_dtype``), the ``transform_version`` column (and ``cluster_id`` for cluster recentering). No model =
    method none (the vectors as they are, cast when ``output_dtype`` is not ``same``)."""
    config = ctx.config
    if ctx.model is not None:
        out = ctx.model.setOutputDtype(config.output_dtype).transform(df)
    else:
        vectors = F.col(config.vector_col)
        if config.output_dtype != "same":
            vectors = vectors.cast(f"array<{'float' if config.output_dtype == 'float32' else 'double'}>")
        out = df.withColumn(config.out_col, vectors)
    if config.out_col != config.vector_col:
        out = out.drop(config.vector_col)
    return out.withColumn(VERSION_COLUMN, F.lit(ctx.transform_version))


def apply(ctx: NightlyContext, info: dict) -> None:
    """Full mode: the plan that transforms every valid row, NOT cached (a cached copy of a 10M × 768 table is as
    big as the table on local disk): diagnose_output, gate and publish each recompute it from the pinned input
    version, which gives the same rows. Incremental: only the rows appended since the previous publish
    (cached: they are the MERGE source), unioned with the current output as the would-be table."""
    config, spark = ctx.config, ctx.spark
    ctx.record["mode_reason"] = full_rebuild_reason(ctx)
    ctx.record["mode"] = "full" if ctx.record["mode_reason"] else "incremental"
    if ctx.record["mode"] == "incremental":
        old_ids = read_table(spark, config.input, ctx.previous["input_version"])[0].select(config.id_col)
        new_valid = ctx.valid.join(old_ids, config.id_col, "left_anti")
        ctx.new_rows = transformed(ctx, new_valid).persist(StorageLevel.MEMORY_AND_DISK)
        ctx.cleanup.callback(ctx.new_rows.unpersist)
        existing = read_table(spark, config.output, ctx.state.version)[0]
        ctx.candidate = existing.unionByName(ctx.new_rows, allowMissingColumns=False)
        info["rows"] = ctx.record["counts"]["rows_written"] = ctx.new_rows.count()
    else:
        ctx.candidate = transformed(ctx, ctx.valid)
        ctx.output_files = file_count(scan_bytes(ctx.input_df), config.target_file_mb)


def diagnose_output(ctx: NightlyContext, info: dict) -> None:
    """Diagnose the would-be output; a failure (e.g. a non-finite vector) is left for the gate to report."""
    try:
        ctx.output_metrics = diagnose_dataframe(ctx.candidate, ctx.config.out_col, ctx.d_out).scalars()
    except ValueError as exc:
        ctx.output_error = str(exc).splitlines()[0]
    ctx.record["output_metrics"] = ctx.output_metrics


def gate_output(ctx: NightlyContext, info: dict) -> None:
    """:func:`jobs.gate.gate`, then (with an ``evaluation:`` block) the quality gate: the applied transform's
    metrics may not fall below raw by more than ``max_quality_drop``. Raises GateError (nothing is published)."""
    ctx.record["counts"].update(gate(ctx.candidate, ctx.valid, ctx.config, ctx.d_out, ctx.output_metrics,
                                     ctx.output_error))
    info["rows"] = ctx.record["counts"]["output_rows"]
    if ctx.record["mode"] == "full":
        ctx.record["counts"]["rows_written"] = info["rows"]
    if ctx.config.evaluation is not None and ctx.method != "none":
        quality_gate(ctx)


def quality_gate(ctx: NightlyContext) -> None:
    """Gate the applied transform on the evaluation set: the chosen candidate's scores (``method: auto``), else
    the applied model scored against raw in one more pass. Records ``evaluation.gate``."""
    record, name = ctx.evaluation, ctx.chosen
    if name is None:
        name = "applied"
        record = evaluation.score_candidates(ctx.spark, ctx.valid, ctx.config.vector_col, ctx.config.id_col,
                                             ctx.report.d, {"none": None, name: ctx.model.transform_},
                                             ctx.config.evaluation)
        ctx.record["evaluation"]["applied"] = json_safe(record["candidates"][name])
    passes, reason = evaluation.gate(record, ctx.config.evaluation, name)
    ctx.record["evaluation"]["gate"] = {"candidate": name, "passes": passes, "reason": reason}
    if not passes:
        raise GateError([reason])


def reject_fit(ctx: NightlyContext, reason: str) -> None:
    """After the gate refused the output: mark the fit this run saved ``rejected`` in its fit report
    (:func:`jobs.fit_or_reuse.mark_rejected`; kept, never reused), unless it is the artifact the output is served
    with (a refit of the same numbers). Records ``applied.rejected``."""
    applied = ctx.record.get("applied") or {}
    if not ctx.refitted or applied.get("artifact") == (ctx.previous or {}).get("artifact"):
        return
    mark_rejected(applied["artifact"], ctx.record["run_id"], reason)
    applied["rejected"] = True


def publish_output(ctx: NightlyContext, info: dict) -> None:
    """ONE Delta commit with the run's metadata; see :func:`anisotropy_spark.publish.publish`. A full rebuild is
    written as at most ``output_files`` data files (:mod:`anisotropy_spark.output_files`; ``counts.output_files``)."""
    config, rec = ctx.config, ctx.record
    meta = {"run_id": rec["run_id"], "input_path": config.input, "input_version": ctx.ref.version,
            "transform_version": ctx.transform_version, "artifact": rec["applied"]["artifact"], "method": ctx.method,
            "config_hash": rec["config_hash"], "seq": ctx.state.next_seq, "mode": rec["mode"]}
    target = PublishTarget(config.output, config.id_col, config.app_id)
    candidate = ctx.candidate
    if ctx.new_rows is None:
        candidate = candidate.coalesce(ctx.output_files)
        rec["counts"]["output_files"] = ctx.output_files
    rec["output"]["version"] = publish(ctx.spark, target, candidate, ctx.new_rows, meta, ctx.state.version)
    rec["status"] = "published"


STAGES = (("read", read), ("validate", validate_input), ("diagnose", diagnose), ("decide", decide),
          ("evaluate", evaluate), ("fit", fit),
          ("apply", apply), ("diagnose_output", diagnose_output), ("gate", gate_output), ("publish", publish_output))
