"""Honest splits and paired bootstrap intervals for the candidate evaluation. Plain numpy only, seeded.

* **Splits by hash.** A query (or pair) goes to a fold and to the selection or the report half by a hash of
  its id (:func:`id_hash`), so the same id always lands in the same place, whatever the table's order.
* **Paired bootstrap.** Every candidate is scored on the same queries, so the difference to a baseline is
  resampled *paired*: one resample draws m query indices with replacement and every candidate's mean is taken
  over those same queries (:func:`mean_draws`); for pairs the statistic is Spearman's ρ of the resampled pairs
  (:func:`spearman_draws`). :func:`interval` turns the draws of a difference into ``{"mean", "low", "high"}``:
  the observed difference and the percentile interval.
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence, Union

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
Ids = Union[Sequence[Any], np.ndarray]  # (m,) query or pair ids: a list, or an array of any dtype


def id_hash(ids: Ids, salt: int = 0) -> np.ndarray:
    """(m,) uint64 splitmix64 hash of ``ids`` (integers; anything else is hashed by CRC-32 of its text first),
    mixed with ``salt``."""
    values = np.asarray(ids)
    if values.dtype.kind not in "iu":
        values = np.array([zlib.crc32(str(v).encode()) for v in ids], dtype=np.int64)
    with np.errstate(over="ignore"):
        z = values.astype(np.int64).view(np.uint64) + _GOLDEN * np.uint64(salt + 1)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def folds_of(ids: Ids, folds: int, seed: int = 0) -> np.ndarray:
    """(m,) fold number in 0..folds−1 of each id."""
    if folds < 1:
        raise ValueError(f"folds must be >= 1, got {folds}")
    return (id_hash(ids, 2 * seed) % np.uint64(folds)).astype(np.int64)


def selection_half(ids: Ids, seed: int = 0) -> np.ndarray:
    """(m,) bool: True for the ids of the selection half, False for the report half (a hash bit independent
    of :func:`folds_of`)."""
    return (id_hash(ids, 2 * seed + 1) >> np.uint64(63)).astype(bool)


def resample_indices(m: int, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples, m) indices drawn with replacement, the same for every candidate (the pairing)."""
    if m < 1:
        raise ValueError("the bootstrap needs at least one query or pair")
    return np.random.default_rng(seed).integers(0, m, size=(resamples, m))


def mean_draws(values: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """(resamples, C) mean of each candidate's per-query ``values`` (C, m) over each resample of ``indices``
    (resamples, m): the weights of each query are its counts in the resample."""
    m = values.shape[1]
    counts = np.stack([np.bincount(row, minlength=m) for row in indices]).astype(np.float64)
    return counts @ values.T / m


def rank_rows(x: np.ndarray) -> np.ndarray:
    """1-based average ranks (ties share their mean rank) of every row of (B, p) ``x``."""
    b, p = x.shape
    order = np.argsort(x, axis=1, kind="stable")
    ordered = np.take_along_axis(x, order, axis=1)
    starts = np.concatenate([np.ones((b, 1), dtype=bool), ordered[:, 1:] != ordered[:, :-1]], axis=1)
    group = np.cumsum(starts, axis=1) - 1 + (np.arange(b) * p)[:, None]
    position = np.broadcast_to(np.arange(1, p + 1, dtype=np.float64), (b, p))
    sums, counts = np.bincount(group.ravel(), weights=position.ravel()), np.bincount(group.ravel())
    average = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)  # (unused ids between rows: 0)
    ranks = np.empty((b, p))
    np.put_along_axis(ranks, order, average[group], axis=1)
    return ranks


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(B,) Spearman's ρ of each row of (B, p) ``x`` with the same row of ``y`` (NaN where a row is constant)."""
    rx, ry = rank_rows(x), rank_rows(y)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(axis=1) / np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))


def spearman_draws(cosines: np.ndarray, gold: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """(resamples, C) Spearman's ρ of each candidate's pair cosines (C, p) with the ``gold`` (p,) scores over
    each resample of pair ``indices`` (resamples, p)."""
    gold_draws = gold[indices]
    return np.stack([spearman_rows(row[indices], gold_draws) for row in cosines], axis=1)


def interval(observed: float, draws: np.ndarray, confidence: float = DEFAULT_CONFIDENCE) -> dict[str, float]:
    """``{"mean": observed, "low", "high"}``: the observed statistic and the percentile interval of its
    (resamples,) bootstrap ``draws`` (NaN draws — a constant resample — left out)."""
    finite = draws[np.isfinite(draws)]
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(finite, [tail, 100 - tail]) if finite.size else (np.nan, np.nan)
    return {"mean": float(observed), "low": float(low), "high": float(high)}
