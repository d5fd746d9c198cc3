"""The input contract, checked batch by batch in numpy inside the pass that uses the rows.

A row is invalid, for the first matching reason in this order: ``null_id`` (the id is null),
``null_vector``, ``wrong_dimension:<length>``, ``non_finite`` (NaN, ±Inf or a null element), ``norm_overflow``
(finite elements whose squared length overflows float64, e.g. elements of 1e300: its covariance would be Inf),
``zero_norm`` (a squared length of 0, also when it underflows) or ``norm_outlier`` (a length above the run's ``max_norm``: see :mod:`anisotropy_core.norms`).
:func:`check_batch` splits one Arrow batch into the (B_valid, d) matrix of its valid rows, their lengths and the
per-row reasons; ``array<float>`` stays float32 (no JVM-side double copy, no batch-sized float64 copy: the consumer
casts, e.g. block by block).
:class:`Tally` counts the reasons with up to five sample ids each; partitions' tallies merge like moments.

Errors a worker raises about its rows (:class:`InvalidRowError`, :class:`ForeignDimensionError`) are
:class:`~anisotropy_spark.worker_errors.WorkerError`: the driver receives them as their own class.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .worker_errors import WorkerError

REASON_COLUMN = "invalid_reason"
SAMPLE_IDS = 5
NORM_OUTLIER = "norm_outlier"


class InvalidRowsError(ValueError):
    """Input rows violate the contract and the job was configured with ``on_invalid: error``."""


class InvalidRowError(WorkerError, InvalidRowsError):
    """The first invalid row a worker met under ``on_invalid: error``: its ``id_col`` value ``row_id``, the vector
    ``column`` and the ``reason`` (as in :func:`check_batch`)."""

    fields = ("id_col", "row_id", "column", "reason")
    id_col: str
    row_id: Any
    column: str
    reason: str

    def message(self) -> str:
        return (
            f"invalid input row: {self.reason} in column {self.column!r}, {self.id_col} [{self.row_id}]; "
            "nothing was written. Fix the input or set on_invalid: quarantine."
        )


class ForeignDimensionError(WorkerError, ValueError):
    """A batch of input rows holds vectors, but not one of the dimension the transform was fitted on: their
    ``length``, the transform's ``dimension``."""

    fields = ("length", "dimension")
    length: int
    dimension: int

    def message(self) -> str:
        return f"input vectors have dimension {self.length}, not the transform's {self.dimension}"


class SchemaError(ValueError):
    """The table does not have a column the job needs, or the column has the wrong type."""


class TransformRowError(WorkerError, ValueError):
    """The transform cannot map one row (e.g. its output overflows the output dtype): the vector ``column``, the
    row's other values ``row`` (e.g. ``{"id": 7}``; None when the row is unknown) and the ``reason``."""

    fields = ("column", "row", "reason")
    column: str
    row: dict[str, Any] | None
    reason: str

    def message(self) -> str:
        where = f"column {self.column!r}" + (f", row {self.row}" if self.row is not None else "")
        return f"{self.reason} [{where}]"


def require_columns(columns: list[str], needed: list[str], role: str) -> None:
    """:class:`SchemaError` naming every ``needed`` column (the ``role`` columns, e.g. "metadata") missing from
    ``columns`` (a DataFrame's ``.columns``)."""
    missing = [c for c in needed if c not in columns]
    if missing:
        named = f"column {missing[0]!r}" if len(missing) == 1 else f"columns {missing}"
        raise SchemaError(f"{role} {named} not found; columns are {list(columns)}")


def require_schema(columns: list[str], named: dict[str, list[str]]) -> None:
    """:func:`require_columns` for every role of ``named`` ({role: columns}) in turn: the first role with a
    missing column raises, naming them all."""
    for role, needed in named.items():
        require_columns(columns, needed, role)


@dataclass
class CheckedBatch:
    """One batch split by the contract: ``matrix`` (B_valid, d) of the valid rows in batch order, in the
    column's element type (float32 for ``array<float>``, else float64), ``lengths`` (B_valid,) float64 their
    Euclidean lengths, ``valid`` (B,) bool mask, ``reasons`` (B,) object array (None where valid) or None when all
    rows are valid, ``foreign_length``: the length of the batch's first non-null vector when the batch holds
    non-null vectors but not one of the expected dimension (rows of another embedding model), else None."""

    matrix: np.ndarray
    lengths: np.ndarray
    valid: np.ndarray
    reasons: np.ndarray | None
    foreign_length: int | None = None


def vector_column(batch: pa.RecordBatch, vector_col: str) -> pa.Array:
    """The ``vector_col`` list array of ``batch`` as one contiguous chunk."""
    column = batch.column(batch.schema.get_field_index(vector_col))
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def squared_lengths(matrix: np.ndarray) -> np.ndarray:
    """(B,) float64 squared lengths of the rows of ``matrix`` (B, d), float32 or float64, without a (B, d) float64
    copy. float32 rows are summed in float32 (a third of the time of a float64 sum); the rows whose float32 sum
    overflowed (lengths above ≈ 1.8e19), underflowed to 0 or is NaN are summed again in float64."""
    if matrix.dtype == np.float64:
        return np.einsum("ij,ij->i", matrix, matrix)
    squared = np.einsum("ij,ij->i", matrix, matrix).astype(np.float64)
    redo = ~(np.isfinite(squared) & (squared > 0))
    if redo.any():
        rows = matrix[redo].astype(np.float64)
        squared[redo] = np.einsum("ij,ij->i", rows, rows)
    return squared


