"""Retrieval quality of raw vectors and of every candidate transform, on Spark, without collecting the corpus.

* **Queries** (recall@k, nDCG@k): :func:`distributed_top_k`. The queries of every candidate (transformed on
  the driver, unit rows, (m, d_out) each) are broadcast once. Each partition streams its Arrow batches;
  per batch and candidate it transforms the batch (only the batch, never a stored copy), scores all
  queries with one GEMM per slice of rows (:func:`anisotropy_core.evaluation.block_top_k`) and folds the
  result into a running top-k per query. A partition emits one row — its (C, m, k) partial lists — and the
  rows are combined with ``treeReduce`` (:func:`anisotropy_core.evaluation.merge_top_k`). Memory per task
  is O(C·m·k + slice), independent of the corpus size; the driver holds O(C·m·k).
* **Pairs** (Spearman ρ): :func:`pair_cosines` joins the (id_a, id_b, score) table with the corpus twice
  (Spark joins), computes each candidate's cosine per pair in Arrow batches and brings back C + 1 doubles
  per pair — the pairs table's size, never the corpus's.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from anisotropy_core.evaluation import (block_top_k, empty_top_k, merge_top_k, retrieval_metrics, spearman,
                                        unit_rows)
from anisotropy_core.transforms import FittedTransform

from .arrow import batch_matrix
from .contract import require_columns
from .io import as_vector_array, read_table, require_column
from .tree_reduce import tree_reduce

INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


@dataclasses.dataclass
class QuerySet:
    """Evaluation queries on the driver: ``ids`` (m,) int64, ``vectors`` (m, d) float64 raw query vectors,
    ``relevant`` m arrays of relevant corpus ids (int64, each non-empty)."""

    ids: np.ndarray
    vectors: np.ndarray
    relevant: list[np.ndarray]


def require_integral(df: DataFrame, column: str, role: str) -> None:
    """Raise unless ``column`` of ``df`` holds integers (the top-k merge carries ids as int64)."""
    require_column(df, column, role)
    kind = df.schema[column].dataType
    if isinstance(kind, T.ArrayType):
        kind = kind.elementType
    if not isinstance(kind, INTEGRAL):
        raise ValueError(f"{role} column {column!r} must hold integer ids for the evaluation, got {kind.simpleString()}")


def read_queries(spark: SparkSession, path: str, id_col: str, vector_col: str, relevant_col: str,
                 dimension: int) -> QuerySet:
    """Load a queries table (Delta or Parquet: query id, query vector, relevant id or list of ids)."""
    df, _ = read_table(spark, path, None)
    for column, role in ((id_col, "query id"), (relevant_col, "relevant")):
        require_integral(df, column, role)
    df = as_vector_array(df, vector_col)
    table = df.select(id_col, vector_col, relevant_col).toArrow()
    if table.num_rows == 0:
        raise ValueError(f"queries table {path} is empty")
    vectors = batch_matrix(table.combine_chunks().to_batches()[0], vector_col, dimension)
    if not np.isfinite(vectors).all():
        raise ValueError(f"queries table {path}: non-finite query vector at row {int(np.argmin(np.isfinite(vectors).all(axis=1)))}")
    ids = np.asarray(table.column(id_col).to_numpy(zero_copy_only=False), dtype=np.int64)
    relevant = [np.atleast_1d(np.asarray(r if r is not None else [], dtype=np.int64))
                for r in table.column(relevant_col).to_pylist()]
    empty = [i for i, r in enumerate(relevant) if r.size == 0]
    if empty:
        raise ValueError(f"queries table {path}: {len(empty)} query(ies) without a relevant id, first "
                         f"{id_col}={ids[empty[0]]}; recall and nDCG are undefined for them")
    return QuerySet(ids, vectors, relevant)


def distributed_top_k(df: DataFrame, vector_col: str, id_col: str, dimension: int,
                      candidates: Mapping[str, FittedTransform | None], queries: np.ndarray, k: int,
                      query_ids: np.ndarray | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Exact cosine top-k of raw ``queries`` (m, d) over ``df`` for every candidate transform (None = raw).

    ``query_ids`` (m,): when given, the corpus row with a query's own id is never retrieved for it.
    Returns {candidate: (scores (m, k), ids (m, k))}, best first, ties by smaller id.
    """
    require_integral(df, id_col, "corpus id")
    names = list(candidates)
    m = queries.shape[0]
    per_candidate = [unit_rows(candidates[name].apply(queries) if candidates[name] else queries) for name in names]
    spark = df.sparkSession
    shared = spark.sparkContext.broadcast((per_candidate, None if query_ids is None else np.asarray(query_ids)))
    transforms = [candidates[name] for name in names]

    def fold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        qs, qids = shared.value
        best = [empty_top_k(m, k) for _ in names]
        for batch in batches:
            if not batch.num_rows:
                continue
            x = batch_matrix(batch, vector_col, dimension)
            ids = np.asarray(batch.column(batch.schema.get_field_index(id_col)).to_numpy(zero_copy_only=False),
                             dtype=np.int64)
            for c, transform in enumerate(transforms):
                docs = transform.apply(x) if transform is not None else x
                best[c] = merge_top_k(best[c], block_top_k(qs[c], docs, ids, k, qids))
        payload = np.stack([s for s, _ in best]).tobytes() + np.stack([i for _, i in best]).tobytes()
        yield pa.RecordBatch.from_pydict({"payload": [payload]}, schema=pa.schema([("payload", pa.binary())]))

    def unpack(payload: bytes) -> list[tuple[np.ndarray, np.ndarray]]:
        half = len(names) * m * k
        scores = np.frombuffer(payload, dtype=np.float64, count=half).reshape(len(names), m, k)
        ids = np.frombuffer(payload, dtype=np.int64, offset=half * 8).reshape(len(names), m, k)
        return [(scores[c], ids[c]) for c in range(len(names))]

    def combine(a, b):
        return [merge_top_k(x, y) for x, y in zip(a, b)]

    try:
        partials = df.select(vector_col, id_col).mapInArrow(fold, "payload binary")
        merged = tree_reduce(partials.rdd.map(lambda row: unpack(bytes(row["payload"]))), combine)
    finally:
        shared.unpersist()
    return dict(zip(names, merged))


