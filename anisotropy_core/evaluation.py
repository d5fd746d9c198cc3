"""Retrieval-quality evaluation, pure numpy: exact top-k by cosine, its merge, and the metrics.

The exact top-k of m queries over a corpus too large for one machine is computed as a reduction:
every block of corpus rows gives a partial top-k per query (:func:`block_top_k`, one GEMM), and two partial
lists merge into the top-k of their union (:func:`merge_top_k`). Merging is associative and commutative
(ties are broken by the smaller document id), so any tree of merges over any partition of the corpus gives
the same answer as a brute-force sort of all scores. A partial list is a pair ``(scores (m, k) float64,
ids (m, k) int64)``, best first; unused slots hold score −inf and id :data:`NO_ID`.

Metrics (binary relevance):

* recall@k = |retrieved ∩ relevant| / min(k, |relevant|)  — capped, so 1.0 is reachable when a query has
  more than k relevant documents (for example every other sentence of the same chapter);
* nDCG@k   = Σ_{hits at rank r} 1/log2(r + 1) over the same sum for an ideal ranking of min(k, |relevant|)
  hits;
* Spearman's ρ between two score lists (average ranks for ties), for (id_a, id_b, score) pair tables;
* neighbourhood preservation: the share of a row's raw top-k that stays in its corrected top-k.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

NO_ID = -1
DEFAULT_CELLS = 4_000_000  # scores held at once per block: m × rows ≤ this (32 MB of float64)


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """(n, d) rows scaled to unit length; a zero row raises (its cosine is undefined), naming the row."""
    x = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if not (norms > 0).all():
        raise ValueError(f"row {int(np.argmin(norms[:, 0] > 0))} has zero length: its cosine is undefined")
    return x / norms


def empty_top_k(m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The identity of :func:`merge_top_k` for m queries: scores −inf (m, k), ids NO_ID (m, k)."""
    return np.full((m, k), -np.inf), np.full((m, k), NO_ID, dtype=np.int64)


