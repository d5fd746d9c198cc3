"""Diagnosis job: measure how anisotropic an embedding table is, in one pass.

    anisotropy diagnose --conf conf/diagnose.yaml [--input PATH] [--vector-col C] [--id-col C] ...
    python -m jobs.diagnose --conf conf/diagnose.yaml ...
    spark-submit --packages io.delta:delta-spark_2.13:4.0.0 jobs/diagnose.py --conf conf/diagnose.yaml

Writes ``report.json`` and ``report.md`` to ``output_dir``, prints the Markdown summary, and appends one
row of scalar metrics to the Delta ``metrics_table`` so diagnoses can be tracked night over night.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import sys
import uuid
from typing import Any, Literal

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
from pyspark.sql import DataFrame, SparkSession

from anisotropy_core import storage
from anisotropy_core.artefact_evidence import DEFAULT_DIRECTIONS, sample_artefact_test
from anisotropy_core.cluster_diagnostics import ClusterTable
from anisotropy_core.decision import ArtefactEvidence, DecisionThresholds, Recommendation, recommend
from anisotropy_core.diagnostics import Diagnosis, diagnose, plain_scalar
from anisotropy_core.isotropy_measures import (
    isoscore_from_spectrum,
    partition_ratio,
    sampling_noise,
    sign_structure_null,
    uniformity,
)
from anisotropy_core.mixture_evidence import mixture_check
from anisotropy_core.report import CLUSTER_KEYS, cell_text, write_report_assets
from anisotropy_spark.contract import require_schema
from anisotropy_spark.diagnostics import drawn_or_sampled, pair_alignment
from anisotropy_spark.io import TableRef, as_vector_array, read_table, validate
from anisotropy_spark.kmeans import fit_kmeans, spark_cluster_diagnostics
from anisotropy_spark.row_sample import RowSample
from anisotropy_spark.session import get_spark
from anisotropy_spark.table_files import table_files
from jobs.cli import run
from jobs.config import (
    EvaluationConfig,
    InputSettings,
    VectorReader,
    config_hash,
    parse_args,
)
from jobs.evaluation import evaluation_markdown, run_evaluation
from jobs.stage_log import timed_stage

log = logging.getLogger("anisotropy.diagnose")


@dataclasses.dataclass(frozen=True)
class ExtraMetrics:
    """The scalar measures this job adds to the moments' :class:`~anisotropy_core.diagnostics.Diagnosis`, from the
    spectrum, the driver sample and the null models (meanings: :data:`METRIC_MEANINGS`)."""

    isoscore: float
    A_noise_z: float
    null_effective_rank: float
    A_sign_null: float
    partition_ratio: float
    uniformity: float


EXTRA_METRICS = tuple(f.name for f in dataclasses.fields(ExtraMetrics))
# the diagnosis's scalars, then the measures this job adds
SCALAR_METRICS = Diagnosis.scalar_names() + EXTRA_METRICS
# the diagnosis's arrays that report.json carries (the (d, d) principal directions stay out)
REPORT_ARRAYS = ("power_law_range", "spectrum", "u1", "mean")

INTEGER_METRICS = {"n", "d", "numerical_rank", "mp_above_upper"}

METRIC_MEANINGS = {
    "n": "valid vectors diagnosed",
    "d": "dimension",
    "offset_ratio": "‖mean of unit vectors‖: 0 = centred on the origin, 1 = all vectors point the same way",
    "anisotropy_A": "average pairwise cosine, exact: (n·offset² − 1)/(n − 1)",
    "isotropic_sd": "1/√d, the spread of cosines between unrelated vectors in an isotropic space",
    "top1_var": "share of centred variance along the first principal direction",
    "top10_var": "share of centred variance in the first 10 principal directions",
    "effective_rank": "exp(entropy of the centred spectrum): dimensions actually used",
    "erank_frac": "effective_rank / d",
    "mean_norm_ratio": "‖μ‖ / mean ‖v‖: the raw mean's length relative to a typical vector",
    "raw_top1_share": "top-1 share of the uncentred second moment (offset + shape together)",
    "numerical_rank": "eigenvalues above 1e-10·λ₁ (below d means rank collapse)",
    "mp_lower": "Marchenko–Pastur lower edge for isotropic data of this n, d and total variance",
    "mp_upper": "Marchenko–Pastur upper edge for isotropic data of this n, d and total variance",
    "mp_above_upper": "eigenvalues above that edge: directions that are more than sampling noise",
    "power_law_alpha": "slope α of the log-log spectrum, λ_k ∝ k^−α, fitted over the eigenvalues above the "
    "Marchenko–Pastur edge only (power_law_range); empty when fewer than 3 are above it. "
    "α ≈ 1 is healthy (erank 20 % of d at d = 768), α ≳ 1.5 wastes the space",
    "erank_alpha": "the α of a k^−α spectrum with this effective rank over d: a cross-check of the fitted slope",
    "isoscore": "IsoScore (Rudman et al. 2022): fraction of dimensions used uniformly, 0…1",
    "A_noise_z": "A − A_sign_null in standard errors of A for an isotropic sample of this n and d",
    "null_effective_rank": "effective rank that isotropic noise of this n and d would report",
    "A_sign_null": "the zero A should be compared with: 0 for sign-symmetric data, m²/s measured from the data for "
    "non-negative data (1/π dense ReLU, ½ dense Exp(1), q/2 sparse) (sample)",
    "partition_ratio": "min Z(c)/max Z(c) over principal directions (1 = isotropic) (sample)",
    "uniformity": "log E exp(−2‖x̂−ŷ‖²) over the sample's pairs (Wang & Isola): −4 spread out … 0 one direction; "
    "≈ −4(1 − A) when cosines are tight (sample)",
}


@dataclasses.dataclass(kw_only=True)
class DiagnoseConfig(InputSettings):
    """Settings of the diagnosis job (conf/diagnose.yaml)."""

    input_version: int | None = None
    vector_reader: VectorReader = "auto"
    metadata_cols: list[str] = dataclasses.field(default_factory=list)
    label_col: str | None = None
    pairs: str | None = None
    sample_size: int = 2000
    cluster_k: int | None = None
    cluster_distance_measure: Literal["euclidean", "cosine"] = "euclidean"
    cluster_fit_rows: int = 100_000
    seed: int = 0
    artefact_directions: int = DEFAULT_DIRECTIONS
    decision: DecisionThresholds = dataclasses.field(default_factory=DecisionThresholds)
    evaluation: EvaluationConfig | None = None
    output_dir: str = "out/diagnose"
    metrics_table: str | None = "out/metrics"
    master: str | None = None

    def check(self) -> list[str]:
        problems = self.input_problems()
        if self.sample_size < 2:
            problems.append(f"sample_size must be ≥ 2, got {self.sample_size}")
        if self.cluster_k is not None and self.cluster_k < 1:
            problems.append(f"cluster_k must be ≥ 1, got {self.cluster_k}")
        if self.cluster_fit_rows < 1:
            problems.append(f"cluster_fit_rows must be ≥ 1, got {self.cluster_fit_rows}")
        if self.artefact_directions < 1:
            problems.append(f"artefact_directions must be ≥ 1, got {self.artefact_directions}")
        return problems + [f"decision.{p}" for p in self.decision.check()]


@dataclasses.dataclass(frozen=True)
class DriverSample:
    """A uniform random sample of at most ``sample_size`` valid rows, held on the driver: ``vectors`` (m, d) and the
    ``metadata`` columns drawn with them ({column: (m,)}). The artefact test, the sampled measures and the pictures
    read it; no report serialises it."""

    vectors: np.ndarray
    metadata: dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class DiagnosisReport:
    """One run of the diagnosis job: the moments' ``diagnosis`` as :func:`anisotropy_core.diagnose` returned it,
    the ``extra`` measures, the ``recommendation`` and the evidence behind it, in memory and typed.

    ``run_id``, ``created_at`` (ISO-8601, UTC), ``input`` (the table read, at its pinned version), ``config_hash``,
    ``invalid_rows`` and ``invalid_by_reason`` (set aside by the input contract), ``stages`` (one timing record per
    stage), ``evaluation`` (:func:`jobs.evaluation.run_evaluation`'s record, or None), ``sampling_noise`` and
    ``sign_structure`` (:mod:`anisotropy_core.isotropy_measures`), ``artefact`` (the artefact test of the sample),
    ``per_cluster`` (with ``cluster_k``, else None), ``alignment`` (with ``pairs``, else None) and ``sample`` (the
    :class:`DriverSample`, never serialised).

    :meth:`to_json` is its one serialisation: ``report.json``, and what :func:`markdown_summary` renders.
    """

    run_id: str
    created_at: str
    input: TableRef
    config_hash: str
    invalid_rows: int
    invalid_by_reason: dict[str, int]
    diagnosis: Diagnosis
    extra: ExtraMetrics
    stages: list[dict]
    recommendation: Recommendation
    evaluation: dict | None
    sampling_noise: dict
    sign_structure: dict
    artefact: ArtefactEvidence
    per_cluster: ClusterTable | None
    alignment: dict | None
    sample: DriverSample = dataclasses.field(repr=False, compare=False)

    @property
    def metrics(self) -> dict[str, int | float | None]:
        """{metric: plain Python number, None where undefined} of every :data:`SCALAR_METRICS` name."""
        values = {**self.diagnosis.scalars(), **{k: plain_scalar(v) for k, v in dataclasses.asdict(self.extra).items()}}
        return {k: defined(v) for k, v in values.items()}

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready report (``report.json``): every field but ``sample``; the diagnosis as ``metrics`` (with
        the extra measures) and its :data:`REPORT_ARRAYS` as lists; ``sample_size`` = the sample's rows."""
        return {
            "run_id": self.run_id,
            "created_at": self.created_at,
            "input": dataclasses.asdict(self.input),
            "config_hash": self.config_hash,
            "invalid_rows": self.invalid_rows,
            "invalid_by_reason": self.invalid_by_reason,
            "metrics": self.metrics,
            "stages": self.stages,
            "recommendation": self.recommendation.to_dict(),
            "evaluation": self.evaluation,
            "sampling_noise": self.sampling_noise,
            "sign_structure": self.sign_structure,
            "sample_size": int(self.sample.vectors.shape[0]),
            **{name: np.asarray(getattr(self.diagnosis, name)).tolist() for name in REPORT_ARRAYS},
            "artefact": self.artefact,
            "per_cluster": self.per_cluster,
            "alignment": self.alignment,
        }


def run_diagnosis(spark: SparkSession, config: DiagnoseConfig) -> DiagnosisReport:
    """Read, validate, diagnose, run the per-direction artefact test, recommend a correction and (with an
    ``evaluation`` block) score every candidate; returns the :class:`DiagnosisReport`.

    Passes over the table: a count (from Delta's file statistics on a Delta table), the moments pass (which also
    checks every row against the input contract and draws the random sample), the duplicate-id aggregate over the
    ids, the quarantine extraction (only when invalid rows exist), a sample pass (only when the moments pass could
    not supply the sample: duplicated ids, or fewer rows drawn than needed) and k-means (only with ``cluster_k``).
    The per-direction artefact test runs on the driver sample (metadata and label columns drawn with it), with its
    permutation null (:mod:`anisotropy_core.artefact_evidence`): no pass of its own. Nothing is cached; each stage
    logs one line, the moments stage's record says what read the vectors (``reader``: pyarrow reads the data files
    in Spark tasks where it can, ``vector_reader``, :mod:`anisotropy_spark.table_files`) and the sample stage's
    where its rows came from (``source``).

    The report's ``sample`` (:class:`DriverSample`) is the random sample of at most ``sample_size`` valid rows the
    artefact test, the sampled measures and the pictures use.
    """
    vector_col, id_col = config.vector_col, config.id_col
    timings: list[dict] = []
    with timed_stage(log, timings, "read") as info:
        df, ref = read_table(spark, config.input, config.input_version)
        require_schema(df.columns, config.named_columns())  # before any pass over the table
        vectors = as_vector_array(df, vector_col)
        info["rows"] = total = vectors.count()  # Delta answers from its file statistics; sizes the sample drawn next
        files, planned = table_files(spark, df, ref.path, ref.format, vector_col, total, config.vector_reader)
    with timed_stage(log, timings, "moments") as info:  # validation, quarantine, moments and sample in one pass
        checked = validate(
            vectors,
            vector_col,
            id_col,
            config.dimension,
            config.on_invalid,
            config.quarantine_path,
            input_version=ref.version,
            with_moments=True,
            max_norm_ratio=config.max_norm_ratio,
            sample=RowSample(config.sample_size, total, columns=tuple(sampled_columns(config))),
            files=files,
        )
        if checked.moments is None:
            raise RuntimeError("validate(with_moments=True) returned no moments")
        state, valid, d = checked.moments, checked.valid, checked.dimension
        info["rows"], info["reader"] = state.n + checked.invalid_count, checked.reader if files else planned
    report = diagnose(state)
    with timed_stage(log, timings, "sample") as info:
        (vectors_drawn, columns), info["source"] = drawn_or_sampled(
            checked.drawn, valid, vector_col, d, sampled_columns(config), config.sample_size, state.n
        )
        info["rows"] = int(vectors_drawn.shape[0])
    with timed_stage(log, timings, "artefact") as info:
        artefact = artefact_of_sample(
            vectors_drawn,
            columns,
            report,
            config.metadata_cols,
            config.label_col,
            config.artefact_directions,
            config.decision,
            config.seed,
        )
        info["rows"] = int(vectors_drawn.shape[0])
    sample = DriverSample(vectors_drawn, {c: columns[c] for c in config.metadata_cols})
    per_cluster: ClusterTable | None = None
    if config.cluster_k:
        with timed_stage(log, timings, "clusters") as info:
            per_cluster = per_cluster_table(valid, config, d, report.n)
            if vectors_drawn.shape[0] >= 4 * config.cluster_k:  # the null of the mixture check, on the sample
                try:
                    null = mixture_check(vectors_drawn, config.cluster_k, config.cluster_distance_measure, config.seed)[
                        1
                    ]
                    per_cluster["mixture_null"], per_cluster["mixture_p"] = null["mixture_null"], null["mixture_p"]
                except ValueError as exc:
                    per_cluster["mixture_null"] = {"skipped": str(exc)}
            info["rows"] = state.n
    aligned = None
    if config.pairs:
        with timed_stage(log, timings, "alignment"):
            aligned = pair_alignment(valid, vector_col, id_col, read_table(spark, config.pairs)[0])
    sign_null = sign_structure_null(sample.vectors)
    noise = sampling_noise(report, A_sign_null=sign_null["null"])  # A_z measured from the sign null
    extra = ExtraMetrics(
        isoscore=isoscore_from_spectrum(report.spectrum),
        A_noise_z=noise["A_z"],
        null_effective_rank=noise["null_effective_rank"],
        A_sign_null=sign_null["null"],
        partition_ratio=partition_ratio(sample.vectors)["I"],
        uniformity=uniformity(sample.vectors)["uniformity"],
    )
    recommendation = recommend(report, per_cluster, artefact, config.decision, A_sign_null=extra.A_sign_null)
    evaluation = None
    if config.evaluation and config.evaluation.active:
        with timed_stage(log, timings, "evaluation") as info:
            evaluation, _, _ = run_evaluation(
                spark, valid, vector_col, id_col, d, state, recommendation, config.evaluation, config.decision
            )
    return DiagnosisReport(
        run_id=uuid.uuid4().hex,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        input=ref,
        config_hash=config_hash(config),
        invalid_rows=checked.invalid_count,
        invalid_by_reason=checked.invalid_by_reason,
        diagnosis=report,
        extra=extra,
        stages=timings,
        recommendation=recommendation,
        evaluation=evaluation,
        sampling_noise=noise,
        sign_structure=sign_null,
        artefact=artefact,
        per_cluster=per_cluster,
        alignment=aligned,
        sample=sample,
    )


def sampled_columns(config) -> list[str]:
    """The columns drawn with the sample's vectors: the metadata columns, then the label column (if any)."""
    return list(dict.fromkeys(config.metadata_cols + ([config.label_col] if config.label_col else [])))


def artefact_of_sample(
    vectors: np.ndarray,
    columns: dict,
    report: Diagnosis,
    metadata_cols: list[str],
    label_col: str | None,
    directions: int,
    decision: DecisionThresholds,
    seed: int,
) -> ArtefactEvidence:
    """The per-direction artefact test (:func:`anisotropy_core.artefact_evidence.sample_artefact_test`) of the driver
    sample, with the decision's thresholds (``artefact_alpha``, ``artefact_permutations``, ``artefact_corr``,
    ``label_separation``) and ``seed``."""
    return sample_artefact_test(
        vectors,
        columns,
        report,
        metadata_cols,
        label_col,
        directions,
        decision.artefact_permutations,
        seed,
        decision.artefact_alpha,
        decision.artefact_corr,
        decision.label_separation,
    )


def defined(value):
    """A metric value for JSON and the metrics table: NaN (an undefined fit) becomes None, never NaN."""
    return None if isinstance(value, float) and not np.isfinite(value) else value


def per_cluster_table(valid: DataFrame, config: DiagnoseConfig, dimension: int, n: int) -> ClusterTable:
    """k-means (fitted on at most ``cluster_fit_rows`` sampled rows, the seed's recipe) → per-cluster
    diagnosis of all valid rows; see :func:`anisotropy_core.cluster_diagnostics.cluster_diagnostics`."""
    k = config.cluster_k
    if k is None:
        raise ValueError("per_cluster_table needs cluster_k")
    if k > n:
        raise ValueError(f"cluster_k = {k} exceeds the {n} valid vectors")
    fit_on = (
        valid
        if n <= config.cluster_fit_rows
        else valid.sample(fraction=min(1.0, 1.2 * config.cluster_fit_rows / n), seed=config.seed).limit(
            config.cluster_fit_rows
        )
    )
    km = fit_kmeans(
        fit_on, config.vector_col, k, config.cluster_distance_measure, seed=config.seed, dimension=dimension
    )
    return spark_cluster_diagnostics(valid, config.vector_col, km.centroids, config.cluster_distance_measure, dimension)


def markdown_summary(result: dict) -> str:
    """Human-readable report of ``result`` (:meth:`DiagnosisReport.to_json`): one table of metrics with their
    meaning, then the artefact test."""
    m = result["metrics"]
    ref = result["input"]
    lines = [
        f"# Anisotropy diagnosis of `{ref['path']}`"
        + (f" (Delta version {ref['version']})" if ref["version"] is not None else ""),
        "",
        f"run `{result['run_id']}` · {result['created_at']} · invalid rows: {result['invalid_rows']}"
        + (f" {result['invalid_by_reason']}" if result["invalid_rows"] else ""),
        "",
        verdict_markdown(result["recommendation"]),
        "",
    ]
    if result.get("evaluation"):
        lines += [
            f"## Retrieval quality per candidate (best by {result['evaluation']['metric']})",
            "",
            evaluation_markdown(result["evaluation"]),
            "",
        ]
    lines += ["| metric | value | meaning |", "|---|---|---|"]
    for key in SCALAR_METRICS:
        value = m[key]
        shown = f"{value:.6g}" if isinstance(value, float) else ("–" if value is None else str(value))
        lines.append(f"| {key} | {shown} | {METRIC_MEANINGS.get(key, '')} |")
    null = m["A_sign_null"] or 0.0
    sigma = ((m["anisotropy_A"] - null) / m["isotropic_sd"]) if m["isotropic_sd"] else float("nan")
    k_lo, k_hi = result["power_law_range"]
    lines += [
        "",
        f"A is {sigma:.1f} isotropic standard deviations above its null {null:.4g}. "
        f"α was fitted over eigenvalues k = {k_lo}…{k_hi} (those above the Marchenko–Pastur edge).",
        f"Sampled measures (artefact test, sign null, partition ratio, uniformity) use {result['sample_size']} "
        "random vectors.",
    ]
    aligned = result.get("alignment")
    if aligned:
        value = "undefined (no pair matched)" if aligned["alignment"] is None else f"{aligned['alignment']:.6g}"
        lines += [
            f"Alignment E‖x̂−ŷ‖² over {aligned['pairs']} positive pairs: {value}"
            + (
                f" ({aligned['unmatched_pairs']} pairs name an id not among the valid rows)"
                if aligned["unmatched_pairs"]
                else ""
            )
        ]
    artefact = result["artefact"]
    if artefact["abs_corr"] or artefact["label_means"]:
        lines += ["", "## Is u1 an artefact? (|corr| of the u1 projection)", ""]
        lines += [
            f"- {name}: {'undefined (constant column)' if c is None else f'{c:.4f}'}"
            for name, c in artefact["abs_corr"].items()
        ]
        lines += [f"- mean projection for label {label!r}: {v:+.4f}" for label, v in artefact["label_means"].items()]
        u1, null = artefact["directions"][0], artefact["null"]
        if u1.get("p_adjusted") is not None:
            lines.append(
                f"- permutation-adjusted p (maxT over {len(artefact['directions'])} directions × "
                f"{len(null['columns'])} columns × Pearson/Spearman, {null['permutations']} permutations, "
                f"{null['sample_size']} sampled rows): {u1['p_adjusted']:.3g} — "
                + ("an artefact" if u1["significant"] else "not evidence of an artefact")
            )
    if any(row["abs_corr"] or row["label_separation"] is not None for row in artefact.get("directions", [])):
        lines += ["", directions_markdown(artefact["directions"])]
    if result["per_cluster"]:
        lines += ["", cluster_markdown(result["per_cluster"])]
    return "\n".join(lines) + "\n"


def verdict_markdown(recommendation: dict) -> str:
    """The recommendation as Markdown: method (with its directions / k), reasons, warnings."""
    detail = ", ".join(
        f"{key} = {recommendation[key]}" for key in ("directions", "D", "k") if recommendation.get(key) is not None
    )
    lines = [f"## Verdict: {recommendation['method']}" + (f" ({detail})" if detail else ""), ""]
    lines += [f"- {reason}" for reason in recommendation["reasons"]]
    lines += [f"- **warning:** {warning}" for warning in recommendation["warnings"]]
    return "\n".join(lines)


def directions_markdown(directions: list[dict]) -> str:
    """The per-direction artefact test as a Markdown table: |Pearson| / |Spearman| per metadata column, the
    permutation-adjusted p (maxT over directions × columns × both statistics), label separation and its p."""
    columns = sorted({c for row in directions for c in row["abs_corr"]})

    def number(value, form):
        return "–" if value is None else format(value, form)

    lines = [
        "## Per-direction artefact test (|Pearson| / |Spearman| of each principal direction's projection; "
        "p adjusted over all directions and columns)",
        "",
        "| direction | eigenvalue | " + " | ".join(columns) + " | adjusted p | artefact | label separation (SDs) "
        "| label p |",
        "|---" * (len(columns) + 7) + "|",
    ]
    for row in directions:
        cells = [
            f"{number(row['abs_corr'].get(c), '.3f')} / {number(row.get('abs_spearman', {}).get(c), '.3f')}"
            for c in columns
        ]
        lines.append(
            f"| u{row['index']} | {row['eigenvalue']:.4g} | "
            + " | ".join(cells)
            + f" | {number(row.get('p_adjusted'), '.3g')} | {'yes' if row.get('significant') else 'no'} | "
            f"{number(row['label_separation'], '.2f')} | {number(row.get('label_p_adjusted'), '.3g')} |"
        )
    return "\n".join(lines)


def cluster_markdown(table: dict) -> str:
    """The per-cluster diagnosis as a Markdown table, with the "globally anisotropic, locally isotropic" verdict."""
    keys = CLUSTER_KEYS
    lines = ["## Per cluster", "", "| cluster | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    rows = [("all", table["global"])] + [(str(r["cluster"]), r) for r in table["clusters"]]
    lines += [f"| {name} | " + " | ".join(cell_text(row.get(k)) for k in keys) + " |" for name, row in rows]
    verdict = (
        "globally anisotropic, locally isotropic: every cluster has a lower top-1 share and a higher "
        "effective rank than the whole corpus"
        if table["locally_isotropic"]
        else "not locally isotropic: some cluster is as concentrated as the whole corpus"
    )
    return "\n".join(lines + ["", verdict])


def append_metrics_row(spark: SparkSession, table: str, result: DiagnosisReport) -> None:
    """Append one row (run id, time, input path + version, config hash, scalar metrics) to a Delta table."""
    row = {
        "run_id": result.run_id,
        "created_at": datetime.datetime.fromisoformat(result.created_at),
        "input_path": result.input.path,
        "input_version": result.input.version,
        "config_hash": result.config_hash,
        "invalid_rows": result.invalid_rows,
    }
    row.update({k: v if v is None or k in INTEGER_METRICS else float(v) for k, v in result.metrics.items()})
    schema = (
        "run_id string, created_at timestamp, input_path string, input_version long, config_hash string, "
        "invalid_rows long, " + ", ".join(f"{k} {'long' if k in INTEGER_METRICS else 'double'}" for k in SCALAR_METRICS)
    )
    (
        spark.createDataFrame([row], schema)
        .write.format("delta")
        .mode("append")
        .option("mergeSchema", "true")
        .save(table)
    )  # a metric added by a newer version becomes a new column


def write_outputs(
    spark: SparkSession,
    config: DiagnoseConfig,
    result: DiagnosisReport,
    before: DiagnosisReport | None = None,
    applied: dict | None = None,
) -> str:
    """Write report.json (:meth:`DiagnosisReport.to_json`) / report.md, the PNGs + report.html, and the metrics row;
    returns the Markdown.

    ``before``: the report of the same corpus before a transform (adds before/after panels).
    ``applied``: ``{"headline", "notes"}`` of a run that applied a correction to this corpus: the page and the
    Markdown open with it.
    """
    data = result.to_json()
    storage.write_atomic(storage.join(config.output_dir, "report.json"), json.dumps(data, indent=2, default=str))
    write_report_assets(
        picture_report(result),
        config.output_dir,
        samples=result.sample.vectors,
        metadata=result.sample.metadata or None,
        before=picture_report(before) if before else None,
        before_samples=before.sample.vectors if before else None,
        title=f"Anisotropy report: {result.input.path}",
        artefact_directions=result.artefact.get("directions"),
        meanings=METRIC_MEANINGS,
        verdict=data["recommendation"],
        evaluation=result.evaluation,
        clusters=result.per_cluster,
        applied=applied,
    )
    summary = markdown_summary(data)
    if applied:
        summary = "\n".join([f"**{applied['headline']}**", *[f"- {note}" for note in applied["notes"]], "", summary])
    storage.write_atomic(storage.join(config.output_dir, "report.md"), summary)
    if config.metrics_table:
        append_metrics_row(spark, config.metrics_table, result)
    return summary


def picture_report(result: DiagnosisReport) -> dict:
    """The flat report shape the pictures read: scalar metrics plus spectrum, u1 and mean as arrays."""
    return {
        **result.metrics,
        **{k: np.asarray(getattr(result.diagnosis, k)) for k in ("spectrum", "u1", "mean")},
        "power_law_range": list(result.diagnosis.power_law_range),
    }


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_args(DiagnoseConfig, argv, "Diagnose the anisotropy of an embedding table")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = get_spark("anisotropy-diagnose", master=config.master)
    result = run_diagnosis(spark, config)
    print(write_outputs(spark, config, result))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
