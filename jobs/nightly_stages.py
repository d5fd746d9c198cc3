"""The stages of the nightly job. Each is a function of the one :class:`NightlyContext`, reading what earlier
stages left there and adding its own results; :mod:`jobs.nightly` runs them in order.

read → validate → diagnose → decide → evaluate → fit (or reuse) → apply → diagnose_output → gate → publish → index.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Generic, TypeVar, overload

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, FloatType

from anisotropy_core.artifact import ArtifactError, load_artifact
from anisotropy_core.candidates import PUBLISHED, refuse_explicit
from anisotropy_core.cluster_recenter import ClusterRecenter
from anisotropy_core.decision import ArtefactEvidence, MixtureEvidence, Recommendation, recommend
from anisotropy_core.diagnostics import Diagnosis
from anisotropy_core.diagnostics import diagnose as diagnose_moments
from anisotropy_core.evaluation import neighbour_overlap
from anisotropy_core.methods import Method
from anisotropy_core.mixture_evidence import mixture_check
from anisotropy_core.output_facts import OutputFacts, OverlapQueries
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import FittedTransform
from anisotropy_spark.contract import REASON_COLUMN, TransformRowError, require_schema
from anisotropy_spark.diagnostics import diagnose_dataframe, drawn_or_sampled
from anisotropy_spark.estimators import CorrectionModel, numpy_dtype, output_element_type
from anisotropy_spark.io import (
    TableRef,
    ValidatedInput,
    as_vector_array,
    read_table,
    validate,
)
from anisotropy_spark.kmeans import cluster_moments_pass
from anisotropy_spark.output_files import file_count, scan_bytes
from anisotropy_spark.output_pass import OutputPass, output_facts
from anisotropy_spark.publish import (
    OutputState,
    PublishTarget,
    only_appends,
    output_state,
    publish,
)
from anisotropy_spark.quarantine import DUPLICATE_ID
from anisotropy_spark.row_sample import RowSample, as_sample
from anisotropy_spark.table_files import FileLayoutError, TableFiles, table_files
from anisotropy_spark.worker_errors import worker_error
from jobs import evaluation
from jobs.columns import VERSION_COLUMN
from jobs.config import ConfigError, EvaluationConfig
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
from jobs.gate import GateError, gate, gate_facts
from jobs.index import index_stage
from jobs.index_settings import LabelledQueries
from jobs.nightly_config import NightlyConfig, check_against_data
from jobs.run_records import Applied, NeighbourOverlap, OutputSums, RunRecord, ServingArtifact, read_record

log = logging.getLogger("anisotropy.nightly")

T = TypeVar("T")


def required(value: T | None, problem: str) -> T:
    """``value``, which the caller's path implies is set; RuntimeError(``problem``) when it is None (a stage run out
    of order, or a state an earlier stage should have ruled out)."""
    if value is None:
        raise RuntimeError(problem)
    return value


class StageValue(Generic[T]):
    """A value of a context's state that one ``stage`` sets and later stages read, typed as set (``T``, not
    ``T | None``): read before that stage set it, it raises RuntimeError naming the stage."""

    def __init__(self, stage: str) -> None:
        self.stage, self.name = stage, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> StageValue[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> StageValue[T] | T:
        if obj is None:
            return self
        value: Any = obj.__dict__.get(self.name)
        return required(value, f"{type(obj).__name__}.{self.name}: the {self.stage} stage has not run")

    def __set__(self, obj: object, value: T) -> None:
        obj.__dict__[self.name] = value


@dataclasses.dataclass
class TableState:
    """What the read and validate stages found: the input pinned (``ref``) and its DataFrame (``input_df``), the
    ``output_state`` of the output table when the run read it, the validation's result (``checked``), its ``valid``
    rows and their ``moments``, the pinned version's data ``files`` (None: pyarrow cannot read them) and the
    ``overlap_rows`` the neighbour-overlap check queries with (their ids, an Arrow array, and raw vectors (m, d)).
    The read and validate stages' values are :class:`StageValue`: a stage that reads one before it is set raises."""

    ref = StageValue[TableRef]("read")
    input_df = StageValue[DataFrame]("read")
    output_state = StageValue[OutputState]("read")
    checked = StageValue[ValidatedInput]("validate")
    valid = StageValue[DataFrame]("validate")
    moments = StageValue[Moments]("validate")
    files: TableFiles | None = None
    overlap_rows: tuple[pa.Array, np.ndarray] | None = None


@dataclasses.dataclass
class Findings:
    """What the diagnose, decide and evaluate stages know: the ``report`` of the valid rows' moments, the
    ``artefact`` test and the mixture check's ``clusters`` (with the ``sample_centroids`` of its k-means) of the
    sample, the full ``cluster_recenter`` candidate fitted from them, the ``recommendation`` and the held-out
    ``evaluation`` record (None: no evaluation chose). ``report`` and ``recommendation`` are :class:`StageValue`."""

    report = StageValue[Diagnosis]("diagnose")
    artefact: ArtefactEvidence | None = None
    clusters: MixtureEvidence | None = None
    sample_centroids: np.ndarray | None = None
    cluster_recenter: ClusterRecenter | None = None
    recommendation = StageValue[Recommendation]("decide")
    evaluation: dict | None = None


@dataclasses.dataclass
class FitState:
    """The transform the run applies: the evaluation's ``chosen`` candidate (None: no evaluation chose) with its
    ``chosen_transform`` and ``chosen_params``; the ``method`` applied, its ``model`` (None: method none), the
    ``transform_version``, the output dimension ``d_out`` and whether the fit stage ``refitted``."""

    chosen: str | None = None
    chosen_transform: FittedTransform | None = None
    chosen_params: dict | None = None
    method: str = Method.NONE
    model: CorrectionModel | None = None
    transform_version: str = "none"
    d_out: int = 0
    refitted: bool = False


