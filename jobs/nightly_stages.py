"""The stages of the nightly job. Each is a function of the one :class:`NightlyContext`, reading what earlier
stages left there and adding its own results; :mod:`jobs.nightly` runs them in order.

read → validate → diagnose → decide → evaluate → fit (or reuse) → apply → diagnose_output → gate → publish → index.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

import numpy as np
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from anisotropy_core.artifact import ArtifactError, load_artifact
from anisotropy_core.candidates import PUBLISHED, refuse_explicit
from anisotropy_core.clustering import ClusterRecenter
from anisotropy_core.decision import Recommendation, recommend
from anisotropy_core.diagnostics import Diagnosis
from anisotropy_core.diagnostics import diagnose as diagnose_moments
from anisotropy_core.methods import Method
from anisotropy_core.mixture_evidence import mixture_check
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import FittedTransform
from anisotropy_spark.contract import TransformRowError, require_schema
from anisotropy_spark.diagnostics import diagnose_dataframe, drawn_or_sampled
from anisotropy_spark.estimators import CorrectionModel
from anisotropy_spark.io import (
    TableRef,
    ValidatedInput,
    as_vector_array,
    read_table,
    validate,
)
from anisotropy_spark.kmeans import cluster_moments_pass
from anisotropy_spark.output_files import file_count, scan_bytes
from anisotropy_spark.publish import (
    OutputState,
    PublishTarget,
    only_appends,
    output_state,
    publish,
)
from anisotropy_spark.quarantine import DUPLICATE_ID
from anisotropy_spark.row_sample import RowSample
from anisotropy_spark.table_files import table_files
from anisotropy_spark.worker_errors import worker_error
from jobs import evaluation
from jobs.apply import VERSION_COLUMN
from jobs.config import ConfigError
from jobs.diagnose import artefact_of_sample, sampled_columns
from jobs.fit_or_reuse import (
    candidate_fit,
    fit_model,
    fit_params,
    mark_rejected,
    model_from,
    model_of,
    reusable,
    save_fit,
    serving_artifact,
)
from jobs.gate import GateError, gate
from jobs.index import LabelledQueries, index_stage
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
    sample_centroids: np.ndarray | None = None
    cluster_recenter: ClusterRecenter | None = None
    recommendation: Recommendation | None = None
    evaluation: dict | None = None
    chosen: str | None = None
    chosen_transform: FittedTransform | None = None
    chosen_params: dict | None = None
    neighbour_overlap: float | None = None
    method: str = Method.NONE
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
    require_schema(ctx.input_df.columns, config.named_columns())      # every named column, before any pass
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
    :func:`anisotropy_spark.io.validate`. With metadata or label columns that pass also draws the uniform sample
    of ``sample_size`` rows (with those columns) the artefact test runs on."""
    config = ctx.config
    total = ctx.input_df.count()          # Delta answers from its file statistics; sizes the sample
    files, planned = table_files(ctx.spark, ctx.input_df, ctx.ref.path, ctx.ref.format, config.vector_col, total,
                                 config.vector_reader)
    columns = sampled_columns(config)
    drawn = RowSample(config.sample_size, total, columns=tuple(columns)) if columns or config.mixture_check else None
    ctx.checked = validate(as_vector_array(ctx.input_df, config.vector_col), config.vector_col, config.id_col,
                           config.dimension, config.on_invalid, config.quarantine_path,
                           run_id=ctx.record["run_id"], input_version=ctx.ref.version, with_moments=True, files=files,
                           max_norm_ratio=config.max_norm_ratio,
                           sample=drawn)
    ctx.valid, ctx.moments = ctx.checked.valid, ctx.checked.moments
    info["rows"], info["reader"] = ctx.moments.n + ctx.checked.invalid_count, ctx.checked.reader if files else planned
    ctx.record["counts"].update(invalid_rows=ctx.checked.invalid_count,
                                invalid_by_reason=ctx.checked.invalid_by_reason)


