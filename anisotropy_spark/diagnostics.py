"""Corpus-scale diagnosis on Spark: one moments pass, then the cheap u1 artefact pass."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from anisotropy_core.diagnostics import Diagnosis, diagnose

from .arrow import batch_matrix
from .moments import corpus_moments

PROJECTION_COL = "u1_projection"


def diagnose_dataframe(df: DataFrame, vector_col: str, dimension: int) -> Diagnosis:
    """:func:`anisotropy_core.diagnose` of the valid rows of ``df`` (``array<float|double>`` vectors)."""
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
                seed: int = 0, total: int | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A random sample of about ``size`` valid rows on the driver, for pictures and in-memory measures.

    ``total``: the rows of ``df`` when already known (saves a counting pass). Returns
    ``(vectors (m, d) float64, {column: (m,) array})`` with m ≤ ``size``.
    """
    total = df.count() if total is None else total
    fraction = min(1.0, 1.5 * size / max(total, 1))
    rows = df.select(vector_col, *columns).sample(fraction=fraction, seed=seed).limit(size).toArrow()
    vectors = batch_matrix(rows.combine_chunks().to_batches()[0], vector_col, dimension) if rows.num_rows \
        else np.empty((0, dimension))
    return vectors, {c: rows.column(c).to_numpy(zero_copy_only=False) for c in columns}
