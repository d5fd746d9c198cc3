"""Uniform sample keys from a row's place (anisotropy_core.row_keys); their equality with the keys Spark SQL
computes is tested in test_kmeans_spark."""

import numpy as np
import pytest

from anisotropy_core.kmeans import KeyedSample
from anisotropy_core.row_keys import row_ids, row_keys, split_row_ids, xxhash64_long


@pytest.mark.parametrize(
    "value, seed, digest",
    [
        # XXH64 of the value's 8 little-endian bytes, from the reference implementation (the `xxhash` package 3.x,
        # xxh64(struct.pack('<q', value), seed).intdigest())
        (0, 0, 0x34C96ACDCADB1BBB),
        (1, 0, 0x9F29CB17A2A49995),
        (-5, 42, 0xB700F567D937365C),
    ],
)
def test_xxhash64_of_a_long_is_the_reference_digest(value, seed, digest):
    assert int(xxhash64_long(np.array([value]), np.uint64(seed))[0]) == digest


def test_row_ids_pack_partition_and_row_as_monotonically_increasing_id():
    ids = row_ids(3, np.array([0, 1, 2**33 - 1]))
    assert ids.tolist() == [3 * 2**33, 3 * 2**33 + 1, 4 * 2**33 - 1]
    assert split_row_ids(ids).tolist() == [[3, 0], [3, 1], [3, 2**33 - 1]]


def test_row_keys_are_uniform_and_differ_between_seeds_and_partitions():
    ids = row_ids(0, np.arange(200_000))
    keys = row_keys(5, ids)
    assert keys.min() >= 0.0 and keys.max() < 1.0
    # 20 equal bins of 10,000 expected rows each: a binomial standard deviation of ≈ 98, so ±500 is > 5σ
    assert np.abs(np.bincount((keys * 20).astype(int), minlength=20) - 10_000).max() < 500
    assert abs(np.corrcoef(keys[:-1], keys[1:])[0, 1]) < 0.01  # consecutive rows are not correlated
    assert not np.array_equal(keys, row_keys(6, ids))
    assert not np.array_equal(keys, row_keys(5, row_ids(1, np.arange(200_000))))


def test_row_sample_depends_on_rows_places_not_on_batch_boundaries():
    x = np.random.default_rng(0).standard_normal((1000, 3))
    whole = KeyedSample.of_rows(x, 4, 2, 0, 100)
    batched = KeyedSample.of_rows(x[:370], 4, 2, 0, 100).merge(KeyedSample.of_rows(x[370:], 4, 2, 370, 100))
    assert whole.n == batched.n == 1000 and whole.complete
    assert np.array_equal(whole.keys, batched.keys) and np.array_equal(whole.rows, batched.rows)
    assert np.array_equal(whole.origin, batched.origin) and set(whole.origin[:, 0]) == {2}
    assert np.array_equal(whole.keys, np.sort(row_keys(4, row_ids(2, np.arange(1000))))[:100])
