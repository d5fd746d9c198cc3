"""Cluster-wise recentering (seed chapter 7, "the mean belongs to nobody"), in numpy.

A single global mean is right for a single population only. For a mixture (90 % product text + 10 %
tickets, ‖a − b‖ = 1, residual spread 1) the global mean μ = 0.9a + 0.1b leaves population B carrying
the offset b − μ = 0.9(b − a) of norm 0.9, and Chapter 1's identity gives B an induced anisotropy
A ≈ ‖δ‖² / (‖δ‖² + 1) = 0.81 / 1.81 ≈ 0.45. The fix: cluster (k-means, :mod:`anisotropy_core.kmeans`,
modest k), keep one mean per cluster (optionally its top-D within-cluster directions) and subtract the mean
of the cluster a vector lands in: :class:`ClusterRecenter` (registered transform ``"cluster_recenter"``),
fitted in memory by :func:`fit_cluster_recenter` (on Spark: ``anisotropy_spark.kmeans.spark_fit_cluster_recenter``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .cluster_diagnostics import cluster_moments
from .diagnostics import centred_spectrum
from .kmeans import KMeansResult, assign, check_metric, kmeans, prepare
from .methods import Method
from .moments import Moments
from .transforms import FittedTransform, check_shape, map_blocks, register


@register
class ClusterRecenter(FittedTransform):
    """Fitted cluster-wise recentering (registered transform ``"cluster_recenter"``): assign each vector to
    its nearest centroid, subtract that cluster's mean, and optionally project out that cluster's top-D
    within-cluster principal directions. (n, d) → (n, d).

    * ``metric``      — assignment metric (``"euclidean"`` | ``"cosine"``),
    * ``centroids``   — (k, d) assignment centroids (unit rows for cosine),
    * ``means``       — (k, d) per-cluster mean of the *raw* vectors (what is subtracted),
    * ``directions``  — (k, D, d) per-cluster top-D unit directions (rows), sign-canonical; D may be 0,
    * ``sizes``       — (k,) int64 number of fitting vectors per cluster,
    * ``mean``        — (d,) corpus mean (size-weighted mean of ``means``; kept for the shared contract),
    * ``fit_info``    — JSON scalars about the k-means fit (``inertia``, ``n_iter``, ``converged``).

    :meth:`apply` follows the :class:`FittedTransform` contract and returns the corrected vectors only;
    :meth:`apply_with_clusters` also returns the cluster ids.
    """

    method = Method.CLUSTER_RECENTER

    def __init__(
        self,
        metric: str,
        centroids: np.ndarray,
        means: np.ndarray,
        directions: np.ndarray,
        sizes: np.ndarray,
        fit_info: Mapping[str, Any] | None = None,
    ):
        self.metric = check_metric(metric)
        self.centroids = np.asarray(centroids, dtype=np.float64)
        self.means = np.asarray(means, dtype=np.float64)
        self.sizes = np.asarray(sizes).round().astype(np.int64)
        k, d = self.centroids.shape
        self.directions = np.asarray(directions, dtype=np.float64).reshape(k, -1, d)
        if self.means.shape != (k, d) or self.sizes.shape != (k,):
            raise ValueError(
                f"inconsistent cluster-recenter arrays: centroids {self.centroids.shape}, "
                f"means {self.means.shape}, sizes {self.sizes.shape}"
            )
        if not (self.sizes > 0).all():
            raise ValueError(
                f"clusters {np.flatnonzero(self.sizes <= 0).tolist()} received no fitting vectors; "
                "their mean is undefined (lower k or raise max_iter)"
            )
        super().__init__(self.sizes @ self.means / self.sizes.sum())
        self.fit_info = dict(fit_info or {})

    @property
    def k(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def n_directions(self) -> int:
        return int(self.directions.shape[1])

    @classmethod
    def from_moments(
        cls,
        centroids: np.ndarray,
        states: Sequence[Moments],
        n_directions: int,
        metric: str,
        fit_info: Mapping[str, Any] | None = None,
    ) -> "ClusterRecenter":
        """Build from (k, d) ``centroids`` and the k per-cluster :class:`Moments` of the fitting data."""
        k, d = np.shape(centroids)
        if len(states) != k:
            raise ValueError(f"{len(states)} cluster moments for {k} centroids")
        if not 0 <= n_directions < d:
            raise ValueError(f"directions per cluster must be in [0, {d}), got {n_directions}")
        empty = [c for c, s in enumerate(states) if s.n == 0]
        if empty:
            raise ValueError(
                f"clusters {empty} received no fitting vectors; their mean is undefined (lower k or raise max_iter)"
            )
        directions = np.stack([centred_spectrum(s)[1][:, :n_directions].T for s in states])
        return cls(
            metric,
            centroids,
            np.stack([s.mean for s in states]),
            directions.reshape(k, n_directions, d),
            np.array([s.n for s in states]),
            fit_info,
        )

    def params(self) -> dict[str, Any]:
        return {"metric": self.metric, "k": self.k, "D_per_cluster": self.n_directions, **self.fit_info}

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "mean": self.mean,
            "centroids": self.centroids,
            "means": self.means,
            "directions": self.directions,
            "sizes": self.sizes.astype(np.float64),
        }

    @classmethod
    def from_parts(cls, params: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> "ClusterRecenter":
        info = {key: value for key, value in params.items() if key not in ("metric", "k", "D_per_cluster")}
        return cls(params["metric"], arrays["centroids"], arrays["means"], arrays["directions"], arrays["sizes"], info)

    def assign(self, vectors: np.ndarray) -> np.ndarray:
        """(B,) int64 cluster id of each raw vector (B, d)."""
        return assign(prepare(vectors, self.metric), self.centroids, self.metric)[0]

    def apply_with_clusters(self, vectors: np.ndarray, dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
        """``(corrected (B, d) of dtype, cluster ids (B,) int64)`` for raw ``vectors`` (B, d), float32 or float64.

        Computed in float64 block by block (:func:`~anisotropy_core.transforms.map_blocks`; the assignment too),
        then cast to ``dtype``. Raises :class:`TransformInputError` (naming the row) on a wrong dimension or a
        non-finite value, :class:`NonFiniteOutputError` on a non-finite output (e.g. after the cast).
        """
        x = check_shape(np.asarray(vectors), self.d_in)
        ids = np.empty(x.shape[0], dtype=np.int64)

        def recenter(rows: np.ndarray, start: int) -> np.ndarray:
            block_ids = ids[start : start + rows.shape[0]]
            block_ids[...] = self.assign(rows)
            rows -= self.means[block_ids]
            if self.n_directions:
                u = self.directions[block_ids]  # (b, D, d)
                rows -= np.einsum("bj,bjd->bd", np.einsum("bjd,bd->bj", u, rows), u)
            return rows

        return map_blocks(x, self.d_in, self.d_out, dtype, recenter, self.method), ids

    def apply(self, vectors: np.ndarray, dtype: type = np.float64) -> np.ndarray:
        """Corrected vectors (B, d) (or (d,) for one vector) of ``dtype``; see :meth:`apply_with_clusters`."""
        x = np.asarray(vectors)
        out = self.apply_with_clusters(x[None, :] if x.ndim == 1 else x, dtype)[0]
        return out[0] if x.ndim == 1 else out


def kmeans_info(result: KMeansResult) -> dict[str, Any]:
    """JSON scalars recorded with a cluster-recenter fit."""
    return {
        "inertia": float(result.inertia),
        "n_iter": int(result.n_iter),
        "converged": bool(result.converged),
        "refinement": result.refinement,
    }


def fit_cluster_recenter(
    vectors: np.ndarray, k: int, n_directions: int = 0, metric: str = "euclidean", seed: int = 0, **kmeans_options
) -> tuple[ClusterRecenter, KMeansResult]:
    """Numpy reference fit on (n, d) ``vectors``: k-means, then one per-cluster moments pass."""
    result = kmeans(vectors, k, metric, seed, **kmeans_options)
    x = np.asarray(vectors, dtype=np.float64)
    ids = assign(prepare(x, metric), result.centroids, metric)[0]
    fit = ClusterRecenter.from_moments(
        result.centroids, cluster_moments(x, ids, k), n_directions, metric, kmeans_info(result)
    )
    return fit, result