@dataclasses.dataclass
class WouldBeOutput:
    """The would-be output and what the gate reads of it: the incremental ``candidate`` plan and its ``new_rows``
    (None: a full rebuild, whose rows the publish stage writes in its one transforming pass) or a full rebuild's
    number of data ``files``, the output's scalar ``metrics`` or the ``error`` that stopped its diagnosis, the
    ``rows`` its output pass produced and the ``reader`` that pass read with (full rebuild), and the
    ``neighbour_overlap`` of the correction (over ``overlap_queries`` sampled rows when the output pass measured it);
    on an incremental night summed from the last publish (:func:`summed_incremental`), the ``appended`` data files
    and the ``previous`` publish's run record."""

    candidate: DataFrame | None = None
    new_rows: DataFrame | None = None
    files: int | None = None
    metrics: dict | None = None
    error: str | None = None
    rows: int | None = None
    reader: str | None = None
    neighbour_overlap: float | None = None
    overlap_queries: int | None = None
    appended: TableFiles | None = None
    previous: RunRecord | None = None


@dataclasses.dataclass
class NightlyContext:
    """Everything one run knows, filled in stage by stage, by concern: the ``table`` read and validated, the
    ``findings`` (diagnosis, evidence, decision), the ``fit`` applied, the ``output`` gated, and the ``record``
    (:class:`~jobs.run_records.RunRecord`).
    ``cleanup`` releases cached data when the run ends; ``finished`` stops the run early (no-op)."""

    spark: SparkSession
    config: NightlyConfig
    record: RunRecord
    cleanup: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)
    finished: bool = False
    table: TableState = dataclasses.field(default_factory=TableState)
    findings: Findings = dataclasses.field(default_factory=Findings)
    fit: FitState = dataclasses.field(default_factory=FitState)
    output: WouldBeOutput = dataclasses.field(default_factory=WouldBeOutput)

    @property
    def previous(self) -> dict | None:
        """The publish metadata of the output's current state (None: nothing published yet)."""
        return self.table.output_state.meta

    @property
    def last_publish(self) -> dict:
        """:attr:`previous` where the caller's path implies a publish (a reuse, an incremental night, the evaluation
        keeping the published transform)."""
        return required(self.previous, "the output has no previous publish")

    @property
    def applied(self) -> Applied:
        """What the fit stage applied (the record's ``applied``)."""
        return required(self.record.applied, "the fit stage has not run")


def read(ctx: NightlyContext, info: dict) -> None:
    """Pin the input's latest Delta version and verify the artifact the output is served with
    (:func:`check_serving`); stop (no-op) when the output already holds that input version with this config and
    its artifact passed the check. A failed check is no no-op: the run refits (the fit stage cannot reuse the
    artifact) and republishes, the record saying why."""
    config, rec, table = ctx.config, ctx.record, ctx.table
    table.input_df, table.ref = read_table(ctx.spark, config.input)
    if table.ref.format != "delta":
        raise ConfigError(f"input: {config.input} is not a Delta table (the nightly job pins a Delta version)")
    require_schema(table.input_df.columns, config.named_columns())  # every named column, before any pass
    rec.input.version = table.ref.version
    table.output_state = output_state(ctx.spark, config.output)
    current = rec.output.previous_version = table.output_state.version
    previous = ctx.previous
    problem = check_serving(ctx)
    if (
        previous
        and previous.get("input_path") == config.input
        and previous.get("input_version") == table.ref.version
        and previous.get("config_hash") == rec.config_hash
    ):
        if problem is not None:
            rec.reason = (
                f"not a no-op: output version {current} already holds input version {table.ref.version}, "
                f"but its artifact failed the check ({problem}): refit and republish"
            )
            log.warning("%s", rec.reason)
            return
        rec.status, rec.mode, rec.reason = (
            "noop",
            "noop",
            (
                f"output version {current} already holds input version {table.ref.version} with this config "
                f"(run {previous['run_id']}, transform {previous.get('transform_version')}, artifact verified)"
            ),
        )
        rec.output.version = current
        ctx.finished = True


def check_serving(ctx: NightlyContext) -> str | None:
    """Load and verify the artifact of the output's current state (:func:`jobs.fit_or_reuse.serving_artifact`:
    its content hash, and the transform version its rows carry); record the result as ``serving_artifact``
    (:class:`~jobs.run_records.ServingArtifact`; None when the state has no artifact). Returns the problem, or
    None."""
    previous = ctx.previous or {}
    if not previous.get("artifact"):
        ctx.record.serving_artifact = None
        return None
    path, version = previous["artifact"], previous.get("transform_version")
    try:
        serving_artifact(previous)
    except ArtifactError as exc:
        ctx.record.serving_artifact = ServingArtifact(path, version, verified=False, problem=str(exc))
        return str(exc)
    ctx.record.serving_artifact = ServingArtifact(path, version, verified=True)
    return None


