"""Issue 13 E/F: exact distributed top-k against a brute-force reference, the metrics, candidates, the gate."""
import time

import numpy as np
import pytest

from anisotropy_core.candidates import choose_candidate, evaluation_record, fit_candidates, quality_gate
from anisotropy_core.evaluation import (block_top_k, empty_top_k, merge_top_k, ndcg_at_k, recall_at_k, spearman,
                                        unit_rows)
from anisotropy_core.moments import Moments
from anisotropy_core.synthetic import cone


def brute_force(queries, docs, doc_ids, k, query_ids=None):
    """Reference: every cosine, a full sort (score descending, id ascending)."""
    scores = unit_rows(queries) @ unit_rows(docs).T
    if query_ids is not None:
        scores[query_ids[:, None] == doc_ids[None, :]] = -np.inf
    order = np.lexsort((np.broadcast_to(doc_ids, scores.shape), -scores), axis=-1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), doc_ids[order]


def test_blocked_merge_equals_brute_force_in_any_order():
    rng = np.random.default_rng(0)
    docs, queries = rng.normal(size=(500, 8)), rng.normal(size=(40, 8))
    ids = rng.permutation(10_000)[:500].astype(np.int64)
    docs[17] = docs[3]                                    # an exact tie: broken by the smaller id
    queries[5] = docs[3]
    ref = brute_force(queries, docs, ids, 7)
    unit = unit_rows(queries)
    blocks = [slice(0, 130), slice(130, 131), slice(131, 400), slice(400, 500)]
    parts = [block_top_k(unit, docs[b], ids[b], 7, max_cells=40 * 9) for b in blocks]   # slices of 9 rows
    forward, backward = empty_top_k(40, 7), empty_top_k(40, 7)
    for part in parts:
        forward = merge_top_k(forward, part)
    for part in reversed(parts):
        backward = merge_top_k(backward, part)
    for got in (forward, backward):
        assert np.array_equal(got[1], ref[1]) and np.allclose(got[0], ref[0], atol=1e-12)
    assert ref[1][5, 0] == min(ids[3], ids[17])


def test_own_id_is_excluded_and_short_blocks_pad():
    rng = np.random.default_rng(1)
    docs = rng.normal(size=(6, 4))
    ids = np.arange(6, dtype=np.int64)
    got = block_top_k(unit_rows(docs[:2]), docs, ids, 3, query_ids=ids[:2])
    assert (got[1][:, 0] != ids[:2]).all()
    short = block_top_k(unit_rows(docs[:1]), docs[:2], ids[:2], 4)
    assert list(short[1][0, 2:]) == [-1, -1] and np.isneginf(short[0][0, 2:]).all()


def test_recall_ndcg_and_spearman_by_hand():
    retrieved = np.array([[1, 2, 3], [4, 5, 6]])
    relevant = [np.array([2, 9]), np.array([4, 5, 6, 7])]
    # q0: 1 hit of min(3, 2) = 2 → 0.5; q1: 3 of 3 → 1.0
    assert recall_at_k(retrieved, relevant) == pytest.approx(0.75)
    ndcg0 = (1 / np.log2(3)) / (1 + 1 / np.log2(3))
    assert ndcg_at_k(retrieved, relevant) == pytest.approx((ndcg0 + 1.0) / 2)
    assert spearman(np.array([1.0, 2.0, 3.0, 4.0]), np.array([10.0, 20.0, 20.0, 40.0])) == pytest.approx(
        np.corrcoef([1, 2, 3, 4], [1, 2.5, 2.5, 4])[0, 1])
    with pytest.raises(ValueError, match="query row 1"):
        recall_at_k(retrieved, [np.array([2]), np.array([], dtype=np.int64)])


def test_candidates_from_one_state_choice_and_gate():
    x = cone(1000, 12, offset=3.0, alpha=1.2, seed=2)
    fitted = fit_candidates(Moments.of_batch(x), directions=[1, 3], k=5)
    assert list(fitted) == ["none", "center", "abtt", "whitening", "abtt+whitening"]
    assert fitted["none"] is None and fitted["abtt"].directions == [1, 3]
    assert fitted["abtt+whitening"].d_out == 5
    assert "abtt" not in fit_candidates(Moments.of_batch(x), directions=[], k=5)
    scores = {"none": {"ndcg@10": 0.5}, "center": {"ndcg@10": 0.6}, "abtt": {"ndcg@10": 0.6},
              "whitening": {"ndcg@10": 0.4}}
    assert choose_candidate(scores, "ndcg@10") == "center"          # a tie goes to the simpler candidate
    record = evaluation_record(scores, "ndcg@10")
    assert record["raw"] == {"ndcg@10": 0.5} and record["chosen"] == "center"
    assert quality_gate(scores["none"], scores["center"], 0.0)[0]
    passes, reason = quality_gate({"ndcg@10": 0.5, "spearman": 0.8}, {"ndcg@10": 0.55, "spearman": 0.7}, 0.05)
    assert not passes and "spearman" in reason and "0.1000" in reason
    with pytest.raises(ValueError, match="max_quality_drop"):
        quality_gate(scores["none"], scores["center"], -0.1)


# --- Spark ---------------------------------------------------------------------------------------------


def corpus_frame(spark, x, ids, partitions=3):
    rows = [(int(i), [float(v) for v in row]) for i, row in zip(ids, x)]
    return spark.createDataFrame(rows, "id long, vector array<double>").repartition(partitions)


