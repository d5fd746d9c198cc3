"""The chapter-9 diagnosis panel computed from a :class:`~anisotropy_core.moments.Moments` state.

``diagnose`` accepts a merged state (what the Spark job produces) or a plain (n, d) array, and
returns every number of the seed's report plus the spectrum-level checks a careful user wants:
the raw second-moment top-1 share, a rank-collapse count, the Marchenko–Pastur null edges and the
number of eigenvalues above them, and the power-law slope of the spectrum.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .moments import Moments

RANK_TOLERANCE = 1e-10  # eigenvalues below RANK_TOLERANCE · λ₁ count as zero (rank-collapse check)
IDENTICAL_TOLERANCE = 1e-24  # total variance below this × ‖μ‖² is rounding noise: all vectors identical


def anisotropy_from_offset(n: int, offset: float) -> float:
    """Exact average pairwise cosine A = (n‖μ̂‖² − 1)/(n − 1) (seed chapter 1 identity)."""
    if n < 2:
        raise ValueError(f"average pairwise cosine needs at least 2 vectors, got n={n}")
    return (n * offset ** 2 - 1.0) / (n - 1.0)


def effective_rank(eigenvalues: np.ndarray) -> float:
    """exp(entropy) of the normalised non-negative spectrum; 0·log 0 is taken as 0."""
    lam = np.clip(np.asarray(eigenvalues, dtype=np.float64), 0.0, None)
    total = lam.sum()
    if total <= 0:
        raise ValueError("effective rank is undefined for an all-zero spectrum (every vector identical)")
    p = lam[lam > 0] / total
    return float(np.exp(-(p * np.log(p)).sum()))


def marchenko_pastur_edges(n: int, d: int, variance: float = 1.0) -> tuple[float, float]:
    """(lower, upper) edges σ²(1 ∓ √(d/n))² of isotropic sample-covariance eigenvalues.

    For n < d the lower edge is the edge of the nonzero part; d − n eigenvalues are exactly 0.
    """
    gamma = np.sqrt(d / n)
    return float(variance * (1 - gamma) ** 2), float(variance * (1 + gamma) ** 2)


def power_law_fit(eigenvalues: np.ndarray) -> tuple[float, float]:
    """(α, C) of the least-squares line log λ_k = log C − α log k over the nonzero spectrum.

    ``eigenvalues``: (d,) descending. Every eigenvalue above ``RANK_TOLERANCE · λ₁`` takes part (the seed's
    "fit a straight line to your log-log spectrum"); (nan, nan) with fewer than 2 of them.
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    keep = lam > RANK_TOLERANCE * lam[0]
    if keep.sum() < 2:
        return float("nan"), float("nan")
    k = np.arange(1, lam.shape[0] + 1)[keep]
    slope, intercept = np.polyfit(np.log(k), np.log(lam[keep]), 1)
    return float(-slope), float(np.exp(intercept))


def plain_scalar(value):
    """numpy scalar → Python scalar, so reports serialise to JSON and fit in Spark rows."""
    return value.item() if isinstance(value, np.generic) else value


def canonical_sign(vector: np.ndarray) -> np.ndarray:
    """Flip ``vector`` so its largest-magnitude entry (first one on ties) is positive.

    Eigenvectors are defined only up to sign; this makes u1 reproducible across BLAS builds.
    """
    pivot = int(np.argmax(np.abs(vector)))
    return vector if vector[pivot] >= 0 else -vector


def centred_spectrum(state: Moments) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of the centred covariance: (eigenvalues (d,), eigenvectors (d, d)) descending.

    Columns of the eigenvector matrix are sign-canonicalised with :func:`canonical_sign`.
    """
    return covariance_spectrum(state.covariance())


def covariance_spectrum(covariance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eigenvalues (k,), sign-canonical eigenvectors (k, k) as columns) of a (k, k) covariance, descending."""
    lam, vecs = np.linalg.eigh(covariance)
    lam, vecs = lam[::-1], vecs[:, ::-1]
    return np.clip(lam, 0.0, None), _canonical_columns(vecs)


