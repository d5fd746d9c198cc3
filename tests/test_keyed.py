"""Keyed partial states (anisotropy_spark.keyed): byte-bounded emission and merge by key."""

import numpy as np

from anisotropy_core.moments import Moments
from anisotropy_spark.keyed import (
    EMIT_BATCH_BYTES,
    KEYED_SCHEMA,
    coalesce_to_slots,
    keyed_batches,
    merge_by_key,
    merge_moments_bytes,
)


def test_keyed_batches_stay_under_the_byte_budget_and_keep_every_state_once():
    small = {f"s{i}".encode(): bytes(1000) for i in range(50)}
    big = {
        b"big0": bytes(EMIT_BATCH_BYTES + 1),
        b"big1": bytes(EMIT_BATCH_BYTES // 2 + 1),
        b"big2": bytes(EMIT_BATCH_BYTES // 2 + 1),
    }
    states = {**small, **big}
    batches = list(keyed_batches(states))
    seen = {}
    for batch in batches:
        keys, payloads = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        size = sum(len(k) + len(p) for k, p in zip(keys, payloads))
        assert size <= EMIT_BATCH_BYTES or len(keys) == 1  # only a single oversized state travels alone
        seen.update(zip(keys, payloads))
    assert seen == states
    # 50 small states share one batch; big0 alone; big1 and big2 cannot share one (together > budget)
    assert [b.num_rows for b in batches] == [50, 1, 1, 1]
    assert list(keyed_batches({})) == []


def test_merge_by_key_merges_moments_across_partitions(spark):
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(40, 3)) + 5 for _ in range(4)]
    rows = [(key, Moments.of_batch(x[i::2]).to_bytes()) for x in parts for i, key in enumerate([b"a", b"b"])]
    partials = spark.createDataFrame(rows, KEYED_SCHEMA).repartition(3)
    merged = merge_by_key(partials, merge_moments_bytes)
    assert sorted(merged) == [b"a", b"b"]
    for i, key in enumerate([b"a", b"b"]):
        want = Moments.of_batch(np.concatenate([x[i::2] for x in parts]))
        got = Moments.from_bytes(merged[key])
        assert got.n == want.n == 80
        np.testing.assert_allclose(got.mean, want.mean, rtol=1e-13)
        np.testing.assert_allclose(got.covariance(), want.covariance(), rtol=1e-12)


def test_coalesce_to_slots_bounds_the_partitions_that_emit_states(spark):
    slots = spark.sparkContext.defaultParallelism
    many = spark.range(100).repartition(slots * 4)
    assert many.rdd.getNumPartitions() == slots * 4
    assert coalesce_to_slots(many).rdd.getNumPartitions() == slots
    few = spark.range(10).coalesce(1)
    assert coalesce_to_slots(few).rdd.getNumPartitions() == 1
    assert coalesce_to_slots(many).count() == 100
