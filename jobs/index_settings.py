"""How to build the corpus index: the ``index:`` block of a nightly, and the index job's settings without its
input keys (:class:`jobs.index.IndexConfig`). Spark-free, so that :mod:`jobs.nightly_config` imports no job."""
from __future__ import annotations

import dataclasses

from anisotropy_core.index import DEFAULT_FACTORY


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

    def check(self) -> list[str]:
        problems = [f"{key} must be >= 1, got {getattr(self, key)}" for key in ("k", "train_size", "query_size")
                    if getattr(self, key) < 1]
        if self.nprobe is not None and self.nprobe < 1:
            problems.append(f"nprobe must be >= 1 or null, got {self.nprobe}")
        if not 0 <= self.min_index_recall <= 1:
            problems.append(f"min_index_recall must be in [0, 1], got {self.min_index_recall}")
        if self.dimension is not None and self.dimension < 1:
            problems.append(f"dimension must be >= 1, got {self.dimension}")
        return problems
