"""The norm-outlier rule: a row whose length is more than ``max_norm_ratio`` × the median length of the valid rows
is invalid (reason ``norm_outlier``), so that a few vectors of a broken writer (elements of 1e39 among lengths of
order 1) cannot take over the second moment and collapse the fit onto their direction.

The median comes from :class:`LengthSketch`, a fixed log-spaced histogram of the valid rows' lengths gathered in
the moments pass and merged like the moments (exactly: bin counts add, so the result does not depend on the order of
the merge). :data:`BINS_PER_DECADE` bins per factor of 10 over [1e-30, 1e40] (lengths outside fall into the end
bins; the exact maximum is kept beside them). The median is reported as the geometric centre of the bin holding
it, so it is within a factor 10^(1/(2·BINS_PER_DECADE)) of the exact (lower) median: 0.9 % at 128 bins per
decade. At the default ratio of 1e3 that error moves the threshold by under 1 %.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BINS_PER_DECADE = 128
LOW_DECADE, HIGH_DECADE = -30, 40
BINS = (HIGH_DECADE - LOW_DECADE) * BINS_PER_DECADE
DEFAULT_MAX_NORM_RATIO = 1e3
MEDIAN_ERROR = 10 ** (1 / (2 * BINS_PER_DECADE)) - 1  # relative bound of the median's error (module docstring)


@dataclass
class LengthSketch:
    """Counts of row lengths per log-spaced bin (``counts``, (:data:`BINS`,) int64) and the largest length seen
    (``maximum``, 0.0 when empty). Mergeable: :meth:`merge` adds counts and keeps the larger maximum."""

    counts: np.ndarray
    maximum: float = 0.0

    @classmethod
    def empty(cls) -> "LengthSketch":
        return cls(np.zeros(BINS, np.int64))

    @classmethod
    def of(cls, lengths: np.ndarray) -> "LengthSketch":
        """The sketch of ``lengths`` (n,), finite and > 0 (the contract's valid rows)."""
        lengths = np.asarray(lengths, np.float64)
        if not lengths.size:
            return cls.empty()
        index = np.floor((np.log10(lengths) - LOW_DECADE) * BINS_PER_DECADE).astype(np.int64)
        counts = np.bincount(np.clip(index, 0, BINS - 1), minlength=BINS).astype(np.int64)
        return cls(counts, float(lengths.max()))

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def merge(self, other: "LengthSketch") -> "LengthSketch":
        return LengthSketch(self.counts + other.counts, max(self.maximum, other.maximum))

    def median(self) -> float | None:
        """The (lower) median length, within :data:`MEDIAN_ERROR` relative; None when empty."""
        n = self.n
        if not n:
            return None
        k = int(np.searchsorted(np.cumsum(self.counts), (n + 1) // 2))
        return float(10 ** (LOW_DECADE + (k + 0.5) / BINS_PER_DECADE))

    def to_bytes(self) -> bytes:
        """The maximum, then the non-empty bins only (index, count): a few hundred bytes for one corpus."""
        used = np.flatnonzero(self.counts)
        return (
            np.float64(self.maximum).astype("<f8").tobytes()
            + used.astype("<i8").tobytes()
            + self.counts[used].astype("<i8").tobytes()
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> "LengthSketch":
        pairs = np.frombuffer(data[8:], "<i8").reshape(2, -1)
        counts = np.zeros(BINS, np.int64)
        counts[pairs[0]] = pairs[1]
        return cls(counts, float(np.frombuffer(data[:8], "<f8")[0]))


def max_norm(median: float | None, ratio: float | None) -> float | None:
    """The length above which a row is a norm outlier: ``ratio`` × ``median``; None (the rule off) when ``ratio``
    is None or 0, or when no median is known."""
    if not ratio or median is None:
        return None
    return float(ratio) * float(median)
