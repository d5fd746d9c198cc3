"""Mergeable first- and second-moment state of an embedding cloud (seed chapter 1, "one streaming pass").

The state never holds the vectors. It keeps, in float64:

* ``n``          — number of vectors seen,
* ``sum_unit``   — (d,) sum of the unit-normalised vectors (gives the offset ‖μ̂‖ and A exactly),
* ``sum_norm``   — sum of the vector lengths ‖v‖ (gives the mean length, for ‖μ‖ / mean‖v‖),
* ``mean``       — (d,) running mean μ of the raw vectors,
* ``comoment``   — (d, d) *centred* co-moment Σ (v−μ)(v−μ)ᵀ.

Two states are merged with the pairwise update of Chan, Golub & LeVeque (1979):
``M = M_a + M_b + δδᵀ · n_a n_b / n`` with ``δ = μ_b − μ_a``. Unlike the textbook sketch's
``gram/n − μμᵀ``, this never subtracts two huge nearly-equal numbers, so the covariance stays exact
when ‖μ‖ is many orders of magnitude larger than the spread (offset ratio ≈ 0.99 in real embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class InvalidVectorsError(ValueError):
    """Raised when vectors have no defined geometry: NaN/Inf or zero-length rows in a batch, fewer than 2 valid
    vectors, or all of them identical (zero spread)."""


@dataclass
class Moments:
    """Centred moment state of ``n`` d-dimensional vectors; see module docstring for fields."""

    n: int
    sum_unit: np.ndarray  # (d,)
    sum_norm: float
    mean: np.ndarray  # (d,)
    comoment: np.ndarray  # (d, d)

    @property
    def d(self) -> int:
        return int(self.mean.shape[0])

    @classmethod
    def empty(cls, d: int) -> "Moments":
        """The identity element of :meth:`merge` for dimension ``d``."""
        return cls(0, np.zeros(d), 0.0, np.zeros(d), np.zeros((d, d)))

    @classmethod
    def of_batch(cls, vectors: np.ndarray) -> "Moments":
        """Exact moments of one batch ``vectors`` (B, d); any float dtype, accumulated in float64.

        Raises :class:`InvalidVectorsError` (naming the batch row) on NaN/Inf or zero-length rows,
        because unit normalisation and the covariance are undefined for them, and on a row whose squared
        length overflows float64 (a float64 input with elements beyond ≈ 1e154), whose covariance would be Inf.

        One float64 copy of the batch is the only batch-sized array: the squared lengths come from ``einsum``
        (no (B, d) temporary), the unit-vector sum is one matrix-vector product, and the copy is centred in
        place before the Gram product (which numpy runs as a symmetric rank-k update). The textbook form holds
        four (B, d) temporaries instead of one and gives the same co-moment bit for bit (timings:
        bench/RESULTS.md).
        """
        x = np.array(vectors, dtype=np.float64)  # a private copy: it is centred in place below
        if x.ndim != 2:
            raise ValueError(f"expected a (B, d) matrix, got shape {x.shape}")
        batch, d = x.shape
        if batch == 0:
            return cls.empty(d)
        squared_norms = np.einsum("ij,ij->i", x, x)
        if not np.isfinite(squared_norms).all():
            finite = np.isfinite(x).all(axis=1)
            if not finite.all():
                raise InvalidVectorsError(f"non-finite value in batch row {int(np.argmin(finite))}")
            row = int(np.argmin(np.isfinite(squared_norms)))
            raise InvalidVectorsError(f"squared length overflows float64 in batch row {row}")
        if not (squared_norms > 0).all():
            raise InvalidVectorsError(f"zero-length vector in batch row {int(np.argmin(squared_norms > 0))}")
        norms = np.sqrt(squared_norms)
        sum_unit = (1.0 / norms) @ x
        mean = x.mean(axis=0)
        x -= mean
        return cls(n=batch, sum_unit=sum_unit, sum_norm=float(norms.sum()), mean=mean, comoment=x.T @ x)

    def merge(self, other: "Moments") -> "Moments":
        """Chan et al. pairwise combination; associative and commutative up to rounding."""
        if self.d != other.d:
            raise ValueError(f"cannot merge moments of dimension {self.d} and {other.d}")
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        delta = other.mean - self.mean
        return Moments(
            n=n,
            sum_unit=self.sum_unit + other.sum_unit,
            sum_norm=self.sum_norm + other.sum_norm,
            mean=self.mean + delta * (other.n / n),
            comoment=self.comoment + other.comoment + np.outer(delta, delta) * (self.n * other.n / n),
        )

    def remove(self, part: "Moments") -> "Moments":
        """The state of the vectors that remain when the vectors of ``part`` (a sub-state of this one) are taken
        out: the exact inverse of :meth:`merge`. With n_b = n − n_a, μ_b = μ + (μ − μ_a)·n_a/n_b and
        δ = μ_b − μ_a, the co-moment is M_b = M − M_a − δδᵀ·n_a n_b / n. Raises when ``part`` holds as many
        vectors as this state or more (nothing would remain) or has another dimension."""
        if self.d != part.d:
            raise ValueError(f"cannot remove moments of dimension {part.d} from dimension {self.d}")
        if part.n == 0:
            return self
        if part.n >= self.n:
            raise ValueError(f"cannot remove {part.n} vectors from a state of {self.n}: nothing would remain")
        rest = self.n - part.n
        mean = self.mean + (self.mean - part.mean) * (part.n / rest)
        delta = mean - part.mean
        comoment = self.comoment - part.comoment - np.outer(delta, delta) * (part.n * rest / self.n)
        return Moments(
            n=rest,
            sum_unit=self.sum_unit - part.sum_unit,
            sum_norm=self.sum_norm - part.sum_norm,
            mean=mean,
            comoment=(comoment + comoment.T) / 2,
        )

    def covariance(self) -> np.ndarray:
        """(d, d) population covariance Σ = comoment / n (the seed's 1/n convention)."""
        self._require_data()
        return self.comoment / self.n

    def second_moment(self) -> np.ndarray:
        """(d, d) uncentred second moment S = Σ + μμᵀ (seed chapter 1)."""
        return self.covariance() + np.outer(self.mean, self.mean)

    def mean_unit(self) -> np.ndarray:
        """(d,) mean of the unit-normalised vectors, μ̂."""
        self._require_data()
        return self.sum_unit / self.n

    def mean_norm(self) -> float:
        """Average vector length, mean ‖v‖."""
        self._require_data()
        return self.sum_norm / self.n

    def _require_data(self) -> None:
        if self.n == 0:
            raise ValueError("no vectors: the moments of an empty corpus are undefined")

    # --- wire format: a flat float64 buffer, so Spark can ship a state as one binary cell ---

    def to_bytes(self) -> bytes:
        """Serialise as float64 ``[d, n, sum_norm, sum_unit…, mean…, comoment…]`` (no pickle)."""
        head = np.array([self.d, self.n, self.sum_norm], dtype=np.float64)
        return np.concatenate([head, self.sum_unit, self.mean, self.comoment.ravel()]).tobytes()

    @classmethod
    def from_bytes(cls, payload: bytes) -> "Moments":
        flat = np.frombuffer(payload, dtype=np.float64)
        d, n = int(flat[0]), int(flat[1])
        body = flat[3:]
        if body.shape[0] != 2 * d + d * d:
            raise ValueError(f"corrupt moments payload: {body.shape[0]} values for d={d}")
        return cls(
            n=n,
            sum_unit=body[:d].copy(),
            sum_norm=float(flat[2]),
            mean=body[d : 2 * d].copy(),
            comoment=body[2 * d :].reshape(d, d).copy(),
        )
