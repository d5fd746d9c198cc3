"""Chapter-4 contextual measures on Spark: per-group partial sums in ``mapInArrow``, merged by key.

Pass 1 (always): every partition folds its Arrow batches into one :class:`GroupSums` per layer, per
(layer, word) and per (layer, sentence) group and emits them as binary rows; ``reduceByKey`` merges the
partial states (never Spark Accumulators). Baselines, self-similarity, adjusted self-similarity and
intra-sentence similarity all come from these sums.

Pass 2 (MEV, optional): a (d, d) centred-moments state is needed per word, so it is built only for the
(layer, word) groups chosen from pass 1's counts (≥ ``mev_min_occurrences``, the ``mev_max_words`` most
frequent), folded and merged the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame

from anisotropy_core.contextual import GroupSums, contextual_measures, group_sums
from anisotropy_core.moments import Moments

from .arrow import batch_matrix
from .contract import require_columns
from .keyed import fold_by_key, merge_moments_bytes


def _encode_key(key) -> bytes:
    """Group key ((kind, layer) or (kind, (layer, word|sentence)) of str/int values) → bytes, losslessly via repr."""
    return repr(key).encode("utf-8")


def _decode_key(raw: bytes):
    import ast

    return ast.literal_eval(bytes(raw).decode("utf-8"))


def _fold_partitions(
    df: DataFrame,
    columns: list[str],
    vector_col: str,
    dimension: int,
    fold: Callable[[np.ndarray, dict[str, list]], dict[tuple[str, Any], bytes]],
    merge: Callable[[bytes, bytes], bytes],
) -> dict[tuple[str, Any], bytes]:
    """Run ``fold`` (batch matrix (B, d), key columns as Python lists → {(kind, key): state bytes}) over every
    Arrow batch, merge states within a partition and then across partitions by key with ``merge``
    (:mod:`~anisotropy_spark.keyed`)."""

    def per_partition(batches: Iterator[pa.RecordBatch]) -> dict[bytes, bytes]:
        states: dict[bytes, bytes] = {}
        for batch in batches:
            if not batch.num_rows:
                continue
            cols = {c: batch.column(batch.schema.get_field_index(c)).to_pylist() for c in columns}
            for group, payload in fold(batch_matrix(batch, vector_col, dimension), cols).items():
                key = _encode_key(group)
                states[key] = merge(states[key], payload) if key in states else payload
        return states

    merged = fold_by_key(df.select(*columns, vector_col), per_partition, merge)
    return {_decode_key(key): payload for key, payload in merged.items()}


def _merge_sums(a: bytes, b: bytes) -> bytes:
    return _sums_bytes(GroupSums.from_array(np.frombuffer(a)).merge(GroupSums.from_array(np.frombuffer(b))))


def _sums_bytes(state: GroupSums) -> bytes:
    return state.to_array().tobytes()


def contextual_dataframe(
    df: DataFrame,
    vector_col: str,
    dimension: int,
    layer_col: str = "layer",
    word_col: str = "word",
    sentence_col: str = "sentence",
    mev_min_occurrences: int = 2,
    mev_max_words: int | None = 200,
) -> dict:
    """Chapter-4 report of a token table: one row per token occurrence with ``layer_col``, ``word_col``,
    ``sentence_col`` (non-null) and a validated ``array<double>`` vector of length ``dimension``.

    ``word_col`` or ``sentence_col`` may be None (those sections come back empty). MEV is computed for at
    most ``mev_max_words`` (layer, word) groups (None: all) with ≥ ``mev_min_occurrences`` occurrences.
    Same output as :func:`anisotropy_core.contextual.contextual_report`.
    """
    columns = [c for c in (layer_col, word_col, sentence_col) if c]
    require_columns(df.columns, columns + [vector_col], "contextual")
    kinds = {"layer": None, "word": word_col, "sentence": sentence_col}

    def fold_sums(x: np.ndarray, cols: dict[str, list]) -> dict[tuple[str, Any], bytes]:
        out: dict[tuple[str, Any], bytes] = {}
        for kind, col in kinds.items():
            if kind != "layer" and not col:
                continue
            keys = cols[layer_col] if col is None else list(zip(cols[layer_col], cols[col]))
            out.update({(kind, key): _sums_bytes(s) for key, s in group_sums(x, keys).items()})
        return out

    states = _fold_partitions(df, columns, vector_col, dimension, fold_sums, _merge_sums)
    sums = {
        kind: {key: GroupSums.from_array(np.frombuffer(p)) for (k, key), p in states.items() if k == kind}
        for kind in kinds
    }

    word_moments: dict[Any, Moments] = {}  # (layer, word) → its occurrences' moments
    if word_col:
        eligible = sorted(
            (key for key, s in sums["word"].items() if s.n >= max(2, mev_min_occurrences)),
            key=lambda key: (-sums["word"][key].n, repr(key)),
        )
        chosen = set(eligible if mev_max_words is None else eligible[:mev_max_words])
        if chosen:

            def fold_moments(x: np.ndarray, cols: dict[str, list]) -> dict[tuple[str, Any], bytes]:
                keys = list(zip(cols[layer_col], cols[word_col]))
                out: dict[tuple[str, Any], bytes] = {}
                for key in set(keys) & chosen:
                    rows = np.fromiter((k == key for k in keys), dtype=bool, count=len(keys))
                    out[("mev", key)] = Moments.of_batch(x[rows]).to_bytes()
                return out

            moments = _fold_partitions(
                df, [layer_col, word_col], vector_col, dimension, fold_moments, merge_moments_bytes
            )
            word_moments = {key: Moments.from_bytes(p) for (_, key), p in moments.items()}
    return contextual_measures(sums["layer"], sums["word"], sums["sentence"], word_moments)