def diagnose(ctx: NightlyContext, info: dict) -> None:
    """The diagnosis of the validation pass's moments and, on the uniform sample that pass drew (a sample pass of its
    own only when it could not: duplicated ids): with metadata or label columns the per-direction artefact test;
    with ``mixture_check`` (on by default) k-means of the sample, its per-cluster diagnostics and their null, which
    feed the decision's mixture branch (:func:`anisotropy_core.mixture_evidence.mixture_check`: no pass over the
    table)."""
    config, rec, d = ctx.config, ctx.record, ctx.checked.dimension
    ctx.report = diagnose_moments(ctx.moments)
    columns = sampled_columns(config)
    info["rows"] = ctx.report.n
    rec["counts"]["valid_rows"] = ctx.report.n
    rec["input_metrics"] = ctx.report.scalars()
    check_against_data(config, ctx.report.n, d, config.method)
    if columns or config.mixture_check:
        (vectors, values), info["sample_source"] = drawn_or_sampled(ctx.checked.drawn, ctx.valid, config.vector_col, d,
                                                                    columns, config.sample_size, ctx.report.n)
        info["sample_rows"] = int(vectors.shape[0])
    if columns:
        ctx.artefact = artefact_of_sample(vectors, values, ctx.report, config.metadata_cols, config.label_col,
                                          config.artefact_directions, config.decision, config.seed)
    rec["artefact"] = ctx.artefact
    if config.mixture_check and vectors.shape[0] < 4 * config.cluster_k:
        rec["clusters"] = {"skipped": f"mixture check: {vectors.shape[0]} sampled rows < 4 · cluster_k"}
    elif config.mixture_check:
        try:
            ctx.sample_centroids, ctx.clusters = mixture_check(vectors, config.cluster_k,
                                                               config.cluster_distance_measure, config.seed)
        except ValueError as exc:
            rec["clusters"] = {"skipped": f"mixture check: {exc}"}
            return
        rec["clusters"] = {"source": f"k-means of the {vectors.shape[0]}-row sample",
                           **{key: ctx.clusters[key] for key in ("locally_isotropic", "clusters", "mixture_null")}}


def fit_cluster_candidate(ctx: NightlyContext) -> None:
    """When the decision recommends cluster recentering on the sample's clusters: the full fit, ONE pass over the
    valid rows for the per-cluster moments of the sample's centroids (no k-means over the table); it is the
    cluster_recenter evaluation candidate and, applied label-free, the transform published (``method: auto`` only).
    A sample cluster that no row of the table falls in leaves no candidate, recorded in ``clusters.candidate``."""
    config = ctx.config
    centroids = ctx.sample_centroids
    states = cluster_moments_pass(as_vector_array(ctx.valid.select(config.vector_col), config.vector_col),
                                  config.vector_col, ctx.report.d, centroids, config.cluster_distance_measure)
    try:
        ctx.cluster_recenter = ClusterRecenter.from_moments(centroids, states, config.cluster_D,
                                                            config.cluster_distance_measure,
                                                            {"kmeans": "faiss, on the mixture check's sample"})
    except ValueError as exc:                  # a sample cluster no row of the table falls in: no candidate
        ctx.record["clusters"]["candidate"] = f"not fitted: {exc}"
        return
    if ctx.method == Method.CLUSTER_RECENTER and config.method == "auto":
        ctx.chosen_transform = ctx.cluster_recenter


def decide(ctx: NightlyContext, info: dict) -> None:
    """``method: auto`` applies the recommendation (or, with an ``evaluation:`` block, what the evaluation's
    intervals support: see :func:`evaluate`); an explicit method is applied, the recommendation recorded."""
    rec = ctx.record
    recommendation = ctx.recommendation = recommend(ctx.report, ctx.clusters, ctx.artefact, ctx.config.decision)
    ctx.method = recommendation.method if ctx.config.method == "auto" else ctx.config.method
    rec["recommendation"] = recommendation.to_dict()
    for warning in recommendation.warnings:
        log.warning("decision: %s", warning)
    log.info("decision: recommend %s (%s); applying %s", recommendation.method,
             "; ".join(recommendation.reasons), ctx.method)
    check_against_data(ctx.config, ctx.report.n, ctx.report.d, ctx.method)
    if recommendation.method == Method.CLUSTER_RECENTER and ctx.sample_centroids is not None and ctx.config.method == "auto":
        fit_cluster_candidate(ctx)