def validate_input(ctx: NightlyContext, info: dict) -> None:
    """Quarantine (with a reason, the run id and the input version) or refuse the invalid rows and every copy
    of a duplicated id, in the pass that also merges the valid rows' moments for :func:`diagnose` (read by pyarrow
    from the data files where it can: ``vector_reader``, :mod:`anisotropy_spark.table_files`); see
    :func:`anisotropy_spark.io.validate`. With metadata or label columns that pass also draws the uniform sample
    of ``sample_size`` rows (with those columns) the artefact test runs on; on a label-free night it also keeps the
    ``neighbour_sample`` valid rows of smallest ``xxhash64(id, seed)`` (integer ids), the neighbour-overlap check's
    queries (:mod:`anisotropy_spark.row_sample`: the rows a sample query of their own would choose)."""
    config, table = ctx.config, ctx.table
    total = table.input_df.count()  # Delta answers from its file statistics; sizes the sample
    files, planned = table_files(
        ctx.spark, table.input_df, table.ref.path, table.ref.format, config.vector_col, total, config.vector_reader
    )
    columns, lowest = sampled_columns(config), 0 if labelled(config) else config.neighbour_sample
    drawn = (
        RowSample(config.sample_size, total, columns=tuple(columns), lowest=lowest, id_col=config.id_col)
        if columns or config.mixture_check or lowest
        else None
    )
    table.files = files
    checked = table.checked = validate(
        as_vector_array(table.input_df, config.vector_col),
        config.vector_col,
        config.id_col,
        config.dimension,
        config.on_invalid,
        config.quarantine_path,
        run_id=ctx.record.run_id,
        input_version=table.ref.version,
        with_moments=True,
        files=files,
        max_norm_ratio=config.max_norm_ratio,
        sample=drawn,
    )
    table.valid, table.moments = checked.valid, required(checked.moments, "validate: the moments pass gave none")
    info["rows"], info["reader"] = table.moments.n + checked.invalid_count, checked.reader if files else planned
    ctx.record.counts.update(invalid_rows=checked.invalid_count, invalid_by_reason=checked.invalid_by_reason)


def diagnose(ctx: NightlyContext, info: dict) -> None:
    """The diagnosis of the validation pass's moments and, on the uniform sample that pass drew (a sample pass of its
    own only when it could not: duplicated ids): with metadata or label columns the per-direction artefact test;
    with ``mixture_check`` (on by default) k-means of the sample, its per-cluster diagnostics and their null, which
    feed the decision's mixture branch (:func:`anisotropy_core.mixture_evidence.mixture_check`: no pass over the
    table)."""
    config, rec, table, findings = ctx.config, ctx.record, ctx.table, ctx.findings
    d = table.checked.dimension
    report = findings.report = diagnose_moments(table.moments)
    columns = sampled_columns(config)
    info["rows"] = rec.counts.valid_rows = report.n
    rec.input_metrics = report.scalars()
    check_against_data(config, report.n, d, config.method)
    if columns or config.mixture_check:
        (vectors, values), info["sample_source"] = drawn_or_sampled(
            table.checked.drawn, table.valid, config.vector_col, d, columns, config.sample_size, report.n
        )
        info["sample_rows"] = int(vectors.shape[0])
    lowest = table.checked.lowest
    if not labelled(config) and lowest is not None and lowest.num_rows == min(config.neighbour_sample, report.n):
        table.overlap_rows = (
            lowest.column(config.id_col).combine_chunks(),
            as_sample(lowest, config.vector_col, d, [])[0],
        )
    if columns:
        findings.artefact = artefact_of_sample(
            vectors,
            values,
            report,
            config.metadata_cols,
            config.label_col,
            config.artefact_directions,
            config.decision,
            config.seed,
        )
    rec.artefact = findings.artefact
    if config.mixture_check and vectors.shape[0] < 4 * config.cluster_k:
        rec.clusters = {"skipped": f"mixture check: {vectors.shape[0]} sampled rows < 4 · cluster_k"}
    elif config.mixture_check:
        try:
            findings.sample_centroids, findings.clusters = mixture_check(
                vectors, config.cluster_k, config.cluster_distance_measure, config.seed
            )
        except ValueError as exc:
            rec.clusters = {"skipped": f"mixture check: {exc}"}
            return
        rec.clusters = {
            "source": f"k-means of the {vectors.shape[0]}-row sample",
            **{key: findings.clusters[key] for key in ("locally_isotropic", "clusters", "mixture_null")},
        }


def fit_cluster_candidate(ctx: NightlyContext, centroids: np.ndarray) -> None:
    """When the decision recommends cluster recentering on the sample's clusters (their ``centroids``): the full
    fit, ONE pass over the valid rows for the per-cluster moments of those centroids (no k-means over the table); it
    is the cluster_recenter evaluation candidate and, applied label-free, the transform published (``method: auto``
    only).
    A sample cluster that no row of the table falls in leaves no candidate, recorded in ``clusters.candidate``."""
    config, findings = ctx.config, ctx.findings
    states = cluster_moments_pass(
        as_vector_array(ctx.table.valid.select(config.vector_col), config.vector_col),
        config.vector_col,
        findings.report.d,
        centroids,
        config.cluster_distance_measure,
    )
    try:
        findings.cluster_recenter = ClusterRecenter.from_moments(
            centroids,
            states,
            config.cluster_D,
            config.cluster_distance_measure,
            {"kmeans": "faiss, on the mixture check's sample"},
        )
    except ValueError as exc:  # a sample cluster no row of the table falls in: no candidate
        required(ctx.record.clusters, "the mixture check has not run")["candidate"] = f"not fitted: {exc}"
        return
    if ctx.fit.method == Method.CLUSTER_RECENTER and config.method == "auto":
        ctx.fit.chosen_transform = findings.cluster_recenter


