"""Synthetic embedding clouds with known geometry, for tests, benches and the demo.

Every generator takes ``n`` (rows), ``d`` (dimension) and a ``seed`` and returns an (n, d) float64 array.
"""

from __future__ import annotations

import numpy as np


def random_rotation(d: int, rng: np.random.Generator) -> np.ndarray:
    """(d, d) Haar-random orthogonal matrix (QR of a Gaussian with the sign fix)."""
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))


def power_law(n: int, d: int, alpha: float, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """Centred Gaussian cloud whose covariance eigenvalues are scale·k^−α in a random basis."""
    rng = np.random.default_rng(seed)
    sd = np.sqrt(scale * np.arange(1, d + 1, dtype=np.float64) ** -alpha)
    return (rng.normal(size=(n, d)) * sd) @ random_rotation(d, rng).T


def cone(n: int, d: int, offset: float, spread: float = 1.0, alpha: float = 0.0, seed: int = 0) -> np.ndarray:
    """A narrow cone: a common mean of length ``offset`` along a random direction plus a cloud of total
    per-dimension scale ``spread`` with power-law shape ``alpha`` (0 = isotropic ball)."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=d)
    direction /= np.linalg.norm(direction)
    return offset * direction + power_law(n, d, alpha, seed=seed + 1, scale=spread**2)


def pencil(n: int, d: int, length: float = 10.0, seed: int = 0) -> np.ndarray:
    """Centred but shaped like a pencil: one direction with ``length``× the spread of the others."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x[:, 0] *= length
    return x @ random_rotation(d, rng).T


def mixture(
    n: int, d: int, proportions: tuple[float, ...], separation: float, spread: float = 1.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian populations whose means lie on random, nearly orthogonal directions about ``separation`` apart.

    Returns ``(vectors (n, d), labels (n,))``; population sizes follow ``proportions``.
    """
    rng = np.random.default_rng(seed)
    sizes = np.floor(np.asarray(proportions) / np.sum(proportions) * n).astype(int)
    sizes[0] += n - sizes.sum()
    centres = rng.normal(size=(len(sizes), d))
    centres *= separation / np.sqrt(2.0) / np.linalg.norm(centres, axis=1, keepdims=True)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    vectors = centres[labels] + spread * rng.normal(size=(n, d))
    order = rng.permutation(n)
    return vectors[order], labels[order]
