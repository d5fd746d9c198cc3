"""How to build the corpus index: the ``index:`` block of a nightly, and the index job's settings without its
input keys (:class:`jobs.index.IndexConfig`); the labelled queries its verification may use. Spark-free, so that
:mod:`jobs.nightly_config` imports no job."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from anisotropy_core.index import DEFAULT_FACTORY

if TYPE_CHECKING:
    from jobs.config import EvaluationConfig


@dataclasses.dataclass(kw_only=True)
class LabelledQueries:
    """Labelled queries for the index's nDCG verification: a Delta/Parquet table at ``path`` of (``id_col``,
    ``vector_col`` — the RAW query vector, as a user would search with —, ``relevant_col`` — one relevant corpus
    id or a list), read as the evaluation block's ``queries`` (:func:`anisotropy_spark.evaluation.read_queries`).
    ``exclude_self``: the queries are corpus rows and never retrieve their own row (the evaluation's
    ``exclude_self``)."""

    path: str
    id_col: str = "query_id"
    vector_col: str = "vector"
    relevant_col: str = "relevant"
    exclude_self: bool = False

    @classmethod
    def of_evaluation(cls, evaluation: "EvaluationConfig | None") -> "LabelledQueries | None":
        """The queries of an ``evaluation:`` block (None when it names none)."""
        if evaluation is None or not evaluation.queries:
            return None
        return cls(
            path=evaluation.queries,
            id_col=evaluation.query_id_col,
            vector_col=evaluation.query_vector_col,
            relevant_col=evaluation.relevant_col,
            exclude_self=evaluation.exclude_self,
        )


@dataclasses.dataclass(kw_only=True)
class IndexSettings:
    """How to build the index (the ``index:`` block of a nightly, or the index job without its input keys)."""

    index_dir: str
    factory: str = DEFAULT_FACTORY
    nprobe: int | None = None
    min_index_recall: float = 0.9
    k: int = 10
    train_size: int = 100_000
    query_size: int = 1_000
    seed: int = 0
    vector_col: str = "vector"
    id_col: str = "id"
    dimension: int | None = None
    merge_memory_mb: float = dataclasses.field(
        default=4096.0,
        metadata={
            "help": (
                "MiB of shards the driver merges in memory; beyond it faiss's on-disk merge writes the inverted lists to "
                "an .ivfdata file beside the index (IVF factories only) (default 4096)"
            )
        },
    )
    queries: LabelledQueries | None = dataclasses.field(
        default=None,
        metadata={
            "help": (
                "labelled queries {path, id_col, vector_col, relevant_col, exclude_self} (raw vectors): the verification "
                "also compares the index's nDCG@k with exact search's; null = not measured (the nightly then uses its "
                "evaluation block's queries, if any) (default null)"
            )
        },
    )
    max_ndcg_drop: float = dataclasses.field(
        default=0.02,
        metadata={
            "help": (
                "with queries: refuse the swap when the index's nDCG@k is below exact search's by more than this "
                "(default 0.02)"
            )
        },
    )

    def check(self) -> list[str]:
        problems = [
            f"{key} must be >= 1, got {getattr(self, key)}"
            for key in ("k", "train_size", "query_size")
            if getattr(self, key) < 1
        ]
        if self.nprobe is not None and self.nprobe < 1:
            problems.append(f"nprobe must be >= 1 or null, got {self.nprobe}")
        if not 0 <= self.min_index_recall <= 1:
            problems.append(f"min_index_recall must be in [0, 1], got {self.min_index_recall}")
        if not self.merge_memory_mb >= 0:
            problems.append(f"merge_memory_mb must be >= 0 (0: always on disk), got {self.merge_memory_mb}")
        if not 0 <= self.max_ndcg_drop <= 1:
            problems.append(f"max_ndcg_drop must be in [0, 1], got {self.max_ndcg_drop}")
        if self.dimension is not None and self.dimension < 1:
            problems.append(f"dimension must be >= 1, got {self.dimension}")
        return problems
