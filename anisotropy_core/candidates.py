"""Candidate corrections fitted from one moments state, the choice between them, and the quality gate.

Every candidate except cluster-wise recentring costs nothing beyond the moments pass already made for the
diagnosis (one ``eigh`` each); cluster_recenter needs its k-means fit and is passed in ready-made.

* ``none``            — the raw vectors (no transform; the evaluation's baseline, ``raw``),
* ``center``          — v − μ,
* ``abtt``            — ABTT of the evidence directions (the recommendation's set, e.g. [1, 3]),
* ``whitening``       — whitening-k,
* ``abtt+whitening``  — ABTT of those directions, then whitening-k of what is left,
* ``cluster_recenter``— when a fitted :class:`~anisotropy_core.clustering.ClusterRecenter` is given.

Scores are ``{candidate: {metric: value}}`` with higher = better for every metric (recall@k, nDCG@k,
Spearman ρ).
"""
from __future__ import annotations

from typing import Mapping

from .moments import Moments
from .transforms import FittedTransform, fit_abtt, fit_center, fit_whitening

CANDIDATE_ORDER = ("none", "center", "abtt", "whitening", "abtt+whitening", "cluster_recenter")


def fit_candidates(state: Moments, directions: list[int], k: int,
                   cluster_recenter: FittedTransform | None = None) -> dict[str, FittedTransform | None]:
    """Every candidate of the module docstring from one merged ``state``; ``none`` maps to None.

    ``directions``: 1-based principal directions ABTT removes (empty: the ABTT candidates are left out —
    ABTT of nothing is centring). ``k``: whitening's kept directions (capped at d − len(directions) for
    ``abtt+whitening``). Returns {name: transform} in :data:`CANDIDATE_ORDER`.
    """
    fitted: dict[str, FittedTransform | None] = {"none": None, "center": fit_center(state)}
    if directions:
        fitted["abtt"] = fit_abtt(state, directions=directions)
    fitted["whitening"] = fit_whitening(state, k=k)
    if directions:
        fitted["abtt+whitening"] = fit_whitening(state, k=min(k, state.d - len(directions)), exclude=directions)
    if cluster_recenter is not None:
        fitted["cluster_recenter"] = cluster_recenter
    return fitted


def choose_candidate(scores: Mapping[str, Mapping[str, float]], metric: str) -> str:
    """The candidate with the highest ``metric``; ties go to the simpler one (earlier in CANDIDATE_ORDER)."""
    missing = [name for name, row in scores.items() if metric not in row]
    if missing:
        raise ValueError(f"metric {metric!r} was not measured for candidate(s) {missing}")
    rank = {name: i for i, name in enumerate(CANDIDATE_ORDER)}
    return max(scores, key=lambda name: (scores[name][metric], -rank.get(name, len(rank))))


def quality_gate(raw: Mapping[str, float], chosen: Mapping[str, float], max_quality_drop: float
                 ) -> tuple[bool, str]:
    """Refuse to publish when any metric of the chosen candidate is below raw by more than
    ``max_quality_drop`` (absolute, same units as the metric). Returns (passes, reason naming the metric)."""
    if not max_quality_drop >= 0:
        raise ValueError(f"max_quality_drop must be >= 0, got {max_quality_drop}")
    drops = {metric: raw[metric] - chosen[metric] for metric in raw if metric in chosen}
    worst = max(drops, key=drops.get, default=None)
    if worst is not None and drops[worst] > max_quality_drop:
        return False, (f"quality gate: {worst} falls from {raw[worst]:.4f} (raw) to {chosen[worst]:.4f}, a drop "
                       f"of {drops[worst]:.4f} > max_quality_drop {max_quality_drop}")
    return True, (f"quality gate passed: no metric falls more than {max_quality_drop} below raw"
                  + (f" (largest drop: {worst} {drops[worst]:+.4f})" if worst is not None else ""))


def evaluation_record(scores: Mapping[str, Mapping[str, float]], metric: str) -> dict:
    """The run record's ``evaluation`` block: ``{"candidates": scores, "raw": scores["none"], "chosen": name,
    "metric": metric}``."""
    return {"candidates": {name: dict(row) for name, row in scores.items()}, "raw": dict(scores["none"]),
            "chosen": choose_candidate(scores, metric), "metric": metric}