def evaluate(ctx: NightlyContext, info: dict) -> None:
    """``method: auto`` with an ``evaluation:`` block: the candidate grid from the diagnosis's moments state, scored
    held out against raw and the published transform in one distributed pass (with the neighbour overlap of every
    candidate), and the decision that follows the intervals (:func:`jobs.evaluation.run_evaluation`; candidates
    below ``min_neighbour_overlap`` are left out of the choice): publish the best candidate, or keep what is
    published — when that leaves the output as it is (same input version), the run stops here with status
    ``kept``. An explicit method is judged in the gate (:func:`quality_gate`)."""
    config, rec = ctx.config, ctx.record
    rec["evidence"] = "labelled" if labelled(config) else "label_free"
    if not labelled(config) or config.method != "auto":
        return
    previous = ctx.previous
    serving = rec.get("serving_artifact")
    published = previous is not None and (serving is None or serving["verified"])     # a corrupt one is no baseline
    published_transform = load_artifact(previous["artifact"], expected_dimension=ctx.report.d).transform \
        if published and previous.get("artifact") else None
    record, fitted, grid = evaluation.run_evaluation(
        ctx.spark, ctx.valid, config.vector_col, config.id_col, ctx.report.d, ctx.moments, ctx.recommendation,
        config.evaluation, config.decision, ctx.cluster_recenter, published, published_transform,
        overlap_sample(config), config.min_neighbour_overlap)
    ctx.evaluation, rec["evaluation"] = record, json_safe(record)
    info["rows"] = record["queries"] or record["pairs"] or 0
    ctx.chosen, ctx.chosen_transform = record["chosen"], fitted[record["chosen"]]
    ctx.neighbour_overlap = record["neighbour_overlap"][ctx.chosen]
    rec["reason"] = record["decision"]["reason"]
    log.info("evaluation: %s", rec["reason"])
    for warning in record["warnings"]:
        log.warning("evaluation: %s", warning)
    if ctx.chosen == PUBLISHED:
        ctx.method = previous.get("method") or Method.NONE
        ctx.chosen_params = load_artifact(previous["artifact"]).manifest["params"] if previous.get("artifact") else {}
        if previous.get("input_path") == config.input and previous.get("input_version") == ctx.ref.version:
            rec.update(status="kept", mode="kept")
            rec["output"]["version"] = ctx.state.version
            ctx.finished = True
        return
    candidate = next(c for c in grid if c.name == ctx.chosen)
    ctx.method, ctx.chosen_params = candidate_fit(candidate.family, ctx.chosen_transform, list(candidate.directions),
                                                  config, ctx.recommendation)


def labelled(config: NightlyConfig) -> bool:
    """Whether the night has labelled evidence: an ``evaluation:`` block with queries or pairs."""
    return config.evaluation is not None and config.evaluation.active


def overlap_sample(config: NightlyConfig) -> evaluation.OverlapSample:
    """The neighbour-overlap check of ``config`` (``neighbour_sample`` rows, top-``neighbour_k``, ``seed``)."""
    return evaluation.OverlapSample(config.neighbour_sample, config.neighbour_k, config.seed)


def fit(ctx: NightlyContext, info: dict) -> None:
    """Reuse the last published transform when allowed (:func:`jobs.fit_or_reuse.reusable`), else fit (from the
    diagnosis's moments when the method is moment-based: no second pass) and save.
    An evaluation candidate chosen by :func:`evaluate` is already fitted: it is saved, not fitted again; when the
    evaluation keeps the published transform, its artifact is applied as it is."""
    config, method = ctx.config, ctx.method
    params = ctx.chosen_params if ctx.chosen is not None else fit_params(config, method, ctx.recommendation)
    artifact_path, why = None, "method none: vectors published unchanged"
    if ctx.chosen == PUBLISHED and method != Method.NONE:
        ctx.model, artifact_path = model_from(load_artifact(ctx.previous["artifact"]), config), ctx.previous["artifact"]
        why = "the evaluation keeps the published transform"
    elif method != Method.NONE:
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
    """Diagnose the would-be output; a failure (e.g. a non-finite vector) is left for the gate to report. A row the
    transform cannot map (:class:`~anisotropy_spark.contract.TransformRowError`, e.g. a value that overflows
    float32 after the cast, raised in a worker and received by its class) leaves no output to gate: GateError
    naming the row."""
    try:
        ctx.output_metrics = diagnose_dataframe(ctx.candidate, ctx.config.out_col, ctx.d_out).scalars()
    except Exception as exc:  # noqa: BLE001 — a worker's error arrives wrapped by Spark; only typed ones are handled
        found = worker_error(exc) or exc
        if isinstance(found, TransformRowError):
            raise GateError([f"the transform cannot produce the output: {found}"]) from None
        if not isinstance(found, ValueError):
            raise
        ctx.output_error = str(found).splitlines()[0]
    ctx.record["output_metrics"] = ctx.output_metrics


