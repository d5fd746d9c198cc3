"""Issue 13 E/F: exact distributed top-k against a brute-force reference, the metrics, candidates, the gate.
Issue 43: the candidate grid, the exact removal of rows from a moments state, the bootstrap intervals, the
decision that follows them, and the held-out scoring in one pass."""

import time

import numpy as np
import pytest

from anisotropy_core.bootstrap import (
    folds_of,
    interval,
    mean_draws,
    rank_rows,
    resample_indices,
    selection_half,
    spearman_rows,
)
from anisotropy_core.candidates import (
    Candidate,
    candidate_grid,
    decide,
    fit_grid,
    query_drift,
    refuse_explicit,
    summarise,
)
from anisotropy_core.evaluation import (
    average_ranks,
    block_top_k,
    empty_top_k,
    merge_top_k,
    ndcg_at_k,
    neighbour_overlap,
    recall_at_k,
    spearman,
    unit_rows,
)
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
    docs[17] = docs[3]  # an exact tie: broken by the smaller id
    queries[5] = docs[3]
    ref = brute_force(queries, docs, ids, 7)
    unit = unit_rows(queries)
    blocks = [slice(0, 130), slice(130, 131), slice(131, 400), slice(400, 500)]
    parts = [block_top_k(unit, docs[b], ids[b], 7, max_cells=40 * 9) for b in blocks]  # slices of 9 rows
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
        np.corrcoef([1, 2, 3, 4], [1, 2.5, 2.5, 4])[0, 1]
    )
    with pytest.raises(ValueError, match="query row 1"):
        recall_at_k(retrieved, [np.array([2]), np.array([], dtype=np.int64)])


def test_candidate_grid_from_one_state():
    x = cone(1000, 200, offset=3.0, alpha=1.2, seed=2)
    state = Moments.of_batch(x)
    grid = candidate_grid(state, artefact=[1, 3], extra_D=[2, [1, 3]], extra_k=[50, 1000])
    names = [c.name for c in grid]
    assert names[:2] == ["none", "center"] and len(set(names)) == len(names)
    abtt = {c.directions: c for c in grid if c.family == "abtt"}
    assert (1,) in abtt and (1, 2) in abtt and (1, 3) in abtt  # d/100 = 2, the artefact set
    assert abtt[(1, 2)].origin == ("d/100", "recommendation") and abtt[(1, 3)].name == "abtt [1, 3]"
    assert abtt[(1, 3)].origin == ("artefact", "recommendation")
    mp = max(abtt, key=len)
    assert abtt[mp].origin == ("marchenko_pastur",) and len(mp) > 2  # the MP count: the upper end
    ks = sorted(c.k for c in grid if c.family == "whitening")
    assert 50 in ks and 100 in ks and max(ks) == 200  # d/4, d/2, 1000 capped at d
    combo = next(c for c in grid if c.family == "abtt+whitening")
    assert combo.directions == (1, 3) and combo.k <= 198
    fitted = fit_grid(state, grid)
    assert fitted["none"] is None and fitted["abtt [1, 3]"].directions == [1, 3]
    assert fitted[combo.name].d_out == combo.k
    # a small fold caps every D and k at the rank its rows span (n < d)
    small = candidate_grid(Moments.of_batch(x[:60]), artefact=[1])
    assert all(len(c.directions) <= 59 and (c.k or 0) <= 59 for c in small)
    assert not any(c.family == "cluster_recenter" for c in grid)


def test_remove_is_the_exact_inverse_of_merge():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(500, 12)) * np.linspace(3, 0.1, 12) + 1e3  # a large offset: the hard case
    whole, part = Moments.of_batch(x), Moments.of_batch(x[rng.permutation(500)[:120]])
    keep = np.ones(500, dtype=bool)
    keep[rng.permutation(500)[:120]] = False
    part = Moments.of_batch(x[~keep])
    rest, direct = whole.remove(part), Moments.of_batch(x[keep])
    assert rest.n == direct.n == keep.sum()
    for name in ("mean", "comoment", "sum_unit"):
        got, want = getattr(rest, name), getattr(direct, name)
        assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max(), name
    assert rest.sum_norm == pytest.approx(direct.sum_norm, rel=1e-12)
    assert np.allclose(rest.merge(part).comoment, whole.comoment, rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match="nothing would remain"):
        part.remove(whole)


