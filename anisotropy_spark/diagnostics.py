"""Corpus-scale diagnosis on Spark: one moments pass, then the cheap per-direction artefact pass."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from anisotropy_core.diagnostics import Diagnosis, diagnose

from .arrow import batch_matrix
from .contract import require_columns
from .moments import corpus_moments
from .row_sample import as_sample, keep_at_most, sample_fraction

PROJECTION_COL = "u1_projection"


def diagnose_dataframe(df: DataFrame, vector_col: str, dimension: int) -> Diagnosis:
    """:func:`anisotropy_core.diagnose` of the valid rows of ``df`` (``array<float|double>`` vectors)."""
    return diagnose(corpus_moments(df, vector_col, dimension))


DEFAULT_DIRECTIONS = 10   # principal directions the per-direction artefact test looks at


def with_projections(df: DataFrame, vector_col: str, mean: np.ndarray, directions: np.ndarray,
                     names: list[str]) -> DataFrame:
    """``df`` without the vector column, plus one double column per direction: ``names[j]`` = (v − μ)·u_j.

    ``mean``: (d,); ``directions``: (d, K) unit columns. One GEMM per Arrow batch for all K directions.
    """
    mean, directions = np.asarray(mean, dtype=np.float64), np.asarray(directions, dtype=np.float64)
    d = mean.shape[0]
    keep = [c for c in df.columns if c != vector_col]

    def project(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            proj = (batch_matrix(batch, vector_col, d) - mean) @ directions          # (B, K)
            columns = [batch.column(batch.schema.get_field_index(c)) for c in keep]
            yield pa.RecordBatch.from_arrays(columns + [pa.array(proj[:, j], pa.float64()) for j in range(len(names))],
                                             names=keep + names)

    schema = df.select(*keep).schema
    for name in names:
        schema = schema.add(name, "double", nullable=False)
    return df.mapInArrow(project, schema)


def with_u1_projection(df: DataFrame, vector_col: str, report: dict) -> DataFrame:
    """``df`` without the vector column, plus ``u1_projection`` = (v − μ)·u1 (double), via Arrow batches."""
    return with_projections(df, vector_col, report["mean"], np.asarray(report["u1"])[:, None], [PROJECTION_COL])


def u1_artefact_test(df: DataFrame, vector_col: str, report: dict, metadata_cols: list[str],
                     label_col: str | None = None, directions: int = DEFAULT_DIRECTIONS) -> dict:
    """The seed's fifth number on Spark, per principal direction (seed chapter 3, Step B).

    Projects every row on the top ``directions`` (K, at most d) principal directions in one Arrow pass, then
    one aggregate of Spark's ``covar_pop``/``var_pop`` (centred co-moments, stable for large offsets; see
    :func:`abs_correlation`) gives |corr(projection_j, column)| for every numeric metadata column, and one ``groupBy`` the mean
    projection per label. Returns ``{"abs_corr", "label_means"}`` for u1 (as before) plus
    ``"directions": [{"index": j (1-based), "eigenvalue": λ_j, "abs_corr": {column: |corr| | None},
    "label_separation": (max − min label mean)/√λ_j | None}…]``. A constant column has no correlation: None.
    """
    require_columns(df.columns, metadata_cols + ([label_col] if label_col else []), "metadata")
    if directions < 1:
        raise ValueError(f"directions must be >= 1, got {directions}")
    k = min(int(directions), int(report["d"]))
    names = [PROJECTION_COL] + [f"_p{j}" for j in range(2, k + 1)]
    basis = np.asarray(report["principal_directions"])[:, :k] if "principal_directions" in report \
        else np.asarray(report["u1"])[:, None]
    names = names[:basis.shape[1]]
    projected = with_projections(df.select(vector_col, *metadata_cols, *([label_col] if label_col else [])),
                                 vector_col, report["mean"], basis, names)
    corr = {}
    if metadata_cols:
        columns = {c: F.col(c).cast("double") for c in metadata_cols}
        row = projected.agg(*[F.var_pop(x).alias(f"var|{x}") for x in names],
                            *[F.var_pop(columns[c]).alias(f"var|{c}") for c in metadata_cols],
                            *[F.covar_pop(p, columns[c]).alias(f"{p}|{c}") for p in names for c in metadata_cols]
                            ).first()
        corr = {(p, c): abs_correlation(row[f"{p}|{c}"], row[f"var|{p}"], row[f"var|{c}"])
                for p in names for c in metadata_cols}
    means = {}
    if label_col:
        for r in projected.groupBy(label_col).agg(*[F.mean(p).alias(p) for p in names]).collect():
            means[r[label_col]] = [float(r[p]) for p in names]
    spectrum = np.asarray(report["spectrum"], dtype=np.float64)
    rows = []
    for j, p in enumerate(names):
        spread = [m[j] for m in means.values()]
        sd = float(np.sqrt(spectrum[j]))
        rows.append({"index": j + 1, "eigenvalue": float(spectrum[j]),
                     "abs_corr": {c: corr[(p, c)] for c in metadata_cols},
                     "label_separation": (max(spread) - min(spread)) / sd if len(spread) >= 2 and sd > 0 else None})
    return {"abs_corr": rows[0]["abs_corr"], "label_means": {label: m[0] for label, m in means.items()},
            "directions": rows}


def abs_correlation(covariance: float | None, variance_x: float | None, variance_y: float | None) -> float | None:
    """|corr| from Spark's ``covar_pop`` and ``var_pop`` (centred co-moments, stable for large offsets); None
    when a side is constant or missing (Spark's ``corr`` would divide by zero under ANSI mode)."""
    if covariance is None or not variance_x or not variance_y or variance_x <= 0 or variance_y <= 0:
        return None
    return min(1.0, abs(float(covariance)) / float(np.sqrt(variance_x * variance_y)))


def sample_rows(df: DataFrame, vector_col: str, dimension: int, columns: list[str], size: int,
                seed: int = 0, total: int | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A uniform random sample of about ``size`` valid rows on the driver, in a pass of its own
    (:mod:`.row_sample`): Spark's Bernoulli ``sample``, then a uniform subset of ``size`` of its rows.

    ``total``: the rows of ``df`` when already known (saves a counting pass). Returns
    ``(vectors (m, d) float64, {column: (m,) array})`` with m ≤ ``size``.
    """
    total = df.count() if total is None else total
    rows = df.select(vector_col, *columns).sample(fraction=sample_fraction(size, total), seed=seed).toArrow()
    return as_sample(keep_at_most(rows, size, seed), vector_col, dimension, columns)


def drawn_or_sampled(drawn: pa.Table | None, df: DataFrame, vector_col: str, dimension: int, columns: list[str],
                     size: int, total: int, seed: int = 0) -> tuple[tuple[np.ndarray, dict[str, np.ndarray]], str]:
    """(the sample, where it came from): the rows ``drawn`` in the moments pass (:class:`.row_sample.RowSample`)
    when they are at least ``min(size, total)``, ``total`` being the valid rows of ``df``; else (none drawn, or
    fewer: many invalid rows, or a Bernoulli shortfall) :func:`sample_rows`, a pass of its own over ``df``."""
    if drawn is not None and drawn.num_rows >= min(size, total):
        return as_sample(keep_at_most(drawn, size, seed), vector_col, dimension, columns), "moments pass"
    return sample_rows(df, vector_col, dimension, columns, size, seed, total), "sample pass"


def pair_alignment(valid: DataFrame, vector_col: str, id_col: str, pairs: DataFrame, alpha: float = 2.0) -> dict:
    """Wang & Isola's alignment E ‖x̂ − ŷ‖^α over every positive pair of ``pairs`` (columns ``id_a``, ``id_b``
    holding ids of ``valid``), distributed: two joins and one aggregate of Spark SQL array functions.

    Pairs with an id missing from ``valid`` (unknown, or quarantined as invalid) cannot be scored: they are
    counted in ``unmatched_pairs``, never silently dropped. Returns ``{"alignment", "alpha", "pairs",
    "unmatched_pairs"}`` (alignment None when no pair matched) — :func:`anisotropy_core.isotropy_measures.alignment`
    on the matched pairs.
    """
    missing = [c for c in ("id_a", "id_b") if c not in pairs.columns]
    if missing:
        raise ValueError(f"pairs table lacks column(s) {missing}; it needs id_a and id_b, has {pairs.columns}")
    vectors = valid.select(F.col(id_col).alias("_id"), F.col(vector_col).alias("_v"))
    joined = (pairs.select("id_a", "id_b")
              .join(vectors.withColumnRenamed("_v", "_a"), F.col("id_a") == F.col("_id"), "left").drop("_id")
              .join(vectors.withColumnRenamed("_v", "_b"), F.col("id_b") == F.col("_id"), "left").drop("_id"))

    def total(expr: str) -> F.Column:
        return F.expr(f"aggregate({expr}, 0D, (acc, v) -> acc + v)")

    dot = total("zip_with(_a, _b, (x, y) -> x * y)")
    norms = F.sqrt(total("transform(_a, x -> x * x)")) * F.sqrt(total("transform(_b, x -> x * x)"))
    squared = F.greatest(F.lit(0.0), 2.0 - 2.0 * dot / norms)            # ‖x̂ − ŷ‖² = 2 − 2cos
    matched = F.col("_a").isNotNull() & F.col("_b").isNotNull()
    row = joined.agg(F.sum(F.when(matched, 1).otherwise(0)).alias("pairs"),
                     F.sum(F.when(matched, 0).otherwise(1)).alias("unmatched"),
                     F.avg(F.when(matched, F.pow(squared, alpha / 2.0))).alias("alignment")).first()
    return {"alignment": row["alignment"], "alpha": float(alpha), "pairs": int(row["pairs"] or 0),
            "unmatched_pairs": int(row["unmatched"] or 0)}
