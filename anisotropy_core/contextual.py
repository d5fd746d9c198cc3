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
  From occurrence rows with m < d it takes the m × m Gram route (seed ch. 6), never a d × d matrix.
* **static vector** of a word — the first principal component of its occurrences, oriented toward the
  occurrences' mean (the seed's ``sign((X @ u1).sum())`` on *centred* X is a sum of centred projections,
  i.e. 0 up to rounding, so its sign is noise); same moments as MEV.
* **mean-pooling amplification** per layer — from the sentence sums alone: pooled vectors p_s = Σ v / m_s,
  the fit E‖p‖² = C² + G²/m of the shared (C) and idiosyncratic (G) parts (model h = c + g, seed ch. 4), the
  predicted pooled baseline C²/(C² + G²/m) against the measured one, and |corr(u1 of the pooled vectors,
  token count)| — its fingerprint; plus which layer to pool from.

:class:`GroupSums` is the mergeable per-group state (Spark's partial sums); the pure-numpy
:func:`contextual_report` is the reference the distributed version is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence, TypeVar

import numpy as np

from .diagnostics import anisotropy_from_offset, plain_scalar
from .moments import Moments
from .transforms import FitData, principal

# a total occurrence variance below this fraction of ‖mean‖² is rounding noise of identical vectors
# (float64 rounding leaves ~1e-32·‖mean‖²); real spread in embeddings is many orders of magnitude above
IDENTICAL_TOLERANCE = 1e-20

Key = TypeVar("Key", bound=Hashable)  # a group key: a layer, or a (layer, word) / (layer, sentence) pair


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
        return cls(int(flat[0]), flat[1 : 1 + d].copy(), flat[1 + d :].copy())


def group_sums(vectors: np.ndarray, keys: Sequence[Key]) -> dict[Key, GroupSums]:
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


def group_rows(vectors: np.ndarray, keys: Sequence[Key], only: Iterable[Key] | None = None) -> dict[Key, np.ndarray]:
    """The rows (m, d) of each group of ``vectors`` (n, d) (for MEV and static vectors); ``only`` restricts
    the groups."""
    x = np.asarray(vectors, dtype=np.float64)
    codes, uniques = _factorize(keys)
    wanted = None if only is None else set(only)
    return {key: x[codes == g] for g, key in enumerate(uniques) if wanted is None or key in wanted}


def _factorize(keys: Sequence[Key]) -> tuple[np.ndarray, list[Key]]:
    """(codes (n,), unique keys in first-seen order) for any hashable keys, tuples included."""
    index: dict[Key, int] = {}
    codes = np.fromiter((index.setdefault(k, len(index)) for k in keys), dtype=np.int64)
    return codes, list(index)


def self_similarity(n: int, sum_unit: np.ndarray) -> float:
    """SelfSim = (n‖μ̂‖² − 1)/(n − 1) of n occurrences whose unit vectors sum to ``sum_unit`` (d,)."""
    return anisotropy_from_offset(n, float(np.linalg.norm(np.asarray(sum_unit) / n)))


def mev(occurrences: FitData) -> dict:
    """Maximum explainable variance of one word from its occurrences: a centred :class:`Moments` state or the
    occurrence rows (m, d) (m < d: the Gram route).

    Returns ``{"m", "mev", "mev_floor", "mev_over_floor"}``: top-1 share of the centred covariance
    spectrum, its uniform floor 1/(m − 1) (rank of the centred m × d occurrence matrix ≤ m − 1, and ≤ d),
    and their ratio (1 = no dominant direction beyond what uniform spread gives). When every occurrence is
    the same vector (e.g. [CLS] at the input layer, always at position 0) there is no variance to explain:
    ``mev`` and ``mev_over_floor`` are None (total variance ≤ ``IDENTICAL_TOLERANCE``·‖mean‖²).
    """
    m = occurrences.n if isinstance(occurrences, Moments) else int(np.shape(occurrences)[0])
    if m < 2:
        raise ValueError(f"MEV needs at least 2 occurrences, got m={m}")
    p = principal(occurrences, require_spread=False)
    total = p.eigenvalues.sum()
    floor = 1.0 / min(m - 1, p.d)
    if total <= IDENTICAL_TOLERANCE * float(p.mean @ p.mean):
        return {"m": int(m), "mev": None, "mev_floor": floor, "mev_over_floor": None}
    share = float(p.eigenvalues[0] / total)
    return {"m": int(m), "mev": share, "mev_floor": floor, "mev_over_floor": share / floor}


def static_vector(occurrences: FitData) -> np.ndarray | None:
    """A word's static embedding (seed ch. 4): the unit first principal component u1 (d,) of its occurrences
    (moments or rows), oriented so that u1·mean ≥ 0 — toward where the occurrences actually are. None when
    the occurrences have no spread (no principal direction). When u1 ⟂ mean (a word whose occurrences
    straddle the origin) the sign stays the canonical one (largest-magnitude entry positive).
    """
    p = principal(occurrences, require_spread=False)
    if p.eigenvalues.sum() <= IDENTICAL_TOLERANCE * float(p.mean @ p.mean) or not p.vectors.shape[1]:
        return None
    u1 = p.vectors[:, 0]
    return -u1 if u1 @ p.mean < 0 else u1


def pooled_anisotropy(ratio: float, tokens: float) -> float:
    """Baseline cosine of mean-pooled vectors of ``tokens`` tokens each, h = c + g with G/C = ``ratio``:
    C² / (C² + G²/m) = 1 / (1 + ratio²/m) (seed ch. 4; the shared part survives pooling, the rest shrinks as
    1/√m)."""
    return 1.0 / (1.0 + ratio**2 / tokens)


def pooling_report(sentence_sums: Mapping[tuple, GroupSums], baselines: Mapping[Hashable, float]) -> dict:
    """Mean-pooling amplification per layer from the ``{(layer, sentence): GroupSums}`` states.

    Per layer with ≥ 3 sentences: ``sentences``, ``token_baseline`` (the layer's A), ``pooled_A`` (measured
    average cosine of the pooled sentence vectors), ``shared_over_idiosyncratic`` G/C from the least-squares
    fit ‖p_s‖² = C² + G²/m_s (None when all sentences have one length or the fit is not positive),
    ``predicted_pooled_A`` at the median length, ``median_tokens`` and ``u1_token_count_corr`` (|corr| of the
    unit pooled vectors' first-PC projection with m_s — long sentences sit closer to the shared direction;
    None for a constant length). ``recommended_layer``: the
    lowest ``pooled_A`` above the input (lowest) layer — which is non-contextual — with the rule stated.
    """
    by_layer: dict[Hashable, list[GroupSums]] = {}
    for (layer, _), s in sorted(sentence_sums.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        by_layer.setdefault(layer, []).append(s)
    rows = []
    for layer, states in sorted(by_layer.items()):
        if len(states) < 3 or layer not in baselines:
            continue
        tokens = np.array([s.n for s in states], dtype=np.float64)
        pooled = np.stack([s.sum_raw / s.n for s in states])  # (S, d)
        squared = (pooled * pooled).sum(axis=1)
        ratio = None
        if tokens.std() > 0:
            slope, intercept = np.polyfit(1.0 / tokens, squared, 1)
            ratio = float(np.sqrt(slope / intercept)) if slope > 0 and intercept > 0 else None
        unit = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)  # cosine geometry
        projection = (unit - unit.mean(axis=0)) @ principal(unit, require_spread=False).vectors[:, 0]
        corr = float(abs(np.corrcoef(projection, tokens)[0, 1])) if tokens.std() > 0 and projection.std() > 0 else None
        median = float(np.median(tokens))
        rows.append(
            {
                "layer": plain_scalar(layer),
                "sentences": len(states),
                "token_baseline": baselines[layer],
                "pooled_A": GroupSums.of_batch(pooled).average_cosine(),
                "shared_over_idiosyncratic": ratio,
                "median_tokens": median,
                "predicted_pooled_A": None if ratio is None else pooled_anisotropy(ratio, median),
                "u1_token_count_corr": corr,
            }
        )
    above_input = rows[1:]
    best = min(above_input, key=lambda r: r["pooled_A"])["layer"] if above_input else None
    return {
        "layers": rows,
        "recommended_layer": best,
        "rule": "lowest pooled anisotropy above the input layer (layer 0 is a lookup table: isotropic but "
        "non-contextual); the first-last average is the standard strong baseline to compare with",
    }


def adjust(
    raw: Mapping[Hashable, float], baselines: Mapping[Hashable, float], layer_of: Mapping[Hashable, Hashable]
) -> dict[Hashable, float]:
    """Baseline-adjusted values: raw[key] − baselines[layer_of[key]] for every key of ``raw``."""
    return {key: value - baselines[layer_of[key]] for key, value in raw.items()}


def ranking(values: Mapping[Hashable, float]) -> list[Hashable]:
    """Keys ordered from the highest value to the lowest (ties keep insertion order)."""
    return sorted(values, key=lambda k: -values[k])


def contextual_measures(
    layer_sums: Mapping[Any, GroupSums],
    word_sums: Mapping[tuple, GroupSums],
    sentence_sums: Mapping[tuple, GroupSums],
    word_moments: Mapping[tuple, FitData] | None = None,
) -> dict:
    """Assemble the chapter-4 report from group states.

    ``layer_sums``: {layer: GroupSums}; ``word_sums``: {(layer, word): GroupSums};
    ``sentence_sums``: {(layer, sentence): GroupSums}; ``word_moments``: {(layer, word): Moments or the
    occurrence rows (m, d)} for MEV and static vectors. Groups with fewer than 2 vectors have no pairwise
    cosine and are left out.

    Returns ``{"layers": [{"layer", "n", "baseline"}...], "words": [{"layer", "word", "n", "self_sim",
    "adjusted_self_sim", ("mev", "mev_floor", "mev_over_floor")}...], "sentences": [{"layer", "sentence",
    "n", "intra_sim", "adjusted_intra_sim"}...], "static_vectors": [{"layer", "word", "vector" (d list)}...],
    "pooling": :func:`pooling_report`}`` sorted by layer then key.
    """
    baselines = {layer: s.average_cosine() for layer, s in layer_sums.items() if s.n >= 2}
    layers = [
        {"layer": plain_scalar(layer), "n": layer_sums[layer].n, "baseline": baselines[layer]}
        for layer in sorted(baselines)
    ]
    words, statics = [], []
    for (layer, word), s in sorted(word_sums.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        if s.n < 2 or layer not in baselines:
            continue
        row = {"layer": plain_scalar(layer), "word": plain_scalar(word), "n": s.n, "self_sim": s.average_cosine()}
        row["adjusted_self_sim"] = row["self_sim"] - baselines[layer]
        if word_moments and (layer, word) in word_moments:
            row.update({k: v for k, v in mev(word_moments[(layer, word)]).items() if k != "m"})
            vector = static_vector(word_moments[(layer, word)])
            if vector is not None:
                statics.append({"layer": plain_scalar(layer), "word": plain_scalar(word), "vector": vector.tolist()})
        words.append(row)
    sentences = []
    for (layer, sentence), s in sorted(sentence_sums.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        if s.n < 2 or layer not in baselines:
            continue
        intra = s.mean_cosine_to_centroid()
        sentences.append(
            {
                "layer": plain_scalar(layer),
                "sentence": plain_scalar(sentence),
                "n": s.n,
                "intra_sim": intra,
                "adjusted_intra_sim": intra - baselines[layer],
            }
        )
    return {
        "layers": layers,
        "words": words,
        "sentences": sentences,
        "static_vectors": statics,
        "pooling": pooling_report(sentence_sums, baselines),
    }


def contextual_report(
    vectors: np.ndarray, layers: Sequence, words: Sequence, sentences: Sequence, mev_min_occurrences: int = 2
) -> dict:
    """In-memory reference of the chapter-4 report for token vectors (n, d) with per-row layer, word and
    sentence keys (each (n,)). MEV and static vectors are computed for (layer, word) groups with
    ≥ ``mev_min_occurrences``, from the occurrence rows (the Gram route when m < d).
    Same output as :func:`contextual_measures`.
    """
    layer_keys = list(layers)
    word_keys = list(zip(layer_keys, words))
    sentence_keys = list(zip(layer_keys, sentences))
    word_sums = group_sums(vectors, word_keys)
    eligible = [k for k, s in word_sums.items() if s.n >= max(2, mev_min_occurrences)]
    return contextual_measures(
        group_sums(vectors, layer_keys),
        word_sums,
        group_sums(vectors, sentence_keys),
        group_rows(vectors, word_keys, only=eligible),
    )