def test_a_fold_fit_never_sees_its_own_query_rows():
    """Every candidate fitted on state − fold equals the direct fit on the remaining rows."""
    from jobs.config import EvaluationConfig
    from jobs.evaluation import held_out_states
    from anisotropy_spark.evaluation import QuerySet

    x = cone(600, 16, offset=2.0, alpha=1.3, seed=4)
    ids = np.arange(1000, 1600, dtype=np.int64)
    picked = np.arange(0, 600, 5)
    queries = QuerySet(ids[picked], x[picked], [np.array([0])] * picked.shape[0])
    state = Moments.of_batch(x)
    states, fold_of = held_out_states(state, queries, EvaluationConfig(queries="q", exclude_self=True, folds=3))
    assert sorted(states) == [0, 1, 2] and np.array_equal(fold_of, folds_of(ids[picked], 3))
    grid = candidate_grid(state, artefact=[2], min_n=min(s.n for s in states.values()))
    for f, fold_state in states.items():
        remaining = np.setdiff1d(np.arange(600), picked[fold_of == f])
        direct = fit_grid(Moments.of_batch(x[remaining]), grid)
        for name, transform in fit_grid(fold_state, grid).items():
            if transform is not None:
                assert np.abs(transform.apply(x) - direct[name].apply(x)).max() < 1e-9, (f, name)


def test_hash_splits_are_stable_and_balanced():
    ids = np.arange(10_000, dtype=np.int64) * 7 + 3
    half = selection_half(ids)
    assert 0.47 < half.mean() < 0.53 and np.array_equal(half, selection_half(ids[::-1])[::-1])
    folds = folds_of(ids, 5)
    assert set(np.unique(folds)) == set(range(5)) and np.bincount(folds).min() > 1800
    assert np.abs(np.corrcoef(half, folds)[0, 1]) < 0.05  # independent hash bits
    assert selection_half(["a\t1", "b\t2"]).dtype == bool


def test_paired_bootstrap_covers_a_known_difference():
    """A candidate better than raw by exactly 0.05 per query on average: the 95 % interval covers 0.05 in about
    95 % of repetitions, and the pairing makes it far narrower than the unpaired spread."""
    rng = np.random.default_rng(0)
    covered, widths = 0, []
    for rep in range(200):
        raw = rng.uniform(0, 1, size=120)
        better = raw + 0.05 + rng.normal(scale=0.1, size=120)
        draws = mean_draws(np.stack([raw, better]), resample_indices(120, 500, seed=rep))
        ci = interval(better.mean() - raw.mean(), draws[:, 1] - draws[:, 0])
        covered += ci["low"] <= 0.05 <= ci["high"]
        widths.append(ci["high"] - ci["low"])
    assert 0.90 <= covered / 200 <= 0.99
    assert np.mean(widths) < 0.05  # 4 × 0.1/√120 ≈ 0.037, not the 0.3 of raw


def test_spearman_rows_and_ranks_match_the_scalar_version():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 5, size=(6, 40)).astype(float)  # many ties
    y = rng.normal(size=(6, 40))
    assert np.allclose(rank_rows(x), np.stack([average_ranks(row) for row in x]))
    assert np.allclose(spearman_rows(x, y), [spearman(a, b) for a, b in zip(x, y)])


