"""Contextual (layer-wise) measures of seed chapter 4, from group-wise sums of unit vectors.

Every measure here is an average pairwise cosine over a *population* of vectors, so Chapter 1's identity
A = (n‖μ̂‖² − 1)/(n − 1) computes it from one count and one (d,) sum of unit vectors per group:

* **anisotropy baseline** of a layer — population: every token vector of that layer;
* **self-similarity** SelfSim_ℓ(w) — population: the occurrences of word w at layer ℓ;
* **adjusted** self-similarity / intra-sentence similarity — the raw value minus the layer's baseline
  (the correction reorders words across layers, it is not a rescaling);
* **intra-sentence similarity** — mean cosine of each token of a sentence to the sentence vector
  s̄ = mean of the raw token vectors: IntraSim = (Σ_i v̂_i)·s̄ / (n‖s̄‖), so it needs the per-group sum of
  raw vectors as well;
* **MEV** (maximum explainable variance) of a word — the top-1 share of the *centred* covariance
  spectrum of its m occurrences, reported beside its uniform floor 1/(m − 1) (the centred occurrence
  matrix has rank ≤ m − 1), because MEV of 12 % means nothing at m = 10 and a great deal at m = 1000.

:class:`GroupSums` is the mergeable per-group state (Spark's partial sums); the pure-numpy
:func:`contextual_report` is the reference the distributed version is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np

from .diagnostics import anisotropy_from_offset, plain_scalar
from .moments import Moments

# a total occurrence variance below this fraction of ‖mean‖² is rounding noise of identical vectors
# (float64 rounding leaves ~1e-32·‖mean‖²); real spread in embeddings is many orders of magnitude above
IDENTICAL_TOLERANCE = 1e-20


@dataclass
class GroupSums:
    """Mergeable state of one group: ``n`` vectors, ``sum_unit`` (d,) Σ v̂, ``sum_raw`` (d,) Σ v."""

    n: int
    sum_unit: np.ndarray
    sum_raw: np.ndarray

    @classmethod
    def of_batch(cls, vectors: np.ndarray) -> "GroupSums":
        """State of a (B, d) batch of nonzero vectors (float64 accumulation)."""
        x = np.asarray(vectors, dtype=np.float64)
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        if not (norms > 0).all():
            raise ValueError("zero-length vector: its direction (and every cosine with it) is undefined")
        return cls(int(x.shape[0]), (x / norms).sum(axis=0), x.sum(axis=0))

    def merge(self, other: "GroupSums") -> "GroupSums":
        """Sum of two states of the same group (associative, commutative)."""
        return GroupSums(self.n + other.n, self.sum_unit + other.sum_unit, self.sum_raw + other.sum_raw)

    def average_cosine(self) -> float:
        """Average pairwise cosine of the group, (n‖μ̂‖² − 1)/(n − 1); needs n ≥ 2."""
        return anisotropy_from_offset(self.n, float(np.linalg.norm(self.sum_unit / self.n)))

    def mean_cosine_to_centroid(self) -> float:
        """(1/n) Σ_i cos(v_i, s̄) with s̄ the mean raw vector (Ethayarajh's intra-sentence similarity)."""
        centroid_norm = float(np.linalg.norm(self.sum_raw))
        if centroid_norm == 0:
            raise ValueError("the group's vectors sum to zero: the centroid has no direction")
        return float(self.sum_unit @ self.sum_raw / (self.n * centroid_norm))

    def to_array(self) -> np.ndarray:
        """Flat float64 wire format ``[n, sum_unit…, sum_raw…]`` of length 2d + 1."""
        return np.concatenate([[float(self.n)], self.sum_unit, self.sum_raw])

    @classmethod
    def from_array(cls, flat: np.ndarray) -> "GroupSums":
        flat = np.asarray(flat, dtype=np.float64)
        d = (flat.shape[0] - 1) // 2
        return cls(int(flat[0]), flat[1:1 + d].copy(), flat[1 + d:].copy())


def group_sums(vectors: np.ndarray, keys: Sequence[Hashable]) -> dict[Hashable, GroupSums]:
    """Group the rows of ``vectors`` (n, d) by ``keys`` (n,) → {key: GroupSums}, vectorised per group."""
    x = np.asarray(vectors, dtype=np.float64)
    codes, uniques = _factorize(keys)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if not (norms > 0).all():
        raise ValueError("zero-length vector: its direction (and every cosine with it) is undefined")
    k = len(uniques)
    counts = np.bincount(codes, minlength=k)
    sum_unit = np.zeros((k, x.shape[1]))
    sum_raw = np.zeros((k, x.shape[1]))
    np.add.at(sum_unit, codes, x / norms)
    np.add.at(sum_raw, codes, x)
    return {uniques[g]: GroupSums(int(counts[g]), sum_unit[g], sum_raw[g]) for g in range(k)}


def group_moments(vectors: np.ndarray, keys: Sequence[Hashable],
                  only: Iterable[Hashable] | None = None) -> dict[Hashable, Moments]:
    """Centred moments (for MEV) of each group of ``vectors`` (n, d); ``only`` restricts the groups."""
    x = np.asarray(vectors, dtype=np.float64)
    codes, uniques = _factorize(keys)
    wanted = None if only is None else set(only)
    return {key: Moments.of_batch(x[codes == g]) for g, key in enumerate(uniques)
            if wanted is None or key in wanted}


def _factorize(keys: Sequence[Hashable]) -> tuple[np.ndarray, list]:
    """(codes (n,), unique keys in first-seen order) for any hashable keys, tuples included."""
    index: dict[Hashable, int] = {}
    codes = np.fromiter((index.setdefault(k, len(index)) for k in keys), dtype=np.int64)
    return codes, list(index)


def self_similarity(n: int, sum_unit: np.ndarray) -> float:
    """SelfSim = (n‖μ̂‖² − 1)/(n − 1) of n occurrences whose unit vectors sum to ``sum_unit`` (d,)."""
    return anisotropy_from_offset(n, float(np.linalg.norm(np.asarray(sum_unit) / n)))


def mev(state: Moments) -> dict:
    """Maximum explainable variance of one word from its occurrences' centred moments.

    Returns ``{"m", "mev", "mev_floor", "mev_over_floor"}``: top-1 share of the centred covariance
    spectrum, its uniform floor 1/(m − 1) (rank of the centred m × d occurrence matrix ≤ m − 1, and ≤ d),
    and their ratio (1 = no dominant direction beyond what uniform spread gives). When every occurrence is
    the same vector (e.g. [CLS] at the input layer, always at position 0) there is no variance to explain:
    ``mev`` and ``mev_over_floor`` are None (total variance ≤ ``IDENTICAL_TOLERANCE``·‖mean‖²).
    """
    m = state.n
    if m < 2:
        raise ValueError(f"MEV needs at least 2 occurrences, got m={m}")
    lam = np.linalg.eigvalsh(state.covariance())
    total = lam.sum()
    floor = 1.0 / min(m - 1, state.d)
    if total <= IDENTICAL_TOLERANCE * float(state.mean @ state.mean):
        return {"m": int(m), "mev": None, "mev_floor": floor, "mev_over_floor": None}
    share = float(lam[-1] / total)
    return {"m": int(m), "mev": share, "mev_floor": floor, "mev_over_floor": share / floor}


def adjust(raw: Mapping[Hashable, float], baselines: Mapping[Hashable, float],
           layer_of: Mapping[Hashable, Hashable]) -> dict[Hashable, float]:
    """Baseline-adjusted values: raw[key] − baselines[layer_of[key]] for every key of ``raw``."""
    return {key: value - baselines[layer_of[key]] for key, value in raw.items()}


def ranking(values: Mapping[Hashable, float]) -> list[Hashable]:
    """Keys ordered from the highest value to the lowest (ties keep insertion order)."""
    return sorted(values, key=lambda k: -values[k])


def contextual_measures(layer_sums: Mapping[Hashable, GroupSums],
                        word_sums: Mapping[tuple, GroupSums],
                        sentence_sums: Mapping[tuple, GroupSums],
                        word_moments: Mapping[tuple, Moments] | None = None) -> dict:
    """Assemble the chapter-4 report from group states.

    ``layer_sums``: {layer: GroupSums}; ``word_sums``: {(layer, word): GroupSums};
    ``sentence_sums``: {(layer, sentence): GroupSums}; ``word_moments``: {(layer, word): Moments} for MEV.
    Groups with fewer than 2 vectors have no pairwise cosine and are left out.

    Returns ``{"layers": [{"layer", "n", "baseline"}...], "words": [{"layer", "word", "n", "self_sim",
    "adjusted_self_sim", ("mev", "mev_floor", "mev_over_floor")}...], "sentences": [{"layer", "sentence",
    "n", "intra_sim", "adjusted_intra_sim"}...]}`` sorted by layer then key.
    """
    baselines = {layer: s.average_cosine() for layer, s in layer_sums.items() if s.n >= 2}
    layers = [{"layer": plain_scalar(layer), "n": layer_sums[layer].n, "baseline": baselines[layer]}
              for layer in sorted(baselines)]
    words = []
    for (layer, word), s in sorted(word_sums.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        if s.n < 2 or layer not in baselines:
            continue
        row = {"layer": plain_scalar(layer), "word": plain_scalar(word), "n": s.n, "self_sim": s.average_cosine()}
        row["adjusted_self_sim"] = row["self_sim"] - baselines[layer]
        if word_moments and (layer, word) in word_moments:
            row.update({k: v for k, v in mev(word_moments[(layer, word)]).items() if k != "m"})
        words.append(row)
    sentences = []
    for (layer, sentence), s in sorted(sentence_sums.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        if s.n < 2 or layer not in baselines:
            continue
        intra = s.mean_cosine_to_centroid()
        sentences.append({"layer": plain_scalar(layer), "sentence": plain_scalar(sentence), "n": s.n,
                          "intra_sim": intra, "adjusted_intra_sim": intra - baselines[layer]})
    return {"layers": layers, "words": words, "sentences": sentences}


def contextual_report(vectors: np.ndarray, layers: Sequence, words: Sequence, sentences: Sequence,
                      mev_min_occurrences: int = 2) -> dict:
    """In-memory reference of the chapter-4 report for token vectors (n, d) with per-row layer, word and
    sentence keys (each (n,)). MEV is computed for (layer, word) groups with ≥ ``mev_min_occurrences``.
    Same output as :func:`contextual_measures`.
    """
    layer_keys = list(layers)
    word_keys = list(zip(layer_keys, words))
    sentence_keys = list(zip(layer_keys, sentences))
    word_sums = group_sums(vectors, word_keys)
    eligible = [k for k, s in word_sums.items() if s.n >= max(2, mev_min_occurrences)]
    return contextual_measures(group_sums(vectors, layer_keys), word_sums,
                               group_sums(vectors, sentence_keys),
                               group_moments(vectors, word_keys, only=eligible))
