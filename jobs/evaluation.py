"""The ``evaluation:`` block shared by the diagnose and nightly jobs: the candidate grid fitted from the diagnosis's
moments state, scored held out in one distributed pass, with paired bootstrap intervals, and the decision that
follows them (:mod:`anisotropy_core.candidates`).

    record = run_evaluation(spark, valid, vector_col, id_col, dimension, state, recommendation, config.evaluation)

**Held out.** With ``exclude_self`` (queries that are corpus rows) the queries fall into ``folds`` folds by a hash
of their id; fold f is scored by every candidate fitted on ``state.remove(moments of fold f's query rows)`` (exact,
:meth:`~anisotropy_core.moments.Moments.remove`), so no query's own row is in the fit that scores it. The rows
the pairs use are removed once for the pair scores. Every (candidate, fold) list — plus, when asked, the
neighbour-overlap lists of a sample of corpus rows — is scored in ONE pass over the corpus
(:func:`anisotropy_spark.evaluation.distributed_top_k`). ``published`` (the output's current transform) and
``cluster_recenter`` (a k-means fit) are not moment fits: they score every fold as they are.

The record (JSON-ready; the run record's / diagnosis report's ``evaluation`` block)::

    {"evidence": "labelled", "metric": "ndcg@10", "queries": m | None, "pairs": p | None,
     "held_out": {"folds": F, "query_rows_removed": bool, "pair_rows_removed": r | None},
     "split": {"queries_selection": …, "queries_report": …, "pairs_selection": …, "pairs_report": …},
     "bootstrap": {"resamples": B, "confidence": 0.95, "seed": s},
     "candidates": {name: {metric: report-half mean}},          # "none" = raw, "published" when there is one
     "selection": {name: {metric: selection-half mean}},
     "intervals": {name: {"delta_vs_raw": {metric: {"mean", "low", "high"}},
                          "delta_vs_published": {metric: {...}} | None}},
     "neighbour_overlap": {name: mean overlap} | None,
     "fitted": {name: {"family", "origin", "method", …params}},
     "raw": candidates["none"], "best": name, "chosen": name,
     "decision": {"action": "publish" | "keep", "candidate": name, "reason": text},
     "query_drift": [{"index", "drift_sd"}…] | None, "warnings": [text…]}
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np
from pyspark.sql import DataFrame, SparkSession

from anisotropy_core.bootstrap import folds_of
from anisotropy_core.candidates import (
    PUBLISHED,
    RAW,
    Candidate,
    best_candidate,
    candidate_grid,
    decide,
    fit_grid,
    interval_text,
    query_drift,
    summarise,
)
from anisotropy_core.decision import DecisionThresholds, Recommendation
from anisotropy_core.evaluation import neighbour_overlap, per_query_metrics
from anisotropy_core.methods import Method
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import FittedTransform
from anisotropy_spark.evaluation import (
    PairRows,
    QuerySet,
    distributed_top_k,
    integral_ids,
    pair_cosines,
    pair_rows,
    read_queries,
    sample_rows,
)
from anisotropy_spark.io import read_table
from jobs.config import ConfigError, EvaluationConfig

OVERLAP = "overlap:"


@dataclasses.dataclass(frozen=True)
class OverlapSample:
    """The neighbour-overlap check: ``rows`` sampled corpus rows (seeded by ``seed``) as queries, top-``k``."""

    rows: int = 200
    k: int = 10
    seed: int = 0


def grid_for(
    state: Moments, recommendation: Recommendation, thresholds: DecisionThresholds, min_n: int, clusters: bool
) -> list[Candidate]:
    """The candidate grid of ``state`` (:func:`anisotropy_core.candidates.candidate_grid`) with the recommendation's
    evidence: its artefact directions, its candidate D (``evidence["candidate_D"]``) and whitening k
    (``evidence["whitening_k"]``), and its own ABTT set / whitening k."""
    evidence = recommendation.evidence or {}
    extra_D: list = list(as_ints(evidence.get("candidate_D")))  # D values: the top D each
    if recommendation.method == Method.ABTT and recommendation.directions:
        extra_D.append(list(recommendation.directions))  # a set of directions
    extra_k = as_ints(evidence.get("whitening_k")) + (
        [recommendation.k] if recommendation.method == Method.WHITENING and recommendation.k else []
    )
    return candidate_grid(
        state,
        as_ints(evidence.get("artefact_directions")),
        extra_D,
        extra_k,
        thresholds.whitening_variance,
        min_n,
        clusters,
    )


def as_ints(value) -> list[int]:
    """None, an int or a list of ints as a list of ints."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def run_evaluation(
    spark: SparkSession,
    valid: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    state: Moments,
    recommendation: Recommendation,
    config: EvaluationConfig,
    thresholds: DecisionThresholds = DecisionThresholds(),
    cluster_recenter: FittedTransform | None = None,
    published: bool = False,
    published_transform: FittedTransform | None = None,
    overlap: OverlapSample | None = None,
    min_overlap: float = 0.0,
) -> tuple[dict, dict[str, FittedTransform | None], list]:
    """Fit the grid, score it held out, summarise and decide (module docstring). ``valid``: the validated corpus
    rows (their merged moments are ``state``); ``published``: the output already carries a transform,
    ``published_transform`` (None: it carries the raw vectors). Returns (record, {name: transform fitted on all
    rows}, the grid). ``min_overlap``: with ``overlap``, candidates whose mean neighbour overlap is below it are left
    out of the choice (the nightly's neighbour gate would refuse them)."""
    queries, pairs = labelled_inputs(spark, valid, vector_col, id_col, dimension, config)
    fold_states, fold_of = held_out_states(state, queries, config)
    pair_state = state.remove(Moments.of_batch(pairs.distinct_rows())) if pairs is not None else None
    min_n = min(s.n for s in [*fold_states.values(), pair_state] if s is not None)
    grid = grid_for(state, recommendation, thresholds, min_n, cluster_recenter is not None)
    full = fit_grid(state, grid, cluster_recenter)
    extra = {PUBLISHED: published_transform} if published else {}
    names = [*full, *extra]
    fits = {
        f: {**(full if s is state else fit_grid(s, grid, cluster_recenter)), **extra} for f, s in fold_states.items()
    }
    lists = scored_lists(
        valid,
        vector_col,
        id_col,
        dimension,
        queries,
        fold_of,
        fits,
        {**full, **extra},
        overlap,
        config.exclude_self,
        config.k,
    )
    per_query = None
    if queries is not None and fold_of is not None:  # fold_of: one fold per query, given queries
        per_query = {
            name: per_query_metrics(assemble(lists, name, fold_of, config.k), queries.relevant) for name in names
        }
    cosines = None
    if pairs is not None and pair_state is not None:  # pair_state: the corpus less the pair rows
        on_pairs = {**fit_grid(pair_state, grid, cluster_recenter), **extra}
        cosines = {name: pair_cosines(pairs, on_pairs[name]) for name in names}
    try:
        evidence = summarise(
            names,
            per_query,
            None if queries is None else queries.ids,
            cosines,
            None if pairs is None else pairs.gold,
            None if pairs is None else pairs.keys(),
            config.seed,
            config.resamples,
            config.confidence,
        )
    except ValueError as exc:
        raise ConfigError(f"evaluation: {exc}") from exc
    metric = config.selection_metric()
    overlap_of = overlaps(lists, names) if overlap is not None else None
    below = {
        name: f"neighbour overlap {value:.3f} < {min_overlap:g}"
        for name, value in (overlap_of or {}).items()
        if value < min_overlap and name != RAW
    }
    action, chosen, reason = decide(evidence, metric, config.min_gain, published, below)
    record: dict[str, Any] = {
        "evidence": "labelled",
        "metric": metric,
        "queries": None if queries is None else int(queries.ids.shape[0]),
        "pairs": None if pairs is None else int(pairs.gold.shape[0]),
        "held_out": {
            "folds": len(fold_states) if queries is not None else None,
            "query_rows_removed": bool(queries is not None and config.exclude_self),
            "pair_rows_removed": None if pair_state is None else int(state.n - pair_state.n),
        },
        "split": evidence.sizes,
        "bootstrap": {"resamples": config.resamples, "confidence": config.confidence, "seed": config.seed},
        "candidates": evidence.report,
        "selection": evidence.selection,
        "intervals": evidence.intervals,
        "neighbour_overlap": overlap_of,
        "fitted": {c.name: {"family": c.family, "origin": list(c.origin), **fitted_params(full[c.name])} for c in grid}
        | ({PUBLISHED: fitted_params(published_transform)} if published else {}),
        "raw": evidence.report[RAW],
        "best": best_candidate(evidence.selection, metric, below),
        "chosen": chosen,
        "decision": {"action": action, "candidate": chosen, "reason": reason},
        "query_drift": None,
        "warnings": [],
    }
    if queries is not None and not config.exclude_self:
        add_query_drift(record, state, queries, grid)
    return record, {**full, **extra}, grid


