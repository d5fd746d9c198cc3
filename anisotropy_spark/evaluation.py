"""Retrieval quality of raw vectors and of every candidate transform, on Spark, without collecting the corpus.

* **Queries** (recall@k, nDCG@k, neighbour overlap): :func:`distributed_top_k`, ONE pass over the corpus for
  every scored list. A list (an *entry*) is a transform (None = raw) and the rows of the query matrix it scores
  — e.g. one entry per (candidate, fold), each fold's queries scored by the candidate fitted without them. The
  transformed, unit-length queries of every entry are broadcast once. Each partition streams its Arrow batches;
  per batch it transforms the batch once per distinct transform (only the batch, never a stored copy), scores
  each entry's queries with one GEMM per slice of rows (:func:`anisotropy_core.evaluation.block_top_k`) and
  folds the result into that entry's running top-k. A partition emits one row — every entry's partial lists —
  and the rows are combined with ``treeReduce`` (:func:`anisotropy_core.evaluation.merge_top_k`). Memory per
  task is O(Σ m_e·k + slice), independent of the corpus size; the driver holds O(Σ m_e·k).
* **Pairs** (Spearman ρ): :func:`pair_rows` joins the (id_a, id_b, score) table with the corpus twice (Spark
  joins) and brings the two vectors of every pair to the driver — the pairs table's size, never the corpus's —
  where every candidate's cosine is computed.
* **A sample of corpus rows** (:func:`sample_rows`): the seeded rows the neighbour-overlap check queries with.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from anisotropy_core.evaluation import block_top_k, empty_top_k, merge_top_k, unit_rows
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
        raise ValueError(
            f"{role} column {column!r} must hold integer ids for the evaluation, got {kind.simpleString()}"
        )


def read_queries(
    spark: SparkSession, path: str, id_col: str, vector_col: str, relevant_col: str, dimension: int
) -> QuerySet:
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
        raise ValueError(
            f"queries table {path}: non-finite query vector at row {int(np.argmin(np.isfinite(vectors).all(axis=1)))}"
        )
    ids = np.asarray(table.column(id_col).to_numpy(zero_copy_only=False), dtype=np.int64)
    relevant = [
        np.atleast_1d(np.asarray(r if r is not None else [], dtype=np.int64))
        for r in table.column(relevant_col).to_pylist()
    ]
    empty = [i for i, r in enumerate(relevant) if r.size == 0]
    if empty:
        raise ValueError(
            f"queries table {path}: {len(empty)} query(ies) without a relevant id, first "
            f"{id_col}={ids[empty[0]]}; recall and nDCG are undefined for them"
        )
    return QuerySet(ids, vectors, relevant)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One scored top-k list of :func:`distributed_top_k`: ``transform`` (None = raw vectors) and ``rows`` (m_e,),
    the indices of the query-matrix rows it scores."""

    transform: FittedTransform | None
    rows: np.ndarray


