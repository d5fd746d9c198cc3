"""Uniform sample keys of table rows, from the row's place in its partition alone (a counter-based hash, no
generator state), computed bit for bit as Spark SQL computes them.

A row is named by its partition p and its index r within the partition, packed as Spark's
``monotonically_increasing_id()`` packs them: ``p · 2³³ + r``. Its key is the top 53 bits of XXH64 of
(seed, that id), scaled into [0, 1): exactly ``shiftrightunsigned(xxhash64(CAST(seed AS BIGINT), id), 11) · 2⁻⁵³``
in Spark SQL (``xxhash64`` hashes its arguments in order from the seed 42, each as 8 bytes). A Spark job can
therefore draw the keys on the JVM and ship only the rows it keeps, while this numpy version reproduces the
same sample from in-memory partitions (the reference and the tests).
"""

from __future__ import annotations

import numpy as np

ROW_ID_PARTITION_SHIFT = 33  # monotonically_increasing_id(): partition index in the upper 31 bits
SPARK_XXHASH64_SEED = 42  # the seed Spark SQL's xxhash64 starts from
KEY_BITS = 53  # a double's mantissa: keys are multiples of 2⁻⁵³ in [0, 1)

_PRIME_1, _PRIME_2, _PRIME_3, _PRIME_4, _PRIME_5 = (
    np.uint64(p)
    for p in (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
)


def _rotate_left(x: np.ndarray, bits: int) -> np.ndarray:
    return (x << np.uint64(bits)) | (x >> np.uint64(64 - bits))


def _avalanche(h: np.ndarray) -> np.ndarray:
    """XXH64's final mix (Spark's ``XXH64.fmix``) of uint64 states ``h``."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(33))
        h = h * _PRIME_2
        h = h ^ (h >> np.uint64(29))
        h = h * _PRIME_3
        return h ^ (h >> np.uint64(32))


def xxhash64_long(values: np.ndarray, seed: np.ndarray | np.uint64) -> np.ndarray:
    """(m,) uint64 XXH64 of 8-byte values ``values`` (m,) (int64 or uint64) from ``seed`` (a uint64, or (m,)):
    what Spark's ``XXH64.hashLong`` returns, as unsigned bits."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    with np.errstate(over="ignore"):
        h = np.asarray(seed, dtype=np.uint64) + _PRIME_5 + np.uint64(8)
        h = h ^ (_rotate_left(v * _PRIME_2, 31) * _PRIME_1)
        return _avalanche(_rotate_left(h, 27) * _PRIME_1 + _PRIME_4)


def xxhash64_int(values: np.ndarray, seed: np.ndarray | np.uint64) -> np.ndarray:
    """(m,) uint64 XXH64 of 4-byte values ``values`` (m,) (int32) from ``seed``: Spark's ``XXH64.hashInt``."""
    v = np.asarray(values).astype(np.int32, copy=False).view(np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = np.asarray(seed, dtype=np.uint64) + _PRIME_5 + np.uint64(4)
        h = h ^ (v * _PRIME_1)
        return _avalanche(_rotate_left(h, 23) * _PRIME_2 + _PRIME_3)


def id_seed_hash(ids: np.ndarray, seed: int) -> np.ndarray:
    """(m,) int64 Spark SQL's ``xxhash64(id, seed)`` of integer ids (m,) and an int ``seed`` literal, as
    ``F.xxhash64(F.col(id), F.lit(seed))`` computes it: a 64-bit id is hashed as a long, a narrower one as an int,
    then the seed as an int."""
    ids = np.asarray(ids)
    start = np.uint64(SPARK_XXHASH64_SEED)
    first = xxhash64_long(ids, start) if ids.dtype.itemsize == 8 else xxhash64_int(ids, start)
    return xxhash64_int(np.full(ids.shape[0], seed, dtype=np.int32), first).view(np.int64)


def row_ids(partition: int, rows: np.ndarray) -> np.ndarray:
    """(m,) int64 ``monotonically_increasing_id()`` of rows ``rows`` (m,) (indices within ``partition``)."""
    return (np.int64(partition) << np.int64(ROW_ID_PARTITION_SHIFT)) + np.asarray(rows, dtype=np.int64)


def split_row_ids(ids: np.ndarray) -> np.ndarray:
    """(m, 2) int64 (partition, row index within it) of ``monotonically_increasing_id()`` values ``ids`` (m,)."""
    ids = np.asarray(ids, dtype=np.int64)
    return np.stack([ids >> ROW_ID_PARTITION_SHIFT, ids & ((1 << ROW_ID_PARTITION_SHIFT) - 1)], axis=1)


def row_keys(seed: int, ids: np.ndarray) -> np.ndarray:
    """(m,) float64 uniform keys in [0, 1) of the rows with ``monotonically_increasing_id()`` ``ids`` (m,), for
    ``seed`` (module docstring: Spark SQL computes the same numbers)."""
    seeded = xxhash64_long(np.array([seed], dtype=np.int64), np.uint64(SPARK_XXHASH64_SEED))[0]
    return (xxhash64_long(ids, seeded) >> np.uint64(64 - KEY_BITS)).astype(np.float64) * 2.0**-KEY_BITS
