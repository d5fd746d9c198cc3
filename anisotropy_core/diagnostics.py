"""The chapter-9 diagnosis panel computed from a :class:`~anisotropy_core.moments.Moments` state.

``diagnose`` accepts a merged state (what the Spark job produces) or a plain (n, d) array, and
returns every number of the seed's report plus the spectrum-level checks a careful user wants:
the raw second-moment top-1 share, a rank-collapse count, the Marchenko–Pastur null edges and the
number of eigenvalues above them, and the power-law slope of the spectrum.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping

import numpy as np

from .moments import InvalidVectorsError, Moments

RANK_TOLERANCE = 1e-10  # eigenvalues below RANK_TOLERANCE · λ₁ count as zero (rank-collapse check)
IDENTICAL_TOLERANCE = 1e-24  # total variance below this × ‖μ‖² is rounding noise: all vectors identical


def anisotropy_from_offset(n: int, offset: float) -> float:
    """Exact average pairwise cosine A = (n‖μ̂‖² − 1)/(n − 1) (seed chapter 1 identity)."""
    if n < 2:
        raise ValueError(f"average pairwise cosine needs at least 2 vectors, got n={n}")
    return (n * offset**2 - 1.0) / (n - 1.0)


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


MIN_FIT_POINTS = 3  # a slope over fewer eigenvalues is not a power law (a spike over a flat bulk gives 1)


def signal_range(eigenvalues: np.ndarray, n: int, d: int) -> tuple[int, int]:
    """(k_lo, k_hi), 1-based inclusive: the eigenvalues above the Marchenko–Pastur upper edge.

    ``eigenvalues``: (d,) centred spectrum, descending. The edge is that of an isotropic cloud of the same
    total variance (σ² = tr Σ / d). Below it the spectrum is shaped by finite-sample noise (and LayerNorm's
    exact zero), not by the population, so a slope fitted there measures n/d rather than the embedder.
    k_hi = 0 when nothing is above the edge.
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    _, upper = marchenko_pastur_edges(n, d, variance=float(lam.sum()) / d)
    return 1, int((lam > upper).sum())


def power_law_fit(eigenvalues: np.ndarray, k_range: tuple[int, int] | None = None) -> tuple[float, float]:
    """(α, C) of the least-squares line log λ_k = log C − α log k over k_lo ≤ k ≤ k_hi (1-based).

    ``eigenvalues``: (d,) descending; ``k_range``: usually :func:`signal_range` (None: the whole spectrum,
    for spectra known to be population values rather than samples). Eigenvalues at or below
    ``RANK_TOLERANCE · λ₁`` never take part; (nan, nan) with fewer than ``MIN_FIT_POINTS`` in the range.
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    k = np.arange(1, lam.shape[0] + 1)
    k_range = k_range or (1, lam.shape[0])
    keep = (k >= k_range[0]) & (k <= k_range[1]) & (lam > RANK_TOLERANCE * lam[0])
    if keep.sum() < MIN_FIT_POINTS:
        return float("nan"), float("nan")
    slope, intercept = np.polyfit(np.log(k[keep]), np.log(lam[keep]), 1)
    return float(-slope), float(np.exp(intercept))


def power_law_effective_rank(alpha: float, d: int) -> float:
    """Effective rank of the spectrum k^−α, k = 1..d (seed chapter 1: α = 1 at d = 768 gives ≈ 152)."""
    return effective_rank(np.arange(1, d + 1, dtype=np.float64) ** -float(alpha))


def alpha_from_effective_rank(erank: float, d: int, alpha_max: float = 20.0) -> float:
    """The α whose k^−α spectrum over ``d`` eigenvalues has effective rank ``erank`` (bisection; erank
    falls monotonically from d at α = 0). A cross-check of the fitted slope that uses the whole spectrum's
    entropy instead of a line; ``alpha_max`` when erank is below that of k^−alpha_max."""
    lo, hi = 0.0, float(alpha_max)
    if erank >= d:
        return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if power_law_effective_rank(mid, d) > erank else (lo, mid)
    return 0.5 * (lo + hi)


def plain_scalar(value):
    """numpy scalar → Python scalar, so reports serialise to JSON and fit in Spark rows."""
    return value.item() if isinstance(value, np.generic) else value


def canonical_sign(vector: np.ndarray) -> np.ndarray:
    """Flip ``vector`` so its largest-magnitude entry (first one on ties) is positive.

    Eigenvectors are defined only up to sign; this makes u1 reproducible across BLAS builds.
    """
    pivot = int(np.argmax(np.abs(vector)))
    return vector if vector[pivot] >= 0 else -vector


def descending_eigh(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of a symmetric (d, d) ``matrix``: (eigenvalues (d,), eigenvectors (d, d) as
    columns), descending, every column sign-canonicalised with :func:`canonical_sign`."""
    lam, vecs = np.linalg.eigh(matrix)
    lam, vecs = lam[::-1].copy(), vecs[:, ::-1]
    return lam, canonical_columns(vecs)


