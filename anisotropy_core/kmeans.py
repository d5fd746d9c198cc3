"""k-means (Lloyd, k-means|| seeding, a sample fit refined by full passes), in numpy.

Everything distributed is expressed through *passes*: a function of the current centroids that returns a
mergeable :class:`ClusterState` (per-cluster sums, counts, inertia and the farthest points seen). The
driver loops (:func:`lloyd`, :func:`kmeans_parallel_init`, :func:`sampled_kmeans`) are shared by the numpy
reference (:func:`kmeans`) and the Spark implementation (``anisotropy_spark.kmeans``), so both run the very
same algorithm and differ only in where a pass executes.

Metrics: ``"euclidean"`` (distance ‖x − c‖², inertia Σ‖x − c‖²) and ``"cosine"`` (spherical k-means on
unit vectors: distance 1 − cos(x, c), unit centroids, inertia Σ(1 − cos)) — the same cost definitions
as ``pyspark.ml.clustering.KMeans``.

The cluster-wise recentering fitted on top of it lives in :mod:`anisotropy_core.cluster_recenter`, the
per-cluster diagnosis table in :mod:`anisotropy_core.cluster_diagnostics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .methods import ClusterRecenterSettings
from .moments import InvalidVectorsError
from .row_keys import row_ids, row_keys, split_row_ids

METRICS = ("euclidean", "cosine")
DEFAULT_MAX_ITER = ClusterRecenterSettings.max_iter
DEFAULT_TOL = ClusterRecenterSettings.tol  # relative inertia change below which Lloyd iterations stop
DEFAULT_INIT_STEPS = ClusterRecenterSettings.init_steps  # k-means|| rounds
DEFAULT_OVERSAMPLING = 2.0  # k-means|| expected candidates per round = oversampling · k
LOCAL_MAX_ITER = 30  # weighted Lloyd iterations on the k-means|| candidates (as Spark ML)
DEFAULT_SAMPLE_SIZE = 1 << 17  # rows k-means is fitted on in one process before the full-table passes
DEFAULT_REFINE_PASSES = 2  # full-table Lloyd passes that finish a sample fit
DEFAULT_CORRECTED_ITER = 10  # bias-corrected sample updates after each full pass but the last


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    return metric


def prepare(vectors: np.ndarray, metric: str) -> np.ndarray:
    """(B, d) copy of ``vectors`` ready for assignment: unit rows for cosine, as-is for Euclidean. float32
    rows stay float32 (the distance GEMM then runs in float32), anything else becomes float64.

    Raises :class:`InvalidVectorsError` on NaN/Inf (either metric) or a zero row (cosine), so an invalid
    vector can never turn a centroid into NaN.
    """
    x = np.asarray(vectors)
    if x.dtype != np.float32:
        x = x.astype(np.float64, copy=False)
    if x.ndim != 2:
        raise ValueError(f"expected a (B, d) matrix, got shape {x.shape}")
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        raise InvalidVectorsError(f"non-finite value in batch row {int(np.argmin(finite))}")
    if check_metric(metric) == "cosine":
        norms = np.linalg.norm(x, axis=1)
        if not (norms > 0).all():
            raise InvalidVectorsError(
                f"zero-length vector in batch row {int(np.argmin(norms > 0))}: cosine distance is undefined"
            )
        return x / norms[:, None]
    return x.copy()


def row_norms_squared(x: np.ndarray) -> np.ndarray:
    """(B,) float64 ‖x_i‖² of the rows of ``x`` (B, d), accumulated in float64 for float32 rows too."""
    return np.einsum("ij,ij->i", x, x, dtype=np.float64)


def distances(x: np.ndarray, centroids: np.ndarray, metric: str, x_sq: np.ndarray | None = None) -> np.ndarray:
    """(B, k) float64 distances of prepared rows ``x`` (B, d) to ``centroids`` (k, d), one GEMM in the rows'
    precision (float32 rows: a float32 GEMM, the fast kernel; the rest is float64).

    Euclidean: ‖x‖² − 2 x·c + ‖c‖², clipped at 0 against cancellation; ``x_sq`` (B,) optional precomputed
    :func:`row_norms_squared` of ``x`` (same numbers, not recomputed every pass). Cosine (unit x and c):
    1 − x·c.
    """
    out = (x @ centroids.T.astype(x.dtype, copy=False)).astype(np.float64, copy=False)
    if metric == "cosine":
        np.subtract(1.0, out, out=out)
        return np.clip(out, 0.0, 2.0, out=out)
    out *= -2.0
    out += (row_norms_squared(x) if x_sq is None else x_sq)[:, None]
    out += row_norms_squared(centroids)
    return np.maximum(out, 0.0, out=out)


def assign(
    x: np.ndarray, centroids: np.ndarray, metric: str, x_sq: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid of each prepared row: ``(ids (B,) int64, distance (B,))``; ties go to the lower id.
    ``x_sq``: optional (B,) precomputed ‖x‖² (Euclidean), see :func:`distances`."""
    dist = distances(x, centroids, metric, x_sq)
    ids = np.argmin(dist, axis=1)
    return ids, np.take_along_axis(dist, ids[:, None], axis=1)[:, 0]