def evidence_for(gain_raw, gain_published=None, m=400, seed=0):
    """Per-query nDCG of raw, a candidate and (optionally) the published transform with known mean gains."""
    rng = np.random.default_rng(seed)
    raw = rng.uniform(0, 1, size=m)
    metrics = {"none": {"ndcg@10": raw}, "abtt D=1": {"ndcg@10": raw + gain_raw + rng.normal(scale=0.05, size=m)}}
    if gain_published is not None:
        metrics["published"] = {
            "ndcg@10": metrics["abtt D=1"]["ndcg@10"] - gain_published + rng.normal(scale=0.05, size=m)
        }
    return summarise(list(metrics), metrics, np.arange(m, dtype=np.int64), seed=seed, resamples=500)


def test_the_decision_follows_the_intervals():
    clear = evidence_for(0.05)
    action, chosen, reason = decide(clear, "ndcg@10", 0.0, published=False)
    assert (action, chosen) == ("publish", "abtt D=1") and "exceeds min_gain 0" in reason
    assert clear.intervals["abtt D=1"]["delta_vs_published"] is None
    # not significantly better than raw: nothing published yet → none (the vectors unchanged)
    action, chosen, reason = decide(evidence_for(0.0), "ndcg@10", 0.0, published=False)
    assert (action, chosen) == ("keep", "none") and reason.startswith("published none (the vectors unchanged)")
    # a demanding min_gain: the interval is named in the reason
    action, chosen, reason = decide(clear, "ndcg@10", 0.2, published=True)
    delta = clear.intervals["abtt D=1"]["delta_vs_raw"]["ndcg@10"]
    assert (action, chosen) == ("keep", "published") and f"[{delta['low']:+.4f}, {delta['high']:+.4f}]" in reason
    assert reason.startswith("kept the published transform: best candidate abtt D=1 Δ ndcg@10 vs raw")
    # better than raw but not than the published transform → keep it
    action, chosen, reason = decide(evidence_for(0.05, gain_published=0.0), "ndcg@10", 0.0, published=True)
    assert (action, chosen) == ("keep", "published") and "but Δ vs the published transform" in reason
    action, chosen, _ = decide(evidence_for(0.05, gain_published=0.05), "ndcg@10", 0.0, published=True)
    assert (action, chosen) == ("publish", "abtt D=1")
    # a candidate the neighbour gate would refuse is left out of the choice, and named
    action, chosen, reason = decide(clear, "ndcg@10", 0.0, False, {"abtt D=1": "neighbour overlap 0.100 < 0.25"})
    assert (action, chosen) == ("keep", "none") and "left out: abtt D=1: neighbour overlap 0.100 < 0.25" in reason


def test_an_explicit_method_worse_than_raw_is_refused():
    worse = evidence_for(-0.05)
    passes, reason = refuse_explicit(worse.intervals["abtt D=1"], 0.0)
    assert not passes and reason.startswith("quality gate: ndcg@10 Δ vs raw -0.0")
    assert "is below -max_quality_drop 0 (the interval says it is worse than raw)" in reason
    assert refuse_explicit(worse.intervals["abtt D=1"], 0.1)[0]  # within the allowed drop
    assert refuse_explicit(evidence_for(0.0).intervals["abtt D=1"], 0.0)[0]  # not shown worse: applied
    with pytest.raises(ValueError, match="max_quality_drop"):
        refuse_explicit(worse.intervals["abtt D=1"], -0.1)