def _best_k(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best columns per row of (m, c) scores/ids: score descending, then id ascending."""
    order = np.lexsort((ids, -scores), axis=-1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)


def merge_top_k(
    left: tuple[np.ndarray, np.ndarray], right: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of the union of two partial lists (each (scores (m, k), ids (m, k))); k taken from ``left``."""
    k = left[0].shape[1]
    return _best_k(np.concatenate([left[0], right[0]], axis=1), np.concatenate([left[1], right[1]], axis=1), k)


def block_top_k(
    unit_queries: np.ndarray,
    docs: np.ndarray,
    doc_ids: np.ndarray,
    k: int,
    query_ids: np.ndarray | None = None,
    max_cells: int = DEFAULT_CELLS,
) -> tuple[np.ndarray, np.ndarray]:
    """Partial top-k by cosine of ``unit_queries`` (m, d) (unit rows) over one block ``docs`` (B, d).

    ``doc_ids``: (B,) int64. ``query_ids``: (m,) int64 or None; when given, a document whose id equals the
    query's id is never retrieved (a corpus row used as its own query). The block is scored in slices of at
    most ``max_cells // m`` rows, one GEMM each, so memory is O(m·k + max_cells) whatever B is.
    Returns (scores (m, k), ids (m, k)), best first.
    """
    m = unit_queries.shape[0]
    best = empty_top_k(m, k)
    step = max(1, max_cells // max(m, 1))
    ids = np.asarray(doc_ids, dtype=np.int64)
    for start in range(0, docs.shape[0], step):
        chunk_ids = ids[start : start + step]
        scores = unit_queries @ unit_rows(docs[start : start + step]).T  # (m, slice)
        if query_ids is not None:
            scores[np.asarray(query_ids)[:, None] == chunk_ids[None, :]] = -np.inf
        width = min(k, scores.shape[1])
        part = (
            np.argpartition(-scores, width - 1, axis=1)[:, :width]
            if width < scores.shape[1]
            else np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
        )
        picked = np.take_along_axis(scores, part, axis=1)
        best = merge_top_k(best, (picked, chunk_ids[part]))
    return best


def per_query_recall(retrieved: np.ndarray, relevant: Sequence[np.ndarray]) -> np.ndarray:
    """(m,) |top-k ∩ relevant| / min(k, |relevant|) per query. ``retrieved``: (m, k) ids, best first;
    ``relevant``: m arrays of relevant ids (each non-empty)."""
    k = retrieved.shape[1]
    hits = _hits(retrieved, relevant)
    return np.array([row.sum() / min(k, len(rel)) for row, rel in zip(hits, relevant)], dtype=np.float64)


def per_query_ndcg(retrieved: np.ndarray, relevant: Sequence[np.ndarray]) -> np.ndarray:
    """(m,) binary-relevance nDCG@k per query (see the module docstring)."""
    k = retrieved.shape[1]
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    hits = _hits(retrieved, relevant)
    return np.array(
        [(row * discount).sum() / discount[: min(k, len(rel))].sum() for row, rel in zip(hits, relevant)],
        dtype=np.float64,
    )


def recall_at_k(retrieved: np.ndarray, relevant: Sequence[np.ndarray]) -> float:
    """Mean over queries of :func:`per_query_recall`."""
    return float(np.mean(per_query_recall(retrieved, relevant)))


def ndcg_at_k(retrieved: np.ndarray, relevant: Sequence[np.ndarray]) -> float:
    """Mean over queries of :func:`per_query_ndcg`."""
    return float(np.mean(per_query_ndcg(retrieved, relevant)))


def neighbour_overlap(raw: np.ndarray, corrected: np.ndarray) -> np.ndarray:
    """(m,) |raw top-k ∩ corrected top-k| / k per query row, for (m, k) id lists (unused slots, id
    :data:`NO_ID`, never count as shared)."""
    if raw.shape != corrected.shape:
        raise ValueError(f"top-k lists of shapes {raw.shape} and {corrected.shape} cannot be compared")
    shared = [np.intersect1d(a[a != NO_ID], b[b != NO_ID]).shape[0] for a, b in zip(raw, corrected)]
    return np.asarray(shared, dtype=np.float64) / raw.shape[1]


def _hits(retrieved: np.ndarray, relevant: Sequence[np.ndarray]) -> np.ndarray:
    if len(relevant) != retrieved.shape[0]:
        raise ValueError(f"{retrieved.shape[0]} retrieved lists for {len(relevant)} relevance lists")
    empty = [i for i, rel in enumerate(relevant) if len(rel) == 0]
    if empty:
        raise ValueError(f"query row {empty[0]} has no relevant id: recall and nDCG are undefined for it")
    return np.stack([np.isin(row, rel) for row, rel in zip(retrieved, relevant)]).astype(np.float64)


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of (n,) ``values``, ties sharing their average rank."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.shape[0])
    ranks[order] = np.arange(1, x.shape[0] + 1)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation of two (n,) score lists (Pearson of average ranks); needs n ≥ 2 and
    neither list constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    if rx.shape != ry.shape or rx.shape[0] < 2 or rx.std() == 0 or ry.std() == 0:
        raise ValueError("Spearman needs two equally long lists of at least 2 values, neither constant")
    return float(np.corrcoef(rx, ry)[0, 1])


def retrieval_metrics(retrieved: np.ndarray, relevant: Sequence[np.ndarray]) -> dict[str, float]:
    """``{"recall@k": …, "ndcg@k": …}`` (means over queries) for (m, k) retrieved ids."""
    return {name: float(values.mean()) for name, values in per_query_metrics(retrieved, relevant).items()}


def per_query_metrics(retrieved: np.ndarray, relevant: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """``{"recall@k": (m,), "ndcg@k": (m,)}`` per-query values for (m, k) retrieved ids."""
    k = retrieved.shape[1]
    return {f"recall@{k}": per_query_recall(retrieved, relevant), f"ndcg@{k}": per_query_ndcg(retrieved, relevant)}