def _farthest(dist: np.ndarray, points: np.ndarray, m: int) -> np.ndarray:
    """Indices of the ``m`` rows with the largest ``dist`` (B,), farthest first; ties are broken by the rows'
    coordinates (``points`` (B, d)), so the choice does not depend on row order or partitioning."""
    if dist.shape[0] > m:
        threshold = np.partition(dist, dist.shape[0] - m)[dist.shape[0] - m]
        candidates = np.flatnonzero(dist >= threshold)
    else:
        candidates = np.arange(dist.shape[0])
    sub = points[candidates]
    keys = [sub[:, j] for j in range(sub.shape[1] - 1, -1, -1)] + [-dist[candidates]]
    return candidates[np.lexsort(keys)[:m]]


@dataclass
class ClusterState:
    """Mergeable result of one assignment pass over some rows, for ``k`` clusters in dimension ``d``.

    * ``sums``       — (k, d) per-cluster (weighted) sum of the prepared rows,
    * ``counts``     — (k,) per-cluster (weighted) count, float64 so k-means|| weights fit the same state,
    * ``inertia``    — Σ weight · distance to the nearest centroid,
    * ``far_points`` — (m, d) the m rows farthest from their centroid (m ≤ k), farthest first,
    * ``far_dist``   — (m,) their distances; empty clusters are re-seeded from these points.
    """

    sums: np.ndarray
    counts: np.ndarray
    inertia: float
    far_points: np.ndarray
    far_dist: np.ndarray

    @property
    def k(self) -> int:
        return int(self.counts.shape[0])

    @property
    def d(self) -> int:
        return int(self.sums.shape[1])

    @classmethod
    def empty(cls, k: int, d: int) -> "ClusterState":
        """Identity element of :meth:`merge`."""
        return cls(np.zeros((k, d)), np.zeros(k), 0.0, np.zeros((0, d)), np.zeros(0))

    @classmethod
    def of_batch(
        cls,
        x: np.ndarray,
        centroids: np.ndarray,
        metric: str,
        weights: np.ndarray | None = None,
        x_sq: np.ndarray | None = None,
    ) -> "ClusterState":
        """State of prepared rows ``x`` (B, d) (see :func:`prepare`) against ``centroids`` (k, d).

        ``weights``: optional (B,) non-negative row weights (k-means|| candidates); default 1. ``x_sq``:
        optional (B,) precomputed :func:`row_norms_squared` of ``x`` (Euclidean passes over fixed blocks).
        """
        k, d = centroids.shape
        if x.shape[0] == 0:
            return cls.empty(k, d)
        ids, dist = assign(x, centroids, metric, x_sq)
        w = None if weights is None else np.asarray(weights, dtype=np.float64)
        sums = _grouped_sum(k, ids, x, w)
        counts = np.bincount(ids, weights=w, minlength=k).astype(np.float64)
        order = _farthest(dist, x, k)
        inertia = float(dist.sum() if w is None else np.dot(w, dist))
        return cls(sums, counts, inertia, x[order].copy(), dist[order].copy())

    def shifted(self, shift: np.ndarray) -> "ClusterState":
        """This state with every non-empty cluster's mean moved by ``shift`` (k, d): sums + counts · shift
        (counts, inertia and farthest points unchanged; an empty cluster stays empty)."""
        return ClusterState(
            self.sums + self.counts[:, None] * shift, self.counts, self.inertia, self.far_points, self.far_dist
        )

    def merge(self, other: "ClusterState") -> "ClusterState":
        """Combine two states over disjoint rows (associative, commutative up to rounding)."""
        if (self.k, self.d) != (other.k, other.d):
            raise ValueError(f"cannot merge states of shape {(self.k, self.d)} and {(other.k, other.d)}")
        points = np.concatenate([self.far_points, other.far_points])
        dist = np.concatenate([self.far_dist, other.far_dist])
        order = _farthest(dist, points, self.k)
        return ClusterState(
            self.sums + other.sums, self.counts + other.counts, self.inertia + other.inertia, points[order], dist[order]
        )

    # --- wire format: flat float64 [k, d, m, inertia, counts…, sums…, far_dist…, far_points…] (no pickle) ---

    @staticmethod
    def max_wire_bytes(k: int, d: int) -> int:
        """Size of :meth:`to_bytes` for k clusters in dimension d at its largest (m = k farthest points)."""
        return 8 * (4 + k + k * d + k + k * d)

    def to_bytes(self) -> bytes:
        head = np.array([self.k, self.d, self.far_dist.shape[0], self.inertia], dtype=np.float64)
        return np.concatenate([head, self.counts, self.sums.ravel(), self.far_dist, self.far_points.ravel()]).tobytes()

    @classmethod
    def from_bytes(cls, payload: bytes) -> "ClusterState":
        flat = np.frombuffer(payload, dtype=np.float64)
        k, d, m = (int(v) for v in flat[:3])
        body = flat[4:]
        if body.shape[0] != k + k * d + m + m * d:
            raise ValueError(f"corrupt cluster-state payload: {body.shape[0]} values for k={k}, d={d}, m={m}")
        counts, body = body[:k], body[k:]
        sums, body = body[: k * d].reshape(k, d), body[k * d :]
        far_dist, body = body[:m], body[m:]
        return cls(sums.copy(), counts.copy(), float(flat[3]), body.reshape(m, d).copy(), far_dist.copy())