def check_batch(
    batch: pa.RecordBatch, vector_col: str, id_col: str | None, dimension: int, max_norm: float | None = None
) -> CheckedBatch:
    """Apply the contract to ``batch`` (``vector_col`` list<float|double>); ``id_col`` None skips ``null_id``,
    ``max_norm`` None skips ``norm_outlier`` (rows longer than it are invalid)."""
    column = vector_column(batch, vector_col)
    rows = len(column)
    offsets = np.asarray(column.offsets)
    lengths = np.diff(offsets)
    values = column.values.to_numpy(zero_copy_only=False)  # float32 stays float32; null elements → NaN
    null_vector = column.is_null().to_numpy(zero_copy_only=False) if column.null_count else np.zeros(rows, bool)
    shaped = ~null_vector & (lengths == dimension)
    if shaped.all():
        start = offsets[0] if rows else 0
        matrix = values[start : start + rows * dimension].reshape(rows, dimension)
    else:
        matrix = values[offsets[:-1][shaped][:, None] + np.arange(dimension)]
    with np.errstate(over="ignore", invalid="ignore"):  # NaN, Inf and overflow are reported as reasons
        squared = squared_lengths(matrix)
    finite = np.isfinite(matrix).all(axis=1)
    overflow = finite & ~np.isfinite(squared)
    nonzero = squared > 0
    outlier = squared > float(max_norm) ** 2 if max_norm is not None else np.zeros(len(squared), bool)
    null_id = np.zeros(rows, bool)
    if id_col is not None:
        ids = batch.column(batch.schema.get_field_index(id_col))
        if ids.null_count:
            null_id = ids.is_null().to_numpy(zero_copy_only=False)
    kept = finite & ~overflow & nonzero & ~outlier & ~null_id[shaped]  # over the rows of ``matrix``
    valid = shaped.copy()
    valid[shaped] = kept
    if valid.all():
        return CheckedBatch(matrix, np.sqrt(squared), valid, None)
    foreign = None
    if not shaped.any() and not null_vector.all():
        foreign = int(lengths[np.argmin(null_vector)])
    reasons = np.full(rows, None, dtype=object)
    shaped_rows = np.flatnonzero(shaped)
    reasons[shaped_rows[outlier]] = NORM_OUTLIER
    reasons[shaped_rows[~nonzero]] = "zero_norm"
    reasons[shaped_rows[overflow]] = "norm_overflow"
    reasons[shaped_rows[~finite]] = "non_finite"
    for row in np.flatnonzero(~shaped & ~null_vector):
        reasons[row] = f"wrong_dimension:{lengths[row]}"
    reasons[null_vector] = "null_vector"
    reasons[null_id] = "null_id"
    return CheckedBatch(matrix[kept], np.sqrt(squared[kept]), valid, reasons, foreign)


@dataclass
class Tally:
    """Invalid rows seen so far: ``counts`` {reason: rows} and ``samples`` {reason: up to five ids}."""

    counts: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, checked: CheckedBatch, ids: pa.Array | None) -> None:
        """Count the invalid rows of one checked batch; ``ids``: the batch's id column (None: no samples)."""
        if checked.reasons is None:
            return
        for row in np.flatnonzero(~checked.valid):
            reason = checked.reasons[row]
            self.counts[reason] = self.counts.get(reason, 0) + 1
            kept = self.samples.setdefault(reason, [])
            if ids is not None and len(kept) < SAMPLE_IDS:
                kept.append(ids[row].as_py())

    def merge(self, other: "Tally") -> "Tally":
        counts = {r: self.counts.get(r, 0) + other.counts.get(r, 0) for r in {*self.counts, *other.counts}}
        samples = {r: (self.samples.get(r, []) + other.samples.get(r, []))[:SAMPLE_IDS] for r in counts}
        return Tally(counts, samples)

    def sample_ids(self) -> list:
        """Up to five sample ids over all reasons, in reason order."""
        return [i for r in sorted(self.samples) for i in self.samples[r]][:SAMPLE_IDS]

    def to_json(self) -> str:
        return json.dumps({"counts": self.counts, "samples": self.samples}, default=str)

    @classmethod
    def from_json(cls, text: str) -> "Tally":
        return cls(**json.loads(text))


def first_invalid_error(checked: CheckedBatch, batch: pa.RecordBatch, vector_col: str, id_col: str) -> InvalidRowError:
    """The error raised in a worker for the first invalid row of ``batch`` (``on_invalid: error``)."""
    if checked.reasons is None:
        raise ValueError("first_invalid_error of a batch whose rows are all valid")
    row = int(np.argmin(checked.valid))
    row_id = batch.column(batch.schema.get_field_index(id_col))[row].as_py()
    return InvalidRowError(id_col=id_col, row_id=row_id, column=vector_col, reason=checked.reasons[row])