def dual_spectrum(centred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nonzero spectrum of the covariance XᵀX/n of centred rows X (n, d) by the n × n Gram route (seed ch. 6).

    X = P S Qᵀ ⇒ XXᵀ = P S² Pᵀ and XᵀX = Q S² Qᵀ: the Gram matrix G = XXᵀ/n (n, n) has the same nonzero
    eigenvalues λ = S²/n, and the principal directions are recovered as Q = XᵀP / S = XᵀP / √(nλ), without
    ever forming the d × d covariance — O(n²d + n³) instead of O(nd² + d³), the route to take when n < d.
    Returns (λ (r,), Q (d, r)) descending, r = eigenvalues above ``RANK_TOLERANCE``·λ₁ (≤ n − 1 when centred),
    columns sign-canonicalised like :func:`centred_spectrum`.
    """
    x = np.asarray(centred, dtype=np.float64)
    n = x.shape[0]
    lam, left = np.linalg.eigh(x @ x.T / n)
    lam, left = lam[::-1], left[:, ::-1]
    rank = int((lam > RANK_TOLERANCE * lam[0]).sum()) if lam[0] > 0 else 0
    lam, left = lam[:rank], left[:, :rank]
    return lam, _canonical_columns(x.T @ left / np.sqrt(n * lam))


def _canonical_columns(vecs: np.ndarray) -> np.ndarray:
    return np.stack([canonical_sign(vecs[:, j]) for j in range(vecs.shape[1])], axis=1) if vecs.shape[1] \
        else vecs


def diagnose(data: Moments | np.ndarray) -> dict:
    """Full anisotropy report of an embedding cloud.

    ``data``: a merged :class:`Moments` state or an (n, d) array of raw vectors.
    Returns a dict with the seed's keys ``n, d, offset_ratio, anisotropy_A, isotropic_sd, top1_var,
    top10_var, effective_rank, erank_frac`` and, in addition:

    * ``mean_norm_ratio`` — ‖μ‖ / mean ‖v‖, the raw mean's length relative to a typical vector,
    * ``spectrum`` — (d,) centred covariance eigenvalues, descending (1/n normalisation),
    * ``raw_top1_share`` — top eigenvalue share of the *uncentred* second moment S = Σ + μμᵀ,
    * ``numerical_rank`` — eigenvalues above ``RANK_TOLERANCE · λ₁`` (rank-collapse check),
    * ``mp_lower``, ``mp_upper`` — Marchenko–Pastur edges for this n and d, scaled to the mean
      eigenvalue (an isotropic cloud of the same total variance); ``mp_above_upper`` — how many
      eigenvalues exceed the upper edge (directions that are signal rather than sampling noise),
    * ``power_law_alpha`` — fitted slope α of the log-log spectrum (see :func:`power_law_fit`),
    * ``u1`` — (d,) first principal direction, sign-canonicalised,
    * ``mean`` — (d,) raw mean μ (needed to project centred vectors onto u1).
    """
    state = data if isinstance(data, Moments) else Moments.of_batch(np.asarray(data))
    n, d = state.n, state.d
    if n < 2:
        raise ValueError(f"diagnosis needs at least 2 vectors, got n={n}")
    offset = float(np.linalg.norm(state.mean_unit()))
    lam, vecs = centred_spectrum(state)
    total = lam.sum()
    if total <= IDENTICAL_TOLERANCE * float(state.mean @ state.mean):
        raise ValueError("all vectors are identical: the centred spectrum is zero and the shape is undefined")
    p = lam / total
    erank = effective_rank(lam)
    raw = np.linalg.eigvalsh(state.second_moment())
    mp_lower, mp_upper = marchenko_pastur_edges(n, d, variance=total / d)
    return {
        "n": int(n),
        "d": int(d),
        "offset_ratio": offset,
        "anisotropy_A": float(anisotropy_from_offset(n, offset)),
        "isotropic_sd": float(1.0 / np.sqrt(d)),
        "top1_var": float(p[0]),
        "top10_var": float(p[:10].sum()),
        "effective_rank": erank,
        "erank_frac": erank / d,
        "mean_norm_ratio": float(np.linalg.norm(state.mean) / state.mean_norm()),
        "spectrum": lam,
        "raw_top1_share": float(raw[-1] / raw.sum()),
        "numerical_rank": int((lam > RANK_TOLERANCE * lam[0]).sum()),
        "mp_lower": mp_lower,
        "mp_upper": mp_upper,
        "mp_above_upper": int((lam > mp_upper).sum()),
        "power_law_alpha": power_law_fit(lam)[0],
        "u1": vecs[:, 0],
        "mean": state.mean.copy(),
    }


def project_on_u1(vectors: np.ndarray, report: Mapping) -> np.ndarray:
    """(n,) projections (v − μ)·u1 of raw ``vectors`` (n, d) using a report's ``mean`` and ``u1``."""
    return (np.asarray(vectors, dtype=np.float64) - report["mean"]) @ report["u1"]


def artefact_test(projection: np.ndarray, numeric: Mapping[str, np.ndarray] | None = None,
                  labels: np.ndarray | None = None) -> dict:
    """The seed's fifth number: is u1 an artefact (length, frequency) or the signal (a label)?

    ``projection``: (n,) projections on u1; ``numeric``: name → (n,) metadata column;
    ``labels``: (n,) label per vector. Returns ``{"abs_corr": {name: |corr|}, "label_means": {label: mean}}``.
    |corr| because u1 has no intrinsic sign. A constant column has no correlation: reported as NaN-free
    ``None``.
    """
    proj = np.asarray(projection, dtype=np.float64)
    abs_corr = {}
    for name, column in (numeric or {}).items():
        col = np.asarray(column, dtype=np.float64)
        if col.std() == 0 or proj.std() == 0:
            abs_corr[name] = None
        else:
            abs_corr[name] = float(abs(np.corrcoef(proj, col)[0, 1]))
    label_means = {}
    if labels is not None:
        labels = np.asarray(labels)
        for label in np.unique(labels):
            label_means[label.item() if hasattr(label, "item") else label] = float(proj[labels == label].mean())
    return {"abs_corr": abs_corr, "label_means": label_means}