def test_neighbour_overlap_and_query_drift():
    raw = np.array([[1, 2, 3, 4], [5, 6, 7, -1]])
    assert list(neighbour_overlap(raw, np.array([[4, 3, 9, 8], [5, -1, -1, -1]]))) == [0.5, 0.25]
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2000, 6)) * [3, 2, 1, 1, 1, 1]
    queries = rng.normal(size=(300, 6)) * [3, 2, 1, 1, 1, 1] + [0, 4, 0, 0, 0, 0]  # 2 SD off along u2
    drift = query_drift(Moments.of_batch(x), queries, 3)
    assert [row["index"] for row in drift] == [1, 2, 3]
    assert drift[1]["drift_sd"] == pytest.approx(2.0, abs=0.3) and drift[0]["drift_sd"] < 0.4


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
    candidates = fit_grid(Moments.of_batch(x), candidate_grid(Moments.of_batch(x), artefact=[2]))
    got = distributed_top_k(corpus_frame(spark, x, ids), "vector", "id", 10, candidates, queries, 5, query_ids=ids[:60])
    for name, transform in candidates.items():
        docs = transform.apply(x) if transform else x
        q = transform.apply(queries) if transform else queries
        ref = brute_force(q, docs, ids, 5, query_ids=ids[:60])
        assert np.array_equal(got[name][1], ref[1]), name
        assert np.allclose(got[name][0], ref[0], atol=1e-12)
    # entries with their own query rows, some not corpus rows (never excluded), in the same pass
    rows = {"center": np.arange(10, 30), "none": np.arange(0, 10)}
    outside = np.concatenate([np.zeros(10, dtype=bool), np.ones(50, dtype=bool)])
    part = distributed_top_k(
        corpus_frame(spark, x, ids),
        "vector",
        "id",
        10,
        {"none": None, "center": candidates["center"]},
        queries,
        5,
        ids[:60],
        rows,
        outside,
    )
    assert part["none"][1].shape == (10, 5)
    assert np.array_equal(part["none"][1], brute_force(queries[:10], x, ids, 5)[1])
    c = candidates["center"]
    assert np.array_equal(part["center"][1], brute_force(c.apply(queries[10:30]), c.apply(x), ids, 5, ids[10:30])[1])
    with pytest.raises(ValueError, match="query id 99999 is not an id of the corpus"):
        distributed_top_k(
            corpus_frame(spark, x, ids), "vector", "id", 10, {"none": None}, queries[:2], 5, np.array([ids[0], 99999])
        )


