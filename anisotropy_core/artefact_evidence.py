"""The per-direction artefact test with a permutation null (seed chapter 3, Step B; chapter 7, failure one). Pure numpy.

Is a principal direction an artefact (its projection tracks a metadata column such as token count) or the signal (a
label separates along it)? Both questions are asked of a sample of m rows projected on the top K principal
directions, and both get a permutation null with family-wise control, so that testing many directions and columns
on a small sample does not flag noise:

* **Metadata.** For every (direction j, numeric column c) the test measures |Pearson| and |Spearman| (Spearman
  catches a curved but monotone artefact, e.g. projection ∝ log(token_count), that Pearson understates). The null
  permutes the metadata rows (all columns with one permutation, so their dependence is kept) against the
  projections; each permutation's statistic is the maximum over all K × C × 2 tests (Westfall–Young maxT). The
  adjusted p of a test is (1 + #{permutations whose maximum ≥ its observed value}) / (1 + B): a family-wise error
  rate over directions × columns × both statistics.
* **Labels.** The label separation of direction j is the spread (max − min) of the per-label mean projections in
  standard deviations √λ_j of the projection. Its null permutes the labels; maxT over the K directions.

A direction is a **significant artefact** when its smallest adjusted p is below ``alpha`` *and* its effect,
max over columns of max(|Pearson|, |Spearman|), reaches ``artefact_corr``; a label separation is significant when
its adjusted p is below ``alpha`` and it reaches ``label_separation`` SDs. Rows with a missing (NaN) metadata value
are left out of the metadata test and counted (``rows_missing_metadata``); a constant column has no correlation
(None) and takes no part in the maximum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

if TYPE_CHECKING:  # decision imports this module's defaults
    from .decision import ArtefactDirection, ArtefactEvidence

DEFAULT_DIRECTIONS = 10  # principal directions the test looks at
DEFAULT_PERMUTATIONS = 999
DEFAULT_ALPHA = 0.05
PERMUTATION_CHUNK = 64  # permutations evaluated per vectorised block (bounds the (chunk, m, ·) scratch)


def ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (1-based, ties share their mean rank) of each column of ``values`` (m, C)."""
    x = np.asarray(values, dtype=np.float64)
    out = np.empty_like(x)
    for c in range(x.shape[1]):
        order = np.argsort(x[:, c], kind="mergesort")
        sorted_values = x[order, c]
        starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
        ends = np.r_[starts[1:], x.shape[0]]
        average = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 … ends
        out[order, c] = np.repeat(average, ends - starts)
    return out