def decide(ctx: NightlyContext, info: dict) -> None:
    """``method: auto`` applies the recommendation (or, with an ``evaluation:`` block, what the evaluation's
    intervals support: see :func:`evaluate`); an explicit method is applied, the recommendation recorded."""
    config, findings = ctx.config, ctx.findings
    recommendation = findings.recommendation = recommend(
        findings.report, findings.clusters, findings.artefact, config.decision
    )
    ctx.fit.method = recommendation.method if config.method == "auto" else config.method
    ctx.record.recommendation = recommendation
    for warning in recommendation.warnings:
        log.warning("decision: %s", warning)
    log.info(
        "decision: recommend %s (%s); applying %s",
        recommendation.method,
        "; ".join(recommendation.reasons),
        ctx.fit.method,
    )
    check_against_data(config, findings.report.n, findings.report.d, ctx.fit.method)
    if (
        recommendation.method == Method.CLUSTER_RECENTER
        and findings.sample_centroids is not None
        and config.method == "auto"
    ):
        fit_cluster_candidate(ctx, findings.sample_centroids)


def evaluate(ctx: NightlyContext, info: dict) -> None:
    """``method: auto`` with an ``evaluation:`` block: the candidate grid from the diagnosis's moments state, scored
    held out against raw and the published transform in one distributed pass (with the neighbour overlap of every
    candidate), and the decision that follows the intervals (:func:`jobs.evaluation.run_evaluation`; candidates
    below ``min_neighbour_overlap`` are left out of the choice): publish the best candidate, or keep what is
    published — when that leaves the output as it is (same input version), the run stops here with status
    ``kept``. An explicit method is judged in the gate (:func:`quality_gate`)."""
    config, rec, findings, state = ctx.config, ctx.record, ctx.findings, ctx.fit
    settings = active_evaluation(config)
    rec.evidence = "labelled" if settings is not None else "label_free"
    if settings is None or config.method != "auto":
        return
    previous, d = ctx.previous, findings.report.d
    serving = rec.serving_artifact
    baseline = previous if serving is None or serving.verified else None  # a corrupt one is no baseline
    published = baseline is not None
    published_transform = (
        load_artifact(baseline["artifact"], expected_dimension=d).transform
        if baseline is not None and baseline.get("artifact")
        else None
    )
    record, fitted, grid = evaluation.run_evaluation(
        ctx.spark,
        ctx.table.valid,
        config.vector_col,
        config.id_col,
        d,
        ctx.table.moments,
        findings.recommendation,
        settings,
        config.decision,
        findings.cluster_recenter,
        published,
        published_transform,
        overlap_sample(config),
        config.min_neighbour_overlap,
    )
    findings.evaluation = rec.evaluation = record
    info["rows"] = record["queries"] or record["pairs"] or 0
    state.chosen, state.chosen_transform = record["chosen"], fitted[record["chosen"]]
    ctx.output.neighbour_overlap = record["neighbour_overlap"][state.chosen]
    rec.reason = record["decision"]["reason"]
    log.info("evaluation: %s", rec.reason)
    for warning in record["warnings"]:
        log.warning("evaluation: %s", warning)
    if state.chosen == PUBLISHED:
        previous = ctx.last_publish
        state.method = previous.get("method") or Method.NONE
        state.chosen_params = load_artifact(previous["artifact"]).manifest["params"] if previous.get("artifact") else {}
        if previous.get("input_path") == config.input and previous.get("input_version") == ctx.table.ref.version:
            rec.status, rec.mode = "kept", "kept"
            rec.output.version = ctx.table.output_state.version
            ctx.finished = True
        return
    candidate = next(c for c in grid if c.name == state.chosen)
    state.method, state.chosen_params = candidate_fit(
        candidate.family, state.chosen_transform, list(candidate.directions), config, findings.recommendation
    )


def labelled(config: NightlyConfig) -> bool:
    """Whether the night has labelled evidence: an ``evaluation:`` block with queries or pairs."""
    return active_evaluation(config) is not None


def active_evaluation(config: NightlyConfig) -> EvaluationConfig | None:
    """The ``evaluation:`` block when the night has labelled evidence (:func:`labelled`), else None."""
    return config.evaluation if config.evaluation is not None and config.evaluation.active else None


def overlap_sample(config: NightlyConfig) -> evaluation.OverlapSample:
    """The neighbour-overlap check of ``config`` (``neighbour_sample`` rows, top-``neighbour_k``, ``seed``)."""
    return evaluation.OverlapSample(config.neighbour_sample, config.neighbour_k, config.seed)


def fit(ctx: NightlyContext, info: dict) -> None:
    """Reuse the last published transform when allowed (:func:`jobs.fit_or_reuse.reusable`), else fit (from the
    diagnosis's moments when the method is moment-based: no second pass) and save.
    An evaluation candidate chosen by :func:`evaluate` is already fitted: it is saved, not fitted again; when the
    evaluation keeps the published transform, its artifact is applied as it is."""
    config, table, state = ctx.config, ctx.table, ctx.fit
    method, recommendation, report = state.method, ctx.findings.recommendation, ctx.findings.report
    metrics = required(ctx.record.input_metrics, "the diagnose stage has not run")
    params = (
        required(state.chosen_params, "the evaluate stage chose no parameters")
        if state.chosen is not None
        else fit_params(config, method, recommendation)
    )
    artifact_path, why = None, "method none: vectors published unchanged"
    if state.chosen == PUBLISHED and method != Method.NONE:
        artifact_path = ctx.last_publish["artifact"]
        state.model = model_from(load_artifact(artifact_path), config)
        why = "the evaluation keeps the published transform"
    elif method != Method.NONE:
        reused, why = reusable(config, ctx.previous, method, params, report.d, metrics)
        if reused is not None:
            state.model, artifact_path = model_from(reused, config), ctx.last_publish["artifact"]
        else:
            state.model = (
                model_of(state.chosen_transform, report.n, config, table.ref)
                if state.chosen_transform is not None
                else fit_model(config, method, params, table.valid, table.ref, table.moments)
            )
            artifact_path = save_fit(config, state.model, method, params, metrics)
            state.refitted = True
    state.transform_version = state.model.transform_version if state.model is not None else "none"
    state.d_out = state.model.transform_.d_out if state.model is not None else report.d
    ctx.record.applied = Applied(
        method=method,
        params=params,
        transform_version=state.transform_version,
        artifact=artifact_path,
        refitted=state.refitted,
        fit_reason=why,
        candidate=state.chosen,
        follows_recommendation=method == recommendation.method,
    )
    log.info("fit: %s %s (%s)", "refitted" if state.refitted else "reused", state.transform_version, why)