def pair_cosines(df: DataFrame, vector_col: str, id_col: str, dimension: int, pairs: DataFrame,
                 candidates: Mapping[str, FittedTransform | None], id_a: str = "id_a", id_b: str = "id_b",
                 score: str = "score") -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Cosine of every (id_a, id_b) pair under every candidate, and the pairs' gold scores.

    Raises naming the first pair whose id is not in the corpus (never a silent drop) or whose score is null.
    Returns ({candidate: (p,) cosines}, (p,) scores).
    """
    require_columns(pairs.columns, [id_a, id_b, score], "pairs")
    corpus = df.select(F.col(id_col).alias("_id"), F.col(vector_col).alias("_v"))
    joined = (pairs.select(F.col(id_a).alias("_a"), F.col(id_b).alias("_b"), F.col(score).cast("double").alias("_s"))
              .join(corpus.withColumnRenamed("_v", "_va"), F.col("_a") == F.col("_id"), "left").drop("_id")
              .join(corpus.withColumnRenamed("_v", "_vb"), F.col("_b") == F.col("_id"), "left").drop("_id"))
    bad = joined.where(F.col("_va").isNull() | F.col("_vb").isNull() | F.col("_s").isNull()).limit(1).collect()
    if bad:
        row = bad[0]
        raise ValueError(f"pair ({id_a}={row['_a']}, {id_b}={row['_b']}): "
                         + ("score is null" if row["_s"] is None else "id not found in the corpus"))
    names = list(candidates)
    transforms = [candidates[name] for name in names]

    def cosines(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            a, b = batch_matrix(batch, "_va", dimension), batch_matrix(batch, "_vb", dimension)
            columns = [batch.column(batch.schema.get_field_index("_s"))]
            for transform in transforms:
                ta, tb = (transform.apply(a), transform.apply(b)) if transform is not None else (a, b)
                columns.append(pa.array(np.einsum("ij,ij->i", unit_rows(ta), unit_rows(tb)), pa.float64()))
            yield pa.RecordBatch.from_arrays(columns, names=["_s"] + [f"c{i}" for i in range(len(names))])

    schema = "_s double, " + ", ".join(f"c{i} double" for i in range(len(names)))
    table = joined.select("_s", "_va", "_vb").mapInArrow(cosines, schema).toArrow()
    return ({name: table.column(f"c{i}").to_numpy() for i, name in enumerate(names)},
            table.column("_s").to_numpy())


def evaluate_candidates(df: DataFrame, vector_col: str, id_col: str, dimension: int,
                        candidates: Mapping[str, FittedTransform | None], queries: QuerySet | None = None,
                        pairs: DataFrame | None = None, k: int = 10, exclude_self: bool = False,
                        pair_cols: tuple[str, str, str] = ("id_a", "id_b", "score")) -> dict[str, dict[str, float]]:
    """Score every candidate (None = raw vectors): recall@k and nDCG@k of ``queries`` against the whole
    corpus, Spearman ρ of ``pairs``. Each candidate transforms only the corpus batches it scores, the
    queries and the paired vectors. ``exclude_self``: a query never retrieves the corpus row with its id.
    Returns {candidate: {metric: value}}."""
    if queries is None and pairs is None:
        raise ValueError("evaluation needs queries, pairs or both")
    scores: dict[str, dict[str, float]] = {name: {} for name in candidates}
    if queries is not None:
        top = distributed_top_k(df, vector_col, id_col, dimension, candidates, queries.vectors, k,
                                queries.ids if exclude_self else None)
        for name, (_, ids) in top.items():
            scores[name].update(retrieval_metrics(ids, queries.relevant))
    if pairs is not None:
        cos, gold = pair_cosines(df, vector_col, id_col, dimension, pairs, candidates, *pair_cols)
        for name, values in cos.items():
            scores[name]["spearman"] = spearman(values, gold)
    return scores