def standardised(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(columns of ``values`` (m, C) centred and scaled to unit norm, (C,) bool: the column is not constant)."""
    x = np.asarray(values, dtype=np.float64)
    centred = x - x.mean(axis=0)
    norms = np.linalg.norm(centred, axis=0)
    varies = norms > 1e-12 * np.maximum(1.0, np.abs(x).max(axis=0))
    return centred / np.where(varies, norms, 1.0), varies


def numeric_columns(metadata: Mapping[str, Any], m: int) -> tuple[list[str], np.ndarray]:
    """(column names, (m, C) float64 matrix) of ``metadata``; a clear error names a column that is not numeric
    or has the wrong length."""
    names, columns = list(metadata), []
    for name in names:
        raw = np.asarray(metadata[name])
        if raw.shape != (m,):
            raise ValueError(f"metadata column {name!r} has shape {raw.shape}, expected ({m},) like the projections")
        try:
            columns.append(
                np.array([np.nan if v is None else v for v in raw], dtype=np.float64)
                if raw.dtype == object
                else raw.astype(np.float64)
            )
        except (TypeError, ValueError):
            raise ValueError(
                f"metadata column {name!r} is not numeric (dtype {raw.dtype}): the artefact test "
                "correlates projections with numeric columns; pass a text column as label_col"
            ) from None
    return names, np.column_stack(columns) if columns else np.empty((m, 0))


def permutations(rng: np.random.Generator, count: int, m: int) -> np.ndarray:
    """(count, m) int array, each row an independent uniform permutation of range(m)."""
    return np.argsort(rng.random((count, m)), axis=1)


def max_t_pvalues(observed: np.ndarray, null_max: np.ndarray) -> np.ndarray:
    """Westfall–Young single-step maxT adjusted p of each ``observed`` statistic against the (B,) maxima of the
    permutations: (1 + #{b: null_max[b] ≥ observed}) / (1 + B)."""
    exceed = (null_max[None, :] >= observed.reshape(-1, 1) - 1e-12).sum(axis=1)
    return ((1.0 + exceed) / (1.0 + null_max.shape[0])).reshape(observed.shape)


def metadata_test(
    projections: np.ndarray, columns: np.ndarray, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(|Pearson| (K, C), |Spearman| (K, C), adjusted p of each (K, C, 2), constant column mask (C,)) of the
    projections (m, K) against complete metadata ``columns`` (m, C) with ``count`` maxT permutations."""
    x_p, _ = standardised(projections)
    x_s, _ = standardised(ranks(projections))
    y_p, varies = standardised(columns)
    y_s, _ = standardised(ranks(columns))
    observed = np.stack([np.abs(x_p.T @ y_p), np.abs(x_s.T @ y_s)], axis=-1)  # (K, C, 2)
    observed[:, ~varies, :] = 0.0
    y = np.stack([y_p[:, varies], y_s[:, varies]], axis=-1)  # (m, C', 2)
    null_max = np.empty(count)
    for start in range(0, count, PERMUTATION_CHUNK):
        perm = permutations(rng, min(PERMUTATION_CHUNK, count - start), columns.shape[0])
        shuffled = y[perm]  # (b, m, C', 2)
        pearson = np.abs(np.einsum("mk,bmc->bkc", x_p, shuffled[..., 0]))
        spearman = np.abs(np.einsum("mk,bmc->bkc", x_s, shuffled[..., 1]))
        null_max[start : start + perm.shape[0]] = np.maximum(
            pearson.max(axis=(1, 2), initial=0.0), spearman.max(axis=(1, 2), initial=0.0)
        )
    p = max_t_pvalues(observed, null_max)
    p[:, ~varies, :] = 1.0
    return np.minimum(observed[..., 0], 1.0), np.minimum(observed[..., 1], 1.0), p, ~varies


def label_test(
    projections: np.ndarray, sd: np.ndarray, labels: np.ndarray, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(separation (K,) in SDs ``sd`` (K,), maxT adjusted p (K,), {label: (K,) mean projection}) of the
    projections (m, K) grouped by ``labels`` (m,) (a null label is its own group), ``count`` label permutations."""
    keys = np.array([str(v) for v in labels])
    order = np.argsort(keys, kind="mergesort")
    names, starts = np.unique(keys[order], return_index=True)
    sizes = np.diff(np.r_[starts, keys.shape[0]])
    scale = np.where(sd > 0, sd, np.inf)

    def spread(sorted_projections: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        means = np.add.reduceat(sorted_projections, starts, axis=-2) / sizes[:, None]  # (..., L, K)
        return (means.max(axis=-2) - means.min(axis=-2)) / scale, means

    observed, means = spread(projections[order])
    null_max = np.empty(count)
    for start in range(0, count, PERMUTATION_CHUNK):
        perm = permutations(rng, min(PERMUTATION_CHUNK, count - start), keys.shape[0])
        null_max[start : start + perm.shape[0]] = spread(projections[perm])[0].max(axis=1)
    return observed, max_t_pvalues(observed, null_max), {str(n): means[i] for i, n in enumerate(names)}


def direction_test(
    projections: np.ndarray,
    eigenvalues: np.ndarray,
    metadata: Mapping[str, Any] | None = None,
    labels: np.ndarray | None = None,
    permutations_count: int = DEFAULT_PERMUTATIONS,
    seed: int = 0,
    alpha: float = DEFAULT_ALPHA,
    artefact_corr: float = 0.5,
    label_separation: float = 1.0,
) -> ArtefactEvidence:
    """The per-direction artefact test of a sample (see the module docstring).

    ``projections``: (m, K) (v − μ)·u_j of m sampled rows on the top K principal directions; ``eigenvalues``: (K,)
    their λ_j (the SD of projection j is √λ_j); ``metadata``: column name → (m,) numeric values (NaN/None =
    missing); ``labels``: (m,) label per row or None. Returns a JSON-safe dict::

        {"directions": [{"index": j (1-based), "eigenvalue": λ_j,
                         "abs_corr": {column: |Pearson| | None}, "abs_spearman": {column: |Spearman| | None},
                         "p_adjusted": smallest maxT-adjusted p over the direction's tests | None (no column),
                         "p_adjusted_by_column": {column: p | None},
                         "label_separation": SDs | None, "label_p_adjusted": p | None,
                         "significant": artefact flag, "label_significant": label flag}…],
         "abs_corr": u1's |Pearson| per column, "label_means": {label: u1 mean projection},
         "null": {"method", "permutations", "seed", "alpha", "artefact_corr", "label_separation", "sample_size",
                  "rows_missing_metadata", "columns", "label_column_given"}}
    """
    proj = np.asarray(projections, dtype=np.float64)
    if proj.ndim != 2 or proj.shape[0] < 3 or proj.shape[1] < 1:
        raise ValueError(f"the artefact test needs projections of shape (m >= 3, K >= 1), got {proj.shape}")
    if not np.isfinite(proj).all():
        raise ValueError(f"projection row {int(np.argmax(~np.isfinite(proj).all(axis=1)))} is not finite")
    if permutations_count < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations_count}")
    m, k = proj.shape
    lam = np.asarray(eigenvalues, dtype=np.float64)[:k]
    names, columns = numeric_columns(metadata or {}, m)
    complete = np.isfinite(columns).all(axis=1)
    rng = np.random.default_rng(seed)
    c = len(names)
    # no test (no column, or fewer than 3 complete rows): every column counts as constant, nothing is read below
    pearson, spearman, p = np.full((k, c), np.nan), np.full((k, c), np.nan), np.full((k, c, 2), np.nan)
    constant = np.zeros(c, dtype=bool)
    if c and complete.sum() >= 3:
        pearson, spearman, p, constant = metadata_test(proj[complete], columns[complete], permutations_count, rng)
    elif c:
        constant[:] = True
    separation = label_p = None
    label_means: dict[str, np.ndarray] = {}
    if labels is not None:
        labels = np.asarray(labels, dtype=object)
        if labels.shape != (m,):
            raise ValueError(f"labels have shape {labels.shape}, expected ({m},) like the projections")
        separation, label_p, label_means = label_test(
            proj, np.sqrt(np.clip(lam, 0.0, None)), labels, permutations_count, rng
        )
    rows: list[ArtefactDirection] = []
    for j in range(k):
        defined = [i for i in range(c) if not constant[i]]
        corr = {names[i]: float(pearson[j, i]) if i in defined else None for i in range(c)}
        rank_corr = {names[i]: float(spearman[j, i]) if i in defined else None for i in range(c)}
        by_column = {names[i]: float(p[j, i].min()) if i in defined else None for i in range(c)}
        p_min = min((float(p[j, i].min()) for i in defined), default=None)
        effect = max((max(float(pearson[j, i]), float(spearman[j, i])) for i in defined), default=0.0)
        spread: float | None = None
        spread_p: float | None = None
        if separation is not None and label_p is not None and len(label_means) >= 2:
            spread, spread_p = float(separation[j]), float(label_p[j])
        rows.append(
            {
                "index": j + 1,
                "eigenvalue": float(lam[j]),
                "abs_corr": corr,
                "abs_spearman": rank_corr,
                "p_adjusted": p_min,
                "p_adjusted_by_column": by_column,
                "label_separation": spread if spread is None or np.isfinite(spread) else None,
                "label_p_adjusted": spread_p,
                "significant": bool(p_min is not None and p_min < alpha and effect >= artefact_corr),
                "label_significant": bool(
                    spread is not None and spread_p is not None and spread_p < alpha and spread >= label_separation
                ),
            }
        )
    return {
        "directions": rows,
        "abs_corr": rows[0]["abs_corr"],
        "label_means": {label: float(v[0]) for label, v in label_means.items()},
        "null": {
            "method": "permutation maxT (Westfall-Young) over directions x columns x {Pearson, Spearman}; "
            "labels: permutation maxT over directions",
            "permutations": int(permutations_count),
            "seed": int(seed),
            "alpha": float(alpha),
            "artefact_corr": float(artefact_corr),
            "label_separation": float(label_separation),
            "sample_size": int(m),
            "rows_missing_metadata": int(m - complete.sum()) if c else 0,
            "columns": names,
            "label_column_given": labels is not None,
        },
    }


def sample_artefact_test(
    vectors: np.ndarray,
    columns: Mapping[str, Any],
    report: Mapping[str, Any],
    metadata_cols: list[str],
    label_col: str | None,
    directions: int = DEFAULT_DIRECTIONS,
    permutations_count: int = DEFAULT_PERMUTATIONS,
    seed: int = 0,
    alpha: float = DEFAULT_ALPHA,
    artefact_corr: float = 0.5,
    label_separation: float = 1.0,
) -> ArtefactEvidence:
    """:func:`direction_test` of a uniform row sample against the corpus diagnosis ``report``.

    ``vectors``: (m, d) sampled raw rows; ``columns``: column name → (m,) values of the same rows (holding
    ``metadata_cols`` and ``label_col``); ``report``: :func:`anisotropy_core.diagnose` of the whole corpus (its
    ``mean`` (d,), ``principal_directions`` (d, d) and ``spectrum`` (d,)). Projects the sample on the top
    ``directions`` (K, at most d) principal directions: (v − μ)·u_j, λ_j from the corpus spectrum.
    """
    if directions < 1:
        raise ValueError(f"directions must be >= 1, got {directions}")
    basis = np.asarray(report["principal_directions"], dtype=np.float64)[:, : int(directions)]
    projections = (np.asarray(vectors, dtype=np.float64) - np.asarray(report["mean"])) @ basis
    return direction_test(
        projections,
        np.asarray(report["spectrum"])[: basis.shape[1]],
        {c: columns[c] for c in metadata_cols},
        columns[label_col] if label_col else None,
        permutations_count,
        seed,
        alpha,
        artefact_corr,
        label_separation,
    )