def gate_output(ctx: NightlyContext, info: dict) -> None:
    """:func:`jobs.gate.gate` (counts and bounds), the neighbour-overlap gate (:func:`neighbour_gate`) and, for an
    explicitly configured method with an ``evaluation:`` block, the quality gate (:func:`quality_gate`). Every
    failed check is listed in ONE GateError (nothing is published)."""
    problems = []
    try:
        ctx.record["counts"].update(gate(ctx.candidate, ctx.valid, ctx.config, ctx.d_out, ctx.output_metrics,
                                         ctx.output_error))
        info["rows"] = ctx.record["counts"]["output_rows"]
        if ctx.record["mode"] == "full":
            ctx.record["counts"]["rows_written"] = info["rows"]
    except GateError as exc:
        problems += exc.problems
    if labelled(ctx.config) and ctx.chosen is None and ctx.method != Method.NONE:
        problems += quality_gate(ctx)
    problems += neighbour_gate(ctx)
    if problems:
        raise GateError(problems)
    if ctx.record.get("evidence") == "label_free":
        overlap = ctx.record["neighbour_overlap"]
        unverified = (f"unverified: {ctx.method} applied without labelled evidence (no evaluation queries or pairs: "
                      f"the recommendation alone); neighbour overlap {overlap['mean']:.3f} >= min_neighbour_overlap "
                      f"{overlap['min']:g}")
        earlier = ctx.record.get("reason")            # e.g. why a night that looked like a no-op was not one
        ctx.record["reason"] = f"{earlier}; {unverified}" if earlier else unverified
    elif ctx.evaluation is not None:
        ctx.record["evaluation"]["gate"] = {"candidate": ctx.chosen, "passes": True,
                                            "reason": ctx.record["evaluation"]["decision"]["reason"]}


def quality_gate(ctx: NightlyContext) -> list[str]:
    """An explicitly configured method against raw: the applied model (as fitted on every row) and raw scored on
    every query / pair in one pass, with the paired bootstrap (:func:`jobs.evaluation.score_applied`; the same
    pass gives the neighbour overlap); refused when an interval of Δ vs raw lies below −``max_quality_drop``
    (:func:`anisotropy_core.candidates.refuse_explicit`). Records ``evaluation`` with its ``gate``; returns the
    problem (empty when it passes)."""
    config = ctx.config
    scored = evaluation.score_applied(ctx.spark, ctx.valid, config.vector_col, config.id_col, ctx.report.d,
                                      ctx.model.transform_, config.evaluation, overlap_sample(config))
    ctx.neighbour_overlap = scored["neighbour_overlap"]
    passes, reason = refuse_explicit(scored["intervals"]["applied"], config.evaluation.max_quality_drop)
    ctx.record["evaluation"] = json_safe({"evidence": "labelled", "metric": config.evaluation.selection_metric(),
                                          **scored, "gate": {"candidate": "applied", "passes": passes,
                                                             "reason": reason}})
    return [] if passes else [reason]


def neighbour_gate(ctx: NightlyContext) -> list[str]:
    """The mean overlap of each sampled corpus row's raw top-k with its corrected top-k (own row excluded), from
    the evaluation pass when it measured it, else one pass now; recorded as ``neighbour_overlap`` and refused
    below ``min_neighbour_overlap``. Returns the problem (empty when it passes)."""
    config = ctx.config
    if ctx.neighbour_overlap is None:
        ctx.neighbour_overlap = evaluation.neighbour_check(
            ctx.valid, config.vector_col, config.id_col, ctx.report.d,
            ctx.model.transform_ if ctx.model is not None else None, overlap_sample(config))
    value = ctx.neighbour_overlap
    passes = value >= config.min_neighbour_overlap
    ctx.record["neighbour_overlap"] = {"mean": value, "k": config.neighbour_k, "rows": config.neighbour_sample,
                                       "min": config.min_neighbour_overlap, "passes": passes}
    if passes:
        return []
    return [f"neighbour overlap {value:.3f} < min_neighbour_overlap {config.min_neighbour_overlap:g}: the correction "
            f"keeps {value:.0%} of each sampled row's raw top-{config.neighbour_k} neighbours"]


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


def build_index(ctx: NightlyContext, info: dict) -> None:
    """With an ``index:`` block, after a publish: build, verify and swap in the faiss index of the version just
    published (:func:`jobs.index.index_stage`; a refused verification leaves ``CURRENT`` on the previous index and
    the record says why). Recorded as ``index``. Without ``queries`` of its own, the index block verifies nDCG
    with the ``evaluation:`` block's labelled queries, when it has some."""
    config, rec = ctx.config, ctx.record
    if config.index is None or rec["status"] != "published":
        return
    settings = dataclasses.replace(config.index, vector_col=config.out_col, id_col=config.id_col,
                                   queries=config.index.queries or LabelledQueries.of_evaluation(config.evaluation))
    rec["index"] = index_stage(ctx.spark, settings, config.output, rec["output"]["version"], rec["applied"]["artifact"],
                               raw_table=(config.input, ctx.ref.version))
    info["rows"] = rec["counts"].get("output_rows", 0)
    (log.info if rec["index"]["status"] == "published" else log.warning)("index: %s", rec["index"].get("reason", ""))


STAGES = (("read", read), ("validate", validate_input), ("diagnose", diagnose), ("decide", decide),
          ("evaluate", evaluate), ("fit", fit),
          ("apply", apply), ("diagnose_output", diagnose_output), ("gate", gate_output), ("publish", publish_output),
          ("index", build_index))