def full_rebuild_reason(ctx: NightlyContext) -> str | None:
    """Why this run must rewrite the whole output, or None when the incremental MERGE applies: the same
    transform, reused, on an input that since the last publish only gained appended rows of the same schema,
    and no duplicated id (a repeated id means a published row must leave the output)."""
    previous, config, table = ctx.previous, ctx.config, ctx.table
    if not config.incremental:
        return "incremental: false"
    if not previous:
        return "no previous publish"
    if ctx.fit.refitted:
        return "the transform was refitted"
    if (previous.get("transform_version"), previous.get("input_path"), previous.get("config_hash")) != (
        ctx.fit.transform_version,
        config.input,
        ctx.record.config_hash,
    ):
        return "transform, input path or config changed since the last publish"
    before = previous.get("input_version")
    pinned = required(table.ref.version, "read: the input has no Delta version")
    if not isinstance(before, int) or before >= pinned:
        return f"input version {pinned} does not follow the published input version {before}"
    if not only_appends(ctx.spark, config.input, before, pinned):
        return f"input commits after version {before} are not all appends (delete, update or overwrite)"
    old_schema = read_table(ctx.spark, config.input, before)[0].schema
    if old_schema != table.input_df.schema:
        added = sorted(set(table.input_df.columns) - set(old_schema.fieldNames()))
        return f"input schema changed since version {before}" + (f" (added columns {added})" if added else "")
    if table.checked.invalid_by_reason.get(DUPLICATE_ID):
        return f"{table.checked.invalid_by_reason[DUPLICATE_ID]} input rows share an id"
    return None


def transformed(ctx: NightlyContext, df: DataFrame) -> DataFrame:
    """Output rows of ``df``: every input column, ``out_col`` = corrected vector (element type per
    ``output_dtype``), the ``transform_version`` column (and ``cluster_id`` for cluster recentering). No model =
    method none (the vectors as they are, cast when ``output_dtype`` is not ``same``)."""
    config = ctx.config
    if ctx.fit.model is not None:
        out = ctx.fit.model.setOutputDtype(config.output_dtype).transform(df)
    else:
        vectors = F.col(config.vector_col)
        if config.output_dtype != "same":
            vectors = vectors.cast(f"array<{'float' if config.output_dtype == 'float32' else 'double'}>")
        out = df.withColumn(config.out_col, vectors)
    if config.out_col != config.vector_col:
        out = out.drop(config.vector_col)
    return out.withColumn(VERSION_COLUMN, F.lit(ctx.fit.transform_version))


def apply(ctx: NightlyContext, info: dict) -> None:
    """Full mode: nothing is planned here; :func:`diagnose_output` reads the pinned input once for the output's
    facts and :func:`publish_output` transforms it once more as it writes (neither caches: a cached copy of a
    10M × 768 table is as big as the table on local disk). Incremental: only the rows appended since the previous
    publish, the MERGE source: read from the data files the input gained (:func:`appended_files`) when the last
    publish recorded its output's sums and the correction is affine (:func:`summed_incremental`: the
    would-be table's facts are then the last publish's plus the new rows', no published row is read); else the new
    valid rows (cached) unioned with the current output as the would-be table, which the gate reads."""
    config, spark, rec, table, out = ctx.config, ctx.spark, ctx.record, ctx.table, ctx.output
    rec.mode_reason = full_rebuild_reason(ctx)
    rec.mode = "full" if rec.mode_reason else "incremental"
    if rec.mode == "incremental" and summed_incremental(ctx):
        out.new_rows = written_rows(ctx, out.appended)
    elif rec.mode == "incremental":
        old_ids = read_table(spark, config.input, ctx.last_publish["input_version"])[0].select(config.id_col)
        new_valid = table.valid.join(old_ids, config.id_col, "left_anti")
        out.new_rows = transformed(ctx, new_valid).persist(StorageLevel.MEMORY_AND_DISK)
        ctx.cleanup.callback(out.new_rows.unpersist)
        existing = read_table(spark, config.output, table.output_state.version)[0]
        out.candidate = existing.unionByName(out.new_rows, allowMissingColumns=False)
        info["rows"] = rec.counts.rows_written = out.new_rows.count()
    else:
        out.files = file_count(scan_bytes(table.input_df), config.target_file_mb)


def summed_incremental(ctx: NightlyContext) -> bool:
    """Whether this incremental night can gate on sums: the last publish's record holds its :class:`OutputSums`,
    the correction is affine (its output moments follow from the input's), and pyarrow can read the input's
    data files; then sets the output's ``appended`` files and ``previous`` record."""
    files, model, out = ctx.table.files, ctx.fit.model, ctx.output
    if files is None or model is None or model.transform_.linear_map() is None:
        return False
    previous = read_record(ctx.config, ctx.last_publish["run_id"])
    if previous is None or previous.output_sums is None:
        return False
    out.previous, out.appended = previous, appended_files(ctx, files)
    return True


