"""Corpus-scale diagnosis on Spark: one moments pass, then the cheap u1 artefact pass."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from anisotropy_core.diagnostics import diagnose

from .arrow import batch_matrix
from .moments import corpus_moments

PROJECTION_COL = "u1_projection"


def diagnose_dataframe(df: DataFrame, vector_col: str, dimension: int) -> dict:
    """:func:`anisotropy_core.diagnose` of the valid rows of ``df`` (``array<double>`` vectors)."""
    return diagnose(corpus_moments(df, vector_col, dimension))


def with_u1_projection(df: DataFrame, vector_col: str, report: dict) -> DataFrame:
    """``df`` without the vector column, plus ``u1_projection`` = (v − μ)·u1 (double), via Arrow batches."""
    mean, u1, d = np.asarray(report["mean"]), np.asarray(report["u1"]), int(report["d"])
    keep = [c for c in df.columns if c != vector_col]

    def project(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            proj = (batch_matrix(batch, vector_col, d) - mean) @ u1
            columns = [batch.column(batch.schema.get_field_index(c)) for c in keep]
            yield pa.RecordBatch.from_arrays(columns + [pa.array(proj, pa.float64())], names=keep + [PROJECTION_COL])

    schema = df.select(*keep).schema.add(PROJECTION_COL, "double", nullable=False)
    return df.mapInArrow(project, schema)


def u1_artefact_test(df: DataFrame, vector_col: str, report: dict, metadata_cols: list[str],
                     label_col: str | None = None) -> dict:
    """The seed's fifth number on Spark: |corr(u1 projection, column)| for each numeric metadata column,
    and the mean projection per label. Spark's ``corr`` aggregate merges centred co-moments, so it is
    stable for large offsets. Same output shape as :func:`anisotropy_core.artefact_test`.
    """
    missing = [c for c in metadata_cols + ([label_col] if label_col else []) if c not in df.columns]
    if missing:
        raise ValueError(f"metadata column(s) {missing} not found; columns are {df.columns}")
    projected = with_u1_projection(df.select(vector_col, *metadata_cols, *([label_col] if label_col else [])),
                                   vector_col, report)
    abs_corr = {}
    if metadata_cols:
        row = projected.agg(*[F.corr(PROJECTION_COL, F.col(c).cast("double")).alias(c) for c in metadata_cols]).first()
        abs_corr = {c: (None if row[c] is None or np.isnan(row[c]) else abs(float(row[c]))) for c in metadata_cols}
    label_means = {}
    if label_col:
        label_means = {r[label_col]: float(r["mean"])
                       for r in projected.groupBy(label_col).agg(F.mean(PROJECTION_COL).alias("mean")).collect()}
    return {"abs_corr": abs_corr, "label_means": label_means}


def sample_rows(df: DataFrame, vector_col: str, dimension: int, columns: list[str], size: int,
                seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A uniform random sample of about ``size`` valid rows on the driver (flow training, pictures, in-memory
    measures): Spark's Bernoulli ``sample`` at 1.5·size/n, then a uniform subset of ``size`` of those rows on
    the driver (``limit`` would keep the first partitions' rows and drop the last ones').

    Returns ``(vectors (m, d) float64, {column: (m,) array})`` with m ≤ ``size``.
    """
    total = df.count()
    fraction = min(1.0, 1.5 * size / max(total, 1))
    rows = df.select(vector_col, *columns).sample(fraction=fraction, seed=seed).toArrow()
    if rows.num_rows > size:
        keep = np.sort(np.random.default_rng(seed).choice(rows.num_rows, size=size, replace=False))
        rows = rows.take(pa.array(keep))
    vectors = batch_matrix(rows.combine_chunks().to_batches()[0], vector_col, dimension) if rows.num_rows \
        else np.empty((0, dimension))
    return vectors, {c: rows.column(c).to_numpy(zero_copy_only=False) for c in columns}


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
