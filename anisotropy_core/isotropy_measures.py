"""Isotropy measures beyond average cosine and their null references (seed chapters 1 and 8).

* :func:`partition_ratio` — Mu & Viswanath's I(V) = min_c Z(c) / max_c Z(c), Z(c) = Σ_w exp(cᵀv_w), over the
  principal directions c, computed in log space (log-sum-exp) so it never overflows.
* :func:`isoscore` — Rudman et al. (2022): distance of the normalised covariance spectrum from the all-ones
  vector, rescaled so that a cloud spreading its variance equally over k of d dimensions has fraction
  φ = k/d and scores ι = (k − 1)/(d − 1); 1 = isotropic, 0 = one direction.
* :func:`sign_structure_null` — chapter 8: for effectively non-negative data (post-ReLU, SAE codes) the
  cosine of two unrelated vectors is m²/s > 0, not 0, with m and s measured from the data: q/2 for sparse
  Exp(1) codes firing with rate q, 1/π for dense ReLU of Gaussians, ½ for dense Exp(1); K = q·d active features
  per vector.
* :func:`isotropic_anisotropy_se`, :func:`null_effective_rank`, :func:`mp_effective_rank`,
  :func:`sampling_noise` — how large A and the effective rank are for pure isotropic noise of this n and d,
  so a report can say whether a finding exceeds sampling noise (seed: erank 711 at n = 5000, 633 at
  n = 2000 for d = 768).
* :func:`uniformity`, :func:`alignment` — Wang & Isola (2020), seed chapter 7: uniformity of a sample of
  unit vectors (≈ −4(1 − A) when the cosines are tight around A) and alignment of positive pairs.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .diagnostics import effective_rank
from .moments import Moments

NEGATIVE_TOLERANCE = 0.01  # "effectively non-negative": under 1 % of the entries are negative (seed ch. 8)
ACTIVE_THRESHOLD = 1e-6  # an entry above this counts as an active feature
SPARSE_RATE = 0.3  # below this activation rate the regime is reported 'sparse', above it 'dense'


def _logsumexp(a: np.ndarray, axis: int = 0) -> np.ndarray:
    top = a.max(axis=axis, keepdims=True)
    return np.squeeze(top, axis=axis) + np.log(np.exp(a - top).sum(axis=axis))


def partition_ratio(vectors: np.ndarray, centre: bool = False) -> dict:
    """Partition-function ratio of ``vectors`` (n, d).

    The directions c are the eigenvectors of VᵀV (of the centred matrix when ``centre``). An eigenvector is
    defined only up to sign and Z(c) ≠ Z(−c), so both orientations of every eigenvector are scored: the
    result is then independent of the eigen-solver's sign choice. Returns ``{"I": min Z/max Z in (0, 1],
    "log_Z": (2d,) log Z over [c_1..c_d, −c_1..−c_d], "argmin", "argmax"}``.
    """
    x = np.asarray(vectors, dtype=np.float64)
    if centre:
        x = x - x.mean(axis=0)
    _, vecs = np.linalg.eigh(x.T @ x)
    directions = np.concatenate([vecs, -vecs], axis=1)  # (d, 2d)
    log_z = _logsumexp(x @ directions, axis=0)  # (2d,)
    return {
        "I": float(np.exp(log_z.min() - log_z.max())),
        "log_Z": log_z,
        "argmin": int(np.argmin(log_z)),
        "argmax": int(np.argmax(log_z)),
    }


def isoscore_from_spectrum(eigenvalues: np.ndarray) -> float:
    """IsoScore of a covariance with eigenvalues ``eigenvalues`` (d,) (any positive scale, any order).

    Rudman et al. 2022, steps 3–6: Σ̂ = √d · λ/‖λ‖; δ = ‖Σ̂ − 1‖ / √(2(d − √d)); φ = (d − δ²(d − √d))²/d²;
    ι = (d·φ − 1)/(d − 1).
    """
    lam = np.clip(np.asarray(eigenvalues, dtype=np.float64), 0.0, None)
    d = lam.shape[0]
    if d < 2:
        raise ValueError("IsoScore needs at least 2 dimensions")
    norm = np.linalg.norm(lam)
    if norm == 0:
        raise ValueError("IsoScore is undefined for a zero covariance (all points identical)")
    root = np.sqrt(d)
    defect = np.linalg.norm(lam * root / norm - 1.0) / np.sqrt(2.0 * (d - root))
    return float(((d - defect**2 * (d - root)) ** 2 - d) / (d * (d - 1)))


def isoscore(data: Moments | np.ndarray) -> float:
    """IsoScore of a point cloud: an (n, d) array or a merged :class:`Moments` state (Spark's output).

    Uses the eigenvalues of the centred covariance (the variances of the PCA-reoriented cloud); the
    1/n versus 1/(n − 1) normalisation cancels.
    """
    state = data if isinstance(data, Moments) else Moments.of_batch(np.asarray(data))
    return isoscore_from_spectrum(np.linalg.eigvalsh(state.covariance()))


def nonnegative_null(mean: float, second_moment: float) -> float:
    """Cosine of two unrelated vectors with iid non-negative coordinates: m² / s (large d)."""
    return float(mean**2 / second_moment)


def sign_structure_null(vectors: np.ndarray) -> dict:
    """The right zero for A, chosen by the sign structure of ``vectors`` (n, d) (seed chapter 8).

    For effectively non-negative data (under ``NEGATIVE_TOLERANCE`` of the entries negative) the cosine of two
    unrelated vectors whose coordinates are iid non-negative with mean m and second moment s = E[x²] is m²/s
    (:func:`nonnegative_null`); m and s are measured over all entries of ``vectors`` (pooled across coordinates:
    the null of the sign structure alone, not of a direction the vectors share). Dense half-normal (ReLU of a
    Gaussian) gives 1/π, dense Exp(1) ½, and a sparse code firing at rate q with Exp(1) values
    m²/s = q²/(2q) = q/2 — chapter 8's sparse regime falls out of the same formula. Sign-symmetric data: 0.

    Returns ``{"nonnegative", "negative_fraction", "active_rate" q, "K" (= q·d, active features per vector),
    "mean_coordinate" m, "second_moment" s, "regime" ('sign-symmetric' | 'sparse' (q < ``SPARSE_RATE``) |
    'dense'), "null"}``; the regime is reported, the null is m²/s in both non-negative regimes.
    """
    x = np.asarray(vectors, dtype=np.float64)
    negative = float((x < 0).mean())
    out = {
        "nonnegative": negative < NEGATIVE_TOLERANCE,
        "negative_fraction": negative,
        "active_rate": None,
        "K": None,
        "mean_coordinate": None,
        "second_moment": None,
        "regime": "sign-symmetric",
        "null": 0.0,
    }
    if out["nonnegative"]:
        q = float((x > ACTIVE_THRESHOLD).mean())
        m, s = float(x.mean()), float(np.square(x).mean())
        out.update(
            active_rate=q,
            K=q * x.shape[1],
            mean_coordinate=m,
            second_moment=s,
            regime="sparse" if q < SPARSE_RATE else "dense",
            null=nonnegative_null(m, s) if s > 0 else 0.0,
        )
    return out


def amplified_anisotropy(active_features: float, dictionary_anisotropy: float) -> float:
    """Chapter 8's amplification law: A_act ≈ k/(1 + k), k = K·A_dict/2 (Exp(1) coefficients, m²/s = ½)."""
    k = active_features * dictionary_anisotropy / 2.0
    return float(k / (1.0 + k))


def isotropic_anisotropy_se(n: int, d: int) -> float:
    """Standard error of A for n isotropic unit vectors in R^d: √(2 / (d·n(n − 1))).

    A averages the n(n − 1)/2 distinct pair cosines twice; each has variance 1/d, and pairs sharing a vector
    are uncorrelated (degenerate U-statistic kernel: E[û_i·û_j | û_i] = 0).
    """
    if n < 2:
        raise ValueError("A needs at least 2 vectors")
    return float(np.sqrt(2.0 / (d * n * (n - 1.0))))


def null_effective_rank(n: int, d: int, trials: int = 3, seed: int = 0) -> dict:
    """Effective rank of the centred covariance of ``n`` standard Gaussian vectors in R^d, by simulation.

    Returns ``{"mean", "sd", "trials"}`` over ``trials`` independent draws (sd is 0 for one trial).
    """
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(trials):
        x = rng.standard_normal((n, d))
        x -= x.mean(axis=0)
        values.append(effective_rank(np.linalg.eigvalsh(x.T @ x / n)))
    return {
        "mean": float(np.mean(values)),
        "sd": float(np.std(values, ddof=1)) if trials > 1 else 0.0,
        "trials": trials,
    }


def mp_effective_rank(n: int, d: int, grid: int = 4001) -> float:
    """Large-(n, d) limit of :func:`null_effective_rank` from the Marchenko–Pastur law.

    With ratio y = d/n ≤ 1 and unit variance, erank → d·exp(−E_MP[λ log λ]) (since E[λ] = 1); for y > 1 the
    d − n zero eigenvalues contribute nothing and the nonzero part is the MP law of ratio 1/y scaled by y.
    """
    if d > n:
        return mp_effective_rank(d, n, grid)  # nonzero spectrum of XᵀX = that of XXᵀ; erank is scale-free
    y = d / n
    lo, hi = (1 - np.sqrt(y)) ** 2, (1 + np.sqrt(y)) ** 2
    # λ = (lo+hi)/2 − (hi−lo)/2·cos θ, θ ∈ [0, π]: the density's square-root edges become smooth in θ
    theta = np.linspace(0.0, np.pi, grid)
    lam = (lo + hi) / 2 - (hi - lo) / 2 * np.cos(theta)
    density_dlam = ((hi - lo) / 2) ** 2 * np.sin(theta) ** 2 / (2 * np.pi * y * lam)
    weights = np.full(grid, np.pi / (grid - 1))
    weights[[0, -1]] /= 2
    mass = float((density_dlam * weights).sum())
    mean_lam = float((lam * density_dlam * weights).sum()) / mass
    lam_log_lam = float((lam * np.log(lam) * density_dlam * weights).sum()) / mass
    # normalise by the simulated spectrum's mean so the result is scale-free
    return float(d * np.exp(-(lam_log_lam / mean_lam - np.log(mean_lam))))


def sampling_noise(
    report: Mapping, simulate_max_cells: int = 20_000_000, seed: int = 0, *, A_sign_null: float = 0.0
) -> dict:
    """Is the report's finding larger than isotropic sampling noise at its n and d?

    ``report``: a :func:`~anisotropy_core.diagnostics.diagnose` dict (uses n, d, anisotropy_A,
    effective_rank). The null effective rank is simulated when n·d ≤ ``simulate_max_cells``, otherwise
    taken from the Marchenko–Pastur limit. Returns ``{"A_isotropic_se", "A_z", "A_exceeds_noise",
    "null_effective_rank", "null_effective_rank_method", "erank_deficit"}`` where A_z = (A − ``A_sign_null``) / se (chapter 8: 1/π
    dense or q/2 sparse for non-negative data; 0 for sign-symmetric data), and
    ``erank_deficit`` = 1 − erank / null erank (≈ 0: the spectrum is as flat as noise allows).
    """
    n, d = int(report["n"]), int(report["d"])
    se = isotropic_anisotropy_se(n, d)
    if n * d <= simulate_max_cells:
        null_erank, method = null_effective_rank(n, d, trials=1, seed=seed)["mean"], "simulation"
    else:
        null_erank, method = mp_effective_rank(n, d), "marchenko-pastur"
    a_z = (float(report["anisotropy_A"]) - float(A_sign_null or 0.0)) / se
    return {
        "A_isotropic_se": se,
        "A_z": a_z,
        "A_exceeds_noise": bool(abs(a_z) > 3.0),
        "null_effective_rank": null_erank,
        "null_effective_rank_method": method,
        "erank_deficit": float(1.0 - report["effective_rank"] / null_erank),
    }


def uniformity(vectors: np.ndarray, t: float = 2.0) -> dict:
    """Wang & Isola's uniformity log E exp(−t‖x̂ − ŷ‖²) over all distinct pairs of a sample (seed ch. 7).

    ``vectors``: (m, d) sample, unit-normalised here. Lower is more uniform: −2t (= −4 at t = 2) is the floor
    of antipodal spread, 0 the ceiling (every vector the same direction). Evaluated exactly over the
    m(m − 1)/2 pairs from the (m, m) cosine matrix (‖x̂ − ŷ‖² = 2 − 2cos). Returns ``{"uniformity", "t",
    "sample_size"}`` — the sample size belongs next to the number wherever it is reported.
    """
    unit = _unit_rows(vectors)
    m = unit.shape[0]
    if m < 2:
        raise ValueError(f"uniformity needs at least 2 vectors, got {m}")
    upper = np.triu_indices(m, k=1)
    exponents = -t * (2.0 - 2.0 * (unit @ unit.T)[upper])
    top = exponents.max()
    value = float(top + np.log(np.exp(exponents - top).mean()))
    return {"uniformity": value, "t": float(t), "sample_size": int(m)}


def uniformity_tight_cone(anisotropy: float, t: float = 2.0) -> float:
    """Uniformity when every pairwise cosine equals A: −2t(1 − A) (= −4(1 − A) at t = 2, seed ch. 7).

    By Jensen (log E e^X ≥ E X) it is also a lower bound on the uniformity of any set with average cosine A.
    """
    return -2.0 * t * (1.0 - anisotropy)


def uniformity_isotropic(d: int, t: float = 2.0) -> float:
    """Uniformity of isotropic unit vectors in R^d, cos ≈ N(0, 1/d): −2t + 2t²/d (−3.990 at d = 768, t = 2)."""
    return -2.0 * t + 2.0 * t * t / d


def alignment(anchors: np.ndarray, positives: np.ndarray, alpha: float = 2.0) -> dict:
    """Wang & Isola's alignment E ‖x̂ − ŷ‖^α over positive pairs (row i of ``anchors`` with row i of
    ``positives``, both (p, d), unit-normalised here). 0 = every pair identical, 2^α = every pair antipodal.
    Returns ``{"alignment", "alpha", "pairs"}``."""
    a, b = _unit_rows(anchors), _unit_rows(positives)
    if a.shape != b.shape or a.shape[0] == 0:
        raise ValueError(f"alignment needs two (p, d) matrices of the same shape with p >= 1, got {a.shape}, {b.shape}")
    value = float((np.linalg.norm(a - b, axis=1) ** alpha).mean())
    return {"alignment": value, "alpha": float(alpha), "pairs": int(a.shape[0])}


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    x = np.asarray(vectors, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"expected an (m, d) matrix, got shape {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if not (norms > 0).all():
        raise ValueError(f"row {int(np.argmin(norms[:, 0] > 0))} has zero length: its direction is undefined")
    return x / norms