def appended_files(ctx: NightlyContext, files: TableFiles) -> TableFiles:
    """The data ``files`` of the pinned input that it gained since the input version of the last publish (every
    commit since an append: :func:`full_rebuild_reason`), with their row count."""
    config = ctx.config
    before, _ = read_table(ctx.spark, config.input, ctx.last_publish["input_version"])
    known = set(before.inputFiles())
    return dataclasses.replace(
        files, uris=tuple(uri for uri in files.uris if uri not in known), rows=files.rows - before.count()
    )


def diagnose_output(ctx: NightlyContext, info: dict) -> None:
    """Diagnose the would-be output. Full mode: ONE pass over the pinned input (:func:`output_pass`) gives the
    rows, the output's unit-vector and length sums (its full moments for a correction that is not affine) and, on a
    label-free night, the neighbour-overlap lists; the moments of an affine correction follow from the input's
    (:mod:`anisotropy_core.output_facts`). Incremental: the would-be table (current output and new rows) is
    diagnosed by a pass over it. A failure (e.g. a non-finite vector) is left for the gate to report. A row the
    transform cannot map (:class:`~anisotropy_spark.contract.TransformRowError`, e.g. a value that overflows
    float32 after the cast, raised in a worker and received by its class) leaves no output to gate: GateError
    naming the row."""
    out = ctx.output
    try:
        if out.new_rows is None or out.appended is not None:
            output_pass(ctx, info)
        else:
            out.metrics = diagnose_dataframe(would_be_table(out), ctx.config.out_col, ctx.fit.d_out).scalars()
    except Exception as exc:  # noqa: BLE001 — a worker's error arrives wrapped by Spark; only typed ones are handled
        found = worker_error(exc) or exc
        if isinstance(found, TransformRowError):
            raise GateError([f"the transform cannot produce the output: {found}"]) from None
        if not isinstance(found, ValueError):
            raise
        out.error = str(found).splitlines()[0]
    ctx.record.output_metrics = out.metrics


def would_be_table(out: WouldBeOutput) -> DataFrame:
    """The ``candidate`` of an incremental night not summed from the last publish: the current output and the new
    rows, the would-be table that :func:`diagnose_output` and the gate read."""
    return required(out.candidate, "the apply stage planned no would-be table")


def output_pass(ctx: NightlyContext, info: dict) -> None:
    """The full rebuild's output facts (:func:`anisotropy_spark.output_pass.output_facts`): the pinned input read
    once (pyarrow where the validation pass could, else Spark's scan), its valid rows kept as the validation kept
    them (contract, norm-outlier limit, duplicated ids) and transformed as the write will; sets the output's
    ``metrics``, its ``rows`` and, on a label-free night with a transform, the ``neighbour_overlap``."""
    config, table, out, model = ctx.config, ctx.table, ctx.output, ctx.fit.model
    transform = model.transform_ if model is not None else None
    files = out.appended if out.appended is not None else table.files
    source = (
        table.input_df
        if out.appended is None
        else ctx.spark.read.schema(table.input_df.schema).parquet(*out.appended.uris)
    )
    vectors = as_vector_array(source, config.vector_col)
    element = output_element_type(config.output_dtype, vector_element_type(vectors, config.vector_col))
    duplicates = table.checked.duplicates
    overlap, query_ids = None, None
    if table.overlap_rows is not None and transform is not None and out.appended is None:
        query_ids, raw_queries = table.overlap_rows
        overlap = OverlapQueries.of(raw_queries, transform, config.neighbour_k)
    spec = OutputPass(
        config.vector_col,
        config.id_col,
        table.checked.dimension,
        transform,
        numpy_dtype(element),
        table.checked.max_norm,
        duplicates.ids.toArrow().column(0).combine_chunks() if duplicates and duplicates.tally.total else None,
        overlap,
        query_ids,
    )
    facts, out.reader = output_facts(vectors, files, spec)
    info["reader"] = out.reader
    if out.previous is not None:  # an incremental night: the last publish's rows and these
        sums = required(out.previous.output_sums, "the last publish's record holds no output sums")
        facts = facts.merge(OutputFacts(sums.rows, np.asarray(sums.sum_unit), sums.sum_norm))
        ctx.record.counts.rows_written = facts.rows - sums.rows
    out.rows = info["rows"] = facts.rows
    ctx.record.output_sums = OutputSums(facts.rows, facts.sum_norm, facts.sum_unit.tolist())
    moments = facts.output_moments(table.moments, transform) if transform is not None else table.moments
    out.metrics = diagnose_moments(moments).scalars()
    if overlap is not None:
        raw_top = required(facts.raw_top, "the output pass gathered no top-k lists")
        corrected_top = required(facts.corrected_top, "the output pass gathered no top-k lists")
        out.neighbour_overlap = float(neighbour_overlap(raw_top[1], corrected_top[1]).mean())
        out.overlap_queries = overlap.size


def vector_element_type(vectors: DataFrame, vector_col: str) -> FloatType | DoubleType:
    """The element type of ``vector_col`` of a frame :func:`~anisotropy_spark.io.as_vector_array` returned."""
    kind = vectors.schema[vector_col].dataType
    if not (isinstance(kind, ArrayType) and isinstance(kind.elementType, (FloatType, DoubleType))):
        raise RuntimeError(f"{vector_col} is no vector array column: {kind.simpleString()}")
    return kind.elementType


