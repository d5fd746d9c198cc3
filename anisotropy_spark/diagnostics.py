"""Corpus-scale diagnosis on Spark: one moments pass, then the cheap per-direction artefact pass."""
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
    one aggregate of Spark's ``corr`` (which merges centred co-moments, so it is stable for large offsets)
    gives |corr(projection_j, column)| for every numeric metadata column, and one ``groupBy`` the mean
    projection per label. Returns ``{"abs_corr", "label_means"}`` for u1 (as before) plus
    ``"directions": [{"index": j (1-based), "eigenvalue": λ_j, "abs_corr": {column: |corr| | None},
    "label_separation": (max − min label mean)/√λ_j | None}…]``. A constant column has no correlation: None.
    """
    missing = [c for c in metadata_cols + ([label_col] if label_col else []) if c not in df.columns]
    if missing:
        raise ValueError(f"metadata column(s) {missing} not found; columns are {df.columns}")
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
        row = projected.agg(*[F.corr(p, F.col(c).cast("double")).alias(f"{p}|{c}")
                              for p in names for c in metadata_cols]).first()
        corr = {(p, c): (None if row[f"{p}|{c}"] is None or np.isnan(row[f"{p}|{c}"]) else abs(float(row[f"{p}|{c}"])))
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
