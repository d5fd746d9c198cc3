"""Corpus-scale diagnosis on Spark: one moments pass (which also draws the uniform driver sample the per-direction
artefact test runs on: :func:`anisotropy_core.artefact_evidence.sample_artefact_test`), projections, the sample."""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from anisotropy_core.diagnostics import Diagnosis, diagnose

from .arrow import batch_matrix
from .moments import corpus_moments
from .row_sample import as_sample, keep_at_most, sample_fraction
from .rows import one_row

PROJECTION_COL = "u1_projection"


def diagnose_dataframe(df: DataFrame, vector_col: str, dimension: int) -> Diagnosis:
    """:func:`anisotropy_core.diagnose` of the valid rows of ``df`` (``array<float|double>`` vectors)."""
    return diagnose(corpus_moments(df, vector_col, dimension))


def with_projections(
    df: DataFrame, vector_col: str, mean: np.ndarray, directions: np.ndarray, names: list[str]
) -> DataFrame:
    """``df`` without the vector column, plus one double column per direction: ``names[j]`` = (v − μ)·u_j.

    ``mean``: (d,); ``directions``: (d, K) unit columns. One GEMM per Arrow batch for all K directions.
    """
    mean, directions = np.asarray(mean, dtype=np.float64), np.asarray(directions, dtype=np.float64)
    d = mean.shape[0]
    keep = [c for c in df.columns if c != vector_col]

    def project(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            proj = (batch_matrix(batch, vector_col, d) - mean) @ directions  # (B, K)
            columns = [batch.column(batch.schema.get_field_index(c)) for c in keep]
            yield pa.RecordBatch.from_arrays(
                columns + [pa.array(proj[:, j], pa.float64()) for j in range(len(names))], names=keep + names
            )

    schema = df.select(*keep).schema
    for name in names:
        schema = schema.add(name, "double", nullable=False)
    return df.mapInArrow(project, schema)


def with_u1_projection(df: DataFrame, vector_col: str, report: dict) -> DataFrame:
    """``df`` without the vector column, plus ``u1_projection`` = (v − μ)·u1 (double), via Arrow batches."""
    return with_projections(df, vector_col, report["mean"], np.asarray(report["u1"])[:, None], [PROJECTION_COL])


def sample_rows(
    df: DataFrame,
    vector_col: str,
    dimension: int,
    columns: list[str],
    size: int,
    seed: int = 0,
    total: int | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A uniform random sample of about ``size`` valid rows on the driver, in a pass of its own
    (:mod:`.row_sample`): Spark's Bernoulli ``sample``, then a uniform subset of ``size`` of its rows.

    ``total``: the rows of ``df`` when already known (saves a counting pass). Returns
    ``(vectors (m, d) float64, {column: (m,) array})`` with m ≤ ``size``.
    """
    total = df.count() if total is None else total
    rows = df.select(vector_col, *columns).sample(fraction=sample_fraction(size, total), seed=seed).toArrow()
    return as_sample(keep_at_most(rows, size, seed), vector_col, dimension, columns)


def drawn_or_sampled(
    drawn: pa.Table | None,
    df: DataFrame,
    vector_col: str,
    dimension: int,
    columns: list[str],
    size: int,
    total: int,
    seed: int = 0,
) -> tuple[tuple[np.ndarray, dict[str, np.ndarray]], str]:
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
    joined = (
        pairs.select("id_a", "id_b")
        .join(vectors.withColumnRenamed("_v", "_a"), F.col("id_a") == F.col("_id"), "left")
        .drop("_id")
        .join(vectors.withColumnRenamed("_v", "_b"), F.col("id_b") == F.col("_id"), "left")
        .drop("_id")
    )

    def total(expr: str) -> F.Column:
        return F.expr(f"aggregate({expr}, 0D, (acc, v) -> acc + v)")

    dot = total("zip_with(_a, _b, (x, y) -> x * y)")
    norms = F.sqrt(total("transform(_a, x -> x * x)")) * F.sqrt(total("transform(_b, x -> x * x)"))
    squared = F.greatest(F.lit(0.0), 2.0 - 2.0 * dot / norms)  # ‖x̂ − ŷ‖² = 2 − 2cos
    matched = F.col("_a").isNotNull() & F.col("_b").isNotNull()
    row = one_row(
        joined.agg(
            F.sum(F.when(matched, 1).otherwise(0)).alias("pairs"),
            F.sum(F.when(matched, 0).otherwise(1)).alias("unmatched"),
            F.avg(F.when(matched, F.pow(squared, alpha / 2.0))).alias("alignment"),
        )
    )
    return {
        "alignment": row["alignment"],
        "alpha": float(alpha),
        "pairs": int(row["pairs"] or 0),
        "unmatched_pairs": int(row["unmatched"] or 0),
    }