def canonical_columns(vecs: np.ndarray) -> np.ndarray:
    """(d, r) ``vecs`` with every column sign-canonicalised (:func:`canonical_sign`); r may be 0."""
    return np.stack([canonical_sign(vecs[:, j]) for j in range(vecs.shape[1])], axis=1) if vecs.shape[1] else vecs


def centred_spectrum(state: Moments) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of the centred covariance: (eigenvalues (d,), eigenvectors (d, d)) descending,
    columns sign-canonical (:func:`covariance_spectrum`)."""
    return covariance_spectrum(state.covariance())


def covariance_spectrum(covariance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eigenvalues (k,) clipped at 0, sign-canonical eigenvectors (k, k) as columns) of a (k, k) covariance,
    descending (:func:`descending_eigh`)."""
    lam, vecs = descending_eigh(covariance)
    return np.clip(lam, 0.0, None), vecs


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
    return lam, canonical_columns(x.T @ left / np.sqrt(n * lam))


def _array() -> Any:
    """A :class:`Diagnosis` field holding a numpy array (not a scalar metric; left out of equality)."""
    return dataclasses.field(metadata={"array": True}, compare=False)


@dataclasses.dataclass(frozen=True)
class Diagnosis(Mapping):
    """The report of :func:`diagnose`. Every field is a scalar metric (``scalars()``, in declaration order)
    unless declared with ``_array()``; adding a metric is adding one field here and one value in
    :func:`diagnose`. Read-only mapping access (``report["top1_var"]``) works as well as attributes.

    The seed's numbers ``n, d, offset_ratio, anisotropy_A, isotropic_sd, top1_var, top10_var,
    effective_rank, erank_frac`` and, in addition:

    * ``mean_norm_ratio`` — ‖μ‖ / mean ‖v‖, the raw mean's length relative to a typical vector,
    * ``spectrum`` — (d,) centred covariance eigenvalues, descending (1/n normalisation),
    * ``raw_top1_share`` — top eigenvalue share of the *uncentred* second moment S = Σ + μμᵀ,
    * ``numerical_rank`` — eigenvalues above ``RANK_TOLERANCE · λ₁`` (rank-collapse check),
    * ``mp_lower``, ``mp_upper`` — Marchenko–Pastur edges for this n and d, scaled to the mean
      eigenvalue (an isotropic cloud of the same total variance); ``mp_above_upper`` — how many
      eigenvalues exceed the upper edge (directions that are signal rather than sampling noise),
    * ``power_law_alpha`` — slope α of the log-log spectrum fitted over the signal range only
      (:func:`power_law_fit` over :func:`signal_range`); nan when fewer than 3 eigenvalues are above the edge,
    * ``power_law_range`` — that range ``[k_lo, k_hi]`` (1-based, inclusive),
    * ``erank_alpha`` — the α implied by the effective rank (:func:`alpha_from_effective_rank`), a cross-check,
    * ``u1`` — (d,) first principal direction, sign-canonicalised,
    * ``principal_directions`` — (d, d) all principal directions as columns, descending, sign-canonicalised
      (the per-direction artefact test projects on the first K of them),
    * ``mean`` — (d,) raw mean μ (needed to project centred vectors onto u1).
    """

    n: int
    d: int
    offset_ratio: float
    anisotropy_A: float
    isotropic_sd: float
    top1_var: float
    top10_var: float
    effective_rank: float
    erank_frac: float
    mean_norm_ratio: float
    raw_top1_share: float
    numerical_rank: int
    mp_lower: float
    mp_upper: float
    mp_above_upper: int
    power_law_alpha: float
    erank_alpha: float
    power_law_range: tuple[int, int] = _array()
    spectrum: np.ndarray = _array()
    u1: np.ndarray = _array()
    principal_directions: np.ndarray = _array()
    mean: np.ndarray = _array()

    @classmethod
    def scalar_names(cls) -> tuple[str, ...]:
        """The scalar metrics, in declaration order (what drift thresholds, bounds and metrics rows name)."""
        return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("array"))

    @classmethod
    def array_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("array"))

    def scalars(self) -> dict[str, int | float]:
        """{metric: plain Python number} of every scalar metric."""
        return {name: plain_scalar(getattr(self, name)) for name in self.scalar_names()}

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict: the scalars plus every array as a list."""
        return {**self.scalars(), **{name: np.asarray(getattr(self, name)).tolist() for name in self.array_names()}}

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


def diagnose(data: Moments | np.ndarray) -> Diagnosis:
    """Full anisotropy report of an embedding cloud (see :class:`Diagnosis` for every field).

    ``data``: a merged :class:`Moments` state or an (n, d) array of raw vectors.
    """
    state = data if isinstance(data, Moments) else Moments.of_batch(np.asarray(data))
    n, d = state.n, state.d
    if n < 2:
        raise InvalidVectorsError(f"diagnosis needs at least 2 vectors, got n={n} valid rows")
    offset = float(np.linalg.norm(state.mean_unit()))
    lam, vecs = centred_spectrum(state)
    total = lam.sum()
    if total <= IDENTICAL_TOLERANCE * float(state.mean @ state.mean):
        raise InvalidVectorsError(
            f"all {n} valid vectors are identical (zero spread): the centred spectrum is "
            "zero and the shape is undefined"
        )
    p = lam / total
    erank = effective_rank(lam)
    raw = np.linalg.eigvalsh(state.second_moment())
    mp_lower, mp_upper = marchenko_pastur_edges(n, d, variance=total / d)
    fit_range = signal_range(lam, n, d)
    return Diagnosis(
        n=int(n),
        d=int(d),
        offset_ratio=offset,
        anisotropy_A=float(anisotropy_from_offset(n, offset)),
        isotropic_sd=float(1.0 / np.sqrt(d)),
        top1_var=float(p[0]),
        top10_var=float(p[:10].sum()),
        effective_rank=erank,
        erank_frac=erank / d,
        mean_norm_ratio=float(np.linalg.norm(state.mean) / state.mean_norm()),
        raw_top1_share=float(raw[-1] / raw.sum()),
        numerical_rank=int((lam > RANK_TOLERANCE * lam[0]).sum()),
        mp_lower=mp_lower,
        mp_upper=mp_upper,
        mp_above_upper=fit_range[1],
        power_law_alpha=power_law_fit(lam, fit_range)[0],
        erank_alpha=alpha_from_effective_rank(erank, d),
        power_law_range=fit_range,
        spectrum=lam,
        u1=vecs[:, 0],
        principal_directions=vecs,
        mean=state.mean.copy(),
    )


def project_on_u1(vectors: np.ndarray, report: Mapping) -> np.ndarray:
    """(n,) projections (v − μ)·u1 of raw ``vectors`` (n, d) using a report's ``mean`` and ``u1``."""
    return (np.asarray(vectors, dtype=np.float64) - report["mean"]) @ report["u1"]


def artefact_test(
    projection: np.ndarray, numeric: Mapping[str, np.ndarray] | None = None, labels: np.ndarray | None = None
) -> dict:
    """The seed's fifth number: is u1 an artefact (length, frequency) or the signal (a label)?

    ``projection``: (n,) projections on u1; ``numeric``: name → (n,) metadata column;
    ``labels``: (n,) label per vector. Returns ``{"abs_corr": {name: |corr|}, "label_means": {label: mean}}``.
    |corr| because u1 has no intrinsic sign. A constant column has no correlation: reported as NaN-free
    ``None``.
    """
    proj = np.asarray(projection, dtype=np.float64)
    abs_corr: dict[str, float | None] = {}
    for name, column in (numeric or {}).items():
        col = np.asarray(column, dtype=np.float64)
        if col.std() == 0 or proj.std() == 0:
            abs_corr[name] = None
        else:
            abs_corr[name] = float(abs(np.corrcoef(proj, col)[0, 1]))
    label_means: dict[Any, float] = {}
    if labels is not None:
        labels = np.asarray(labels)
        for label in np.unique(labels):
            label_means[label.item() if hasattr(label, "item") else label] = float(proj[labels == label].mean())
    return {"abs_corr": abs_corr, "label_means": label_means}
