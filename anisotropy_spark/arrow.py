"""Arrow record batches ↔ numpy matrices, for ``mapInArrow`` partition functions (no per-row Python)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def batch_matrix(batch: pa.RecordBatch, vector_col: str, dimension: int, dtype: type | None = np.float64) -> np.ndarray:
    """(B, dimension) ``dtype`` view of a validated ``array<float|double>`` column of an Arrow batch
    (``dtype=None``: the column's own element type, float32 or float64, without a copy).

    Raises ValueError naming the batch row if a vector is null or has another length, so a contract
    violation can never be silently reshaped into the wrong rows.
    """
    column = batch.column(batch.schema.get_field_index(vector_col))
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise ValueError(f"null vector in column {vector_col!r} at batch row {column.is_null().index(True).as_py()}")
    offsets = np.asarray(column.offsets)
    lengths = np.diff(offsets)
    if lengths.size and not (lengths == dimension).all():
        bad = int(np.argmax(lengths != dimension))
        raise ValueError(
            f"vector in column {vector_col!r} at batch row {bad} has length {lengths[bad]}, expected {dimension}"
        )
    values = np.asarray(column.values.to_numpy(zero_copy_only=False), dtype=dtype)
    start = offsets[0] if offsets.size else 0
    return values[start : start + len(column) * dimension].reshape(len(column), dimension)


def matrix_column(matrix: np.ndarray, dtype: type = np.float64, valid: np.ndarray | None = None) -> pa.Array:
    """Arrow ``list<double>`` (``dtype`` float32: ``list<float>``) array from a (B, d) matrix, one list per row.

    ``valid``: optional (N,) bool mask with B true entries; the result then has N rows, the matrix rows at the
    true entries and null lists elsewhere.
    """
    matrix = np.ascontiguousarray(matrix, dtype=dtype)
    rows, d = matrix.shape
    if valid is None:
        offsets = pa.array(np.arange(0, (rows + 1) * d, d, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, pa.array(matrix.ravel()))
    lengths = np.where(valid, d, 0).astype(np.int32)
    offsets = pa.array(
        np.concatenate([[0], np.cumsum(lengths, dtype=np.int32)]), mask=np.concatenate([~valid, [False]])
    )
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.ravel()))
