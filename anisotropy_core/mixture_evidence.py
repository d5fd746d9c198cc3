"""Is the corpus a mixture? The mixture check on a driver sample, with a null (seed chapter 7: "the mean belongs
to nobody" — a single mean is only right for a single population).

k-means always finds k clusters, also in one Gaussian blob, and cutting an elongated blob along its long axis
leaves clusters that are flatter than the whole and offset from its mean: the per-cluster diagnostics alone
(:func:`anisotropy_core.cluster_diagnostics.cluster_diagnostics`) would call every anisotropic corpus a mixture. So the
check asks whether the sample's clusters explain more variance than k-means finds in a single population of the
same shape: the statistic is the within-cluster share of the centred sum of squares, W_k / W_1, of the sample
(m, d); the null is that statistic on ``references`` Gaussian samples with the sample's mean and covariance (the
gap statistic's reference, Tibshirani et al. 2001, with the covariance kept); p = (1 + #{references whose share
≤ the sample's}) / (1 + references). k-means here is faiss's (one thread, seeded): the sample and its
references are small, and the same k-means must run on both.
"""

from __future__ import annotations

import faiss
import numpy as np

from .cluster_diagnostics import ClusterTable, cluster_diagnostics, cluster_moments
from .kmeans import assign, prepare

DEFAULT_REFERENCES = 19  # the smallest p is 1/(1 + 19) = 0.05
KMEANS_ITERATIONS = 25
MAX_LENGTH_RATIO = 1e12  # longer rows (in median lengths) would overflow float32 squared distances in faiss


def within_share(x: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, float]:
    """(centroids (k, d), W_k / W_1) of faiss k-means on (m, d) ``x`` (float64 in, float32 k-means)."""
    points = np.ascontiguousarray(x, dtype=np.float32)
    model = faiss.Kmeans(points.shape[1], k, niter=KMEANS_ITERATIONS, seed=seed, verbose=False)
    model.train(points)
    if model.centroids is None:  # set by train; None only before it
        raise RuntimeError("faiss k-means returned no centroids")
    distances, _ = model.index.search(points, 1)
    total = float(((x - x.mean(axis=0)) ** 2).sum())
    return model.centroids.astype(np.float64), float(distances.sum()) / total if total > 0 else 1.0


def gaussian_factor(x: np.ndarray) -> np.ndarray:
    """(d, d) F with F Fᵀ = the covariance of (m, d) ``x``, so ``mean + z Fᵀ`` (z standard normal) is a Gaussian
    sample of the same shape."""
    centred = x - x.mean(axis=0)
    lam, vectors = np.linalg.eigh(centred.T @ centred / max(x.shape[0] - 1, 1))
    return vectors * np.sqrt(np.clip(lam, 0.0, None))


def mixture_check(
    vectors: np.ndarray, k: int, metric: str = "euclidean", seed: int = 0, references: int = DEFAULT_REFERENCES
) -> tuple[np.ndarray, ClusterTable]:
    """k-means of the sample ``vectors`` (m, d) and its null (module docstring).

    Returns (centroids (k, d), the :func:`~anisotropy_core.cluster_diagnostics.cluster_diagnostics` of the sample's
    clusters plus ``"mixture_null": {"within_share", "reference_shares": [...], "p", "references"}`` and ``"mixture_p"``).
    ``metric``: the distance the clusters are assigned by (cosine: unit rows are clustered)."""
    x = prepare(np.asarray(vectors, dtype=np.float64), metric).astype(np.float64)
    scale = float(np.median(np.linalg.norm(x, axis=1))) or 1.0
    x /= scale  # k-means and the share do not change; faiss's float32 k-means sees lengths ≈ 1
    if not np.linalg.norm(x, axis=1).max() <= MAX_LENGTH_RATIO:
        raise ValueError(
            f"the mixture check's sample holds rows over {MAX_LENGTH_RATIO:g} × the median length, "
            "whose squared distances float32 k-means cannot hold (norm outliers kept by "
            "max_norm_ratio: null)"
        )
    if not 2 <= k < x.shape[0]:
        raise ValueError(f"the mixture check needs 2 <= k < sample rows, got k={k} for {x.shape[0]} rows")
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        centroids, share = within_share(x, k, seed)
        factor, mean = gaussian_factor(x), x.mean(axis=0)
        shares = [
            within_share(mean + np.random.default_rng(seed + 1 + r).standard_normal(x.shape) @ factor.T, k, seed)[1]
            for r in range(references)
        ]
    finally:
        faiss.omp_set_num_threads(threads)
    ids = assign(x, centroids, metric)[0]
    p = (1 + sum(s <= share for s in shares)) / (1 + references)
    diagnostics = cluster_diagnostics(cluster_moments(np.asarray(vectors, dtype=np.float64), ids, k))
    diagnostics["mixture_null"] = {"within_share": share, "reference_shares": shares, "p": p, "references": references}
    diagnostics["mixture_p"] = p
    return centroids * scale, diagnostics