def test_distributed_top_k_matches_brute_force_for_every_candidate(spark):
    from anisotropy_spark.evaluation import distributed_top_k
    rng = np.random.default_rng(3)
    x = cone(900, 10, offset=2.0, alpha=1.0, seed=3)
    ids = rng.permutation(5000)[:900].astype(np.int64)
    queries = x[:60] + 0.05 * rng.normal(size=(60, 10))
    candidates = fit_candidates(Moments.of_batch(x), directions=[2], k=6)
    got = distributed_top_k(corpus_frame(spark, x, ids), "vector", "id", 10, candidates, queries, 5,
                            query_ids=ids[:60])
    for name, transform in candidates.items():
        docs = transform.apply(x) if transform else x
        q = transform.apply(queries) if transform else queries
        ref = brute_force(q, docs, ids, 5, query_ids=ids[:60])
        assert np.array_equal(got[name][1], ref[1]), name
        assert np.allclose(got[name][0], ref[0], atol=1e-12)


def test_evaluate_candidates_queries_and_pairs(spark, tmp_path):
    from anisotropy_spark.evaluation import evaluate_candidates, read_queries
    rng = np.random.default_rng(4)
    labels = np.repeat(np.arange(4), 100)
    centres = rng.normal(size=(4, 16))
    x = centres[labels] * 0.6 + rng.normal(scale=0.5, size=(400, 16)) + 6.0 * np.eye(16)[0]   # offset cone
    ids = np.arange(400, dtype=np.int64)
    df = corpus_frame(spark, x, ids)
    qrows = [(int(i), [float(v) for v in x[i]], [int(j) for j in ids[labels == labels[i]] if j != i])
             for i in range(0, 400, 10)]
    qpath = str(tmp_path / "queries")
    spark.createDataFrame(qrows, "query_id long, vector array<double>, relevant array<long>") \
        .write.parquet(qpath)
    queries = read_queries(spark, qpath, "query_id", "vector", "relevant", 16)
    pa_, pb_ = rng.integers(0, 400, 300), rng.integers(0, 400, 300)
    gold = (labels[pa_] == labels[pb_]).astype(float) + rng.normal(scale=0.01, size=300)
    pairs = spark.createDataFrame([(int(a), int(b), float(s)) for a, b, s in zip(pa_, pb_, gold)],
                                  "id_a long, id_b long, score double")
    candidates = fit_candidates(Moments.of_batch(x), directions=[1], k=8)
    scores = evaluate_candidates(df, "vector", "id", 16, candidates, queries, pairs, k=10, exclude_self=True)
    assert set(scores) == set(candidates) and set(scores["none"]) == {"recall@10", "ndcg@10", "spearman"}
    # reference for two candidates
    for name in ("none", "center"):
        t = candidates[name]
        docs = t.apply(x) if t else x
        ref = brute_force(docs[queries.ids], docs, ids, 10, query_ids=queries.ids)   # read order
        assert scores[name]["recall@10"] == pytest.approx(recall_at_k(ref[1], queries.relevant))
        u = unit_rows(docs)
        assert scores[name]["spearman"] == pytest.approx(spearman(np.einsum("ij,ij->i", u[pa_], u[pb_]), gold))
    assert scores["center"]["recall@10"] >= scores["none"]["recall@10"]
    missing = spark.createDataFrame([(1, 99999, 0.5)], "id_a long, id_b long, score double")
    with pytest.raises(ValueError, match="id_b=99999"):
        evaluate_candidates(df, "vector", "id", 16, candidates, pairs=missing)


def test_string_ids_are_refused_by_name(spark):
    from anisotropy_spark.evaluation import distributed_top_k
    df = spark.createDataFrame([("a", [1.0, 0.0])], "id string, vector array<double>")
    with pytest.raises(ValueError, match="corpus id column 'id' must hold integer ids"):
        distributed_top_k(df, "vector", "id", 2, {"none": None}, np.ones((1, 2)), 1)


def test_bench_line_many_queries_scaled_down(spark):
    """The 10k-queries shape, scaled down (1,000 queries × 5,000 rows × d 32, k 10): exact against numpy."""
    from anisotropy_spark.evaluation import distributed_top_k
    rng = np.random.default_rng(5)
    x = rng.normal(size=(5_000, 32))
    ids = np.arange(5_000, dtype=np.int64)
    queries = rng.normal(size=(1_000, 32))
    started = time.perf_counter()
    got = distributed_top_k(corpus_frame(spark, x, ids, partitions=4), "vector", "id", 32, {"none": None}, queries, 10)
    elapsed = time.perf_counter() - started
    ref = brute_force(queries, x, ids, 10)
    assert np.array_equal(got["none"][1], ref[1])
    print(f"\nbench: distributed exact top-10, 1000 queries x 5000 rows x d 32, 4 partitions: {elapsed:.2f} s")


def test_cluster_recenter_joins_the_candidates_when_given():
    from anisotropy_core.clustering import fit_cluster_recenter
    from anisotropy_core.synthetic import mixture
    x, _ = mixture(400, 8, (0.5, 0.5), separation=8.0, seed=1)
    recenter, _ = fit_cluster_recenter(x, 2, seed=0)
    fitted = fit_candidates(Moments.of_batch(x), directions=[1], k=4, cluster_recenter=recenter)
    assert list(fitted)[-1] == "cluster_recenter" and fitted["cluster_recenter"] is recenter