def gate_output(ctx: NightlyContext, info: dict) -> None:
    """:func:`jobs.gate.gate_facts` of a full rebuild's output pass, or :func:`jobs.gate.gate` of the incremental
    would-be table (counts and bounds), the neighbour-overlap gate (:func:`neighbour_gate`) and, for an
    explicitly configured method with an ``evaluation:`` block, the quality gate (:func:`quality_gate`). Every
    failed check is listed in ONE GateError (nothing is published)."""
    rec, out = ctx.record, ctx.output
    problems = []
    try:
        if out.new_rows is None or out.appended is not None:
            counts = gate_facts(out.rows, ctx.table.moments.n, ctx.config, ctx.fit.d_out, out.metrics, out.error)
        else:
            counts = gate(would_be_table(out), ctx.table.valid, ctx.config, ctx.fit.d_out, out.metrics, out.error)
        rec.counts.update(**counts)
        info["rows"] = rec.counts.output_rows
        if rec.mode == "full":
            rec.counts.rows_written = info["rows"]
    except GateError as exc:
        problems += exc.problems
    settings = active_evaluation(ctx.config)
    if settings is not None and ctx.fit.chosen is None and ctx.fit.method != Method.NONE:
        problems += quality_gate(ctx, settings)
    problems += neighbour_gate(ctx)
    if problems:
        raise GateError(problems)
    if rec.evidence == "label_free":
        overlap = required(rec.neighbour_overlap, "the neighbour gate recorded no overlap")
        unverified = (
            f"unverified: {ctx.fit.method} applied without labelled evidence (no evaluation queries or "
            f"pairs: the recommendation alone); neighbour overlap {overlap.mean:.3f} >= "
            f"min_neighbour_overlap {overlap.min:g}"
        )
        earlier = rec.reason  # e.g. why a night that looked like a no-op was not one
        rec.reason = f"{earlier}; {unverified}" if earlier else unverified
    elif ctx.findings.evaluation is not None:
        evaluated = required(rec.evaluation, "the evaluate stage recorded no evaluation")
        evaluated["gate"] = {"candidate": ctx.fit.chosen, "passes": True, "reason": evaluated["decision"]["reason"]}


def quality_gate(ctx: NightlyContext, settings: EvaluationConfig) -> list[str]:
    """An explicitly configured method against raw: the applied model (as fitted on every row) and raw scored on
    every query / pair of the ``evaluation:`` block (``settings``) in one pass, with the paired bootstrap
    (:func:`jobs.evaluation.score_applied`; the same pass gives the neighbour overlap); refused when an interval of
    Δ vs raw lies below −``max_quality_drop`` (:func:`anisotropy_core.candidates.refuse_explicit`). Records
    ``evaluation`` with its ``gate``; returns the problem (empty when it passes)."""
    config = ctx.config
    model = required(ctx.fit.model, f"method {ctx.fit.method}: the fit stage fitted no model")
    scored = evaluation.score_applied(
        ctx.spark,
        ctx.table.valid,
        config.vector_col,
        config.id_col,
        ctx.findings.report.d,
        model.transform_,
        settings,
        overlap_sample(config),
    )
    ctx.output.neighbour_overlap = scored["neighbour_overlap"]
    passes, reason = refuse_explicit(scored["intervals"]["applied"], settings.max_quality_drop)
    ctx.record.evaluation = {
        "evidence": "labelled",
        "metric": settings.selection_metric(),
        **scored,
        "gate": {"candidate": "applied", "passes": passes, "reason": reason},
    }
    return [] if passes else [reason]


def neighbour_gate(ctx: NightlyContext) -> list[str]:
    """The mean overlap of each sampled corpus row's raw top-k with its corrected top-k (own row excluded), from
    the evaluation pass or a full rebuild's output pass when one measured it, carried over from the last publish on a
    summed incremental night (the same transform, only appended rows: ``neighbour_overlap_from`` names the run that
    measured it), else one pass now; recorded as ``neighbour_overlap`` and refused
    below ``min_neighbour_overlap``. Returns the problem (empty when it passes)."""
    config, out, previous = ctx.config, ctx.output, ctx.output.previous
    carried = previous.neighbour_overlap if previous is not None else None
    if out.neighbour_overlap is None and previous is not None and carried is not None:
        ctx.record.neighbour_overlap = dataclasses.replace(
            carried,
            min=config.min_neighbour_overlap,
            passes=carried.mean >= config.min_neighbour_overlap,
        )
        ctx.record.neighbour_overlap_from = previous.neighbour_overlap_from or previous.run_id
        out.neighbour_overlap = carried.mean
        return [] if ctx.record.neighbour_overlap.passes else [overlap_problem(config, carried.mean)]
    if out.neighbour_overlap is None:
        out.neighbour_overlap = evaluation.neighbour_check(
            ctx.table.valid,
            config.vector_col,
            config.id_col,
            ctx.findings.report.d,
            ctx.fit.model.transform_ if ctx.fit.model is not None else None,
            overlap_sample(config),
        )
    value = out.neighbour_overlap
    passes = value >= config.min_neighbour_overlap
    rows = out.overlap_queries or config.neighbour_sample
    ctx.record.neighbour_overlap = NeighbourOverlap(
        mean=value, k=config.neighbour_k, rows=rows, min=config.min_neighbour_overlap, passes=passes
    )
    return [] if passes else [overlap_problem(config, value)]


def overlap_problem(config: NightlyConfig, value: float) -> str:
    """The neighbour gate's refusal of a mean overlap ``value``."""
    return (
        f"neighbour overlap {value:.3f} < min_neighbour_overlap {config.min_neighbour_overlap:g}: the correction "
        f"keeps {value:.0%} of each sampled row's raw top-{config.neighbour_k} neighbours"
    )