def _grouped_sum(k: int, ids: np.ndarray, x: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    """(k, d) float64 per-cluster Σ w·x of rows ``x`` (B, d) with cluster ids (B,) and optional weights (B,):
    one ``sum(axis=0, dtype=float64)`` of each non-empty cluster's rows, gathered in row order (float32 rows
    accumulate in float64; ~25× faster than ``np.add.reduceat`` with a dtype cast, and ~25 % faster than
    gathering all rows sorted by cluster at 131,072 × 384). Memory: one cluster's rows at a time."""
    out = np.zeros((k, x.shape[1]))
    for cluster in np.flatnonzero(np.bincount(ids, minlength=k)):
        members = ids == cluster
        rows = x[members] if w is None else x[members] * w[members, None]
        out[cluster] = rows.sum(axis=0, dtype=np.float64)
    return out


def update_centroids(state: ClusterState, centroids: np.ndarray, metric: str) -> tuple[np.ndarray, list[int]]:
    """Lloyd update: ``(new centroids (k, d), ids of clusters re-seeded)``.

    A non-empty cluster moves to its mean (cosine: the normalised mean of its unit rows). An empty one —
    or, for cosine, one whose unit rows cancel exactly — is re-seeded at the farthest remaining point of
    the pass (farthest first, one point per cluster, in cluster-id order).
    """
    new = centroids.copy()
    live = state.counts > 0
    new[live] = state.sums[live] / state.counts[live, None]
    if metric == "cosine":
        norms = np.linalg.norm(new, axis=1)
        live &= norms > 0
        new[live] /= norms[live, None]
    dead = [int(c) for c in np.flatnonzero(~live)]
    if len(dead) > state.far_points.shape[0]:
        raise ValueError(
            f"{len(dead)} empty clusters but only {state.far_points.shape[0]} points to re-seed "
            "them from: k exceeds the number of rows"
        )
    for slot, cluster in enumerate(dead):
        new[cluster] = state.far_points[slot]
    return new, dead


@dataclass
class KMeansResult:
    """A fitted k-means: ``centroids`` (k, d) (unit rows for cosine) and the statistics of their last pass.

    ``counts`` (k,) int64 cluster sizes and ``inertia`` belong to exactly these centroids; ``history`` holds
    the inertia of every pass; ``converged`` is False when ``max_iter`` stopped the loop; ``refinement`` says
    where the full-table passes ran (``"local"``: this process; Spark: ``"in_memory"`` or ``"streaming"``).
    """

    centroids: np.ndarray
    counts: np.ndarray
    inertia: float
    n_iter: int
    converged: bool
    metric: str
    history: list[float] = field(default_factory=list)
    refinement: str = "local"


PassFn = Callable[[np.ndarray], ClusterState]
# (state of a full pass at centroids c (k, d), c, its Lloyd update (k, d)) → the centroids of the next full pass
Step = Callable[[ClusterState, np.ndarray, np.ndarray], np.ndarray]
# (start (k, d), passes, tol, step between passes or None: plain Lloyd) → Lloyd over the table
Refine = Callable[[np.ndarray, int, float, "Step | None"], KMeansResult]


def lloyd(
    run_pass: PassFn,
    init: np.ndarray,
    metric: str,
    max_iter: int = DEFAULT_MAX_ITER,
    tol: float = DEFAULT_TOL,
    step: Step | None = None,
) -> KMeansResult:
    """Lloyd iterations from ``init`` (k, d), each one ``run_pass(centroids) → ClusterState``.

    Stops when the relative inertia change between consecutive passes is ≤ ``tol`` (and nothing was
    re-seeded in the last update), or after ``max_iter`` passes. Returns the centroids of the last pass.
    ``step``: optional :data:`Step` choosing the next pass's centroids from a pass and its Lloyd update
    (:func:`sample_corrected_step`); default: the update itself.
    """
    if max_iter < 1:
        raise ValueError(f"max_iter must be ≥ 1, got {max_iter}")
    centroids = np.asarray(init, dtype=np.float64).copy()
    history: list[float] = []
    for iteration in range(1, max_iter + 1):
        state = run_pass(centroids)
        history.append(state.inertia)
        updated, reseeded = update_centroids(state, centroids, metric)
        converged = not reseeded and (
            state.inertia == 0.0 or (len(history) > 1 and abs(history[-2] - history[-1]) <= tol * history[-2])
        )
        if converged or iteration == max_iter:
            return KMeansResult(
                centroids, state.counts.round().astype(np.int64), state.inertia, iteration, converged, metric, history
            )
        centroids = updated if step is None else step(state, centroids, updated)
    raise AssertionError("unreachable")


def kmeans_plus_plus(
    points: np.ndarray, k: int, metric: str, rng: np.random.Generator, weights: np.ndarray | None = None
) -> np.ndarray:
    """Greedy k-means++ seeding on prepared ``points`` (m, d) with optional (m,) ``weights``: (k, d) centroids.

    The first centre is drawn ∝ weight; for each next one, 2 + ⌊ln k⌋ candidates are drawn
    ∝ weight · distance to the chosen set and the one that lowers the weighted cost most is kept
    (Arthur & Vassilvitskii's greedy variant, as scikit-learn; it avoids most two-centres-in-one-cluster
    starts). When every remaining point coincides with a centre (fewer distinct points than k) the heaviest
    point is repeated; Lloyd's empty-cluster re-seeding then moves the duplicates.
    """
    m = points.shape[0]
    if m == 0:
        raise ValueError("k-means++ needs at least one point")
    w = np.ones(m) if weights is None else np.asarray(weights, dtype=np.float64)
    trials = 2 + int(np.log(k))
    chosen = [int(rng.choice(m, p=w / w.sum()))]
    nearest = distances(points, points[chosen], metric)[:, 0]
    for _ in range(1, k):
        score = w * nearest
        total = score.sum()
        if total <= 0:
            chosen.append(int(np.argmax(w)))
            continue
        picks = rng.choice(m, size=trials, p=score / total)
        candidate_nearest = np.minimum(nearest[None, :], distances(points[picks], points, metric))  # (trials, m)
        best = int(np.argmin(candidate_nearest @ w))
        chosen.append(int(picks[best]))
        nearest = candidate_nearest[best]
    return points[chosen].copy()


def partition_rng(seed: int, round_: int, partition: int) -> np.random.Generator:
    """The generator of one partition in one k-means|| round (``round_`` = −1: the first-centre draw).

    Draws depend only on (seed, round, partition) and the row order, never on batch boundaries.
    """
    return np.random.default_rng([seed, round_ + 1, partition])


def first_centre_candidate(x: np.ndarray, rng: np.random.Generator) -> tuple[float, np.ndarray]:
    """``(key, row)``: the row of prepared ``x`` (B, d) with the smallest uniform key drawn from ``rng``.

    The row with the smallest key over all partitions is a uniformly random first centre.
    """
    keys = rng.random((x.shape[0],))
    best = int(np.argmin(keys))
    return float(keys[best]), x[best]


def oversample(x: np.ndarray, centroids: np.ndarray, metric: str, scale: float, rng: np.random.Generator) -> np.ndarray:
    """k-means|| round on prepared ``x`` (B, d): rows kept independently with probability
    min(1, scale · distance to ``centroids``), where scale = oversampling · k / current cost. (m, d)."""
    _, dist = assign(x, centroids, metric)
    return x[rng.random(x.shape[0]) < scale * dist].copy()


def kmeans_parallel_init(
    first_centre: Callable[[], np.ndarray],
    run_pass: PassFn,
    sample: Callable[[np.ndarray, float, int], np.ndarray],
    k: int,
    metric: str,
    seed: int,
    init_steps: int = DEFAULT_INIT_STEPS,
    oversampling: float = DEFAULT_OVERSAMPLING,
) -> np.ndarray:
    """k-means|| (Bahmani et al. 2012), as Spark ML runs it: (k, d) initial centroids.

    ``first_centre()`` → (d,) a uniformly random row; ``run_pass(C)`` → ClusterState (cost = inertia,
    candidate weights = counts); ``sample(C, scale, round)`` → (m, d) rows oversampled against C.
    ``init_steps`` rounds of oversampling, then the weighted candidates are reduced to k centres by
    k-means++ and weighted Lloyd locally.
    """
    candidates = np.asarray(first_centre(), dtype=np.float64)[None, :]
    for round_ in range(init_steps):
        cost = run_pass(candidates).inertia
        if cost == 0.0:
            break
        candidates = np.concatenate([candidates, sample(candidates, oversampling * k / cost, round_)])
    weights = run_pass(candidates).counts
    keep = weights > 0
    candidates, weights = candidates[keep], weights[keep]
    rng = np.random.default_rng([seed, init_steps + 1])
    init = kmeans_plus_plus(candidates, k, metric, rng, weights)
    local = lloyd(
        lambda c: ClusterState.of_batch(candidates, c, metric, weights), init, metric, max_iter=LOCAL_MAX_ITER, tol=0.0
    )
    return local.centroids


@dataclass
class KeyedSample:
    """Mergeable uniform sample of at most ``size`` rows: the rows with the smallest uniform keys.

    Row r of partition p gets the key :func:`~anisotropy_core.row_keys.row_keys` (seed, its
    ``monotonically_increasing_id`` p · 2³³ + r), a hash of its place alone: the sample depends on the seed and
    the partitioning only (never on batch boundaries or merge order), and Spark draws the same keys on the JVM.

    * ``keys``   — (m,) keys of the kept rows, ascending (m ≤ size),
    * ``rows``   — (m, d) the kept rows as read (float32 stays float32),
    * ``origin`` — (m, 2) int64 (partition, row index within the partition) of each kept row,
    * ``n``      — rows seen; when ``n ≤ size`` the sample is the whole table (:meth:`partitions`).
    """

    keys: np.ndarray
    rows: np.ndarray
    origin: np.ndarray
    n: int
    size: int

    @classmethod
    def of_rows(
        cls, x: np.ndarray, seed: int, partition: int, first_row: int, size: int, below: float = 1.0
    ) -> "KeyedSample":
        """Sample of rows ``x`` (B, d) of ``partition`` starting at row ``first_row``, keyed for ``seed``; only rows
        with key < ``below`` kept (see :func:`sample_threshold`)."""
        ids = row_ids(partition, first_row + np.arange(x.shape[0]))
        keys = row_keys(seed, ids)
        kept = np.flatnonzero(keys < below)
        return cls.of_candidates(keys[kept], x[kept], split_row_ids(ids[kept]), x.shape[0], size)

    @classmethod
    def of_candidates(cls, keys: np.ndarray, rows: np.ndarray, origin: np.ndarray, n: int, size: int) -> "KeyedSample":
        """Sample of ``n`` rows from candidate ``keys`` (m,), ``rows`` (m, d), ``origin`` (m, 2): the ``size``
        smallest keys (ties by origin)."""
        order = np.lexsort((origin[:, 1], origin[:, 0], keys))[:size]
        return cls(keys[order], rows[order], origin[order].astype(np.int64), n, size)

    def merge(self, other: "KeyedSample") -> "KeyedSample":
        """Sample of the union of two disjoint row sets (associative and commutative)."""
        if not len(other.keys) or not len(self.keys):
            kept = other if len(other.keys) else self
            return KeyedSample(kept.keys, kept.rows, kept.origin, self.n + other.n, self.size)
        return self.of_candidates(
            np.concatenate([self.keys, other.keys]),
            np.concatenate([self.rows, other.rows]),
            np.concatenate([self.origin, other.origin]),
            self.n + other.n,
            self.size,
        )

    @property
    def complete(self) -> bool:
        """True when it holds the ``min(n, size)`` smallest keys (False only if a ``below`` bound was too low)."""
        return len(self.keys) == min(self.n, self.size)

    def partitions(self, count: int) -> list[np.ndarray]:
        """The whole table as ``count`` per-partition (n_p, d) matrices in row order (needs ``n ≤ size``)."""
        if self.n > len(self.keys):
            raise ValueError(f"the sample holds {len(self.keys)} of {self.n} rows, not the whole table")
        order = np.lexsort((self.origin[:, 1], self.origin[:, 0]))
        rows, owner = self.rows[order], self.origin[order, 0]
        return [rows[owner == p] for p in range(count)]


def sample_threshold(n: int, size: int) -> float:
    """Key bound ``below`` for a :class:`KeyedSample` of ``size`` of ``n`` rows: the number of keys under it is
    Binomial(n, below) with mean size + 8·√size + 64, so it holds the ``size`` smallest keys except with
    probability < 1e-15 (then the sample is not :attr:`~KeyedSample.complete` and is drawn again with 1)."""
    return 1.0 if n <= size else min(1.0, (size + 8.0 * np.sqrt(size) + 64.0) / n)


def sample_partitions(parts: Sequence[np.ndarray], seed: int, size: int) -> KeyedSample:
    """:class:`KeyedSample` of in-memory partitions ``parts`` (each (n_p, d)), as the Spark sample pass draws it."""
    d = parts[0].shape[1]
    sample = KeyedSample(np.zeros(0), np.zeros((0, d)), np.zeros((0, 2), dtype=np.int64), 0, size)
    for p, x in enumerate(parts):
        sample = sample.merge(KeyedSample.of_rows(x, seed, p, 0, size))
    return sample


def blocks_state(
    blocks: Sequence[np.ndarray], squares: Sequence[np.ndarray], centroids: np.ndarray, metric: str
) -> ClusterState:
    """:class:`ClusterState` of prepared in-memory ``blocks`` (each (n_b, d)) against ``centroids`` (k, d),
    merged in block order; ``squares``: each block's (n_b,) :func:`row_norms_squared`, computed once."""
    state = ClusterState.empty(*centroids.shape)
    for block, square in zip(blocks, squares):
        state = state.merge(ClusterState.of_batch(block, centroids, metric, x_sq=square))
    return state


def in_memory_passes(
    parts: Sequence[np.ndarray], metric: str, seed: int
) -> tuple[Callable[[], np.ndarray], PassFn, Callable[[np.ndarray, float, int], np.ndarray]]:
    """``(first_centre, run_pass, oversample)`` of :func:`kmeans_parallel_init` / :func:`lloyd` over prepared
    in-memory partitions ``parts`` (each (n_p, d)), partition ``i`` drawing from ``partition_rng(seed, ·, i)``."""
    squares = [row_norms_squared(p) for p in parts]

    def run_pass(centroids: np.ndarray) -> ClusterState:
        return blocks_state(parts, squares, centroids, metric)

    def first_centre() -> np.ndarray:
        keyed = [first_centre_candidate(p, partition_rng(seed, -1, i)) for i, p in enumerate(parts) if len(p)]
        return min(keyed, key=lambda kv: kv[0])[1]

    def sample(centroids: np.ndarray, scale: float, round_: int) -> np.ndarray:
        return np.concatenate(
            [oversample(p, centroids, metric, scale, partition_rng(seed, round_, i)) for i, p in enumerate(parts)]
        )

    return first_centre, run_pass, sample


def start_centroids(
    parts: Sequence[np.ndarray],
    k: int,
    metric: str,
    seed: int,
    init: np.ndarray | None,
    init_steps: int,
    oversampling: float,
) -> np.ndarray:
    """(k, d) Lloyd start for prepared in-memory ``parts``: ``init`` (prepared) or k-means|| on the parts."""
    if init is not None:
        start = prepare(init, metric).astype(np.float64)
    else:
        first_centre, run_pass, sample = in_memory_passes(parts, metric, seed)
        start = kmeans_parallel_init(first_centre, run_pass, sample, k, metric, seed, init_steps, oversampling)
    if start.shape != (k, parts[0].shape[1]):
        raise ValueError(f"initial centroids have shape {start.shape}, expected {(k, parts[0].shape[1])}")
    return start


def sample_corrected_step(sample_pass: PassFn, metric: str, iterations: int) -> Step:
    """:data:`Step` that follows a full pass with ``iterations`` Lloyd updates on the sample, each corrected
    by the sample's bias measured at that pass (a control variate).

    At the full pass's centroids c the table's cluster means are known exactly; the sample's differ by
    Δ = mean_table(c) − mean_sample(c) per cluster (0 where either side is empty). From the pass's own
    Lloyd update, each corrected update moves a centroid to mean_sample + Δ of its cluster (cosine: then
    normalised), so the cheap sample updates keep following the table's Lloyd path instead of falling back
    to the sample's optimum. It pays when the sample holds a few hundred rows per cluster or more (the
    default 131,072 rows: 2,048 per cluster at k = 64); with ~100 per cluster Δ is mostly noise and the
    result is as often above plain Lloyd as below (docs/concepts.md). ``sample_pass``: a pass over the
    (prepared) sample rows; ``iterations`` = 0 is plain Lloyd (the update itself)."""

    def step(table: ClusterState, centroids: np.ndarray, updated: np.ndarray) -> np.ndarray:
        if iterations == 0:
            return updated
        sample = sample_pass(centroids)
        both = (table.counts > 0) & (sample.counts > 0)
        shift = np.zeros_like(table.sums)
        shift[both] = table.sums[both] / table.counts[both, None] - sample.sums[both] / sample.counts[both, None]
        for _ in range(iterations):
            updated = update_centroids(sample_pass(updated).shifted(shift), updated, metric)[0]
        return updated

    return step


def sampled_kmeans(
    sample: KeyedSample,
    partition_count: int,
    refine: Refine,
    k: int,
    metric: str,
    seed: int,
    max_iter: int,
    tol: float,
    init: np.ndarray | None,
    init_steps: int,
    oversampling: float,
    refine_passes: int,
    corrected_iter: int = 0,
) -> KMeansResult:
    """k-means of a whole table from its :class:`KeyedSample` and ``refine(start, r, tol, step)``: r Lloyd passes
    over the whole table from ``start`` (k, d) (:func:`lloyd` with a full-table pass, wherever the table lives).

    * The sample is the whole table (n ≤ sample size): exact k-means|| + Lloyd of its ``partition_count``
      partitions, in this process (what :func:`kmeans` always computed).
    * Otherwise: k-means|| start and up to ``max_iter`` Lloyd updates on the sample in this process (fewer
      when ``tol`` stops them), then r = ``refine_passes`` Lloyd passes over the whole table, so the returned
      centroids, counts and inertia are those of the whole table (``history``: the full passes' inertia).
      Between two full passes, ``corrected_iter`` bias-corrected updates on the sample
      (:func:`sample_corrected_step`; 0: plain Lloyd). ``n_iter`` counts the Lloyd updates on the sample
      before the first full pass plus the full passes (at most ``max_iter`` + r), not the corrected ones.
    """
    if max_iter < 1:
        raise ValueError(f"max_iter must be ≥ 1, got {max_iter}")
    if not 1 <= k <= sample.n:
        raise ValueError(f"k must be between 1 and the number of rows ({sample.n}), got k={k}")
    if sample.n <= sample.size:
        parts = [prepare(p, metric) for p in sample.partitions(partition_count)]
        start = start_centroids(parts, k, metric, seed, init, init_steps, oversampling)
        return lloyd(in_memory_passes(parts, metric, seed)[1], start, metric, max_iter, tol)
    if refine_passes < 1:
        raise ValueError(f"refine_passes must be ≥ 1 when the table exceeds the sample, got {refine_passes}")
    if corrected_iter < 0:
        raise ValueError(f"corrected_iter must be ≥ 0, got {corrected_iter}")
    rows = [prepare(sample.rows, metric)]
    start = start_centroids(rows, k, metric, seed, init, init_steps, oversampling)
    sample_pass = in_memory_passes(rows, metric, seed)[1]
    # one sample pass more than max_iter, so that the last update is not lost
    local = lloyd(sample_pass, start, metric, max_iter + 1, tol)
    step = sample_corrected_step(sample_pass, metric, corrected_iter) if corrected_iter else None
    result = refine(local.centroids, refine_passes, tol, step)
    result.n_iter += local.n_iter - 1
    return result


def kmeans(
    data: np.ndarray | Sequence[np.ndarray],
    k: int,
    metric: str = "euclidean",
    seed: int = 0,
    max_iter: int = DEFAULT_MAX_ITER,
    tol: float = DEFAULT_TOL,
    init: np.ndarray | None = None,
    init_steps: int = DEFAULT_INIT_STEPS,
    oversampling: float = DEFAULT_OVERSAMPLING,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    refine_passes: int = DEFAULT_REFINE_PASSES,
    corrected_iter: int = DEFAULT_CORRECTED_ITER,
) -> KMeansResult:
    """Numpy reference k-means, deterministic given ``seed``: :func:`sampled_kmeans` over in-memory data.

    ``data``: an (n, d) array or a sequence of (n_p, d) partitions — given the partitions of a Spark
    DataFrame, this reproduces ``anisotropy_spark.kmeans.fit_kmeans`` on it. Up to ``sample_size`` rows it
    is exact k-means|| + Lloyd; above, a sample fit finished by ``refine_passes`` full passes with
    ``corrected_iter`` bias-corrected sample updates between two of them. ``init``: optional (k, d)
    starting centroids (skips k-means||; rows are normalised for cosine).
    """
    check_metric(metric)
    parts = [data] if isinstance(data, np.ndarray) else list(data)
    prepared = [prepare(p, metric) for p in parts]
    full_pass = in_memory_passes(prepared, metric, seed)[1]
    return sampled_kmeans(
        sample_partitions(parts, seed, sample_size),
        len(parts),
        lambda start, passes, stop, step: lloyd(full_pass, start, metric, passes, stop, step),
        k,
        metric,
        seed,
        max_iter,
        tol,
        init,
        init_steps,
        oversampling,
        refine_passes,
        corrected_iter,
    )
