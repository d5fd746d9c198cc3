"""A uniform random sample of about ``size`` valid rows for the driver (flow training, pictures, in-memory measures).

Every row is kept with probability ``fraction`` = 1.5·size / total (a Bernoulli sample, as Spark's
``DataFrame.sample`` draws one), then the driver keeps a uniform subset of ``size`` of the rows drawn (``limit`` would
keep the first partitions' rows and drop the last ones'). Two ways to draw:

* inside a pass that reads every row anyway (:class:`PartitionSampler`, used by the moments pass): each task draws
  from numpy's generator seeded with (seed, partition index), so the sample is fixed for a seed and a partitioning,
  and holds only the rows it drew (≈ 1.5·size expected over all tasks; never the partition). The tasks' rows travel
  as Arrow IPC payloads with the moments, and diagnose reads the table's vectors once;
* a pass of its own (:func:`anisotropy_spark.diagnostics.sample_rows`), Spark's ``sample`` then ``toArrow``.

With ``lowest`` > 0 and an integer ``id_col`` the same pass also keeps, in a mergeable form, the ``lowest`` valid
rows of smallest Spark SQL ``xxhash64(id, seed)`` (ties by id): exactly the rows
:func:`anisotropy_spark.evaluation.sample_rows` chooses by a query of their own (:func:`lowest_by_hash`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from anisotropy_core.row_keys import id_seed_hash

from .arrow import batch_matrix

OVERSAMPLING = 1.5
HASH_COLUMN = "_id_hash"


def sample_fraction(size: int, total: int) -> float:
    """The Bernoulli probability that draws ≈ ``OVERSAMPLING`` · ``size`` of ``total`` rows (at most 1)."""
    return min(1.0, OVERSAMPLING * size / max(total, 1))


@dataclass(frozen=True)
class RowSample:
    """What to draw: about ``size`` rows of a table of ``total`` rows (its count before validation), with ``seed``;
    ``columns``: the columns carried with the vector (e.g. metadata for the pictures); ``lowest``: also keep that
    many valid rows (vector and integer ``id_col``) of smallest ``xxhash64(id, seed)`` (module docstring)."""

    size: int
    total: int
    seed: int = 0
    columns: tuple[str, ...] = ()
    lowest: int = 0
    id_col: str | None = None

    @property
    def fraction(self) -> float:
        return sample_fraction(self.size, self.total)


class PartitionSampler:
    """The rows one task draws for a :class:`RowSample`, batch by batch (used inside ``mapInArrow``)."""

    def __init__(self, spec: RowSample, vector_col: str, partition: int):
        self.spec, self.columns = spec, [vector_col, *spec.columns]
        self.rng = np.random.default_rng([spec.seed, partition])
        self.drawn: list[pa.RecordBatch] = []
        self.vector_col = vector_col
        self.lowest: pa.Table | None = None

    def add(self, batch: pa.RecordBatch, valid: np.ndarray) -> None:
        """Draw from the rows of ``batch`` where ``valid`` (B,) is true; one uniform number per row of the batch."""
        keep = valid & (self.rng.random(batch.num_rows) < self.spec.fraction)
        if keep.any():
            self.drawn.append(batch.select(self.columns).filter(pa.array(keep)))
        id_col = self.spec.id_col
        if (
            self.spec.lowest
            and id_col is not None
            and pa.types.is_integer(batch.schema.field(id_col).type)
            and valid.any()
        ):
            rows = pa.Table.from_batches([batch.select([id_col, self.vector_col]).filter(pa.array(valid))])
            ids = rows.column(id_col).to_numpy()
            rows = rows.append_column(HASH_COLUMN, pa.array(id_seed_hash(ids, self.spec.seed)))
            self.lowest = lowest_by_hash([self.lowest, rows], self.spec.lowest, id_col)

    def payload(self) -> bytes | None:
        """The drawn rows as one Arrow IPC stream, or None when the task drew none."""
        if not self.drawn:
            return None
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.drawn[0].schema) as writer:
            for batch in self.drawn:
                writer.write_batch(batch)
        return sink.getvalue().to_pybytes()


def lowest_payload(sampler: "PartitionSampler | None") -> bytes | None:
    """A task's lowest-hash rows (:attr:`PartitionSampler.lowest`) as one Arrow IPC stream, or None."""
    if sampler is None or sampler.lowest is None:
        return None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, sampler.lowest.schema) as writer:
        writer.write_table(sampler.lowest)
    return sink.getvalue().to_pybytes()


def lowest_by_hash(tables: list[pa.Table | None], size: int, id_col: str) -> pa.Table | None:
    """The ``size`` rows of smallest (``_id_hash``, id) among ``tables`` (None entries skipped); None when empty.
    Associative, so partition states merge in any order to the same rows."""
    found = [t for t in tables if t is not None and t.num_rows]
    if not found:
        return None
    rows = pa.concat_tables(found)
    order = np.lexsort((rows.column(id_col).to_numpy(), rows.column(HASH_COLUMN).to_numpy()))[:size]
    return rows.take(pa.array(order))


def table_of_payload(payload: bytes | None) -> pa.Table | None:
    return None if payload is None else pa.ipc.open_stream(payload).read_all()


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