def reject_fit(ctx: NightlyContext, reason: str) -> None:
    """After the gate refused the output: mark the fit this run saved ``rejected`` in its fit report
    (:func:`jobs.fit_or_reuse.mark_rejected`; kept, never reused), unless it is the artifact the output is served
    with (a refit of the same numbers). Records ``applied.rejected``."""
    if not ctx.fit.refitted:
        return
    applied = ctx.applied
    artifact = required(applied.artifact, "the fit stage saved no artifact of its refit")
    if artifact == (ctx.previous or {}).get("artifact"):
        return
    mark_rejected(artifact, ctx.record.run_id, reason)
    applied.rejected = True


def publish_output(ctx: NightlyContext, info: dict) -> None:
    """ONE Delta commit with the run's metadata; see :func:`anisotropy_spark.publish.publish`. A full rebuild is
    :func:`written_rows`, written as at most ``output_files`` data files (:mod:`anisotropy_spark.output_files`;
    ``counts.output_files``). A data file pyarrow cannot read as the table's columns (e.g. one written before a
    column was added; the output pass reads the vector and id only) fails that write, so nothing is committed, and
    the rows are written again through Spark's scan (``info["reader"]`` says which read them), as the apply job
    does."""
    config, rec, out, current = ctx.config, ctx.record, ctx.output, ctx.table.output_state
    meta = {
        "run_id": rec.run_id,
        "input_path": config.input,
        "input_version": ctx.table.ref.version,
        "transform_version": ctx.fit.transform_version,
        "artifact": ctx.applied.artifact,
        "method": ctx.fit.method,
        "config_hash": rec.config_hash,
        "seq": current.next_seq,
        "mode": rec.mode,
    }
    target = PublishTarget(config.output, config.id_col, config.app_id)
    candidate = out.candidate
    if out.new_rows is not None:
        rec.output.version = publish(ctx.spark, target, candidate, out.new_rows, meta, current.version)
        rec.status = "published"
        return
    files = required(out.files, "the apply stage counted no output files")
    rec.counts.output_files = files
    unreadable = None
    try:
        rec.output.version = publish(ctx.spark, target, written_rows(ctx).coalesce(files), None, meta, current.version)
    except Exception as exc:  # noqa: BLE001 — only a data file pyarrow cannot read is retried
        found = worker_error(exc)
        if out.reader != "pyarrow" or not isinstance(found, FileLayoutError):
            raise
        unreadable = found.reason
    if unreadable is not None:  # outside the handler: the retry's own errors carry no trace of the first write's
        log.warning("the write reads through Spark's scan instead of pyarrow: %s", unreadable)
        out.reader = f"spark ({unreadable})"
        rec.output.version = publish(ctx.spark, target, written_rows(ctx).coalesce(files), None, meta, current.version)
    info["reader"] = out.reader if ctx.fit.model is not None else "spark"
    rec.status = "published"


def written_rows(ctx: NightlyContext, appended: TableFiles | None = None) -> DataFrame:
    """A full rebuild's output rows in ONE transforming pass over the pinned input: the model's ``transform`` with
    ``handleInvalid`` ``keep`` and the validation's norm-outlier limit (``maxNorm``), on pyarrow's read of the data
    files where the output pass read them (:meth:`~anisotropy_spark.estimators.CorrectionModel.transform_files`),
    else on Spark's scan; the invalid rows and every copy of a duplicated id left out, as the validation left them
    out. Method none: the valid rows as they are (:func:`transformed`). ``appended``: the rows of these data files
    only (an incremental night's new rows; a model is required)."""
    config, table = ctx.config, ctx.table
    if ctx.fit.model is None:
        return transformed(ctx, table.valid)
    model = ctx.fit.model.copy().setHandleInvalid("keep").setIdCol(config.id_col).setMaxNorm(table.checked.max_norm)
    model.setOutputDtype(config.output_dtype)
    files = appended if appended is not None else table.files if ctx.output.reader == "pyarrow" else None
    rows = (
        model.transform_files(ctx.spark, files)
        if files is not None
        else model.transform(as_vector_array(table.input_df, config.vector_col))
    )
    rows = rows.where(F.col(REASON_COLUMN).isNull()).drop(REASON_COLUMN)
    if table.checked.duplicates is not None:
        rows = table.checked.duplicates.drop_from(rows)
    if config.out_col != config.vector_col:
        rows = rows.drop(config.vector_col)
    return rows.withColumn(VERSION_COLUMN, F.lit(ctx.fit.transform_version))


def build_index(ctx: NightlyContext, info: dict) -> None:
    """With an ``index:`` block, after a publish: build, verify and swap in the faiss index of the version just
    published (:func:`jobs.index.index_stage`; a refused verification leaves ``CURRENT`` on the previous index and
    the record says why). Recorded as ``index``. Without ``queries`` of its own, the index block verifies nDCG
    with the ``evaluation:`` block's labelled queries, when it has some."""
    config, rec = ctx.config, ctx.record
    if config.index is None or rec.status != "published":
        return
    settings = dataclasses.replace(
        config.index,
        vector_col=config.out_col,
        id_col=config.id_col,
        queries=config.index.queries or LabelledQueries.of_evaluation(config.evaluation),
    )
    rec.index = index_stage(
        ctx.spark,
        settings,
        config.output,
        rec.output.version,
        ctx.applied.artifact,
        raw_table=(config.input, ctx.table.ref.version),
    )
    info["rows"] = rec.counts.output_rows or 0
    (log.info if rec.index["status"] == "published" else log.warning)("index: %s", rec.index.get("reason", ""))


STAGES = (
    ("read", read),
    ("validate", validate_input),
    ("diagnose", diagnose),
    ("decide", decide),
    ("evaluate", evaluate),
    ("fit", fit),
    ("apply", apply),
    ("diagnose_output", diagnose_output),
    ("gate", gate_output),
    ("publish", publish_output),
    ("index", build_index),
)
