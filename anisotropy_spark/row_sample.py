"""A uniform random sample of about ``size`` valid rows for the driver (flow training, pictures, in-memory measures).

Every row is kept with probability ``fraction`` = 1.5·size / total (a Bernoulli sample, as Spark's
``DataFrame.sample`` draws one), then the driver keeps a uniform subset of ``size`` of the rows drawn (``limit`` would
keep the first partitions' rows and drop the last ones'). Two ways to draw:

* inside a pass that reads every row anyway (:class:`PartitionSampler`, used by the moments pass): each task draws
  from numpy's generator seeded with (seed, partition index), so the sample is fixed for a seed and a partitioning,
  and holds only the rows it drew (≈ 1.5·size expected over all tasks; never the partition). The tasks' rows travel
  as Arrow IPC payloads with the moments, and diagnose reads the table's vectors once;
* a pass of its own (:func:`anisotropy_spark.diagnostics.sample_rows`), Spark's ``sample`` then ``toArrow``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .arrow import batch_matrix

OVERSAMPLING = 1.5


def sample_fraction(size: int, total: int) -> float:
    """The Bernoulli probability that draws ≈ ``OVERSAMPLING`` · ``size`` of ``total`` rows (at most 1)."""
    return min(1.0, OVERSAMPLING * size / max(total, 1))


@dataclass(frozen=True)
class RowSample:
    """What to draw: about ``size`` rows of a table of ``total`` rows (its count before validation), with ``seed``;
    ``columns``: the columns carried with the vector (e.g. metadata for the pictures)."""

    size: int
    total: int
    seed: int = 0
    columns: tuple[str, ...] = ()

    @property
    def fraction(self) -> float:
        return sample_fraction(self.size, self.total)


class PartitionSampler:
    """The rows one task draws for a :class:`RowSample`, batch by batch (used inside ``mapInArrow``)."""

    def __init__(self, spec: RowSample, vector_col: str, partition: int):
        self.spec, self.columns = spec, [vector_col, *spec.columns]
        self.rng = np.random.default_rng([spec.seed, partition])
        self.drawn: list[pa.RecordBatch] = []

    def add(self, batch: pa.RecordBatch, valid: np.ndarray) -> None:
        """Draw from the rows of ``batch`` where ``valid`` (B,) is true; one uniform number per row of the batch."""
        keep = valid & (self.rng.random(batch.num_rows) < self.spec.fraction)
        if keep.any():
            self.drawn.append(batch.select(self.columns).filter(pa.array(keep)))

    def payload(self) -> bytes | None:
        """The drawn rows as one Arrow IPC stream, or None when the task drew none."""
        if not self.drawn:
            return None
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.drawn[0].schema) as writer:
            for batch in self.drawn:
                writer.write_batch(batch)
        return sink.getvalue().to_pybytes()


def rows_of_payloads(payloads: list[bytes]) -> pa.Table | None:
    """The rows of the tasks' :meth:`PartitionSampler.payload` s, in the order given; None when there are none."""
    tables = [pa.ipc.open_stream(payload).read_all() for payload in payloads]
    return pa.concat_tables(tables) if tables else None


def keep_at_most(rows: pa.Table, size: int, seed: int = 0) -> pa.Table:
    """A uniform subset of ``size`` of ``rows`` in their order (all of them when there are not more)."""
    if rows.num_rows <= size:
        return rows
    return rows.take(pa.array(np.sort(np.random.default_rng(seed).choice(rows.num_rows, size=size, replace=False))))


def as_sample(
    rows: pa.Table, vector_col: str, dimension: int, columns: list[str] | tuple[str, ...]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(vectors (m, dimension) float64, {column: (m,) array})`` of the sampled ``rows``."""
    vectors = (
        batch_matrix(rows.combine_chunks().to_batches()[0], vector_col, dimension)
        if rows.num_rows
        else np.empty((0, dimension))
    )
    return vectors, {c: rows.column(c).to_numpy(zero_copy_only=False) for c in columns}
