"""Diagnosis job: measure how anisotropic an embedding table is, in one pass.

    python -m jobs.diagnose --conf conf/diagnose.yaml [--input PATH] [--vector-col C] [--id-col C] ...
    spark-submit --packages io.delta:delta-spark_2.13:4.0.0 jobs/diagnose.py --conf conf/diagnose.yaml

Writes ``report.json`` and ``report.md`` to ``output_dir``, prints the Markdown summary, and appends one
row of scalar metrics to the Delta ``metrics_table`` so diagnoses can be tracked night over night.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import uuid
from typing import Literal

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
from pyspark.sql import DataFrame, SparkSession

from anisotropy_core.diagnostics import plain_scalar
from anisotropy_core.isotropy_measures import (isoscore_from_spectrum, partition_ratio, sampling_noise,
                                               sign_structure_null, uniformity)
from anisotropy_core.report import write_report_assets
from anisotropy_spark.diagnostics import diagnose_dataframe, pair_alignment, sample_rows, u1_artefact_test
from anisotropy_spark.io import as_double_array, read_table, validate
from anisotropy_spark.kmeans import fit_kmeans, spark_cluster_diagnostics
from anisotropy_spark.session import get_spark
from jobs.config import config_hash, parse_args, quarantine_problems

SCALAR_METRICS = ["n", "d", "offset_ratio", "anisotropy_A", "isotropic_sd", "top1_var", "top10_var",
                  "effective_rank", "erank_frac", "mean_norm_ratio", "raw_top1_share", "numerical_rank",
                  "mp_lower", "mp_upper", "mp_above_upper", "power_law_alpha", "isoscore", "A_noise_z",
                  "null_effective_rank", "A_sign_null", "partition_ratio", "uniformity"]

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
    "power_law_alpha": "slope α of the log-log spectrum, λ_k ∝ k^−α",
    "isoscore": "IsoScore (Rudman et al. 2022): fraction of dimensions used uniformly, 0…1",
    "A_noise_z": "A in standard errors of A for an isotropic sample of this n and d",
    "null_effective_rank": "effective rank that isotropic noise of this n and d would report",
    "A_sign_null": "the zero A should be compared with: 0, q/2 (sparse non-negative) or 1/π (dense ReLU) (sample)",
    "partition_ratio": "min Z(c)/max Z(c) over principal directions (1 = isotropic) (sample)",
    "uniformity": "log E exp(−2‖x̂−ŷ‖²) over the sample's pairs (Wang & Isola): −4 spread out … 0 one direction; "
                  "≈ −4(1 − A) when cosines are tight (sample)",
}


@dataclasses.dataclass
class DiagnoseConfig:
    """Settings of the diagnosis job (conf/diagnose.yaml)."""

    input: str
    vector_col: str = "vector"
    id_col: str = "id"
    dimension: int | None = None
    input_version: int | None = None
    metadata_cols: list[str] = dataclasses.field(default_factory=list)
    label_col: str | None = None
    pairs: str | None = None
    on_invalid: Literal["error", "quarantine"] = "error"
    quarantine_path: str | None = None
    sample_size: int = 2000
    clusters: int | None = None
    cluster_metric: Literal["euclidean", "cosine"] = "euclidean"
    cluster_fit_rows: int = 100_000
    seed: int = 0
    output_dir: str = "out/diagnose"
    metrics_table: str | None = "out/metrics"
    master: str | None = None

    def check(self) -> list[str]:
        problems = quarantine_problems(self)
        if self.dimension is not None and self.dimension < 1:
            problems.append(f"dimension must be ≥ 1, got {self.dimension}")
        if self.sample_size < 2:
            problems.append(f"sample_size must be ≥ 2, got {self.sample_size}")
        if self.clusters is not None and self.clusters < 1:
            problems.append(f"clusters must be ≥ 1, got {self.clusters}")
        if self.cluster_fit_rows < 1:
            problems.append(f"cluster_fit_rows must be ≥ 1, got {self.cluster_fit_rows}")
        return problems


def run_diagnosis(spark: SparkSession, config: DiagnoseConfig) -> dict:
    """Read, validate, diagnose and run the artefact test; returns the full JSON-ready report.

    The result's private ``_sample`` entry holds (vectors (m, d), {metadata column: (m,)}), a random sample of
    at most ``sample_size`` valid rows used for the in-memory measures and the pictures; it is not serialised.
    """
    df, ref = read_table(spark, config.input, config.input_version)
    checked = validate(as_double_array(df, config.vector_col), config.vector_col, config.id_col,
                       config.dimension, config.on_invalid, config.quarantine_path)
    try:
        report = diagnose_dataframe(checked.valid, config.vector_col, checked.dimension)
        artefact = u1_artefact_test(checked.valid, config.vector_col, report, config.metadata_cols,
                                    config.label_col)
        sample = sample_rows(checked.valid, config.vector_col, checked.dimension, config.metadata_cols,
                             config.sample_size)
        per_cluster = per_cluster_table(checked.valid, config, checked.dimension, report["n"]) \
            if config.clusters else None
        aligned = pair_alignment(checked.valid, config.vector_col, config.id_col,
                                 read_table(spark, config.pairs)[0]) if config.pairs else None
    finally:
        checked.release()
    noise = sampling_noise(report)
    sign_null = sign_structure_null(sample[0])
    report.update(isoscore=isoscore_from_spectrum(report["spectrum"]), A_noise_z=noise["A_z"],
                  null_effective_rank=noise["null_effective_rank"], A_sign_null=sign_null["null"],
                  partition_ratio=partition_ratio(sample[0])["I"], uniformity=uniformity(sample[0])["uniformity"])
    return {
        "run_id": uuid.uuid4().hex,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "input": dataclasses.asdict(ref),
        "config_hash": config_hash(config),
        "invalid_rows": checked.invalid_count,
        "invalid_by_reason": checked.invalid_by_reason,
        "metrics": {k: plain_scalar(report[k]) for k in SCALAR_METRICS},
        "sampling_noise": noise,
        "sign_structure": sign_null,
        "sample_size": int(sample[0].shape[0]),
        "spectrum": report["spectrum"].tolist(),
        "u1": report["u1"].tolist(),
        "mean": report["mean"].tolist(),
        "artefact": artefact,
        "per_cluster": per_cluster,
        "alignment": aligned,
        "_sample": sample,
    }


def per_cluster_table(valid: DataFrame, config: DiagnoseConfig, dimension: int, n: int) -> dict:
    """k-means (fitted on at most ``cluster_fit_rows`` sampled rows, the seed's recipe) → per-cluster
    diagnosis of all valid rows; see :func:`anisotropy_core.clustering.cluster_diagnostics`."""
    if config.clusters > n:
        raise ValueError(f"clusters = {config.clusters} exceeds the {n} valid vectors")
    fit_on = valid if n <= config.cluster_fit_rows else valid.sample(
        fraction=min(1.0, 1.2 * config.cluster_fit_rows / n), seed=config.seed).limit(config.cluster_fit_rows)
    km = fit_kmeans(fit_on, config.vector_col, config.clusters, config.cluster_metric, seed=config.seed,
                    dimension=dimension)
    return spark_cluster_diagnostics(valid, config.vector_col, km.centroids, config.cluster_metric, dimension)


def markdown_summary(result: dict) -> str:
    """Human-readable report: one table of metrics with their meaning, then the artefact test."""
    m = result["metrics"]
    ref = result["input"]
    lines = [f"# Anisotropy diagnosis of `{ref['path']}`" + (f" (Delta version {ref['version']})" if ref["version"] is not None else ""),
             "", f"run `{result['run_id']}` · {result['created_at']} · invalid rows: {result['invalid_rows']}"
             + (f" {result['invalid_by_reason']}" if result["invalid_rows"] else ""), "",
             "| metric | value | meaning |", "|---|---|---|"]
    for key in SCALAR_METRICS:
        value = m[key]
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        lines.append(f"| {key} | {shown} | {METRIC_MEANINGS.get(key, '')} |")
    sigma = (m["anisotropy_A"] / m["isotropic_sd"]) if m["isotropic_sd"] else float("nan")
    lines += ["", f"A is {sigma:.1f} isotropic standard deviations above 0.",
              f"Sampled measures (sign null, partition ratio, uniformity) use {result['sample_size']} random vectors."]
    aligned = result.get("alignment")
    if aligned:
        value = "undefined (no pair matched)" if aligned["alignment"] is None else f"{aligned['alignment']:.6g}"
        lines += [f"Alignment E‖x̂−ŷ‖² over {aligned['pairs']} positive pairs: {value}"
                  + (f" ({aligned['unmatched_pairs']} pairs name an id not among the valid rows)"
                     if aligned["unmatched_pairs"] else "")]
    artefact = result["artefact"]
    if artefact["abs_corr"] or artefact["label_means"]:
        lines += ["", "## Is u1 an artefact? (|corr| of the u1 projection)", ""]
        lines += [f"- {name}: {'undefined (constant column)' if c is None else f'{c:.4f}'}"
                  for name, c in artefact["abs_corr"].items()]
        lines += [f"- mean projection for label {label!r}: {v:+.4f}" for label, v in artefact["label_means"].items()]
    if result["per_cluster"]:
        lines += ["", cluster_markdown(result["per_cluster"])]
    return "\n".join(lines) + "\n"


def cluster_markdown(table: dict) -> str:
    """The per-cluster diagnosis as a Markdown table, with the "globally anisotropic, locally isotropic" verdict."""
    def cell(value):
        return "–" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
    keys = ["size", "share", "anisotropy_A", "offset_ratio", "top1_var", "effective_rank", "induced_A_global_centring"]
    lines = ["## Per cluster", "", "| cluster | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    rows = [("all", table["global"])] + [(str(r["cluster"]), r) for r in table["clusters"]]
    lines += [f"| {name} | " + " | ".join(cell(row.get(k)) for k in keys) + " |" for name, row in rows]
    verdict = ("globally anisotropic, locally isotropic: every cluster has a lower top-1 share and a higher "
               "effective rank than the whole corpus" if table["locally_isotropic"]
               else "not locally isotropic: some cluster is as concentrated as the whole corpus")
    return "\n".join(lines + ["", verdict])


def append_metrics_row(spark: SparkSession, table: str, result: dict) -> None:
    """Append one row (run id, time, input path + version, config hash, scalar metrics) to a Delta table."""
    row = {"run_id": result["run_id"], "created_at": datetime.datetime.fromisoformat(result["created_at"]),
           "input_path": result["input"]["path"], "input_version": result["input"]["version"],
           "config_hash": result["config_hash"], "invalid_rows": result["invalid_rows"]}
    row.update({k: float(v) if isinstance(v, float) else v for k, v in result["metrics"].items()})
    schema = ("run_id string, created_at timestamp, input_path string, input_version long, config_hash string, "
              "invalid_rows long, " + ", ".join(
                  f"{k} {'double' if isinstance(result['metrics'][k], float) else 'long'}" for k in SCALAR_METRICS))
    spark.createDataFrame([row], schema).write.format("delta").mode("append").save(table)


def write_outputs(spark: SparkSession, config: DiagnoseConfig, result: dict, before: dict | None = None) -> str:
    """Write report.json / report.md, the PNGs + report.html, and the metrics row; returns the Markdown.

    ``before``: the result of diagnosing the same corpus before a transform (adds before/after panels).
    """
    os.makedirs(config.output_dir, exist_ok=True)
    with open(os.path.join(config.output_dir, "report.json"), "w", encoding="utf-8") as handle:
        json.dump({k: v for k, v in result.items() if not k.startswith("_")}, handle, indent=2, default=str)
    vectors, metadata = result["_sample"]
    write_report_assets(picture_report(result), config.output_dir, samples=vectors, metadata=metadata or None,
                        before=picture_report(before) if before else None,
                        before_samples=before["_sample"][0] if before else None,
                        title=f"Anisotropy report: {result['input']['path']}")
    summary = markdown_summary(result)
    with open(os.path.join(config.output_dir, "report.md"), "w", encoding="utf-8") as handle:
        handle.write(summary)
    if config.metrics_table:
        append_metrics_row(spark, config.metrics_table, result)
    return summary


def picture_report(result: dict) -> dict:
    """The flat report shape the pictures read: scalar metrics plus spectrum, u1 and mean as arrays."""
    return {**result["metrics"], **{k: np.asarray(result[k]) for k in ("spectrum", "u1", "mean")}}


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_args(DiagnoseConfig, argv, "Diagnose the anisotropy of an embedding table")
    spark = get_spark("anisotropy-diagnose", master=config.master)
    result = run_diagnosis(spark, config)
    print(write_outputs(spark, config, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
