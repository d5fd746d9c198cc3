"""Per-cluster moments and the per-cluster diagnosis table (seed chapter 7), in numpy.

:func:`cluster_moments` groups raw vectors by cluster id into k mergeable :class:`Moments`;
:func:`cluster_diagnostics` turns k such states into a table of the :func:`~anisotropy_core.diagnostics.diagnose`
numbers per cluster and for the whole corpus, with the anisotropy a global centring leaves inside each cluster
(:func:`induced_anisotropy`) — what the cluster recentering of :mod:`anisotropy_core.cluster_recenter` removes.
"""

from __future__ import annotations

from typing import Any, Sequence, TypedDict

import numpy as np

from .diagnostics import diagnose
from .moments import Moments


def cluster_moments(vectors: np.ndarray, ids: np.ndarray, k: int) -> list[Moments]:
    """k per-cluster :class:`Moments` of raw ``vectors`` (B, d) grouped by ``ids`` (B,) in [0, k)."""
    x = np.asarray(vectors, dtype=np.float64)
    return [Moments.of_batch(x[ids == c]) for c in range(k)]


def merge_cluster_moments(left: Sequence[Moments], right: Sequence[Moments]) -> list[Moments]:
    """Cluster-wise :meth:`Moments.merge` of two equally long lists."""
    if len(left) != len(right):
        raise ValueError(f"cannot merge {len(left)} cluster moments with {len(right)}")
    return [a.merge(b) for a, b in zip(left, right)]


def induced_anisotropy(offset: float, spread: float) -> float:
    """Seed chapter 7: average cosine ‖δ‖² / (‖δ‖² + s²) among vectors sharing a residual offset of norm
    ``offset`` on top of centred residuals of typical norm ``spread`` (equal-norm approximation)."""
    total = offset**2 + spread**2
    if total <= 0:
        raise ValueError("offset and spread are both zero: the vectors are all zero")
    return offset**2 / total


# the per-cluster table (:func:`cluster_diagnostics`; the mixture check adds its null): what
# :class:`anisotropy_core.decision.MixtureEvidence` reads, plus the ``global`` row (a keyword: the functional form)
ClusterTable = TypedDict(
    "ClusterTable",
    {
        "global": dict[str, Any],
        "clusters": list[dict[str, Any]],
        "locally_isotropic": bool,
        "mixture_null": dict[str, Any],
        "mixture_p": float | None,
    },
    total=False,
)

CLUSTER_REPORT_KEYS = ("offset_ratio", "anisotropy_A", "top1_var", "effective_rank", "erank_frac")


def cluster_diagnostics(states: Sequence[Moments]) -> ClusterTable:
    """Per-cluster diagnosis table from k per-cluster :class:`Moments` states (raw vectors).

    Returns ``{"global": row, "clusters": [row per cluster], "locally_isotropic": bool}``. Every row has
    ``size``, ``share`` and the :func:`diagnose` numbers ``offset_ratio, anisotropy_A, top1_var,
    effective_rank, erank_frac`` (the raw cloud as is), ``d``, and for clusters also
    ``cluster`` and ``induced_A_global_centring`` — the seed's ‖δ‖²/(‖δ‖² + tr Σ_c) with δ = μ_c − μ, the
    anisotropy a *global* centring leaves inside that cluster (what cluster recentering removes).
    A cluster with fewer than 2 vectors, or all-identical vectors, has no shape: its shape numbers are
    ``None`` (never NaN). ``locally_isotropic`` is True when every cluster's top-1 share is below the
    global one and its effective rank above the global one — "globally anisotropic, locally isotropic".
    """
    if not states:
        raise ValueError("no cluster states")
    total = states[0]
    for s in states[1:]:
        total = total.merge(s)
    global_row = _diagnosis_row(total, total.n)
    rows = []
    for c, state in enumerate(states):
        row = {"cluster": c, **_diagnosis_row(state, total.n)}
        if state.n:
            delta = float(np.linalg.norm(state.mean - total.mean))
            spread = float(np.sqrt(np.trace(state.covariance())))
            row["induced_A_global_centring"] = induced_anisotropy(delta, spread) if delta > 0 or spread > 0 else None
        else:
            row["induced_A_global_centring"] = None
        rows.append(row)
    shaped = [r for r in rows if r["top1_var"] is not None]
    local = (
        bool(shaped)
        and global_row["top1_var"] is not None
        and all(
            r["top1_var"] < global_row["top1_var"] and r["effective_rank"] > global_row["effective_rank"]
            for r in shaped
        )
    )
    return {"global": global_row, "clusters": rows, "locally_isotropic": local}


def _diagnosis_row(state: Moments, corpus_n: int) -> dict[str, Any]:
    row: dict[str, Any] = {"size": int(state.n), "share": state.n / corpus_n if corpus_n else 0.0, "d": state.d}
    try:
        report = diagnose(state)
    except ValueError:  # fewer than 2 vectors, or zero spread: the shape is undefined
        report = None
    for key in CLUSTER_REPORT_KEYS:
        row[key] = None if report is None else report[key]
    return row