def distributed_top_k(
    df: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    candidates: Mapping[str, FittedTransform | None],
    queries: np.ndarray,
    k: int,
    query_ids: np.ndarray | None = None,
    rows: Mapping[str, np.ndarray] | None = None,
    corpus_rows: np.ndarray | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Exact cosine top-k of raw ``queries`` (m, d) over ``df`` for every candidate transform (None = raw), in
    one pass (module docstring).

    ``rows``: {candidate: indices into ``queries``} the candidate scores (default: every query).
    ``query_ids`` (m,) with ``corpus_rows`` (m,) bool (default: all True): a query that is a corpus row never
    retrieves the row with its own id, and every such id must be a corpus id (else ValueError naming it). An
    entry may not mix corpus-row queries with outside ones.
    Returns {candidate: (scores (m_e, k), ids (m_e, k))}, best first, ties by smaller id.
    """
    require_integral(df, id_col, "corpus id")
    m = queries.shape[0]
    names = list(candidates)
    own = np.ones(m, dtype=bool) if corpus_rows is None else np.asarray(corpus_rows, dtype=bool)
    qids = None if query_ids is None else np.asarray(query_ids, dtype=np.int64)
    entries = [
        Entry(
            candidates[name],
            np.arange(m) if rows is None or name not in rows else np.asarray(rows[name], dtype=np.int64),
        )
        for name in names
    ]
    distinct = list({id(e.transform): e.transform for e in entries}.values())
    slot = {id(t): i for i, t in enumerate(distinct)}
    per_transform = [unit_rows(t.apply(queries) if t is not None else queries) for t in distinct]
    plan = []  # (transform slot, unit queries (m_e, d_out), own ids (m_e,) or None)
    for name, entry in zip(names, entries):
        excluded = own[entry.rows] if qids is not None else np.zeros(entry.rows.shape[0], dtype=bool)
        if excluded.any() and not excluded.all():
            raise ValueError(f"entry {name!r} mixes queries that are corpus rows with queries that are not")
        plan.append(
            (
                slot[id(entry.transform)],
                per_transform[slot[id(entry.transform)]][entry.rows],
                qids[entry.rows] if qids is not None and excluded.any() else None,
            )
        )
    wanted = np.unique(qids[own]) if qids is not None else np.zeros(0, dtype=np.int64)
    sizes = [p[1].shape[0] for p in plan]
    shared = df.sparkSession.sparkContext.broadcast((plan, wanted))

    def fold(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        entries_, ids_wanted = shared.value
        best = [empty_top_k(q.shape[0], k) for _, q, _ in entries_]
        found = np.zeros(ids_wanted.shape[0], dtype=bool)
        for batch in batches:
            if not batch.num_rows:
                continue
            x = batch_matrix(batch, vector_col, dimension)
            ids = np.asarray(
                batch.column(batch.schema.get_field_index(id_col)).to_numpy(zero_copy_only=False), dtype=np.int64
            )
            found |= np.isin(ids_wanted, ids)
            docs = [t.apply(x) if t is not None else x for t in distinct]
            for e, (t_slot, q, own_ids) in enumerate(entries_):
                best[e] = merge_top_k(best[e], block_top_k(q, docs[t_slot], ids, k, own_ids))
        payload = b"".join(
            [
                np.concatenate([s.ravel() for s, _ in best]).tobytes(),
                np.concatenate([i.ravel() for _, i in best]).tobytes(),
                found.tobytes(),
            ]
        )
        yield pa.RecordBatch.from_pydict({"payload": [payload]}, schema=pa.schema([("payload", pa.binary())]))

    total = sum(sizes) * k

    def unpack(payload: bytes):
        scores = np.frombuffer(payload, dtype=np.float64, count=total)
        ids = np.frombuffer(payload, dtype=np.int64, count=total, offset=total * 8)
        found = np.frombuffer(payload, dtype=bool, offset=total * 16)
        bounds = np.cumsum([0] + sizes) * k
        lists = [(scores[a:b].reshape(-1, k), ids[a:b].reshape(-1, k)) for a, b in zip(bounds[:-1], bounds[1:])]
        return lists, found

    def combine(a, b):
        return [merge_top_k(x, y) for x, y in zip(a[0], b[0])], a[1] | b[1]

    try:
        partials = df.select(vector_col, id_col).mapInArrow(fold, "payload binary")
        merged, found = tree_reduce(partials.rdd.map(lambda row: unpack(bytes(row["payload"]))), combine)
    finally:
        shared.unpersist()
    if not found.all():
        raise ValueError(
            f"query id {int(wanted[np.argmin(found)])} is not an id of the corpus: a query marked as a "
            "corpus row (exclude_self) must be one"
        )
    return dict(zip(names, merged))


@dataclasses.dataclass
class PairRows:
    """The pairs of an evaluation on the driver: ``id_a``, ``id_b`` (p,), ``gold`` (p,) scores, ``a``, ``b`` (p, d)
    float64 raw vectors of the two rows of each pair."""

    id_a: np.ndarray
    id_b: np.ndarray
    gold: np.ndarray
    a: np.ndarray
    b: np.ndarray

    def keys(self) -> list[str]:
        """One text key per pair (what the selection / report split hashes)."""
        return [f"{x}\t{y}" for x, y in zip(self.id_a.tolist(), self.id_b.tolist())]

    def distinct_rows(self) -> np.ndarray:
        """(r, d) the vectors of the distinct corpus rows the pairs use (each row once)."""
        ids = np.concatenate([self.id_a, self.id_b])
        _, first = np.unique(ids.astype(str) if ids.dtype.kind not in "iu" else ids, return_index=True)
        return np.concatenate([self.a, self.b])[np.sort(first)]


def pair_rows(
    df: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int,
    pairs: DataFrame,
    id_a: str = "id_a",
    id_b: str = "id_b",
    score: str = "score",
) -> PairRows:
    """The pairs table joined with the corpus ``df``, collected (:class:`PairRows`). Raises naming the first pair
    whose id is not in the corpus (never a silent drop) or whose score is null."""
    require_columns(pairs.columns, [id_a, id_b, score], "pairs")
    corpus = df.select(F.col(id_col).alias("_id"), F.col(vector_col).alias("_v"))
    joined = (
        pairs.select(F.col(id_a).alias("_a"), F.col(id_b).alias("_b"), F.col(score).cast("double").alias("_s"))
        .join(corpus.withColumnRenamed("_v", "_va"), F.col("_a") == F.col("_id"), "left")
        .drop("_id")
        .join(corpus.withColumnRenamed("_v", "_vb"), F.col("_b") == F.col("_id"), "left")
        .drop("_id")
    )
    table = joined.select("_a", "_b", "_s", "_va", "_vb").toArrow().combine_chunks()
    if table.num_rows == 0:
        raise ValueError("pairs table is empty")
    va, vb, gold = table.column("_va"), table.column("_vb"), table.column("_s")
    bad = np.asarray(va.is_null()) | np.asarray(vb.is_null()) | np.asarray(gold.is_null())
    if bad.any():
        i = int(np.argmax(bad))
        a, b = table.column("_a")[i].as_py(), table.column("_b")[i].as_py()
        raise ValueError(
            f"pair ({id_a}={a}, {id_b}={b}): "
            + ("score is null" if not gold[i].is_valid else "id not found in the corpus")
        )
    batch = table.to_batches()[0]
    return PairRows(
        table.column("_a").to_numpy(zero_copy_only=False),
        table.column("_b").to_numpy(zero_copy_only=False),
        gold.to_numpy(),
        batch_matrix(batch, "_va", dimension),
        batch_matrix(batch, "_vb", dimension),
    )


def pair_cosines(rows: PairRows, transform: FittedTransform | None) -> np.ndarray:
    """(p,) cosine of each pair's two vectors under ``transform`` (None = raw)."""
    a, b = (transform.apply(rows.a), transform.apply(rows.b)) if transform is not None else (rows.a, rows.b)
    return np.einsum("ij,ij->i", unit_rows(a), unit_rows(b))


def integral_ids(df: DataFrame, id_col: str) -> tuple[DataFrame, str]:
    """(``df``, an integer id column): ``id_col`` itself when it holds integers, else its 64-bit hash
    ``_row_hash`` (the neighbour-overlap check needs integer ids; a collision is a 2⁻⁶⁴ event per pair)."""
    if isinstance(df.schema[id_col].dataType, INTEGRAL):
        return df, id_col
    return df.withColumn("_row_hash", F.xxhash64(F.col(id_col))), "_row_hash"


def sample_rows(
    df: DataFrame, vector_col: str, id_col: str, dimension: int, size: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(ids (s,) int64, vectors (s, d)) of ``size`` corpus rows chosen by a seeded hash of the (integer) id: the
    same rows for the same ids and seed, in one pass (each partition keeps its ``size`` lowest hashes)."""
    table = (
        df.select(id_col, vector_col)
        .orderBy(F.xxhash64(F.col(id_col), F.lit(seed)), id_col)
        .limit(size)
        .toArrow()
        .combine_chunks()
    )
    if table.num_rows == 0:
        raise ValueError("no corpus rows to sample")
    ids = np.asarray(table.column(id_col).to_numpy(zero_copy_only=False), dtype=np.int64)
    return ids, batch_matrix(table.to_batches()[0], vector_col, dimension)