def held_out_states(
    state: Moments, queries: QuerySet | None, config: EvaluationConfig
) -> tuple[dict[int, Moments], np.ndarray | None]:
    """({fold: the state its queries are scored from}, (m,) fold of each query). Queries that are corpus rows
    (``exclude_self``): ``config.folds`` folds by a hash of the id, each state = ``state`` minus the fold's rows
    (each id once); other queries: one fold, the whole state."""
    if queries is None:
        return {}, None
    if not config.exclude_self:
        return {0: state}, np.zeros(queries.ids.shape[0], dtype=np.int64)
    fold_of = folds_of(queries.ids, config.folds, config.seed)
    _, first = np.unique(queries.ids, return_index=True)
    states = {}
    for f in np.unique(fold_of):
        rows = first[fold_of[first] == f]
        if rows.shape[0] >= state.n - 1:
            raise ConfigError(
                f"evaluation: fold {f} holds {rows.shape[0]} of the {state.n} corpus rows; the fit "
                "without them needs at least 2 rows (more folds or fewer queries)"
            )
        states[int(f)] = state.remove(Moments.of_batch(queries.vectors[rows]))
    return states, fold_of


def scored_lists(
    valid: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    queries: QuerySet | None,
    fold_of: np.ndarray | None,
    fits: Mapping[int, Mapping[str, FittedTransform | None]],
    full: Mapping[str, FittedTransform | None],
    overlap: OverlapSample | None,
    exclude_self: bool,
    k: int,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every top-k list in one pass: ``"<name>#<fold>"`` for the queries of each fold (scored by that fold's fit),
    ``"overlap:<name>"`` for the sampled corpus rows (scored by the fit on all rows, top-``overlap.k``)."""
    blocks, ids, own, candidates, rows = [], [], [], {}, {}
    if queries is not None:
        blocks.append(queries.vectors)
        ids.append(queries.ids)
        own.append(np.full(queries.ids.shape[0], exclude_self))
        for f, fitted in fits.items():
            members = np.flatnonzero(fold_of == f)
            for name, transform in fitted.items():
                candidates[f"{name}#{f}"], rows[f"{name}#{f}"] = transform, members
    df, key = (valid, id_col) if queries is not None else integral_ids(valid, id_col)
    if overlap is not None:
        sample_ids, sample = sample_rows(df, vector_col, key, dimension, overlap.rows, overlap.seed)
        offset = sum(block.shape[0] for block in blocks)
        blocks.append(sample)
        ids.append(sample_ids)
        own.append(np.ones(sample_ids.shape[0], dtype=bool))
        for name, transform in full.items():
            candidates[f"{OVERLAP}{name}"] = transform
            rows[f"{OVERLAP}{name}"] = offset + np.arange(sample_ids.shape[0])
    if not candidates:
        return {}
    depth = max(k if queries is not None else 1, overlap.k if overlap is not None else 1)
    lists = distributed_top_k(
        df,
        vector_col,
        key,
        dimension,
        candidates,
        np.concatenate(blocks),
        depth,
        np.concatenate(ids),
        rows,
        np.concatenate(own),
    )
    # a top-depth list cut to its first k' entries is the top-k' list (best first, ties by id)
    overlap_k = overlap.k if overlap is not None else k  # the overlap lists exist only with ``overlap``
    return {
        name: (scores[:, :overlap_k], found[:, :overlap_k])
        if name.startswith(OVERLAP)
        else (scores[:, :k], found[:, :k])
        for name, (scores, found) in lists.items()
    }


def assemble(lists: Mapping[str, tuple[np.ndarray, np.ndarray]], name: str, fold_of: np.ndarray, k: int) -> np.ndarray:
    """(m, k) retrieved ids of candidate ``name`` in query order, from its per-fold lists."""
    retrieved = np.empty((fold_of.shape[0], k), dtype=np.int64)
    for f in np.unique(fold_of):
        retrieved[fold_of == f] = lists[f"{name}#{f}"][1]
    return retrieved


def overlaps(lists: Mapping[str, tuple[np.ndarray, np.ndarray]], names) -> dict[str, float]:
    """{name: mean neighbour overlap of the sampled rows' raw top-k with its top-k}."""
    raw = lists[OVERLAP + RAW][1]
    return {name: float(neighbour_overlap(raw, lists[OVERLAP + name][1]).mean()) for name in names}


def neighbour_check(
    valid: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    transform: FittedTransform | None,
    sample: OverlapSample,
) -> float:
    """Mean neighbour overlap of ``transform`` (raw top-k against corrected top-k of the sampled corpus rows, own
    row excluded), in one pass; 1.0 for no transform."""
    if transform is None:
        return 1.0
    lists = scored_lists(
        valid, vector_col, id_col, dimension, None, None, {}, {RAW: None, "applied": transform}, sample, True, sample.k
    )
    return overlaps(lists, ["applied"])["applied"]


def labelled_inputs(
    spark: SparkSession, valid: DataFrame, vector_col: str, id_col: str, dimension: int, config: EvaluationConfig
) -> tuple[QuerySet | None, PairRows | None]:
    """(the ``queries`` of ``config`` read with their relevant ids, the ``pairs`` joined to the rows of ``valid``);
    either None when the block names none."""
    queries = (
        read_queries(
            spark, config.queries, config.query_id_col, config.query_vector_col, config.relevant_col, dimension
        )
        if config.queries
        else None
    )
    pairs = (
        pair_rows(valid, vector_col, id_col, dimension, read_table(spark, config.pairs, None)[0], *config.pair_cols)
        if config.pairs
        else None
    )
    return queries, pairs


def score_applied(
    spark: SparkSession,
    valid: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    transform: FittedTransform,
    config: EvaluationConfig,
    overlap: OverlapSample,
) -> dict:
    """An explicitly configured method's evidence: raw and the ``applied`` transform (as fitted on every row, so
    in-sample — which favours the transform: a refusal on it is conservative) on every query / pair, one pass,
    with the paired bootstrap; plus the neighbour overlap. Returns ``{"candidates", "intervals",
    "neighbour_overlap", "raw", "applied"}``."""
    queries, pairs = labelled_inputs(spark, valid, vector_col, id_col, dimension, config)
    fitted = {RAW: None, "applied": transform}
    fold_of = None if queries is None else np.zeros(queries.ids.shape[0], dtype=np.int64)
    lists = scored_lists(
        valid,
        vector_col,
        id_col,
        dimension,
        queries,
        fold_of,
        {0: fitted},
        fitted,
        overlap,
        config.exclude_self,
        config.k,
    )
    per_query = (
        None
        if queries is None or fold_of is None
        else {name: per_query_metrics(assemble(lists, name, fold_of, config.k), queries.relevant) for name in fitted}
    )
    cosines = None if pairs is None else {name: pair_cosines(pairs, t) for name, t in fitted.items()}
    try:
        evidence = summarise(
            list(fitted),
            per_query,
            None if queries is None else queries.ids,
            cosines,
            None if pairs is None else pairs.gold,
            None if pairs is None else pairs.keys(),
            config.seed,
            config.resamples,
            config.confidence,
            split=False,
        )
    except ValueError as exc:
        raise ConfigError(f"evaluation: {exc}") from exc
    return {
        "candidates": evidence.report,
        "intervals": evidence.intervals,
        "raw": evidence.report[RAW],
        "applied": evidence.report["applied"],
        "neighbour_overlap": overlaps(lists, ["applied"])["applied"],
    }


def add_query_drift(record: dict, state: Moments, queries: QuerySet, grid: list[Candidate]) -> None:
    """Real queries (not corpus rows): the query drift along every direction an ABTT candidate removes, and a
    warning for each removed direction where the query mean sits more than 1 SD from the corpus mean."""
    removed = sorted({j for c in grid for j in c.directions})
    if not removed:
        return
    drift = query_drift(state, queries.vectors, removed[-1])
    record["query_drift"] = [row for row in drift if row["index"] in removed]
    for row in record["query_drift"]:
        if row["drift_sd"] is not None and row["drift_sd"] > 1.0:
            record["warnings"].append(
                f"query drift: the queries' mean is {row['drift_sd']:.2f} SD from the corpus mean along u{row['index']}"
                f"; removing u{row['index']} removes where the queries differ from the corpus (chapter 7, failure two)"
            )


def fitted_params(transform: FittedTransform | None) -> dict:
    """``{"method", **params}`` of a transform (``{"method": "none"}`` for raw)."""
    return {"method": transform.method, **transform.params()} if transform is not None else {"method": Method.NONE}


def evaluation_markdown(record: Mapping) -> str:
    """The candidate table as Markdown: report-half means, Δ of the selection metric against raw with its
    interval, and the neighbour overlap when measured (the chosen candidate in bold)."""
    metrics = sorted({m for row in record["candidates"].values() for m in row})
    metric = record["metric"]
    overlap = record.get("neighbour_overlap")
    confidence = record["bootstrap"]["confidence"]
    head = metrics + [f"Δ {metric} vs raw [{confidence:.0%} CI]"] + (["overlap"] if overlap else [])
    lines = ["| candidate | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for name, row in record["candidates"].items():
        shown = f"**{name}** (chosen)" if name == record["chosen"] else ("none (raw)" if name == RAW else name)
        cells = [f"{row[m]:.4f}" if np.isfinite(row.get(m, np.nan)) else "–" for m in metrics]
        cells.append(interval_text(record["intervals"][name]["delta_vs_raw"][metric]))
        if overlap:
            cells.append(f"{overlap[name]:.3f}")
        lines.append(f"| {shown} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", record["decision"]["reason"]])