def test_held_out_evaluation_in_one_pass_queries_pairs_and_overlap(spark, tmp_path, monkeypatch):
    """Every (candidate, fold) list and the neighbour-overlap lists in ONE distributed pass; the scores equal a
    numpy reference that fits each fold on the corpus without that fold's query rows; pairs are scored by fits
    without the pairs' rows; every candidate carries its intervals."""
    from anisotropy_core.bootstrap import selection_half
    from anisotropy_core.decision import Recommendation
    from anisotropy_core.evaluation import per_query_ndcg
    from jobs import evaluation as job
    from jobs.config import EvaluationConfig

    rng = np.random.default_rng(4)
    labels = np.repeat(np.arange(4), 100)
    centres = rng.normal(size=(4, 16))
    x = centres[labels] * 0.6 + rng.normal(scale=0.5, size=(400, 16)) + 6.0 * np.eye(16)[0]  # offset cone
    ids = np.arange(400, dtype=np.int64)
    df = corpus_frame(spark, x, ids)
    picked = np.arange(0, 400, 5)
    relevant = [ids[(labels == labels[i]) & (ids != i)] for i in picked]
    qrows = [(int(i), [float(v) for v in x[i]], [int(j) for j in rel]) for i, rel in zip(picked, relevant)]
    qpath, ppath = str(tmp_path / "queries"), str(tmp_path / "pairs")
    spark.createDataFrame(qrows, "query_id long, vector array<double>, relevant array<long>").write.parquet(qpath)
    pa_, pb_ = rng.integers(0, 400, 120), rng.integers(0, 400, 120)
    gold = (labels[pa_] == labels[pb_]).astype(float) + rng.normal(scale=0.01, size=120)
    spark.createDataFrame(
        [(int(a), int(b), float(g)) for a, b, g in zip(pa_, pb_, gold)], "id_a long, id_b long, score double"
    ).write.parquet(ppath)
    calls = []
    real = job.distributed_top_k
    monkeypatch.setattr(job, "distributed_top_k", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    config = EvaluationConfig(queries=qpath, pairs=ppath, exclude_self=True, k=5, folds=3, resamples=300)
    state = Moments.of_batch(x)
    record, fitted, grid = job.run_evaluation(
        spark, df, "vector", "id", 16, state, Recommendation("center"), config, overlap=job.OverlapSample(rows=40, k=5)
    )
    assert len(calls) == 1  # queries × folds × candidates + overlap
    names = [c.name for c in grid]
    assert list(record["candidates"]) == names and set(names) >= {"none", "center", "abtt D=1"}
    assert record["evidence"] == "labelled" and record["metric"] == "ndcg@5" and record["queries"] == 80
    assert record["held_out"] == {
        "folds": 3,
        "query_rows_removed": True,
        "pair_rows_removed": len(np.unique(np.concatenate([pa_, pb_]))),
    }
    half = selection_half(picked)
    assert record["split"]["queries_selection"] == half.sum() and record["split"]["queries_report"] == (~half).sum()
    fold_of = folds_of(picked, 3)
    for c in grid[:3]:  # none, center, abtt D=1
        scores = np.empty(80)
        for f in range(3):
            keep = np.setdiff1d(np.arange(400), picked[fold_of == f])
            t = fit_grid(Moments.of_batch(x[keep]), [c])[c.name]
            docs, q = (t.apply(x), t.apply(x[picked[fold_of == f]])) if t else (x, x[picked[fold_of == f]])
            ref = brute_force(q, docs, ids, 5, query_ids=picked[fold_of == f])[1]
            scores[fold_of == f] = per_query_ndcg(ref, [relevant[i] for i in np.flatnonzero(fold_of == f)])
        assert record["candidates"][c.name]["ndcg@5"] == pytest.approx(scores[~half].mean(), abs=1e-12), c.name
        assert record["selection"][c.name]["ndcg@5"] == pytest.approx(scores[half].mean(), abs=1e-12), c.name
        t = fit_grid(Moments.of_batch(np.delete(x, np.unique(np.concatenate([pa_, pb_])), axis=0)), [c])[c.name]
        u = unit_rows(t.apply(x) if t else x)
        keys = selection_half([f"{a}\t{b}" for a, b in zip(pa_, pb_)])
        cos = np.einsum("ij,ij->i", u[pa_], u[pb_])
        assert record["candidates"][c.name]["spearman"] == pytest.approx(spearman(cos[~keys], gold[~keys]), abs=1e-9)
    for name in names:
        delta = record["intervals"][name]["delta_vs_raw"]
        assert (
            set(delta) == {"recall@5", "ndcg@5", "spearman"} and record["intervals"][name]["delta_vs_published"] is None
        )
        assert delta["ndcg@5"]["low"] <= delta["ndcg@5"]["mean"] <= delta["ndcg@5"]["high"]
    assert record["intervals"]["none"]["delta_vs_raw"]["ndcg@5"] == {"mean": 0.0, "low": 0.0, "high": 0.0}
    assert record["neighbour_overlap"]["none"] == 1.0 and 0 <= record["neighbour_overlap"]["center"] <= 1
    assert record["decision"]["candidate"] == record["chosen"] and record["best"] in names
    assert fitted["center"] is not None and record["query_drift"] is None
    missing = spark.createDataFrame([(1, 99999, 0.5)], "id_a long, id_b long, score double")
    from anisotropy_spark.evaluation import pair_rows

    with pytest.raises(ValueError, match="id_b=99999"):
        pair_rows(df, "vector", "id", 16, missing)


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
    from anisotropy_core.cluster_recenter import fit_cluster_recenter
    from anisotropy_core.synthetic import mixture

    x, _ = mixture(400, 8, (0.5, 0.5), separation=8.0, seed=1)
    recenter, _ = fit_cluster_recenter(x, 2, seed=0)
    grid = candidate_grid(Moments.of_batch(x), artefact=[1], cluster_recenter=True)
    fitted = fit_grid(Moments.of_batch(x), grid, cluster_recenter=recenter)
    assert list(fitted)[-1] == "cluster_recenter" and fitted["cluster_recenter"] is recenter
    assert grid[-1] == Candidate("cluster_recenter", "cluster_recenter")
