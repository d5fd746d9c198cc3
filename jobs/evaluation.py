"""The ``evaluation:`` block shared by the diagnose and nightly jobs: fit every candidate from the diagnosis's
moments state, score each on the evaluation set, pick the best, and (nightly) gate on it.

    record = run_evaluation(spark, valid, vector_col, id_col, dimension, state, recommendation, config.evaluation)
    passes, reason = gate(record, config.evaluation)

``record`` is the run record's ``evaluation`` block: ``{"candidates": {name: {metric: value}}, "raw": {...},
"chosen": name, "metric": metric, "fitted": {name: params}}``.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
from pyspark.sql import DataFrame, SparkSession

from anisotropy_core.candidates import evaluation_record, fit_candidates, quality_gate
from anisotropy_core.decision import DecisionThresholds, Recommendation, whitening_k
from anisotropy_core.diagnostics import centred_spectrum
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import FittedTransform, choose_directions
from anisotropy_spark.evaluation import evaluate_candidates, read_queries
from anisotropy_spark.io import read_table
from jobs.config import EvaluationConfig


def candidate_directions(state: Moments, recommendation: Recommendation) -> list[int]:
    """The evidence directions of the ABTT candidates: the recommendation's set when it recommends ABTT,
    else the artefact directions it found (``evidence["artefact_directions"]``), else the directions above
    the Marchenko–Pastur edge."""
    if recommendation.method == "abtt" and recommendation.directions:
        return list(recommendation.directions)
    if recommendation.evidence.get("artefact_directions"):
        return list(recommendation.evidence["artefact_directions"])
    lam, _ = centred_spectrum(state)
    return choose_directions(lam, state.n, state.d, "marchenko_pastur")[0]


def fit_for_evaluation(state: Moments, recommendation: Recommendation, thresholds: DecisionThresholds,
                       cluster_recenter: FittedTransform | None = None) -> dict[str, FittedTransform | None]:
    """Every candidate from one moments state (see :func:`anisotropy_core.candidates.fit_candidates`);
    whitening-k uses the recommendation's k, else the ``whitening_variance`` rule."""
    lam, _ = centred_spectrum(state)
    k = recommendation.k if recommendation.method == "whitening" and recommendation.k else \
        whitening_k(lam, state.n, thresholds.whitening_variance)
    return fit_candidates(state, candidate_directions(state, recommendation), k, cluster_recenter)


def run_evaluation(spark: SparkSession, valid: DataFrame, vector_col: str, id_col: str, dimension: int,
                   state: Moments, recommendation: Recommendation, config: EvaluationConfig,
                   thresholds: DecisionThresholds = DecisionThresholds(),
                   cluster_recenter: FittedTransform | None = None) -> dict:
    """Fit, score and choose (see the module docstring). ``valid``: the validated corpus rows."""
    candidates = fit_for_evaluation(state, recommendation, thresholds, cluster_recenter)
    return score_candidates(spark, valid, vector_col, id_col, dimension, candidates, config)


def score_candidates(spark: SparkSession, valid: DataFrame, vector_col: str, id_col: str, dimension: int,
                     candidates: Mapping[str, FittedTransform | None], config: EvaluationConfig) -> dict:
    """Score ``candidates`` ({name: transform, None = raw}) on the evaluation set in one distributed pass and
    choose the best; returns the record of the module docstring."""
    queries = read_queries(spark, config.queries, config.query_id_col, config.query_vector_col,
                           config.relevant_col, dimension) if config.queries else None
    pairs = read_table(spark, config.pairs, None)[0] if config.pairs else None
    scores = evaluate_candidates(valid, vector_col, id_col, dimension, dict(candidates), queries, pairs, config.k,
                                 config.exclude_self, tuple(config.pair_cols))
    record = evaluation_record(scores, config.selection_metric())
    record["fitted"] = {name: ({"method": t.method, **t.params()} if t is not None else {"method": "none"})
                        for name, t in candidates.items()}
    record["queries"] = None if queries is None else int(queries.ids.shape[0])
    return record


def gate(record: Mapping, config: EvaluationConfig, candidate: str | None = None) -> tuple[bool, str]:
    """The quality gate on ``candidate`` (default: the chosen one) against raw; see
    :func:`anisotropy_core.candidates.quality_gate`."""
    name = candidate or record["chosen"]
    return quality_gate(record["raw"], record["candidates"][name], config.max_quality_drop)


def evaluation_markdown(record: Mapping) -> str:
    """The candidate table as Markdown (chosen candidate marked)."""
    metrics = sorted({m for row in record["candidates"].values() for m in row})
    lines = ["| candidate | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for name, row in record["candidates"].items():
        shown = f"**{name}** (chosen)" if name == record["chosen"] else ("none (raw)" if name == "none" else name)
        lines.append(f"| {shown} | " + " | ".join(f"{row[m]:.4f}" if np.isfinite(row.get(m, np.nan)) else "–"
                                                  for m in metrics) + " |")
    return "\n".join(lines)
