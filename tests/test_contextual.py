"""Chapter-4 contextual measures: the seed's worked examples, brute-force cross-checks, and Spark == numpy."""

import itertools

import numpy as np
import pytest

from anisotropy_core.contextual import (
    GroupSums,
    adjust,
    contextual_report,
    group_sums,
    mev,
    pooled_anisotropy,
    pooling_report,
    ranking,
    self_similarity,
    static_vector,
)
from anisotropy_core.moments import Moments


def unit_vectors_with_cosines(pair_cosines):
    """Four unit vectors whose six pairwise cosines are ``pair_cosines`` in the order
    (1,2) (1,3) (1,4) (2,3) (2,4) (3,4): rows of the Cholesky factor of the Gram matrix."""
    gram = np.eye(4)
    upper = np.triu_indices(4, 1)
    gram[upper] = pair_cosines
    gram.T[upper] = pair_cosines
    return np.linalg.cholesky(gram)


def brute_average_cosine(x):
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    return float(np.mean([u[i] @ u[j] for i, j in itertools.combinations(range(len(u)), 2)]))


@pytest.mark.parametrize(
    "cosines, baseline, self_sim, adjusted",
    [
        ([0.991, 0.988, 0.983, 0.990, 0.986, 0.984], 0.985, 0.987, 0.002),  # layer 12
        ([0.81, 0.77, 0.79, 0.76, 0.80, 0.75], 0.250, 0.780, 0.530),  # layer 1
    ],
)
def test_run_at_two_layers(cosines, baseline, self_sim, adjusted):
    occurrences = unit_vectors_with_cosines(cosines)
    s = GroupSums.of_batch(occurrences)
    assert s.average_cosine() == pytest.approx(self_sim, abs=1e-12)
    assert self_similarity(s.n, s.sum_unit) == pytest.approx(self_sim, abs=1e-12)
    got = adjust({"run": s.average_cosine()}, {12: baseline}, {"run": 12})["run"]
    assert got == pytest.approx(adjusted, abs=1e-12)


def test_four_occurrences_two_senses():
    angles = np.radians([20, 25, 65, 70])
    x = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    s = GroupSums.of_batch(x)
    np.testing.assert_allclose(s.sum_unit / 4, [0.65266, 0.65266], atol=5e-6)
    assert s.average_cosine() == pytest.approx(0.802572, abs=1e-6)
    assert s.average_cosine() == pytest.approx(brute_average_cosine(x), abs=1e-14)
    # scaling an occurrence does not change any cosine
    assert GroupSums.of_batch(x * [[3.0], [0.2], [1.0], [7.0]]).average_cosine() == pytest.approx(
        0.8025725018936839, abs=1e-14
    )


def test_cross_layer_reordering_table():
    raw = {"mortgage": 0.962, "crane": 0.804, "the": 0.978, "photosynthesis": 0.851, "bat": 0.905}
    layer_of = {"mortgage": 11, "crane": 6, "the": 12, "photosynthesis": 6, "bat": 9}
    baselines = {11: 0.955, 6: 0.410, 12: 0.981, 9: 0.760}
    adjusted = adjust(raw, baselines, layer_of)
    expected = {"mortgage": 0.007, "crane": 0.394, "the": -0.003, "photosynthesis": 0.441, "bat": 0.145}
    for word, value in expected.items():
        assert adjusted[word] == pytest.approx(value, abs=1e-12)
    assert ranking(raw) == ["the", "mortgage", "bat", "photosynthesis", "crane"]
    assert ranking(adjusted) == ["photosynthesis", "crane", "bat", "mortgage", "the"]


def test_mev_and_its_floor():
    rng = np.random.default_rng(0)
    # 10 isotropic occurrences in d=50: floor 1/9; one dominant direction pushes MEV far above it
    iso = rng.normal(size=(10, 50))
    spiky = iso + np.outer(rng.normal(size=10) * 20, np.eye(50)[0])
    for x in (iso, spiky):
        lam = np.linalg.svd(x - x.mean(0), compute_uv=False) ** 2
        got = mev(Moments.of_batch(x))
        assert got["mev"] == pytest.approx(lam[0] / lam.sum(), abs=1e-12)
        assert got["mev_floor"] == pytest.approx(1 / 9)
        assert got["m"] == 10
    assert mev(Moments.of_batch(spiky))["mev_over_floor"] > 5
    # with m > d the floor is 1/d (rank is capped by the dimension)
    assert mev(Moments.of_batch(rng.normal(size=(30, 4))))["mev_floor"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="at least 2"):
        mev(Moments.of_batch(iso[:1]))
    # identical occurrences (a [CLS] token at the input layer): nothing to explain, reported as None
    assert mev(Moments.of_batch(np.tile(iso[:1], (5, 1)))) == {
        "m": 5,
        "mev": None,
        "mev_floor": 0.25,
        "mev_over_floor": None,
    }


def token_corpus(seed=0, d=16):
    """Three layers of token vectors with a rising common direction; words repeat across sentences."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=d)
    word_vec = {w: rng.normal(size=d) for w in ["the", "bank", "run", "river", "money", "fast"]}
    rows = []
    for layer, lean in [(0, 0.1), (1, 1.0), (2, 4.0)]:
        for sentence in range(12):
            words = rng.choice(list(word_vec), size=5 + sentence % 3)
            context = rng.normal(size=d)
            for w in words:
                rows.append(
                    (
                        layer,
                        str(w),
                        f"s{sentence}",
                        lean * shared + word_vec[w] + (0.5 + layer) * context + 0.3 * rng.normal(size=d),
                    )
                )
    layers, words, sentences, vecs = zip(*rows)
    return np.array(layers), list(words), list(sentences), np.stack(vecs)


def test_report_against_brute_force():
    layers, words, sentences, x = token_corpus()
    rep = contextual_report(x, layers, words, sentences)
    baselines = {r["layer"]: r["baseline"] for r in rep["layers"]}
    for layer, value in baselines.items():
        assert value == pytest.approx(brute_average_cosine(x[layers == layer]), abs=1e-12)
    assert baselines[0] < baselines[1] < baselines[2]  # the cone tightens with depth
    words_arr, sentences_arr = np.array(words), np.array(sentences)
    for row in rep["words"]:
        occ = x[(layers == row["layer"]) & (words_arr == row["word"])]
        assert row["n"] == len(occ)
        assert row["self_sim"] == pytest.approx(brute_average_cosine(occ), abs=1e-12)
        assert row["adjusted_self_sim"] == pytest.approx(row["self_sim"] - baselines[row["layer"]], abs=1e-15)
        lam = np.linalg.svd(occ - occ.mean(0), compute_uv=False) ** 2
        assert row["mev"] == pytest.approx(lam[0] / lam.sum(), abs=1e-12)
        assert row["mev_floor"] == pytest.approx(1 / min(len(occ) - 1, x.shape[1]))
    for row in rep["sentences"]:
        toks = x[(layers == row["layer"]) & (sentences_arr == row["sentence"])]
        centroid = toks.mean(0)
        brute = np.mean([t @ centroid / np.linalg.norm(t) / np.linalg.norm(centroid) for t in toks])
        assert row["intra_sim"] == pytest.approx(brute, abs=1e-12)
    assert len(rep["words"]) == 18 and len(rep["sentences"]) == 36


def test_group_sums_merge_and_wire_format():
    _, _, _, x = token_corpus()
    keys = ["a" if i % 3 else "b" for i in range(len(x))]
    whole = group_sums(x, keys)
    parts = [group_sums(x[:40], keys[:40]), group_sums(x[40:], keys[40:])]
    for key in whole:
        merged = parts[0][key].merge(parts[1][key])
        back = GroupSums.from_array(merged.to_array())
        assert back.n == whole[key].n
        np.testing.assert_allclose(back.sum_unit, whole[key].sum_unit, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(back.sum_raw, whole[key].sum_raw, rtol=1e-13, atol=1e-13)


def test_zero_vector_is_rejected():
    with pytest.raises(ValueError, match="zero-length"):
        group_sums(np.array([[1.0, 0.0], [0.0, 0.0]]), ["a", "a"])


def test_spark_matches_numpy(spark):
    from anisotropy_spark.contextual import contextual_dataframe

    layers, words, sentences, x = token_corpus(seed=3)
    rows = [
        (int(i), int(layer), w, s, [float(v) for v in vec])
        for i, (layer, w, s, vec) in enumerate(zip(layers, words, sentences, x))
    ]
    df = spark.createDataFrame(rows, "id long, layer int, word string, sentence string, vector array<double>")
    got = contextual_dataframe(df.repartition(3), "vector", x.shape[1])
    want = contextual_report(x, layers, words, sentences)
    assert [r["layer"] for r in got["layers"]] == [r["layer"] for r in want["layers"]]
    for section in ("layers", "words", "sentences"):
        assert len(got[section]) == len(want[section])
        for g, w in zip(got[section], want[section]):
            assert g.keys() == w.keys()
            for key, value in w.items():
                if isinstance(value, float):
                    assert g[key] == pytest.approx(value, abs=1e-10), (section, key)
                else:
                    assert g[key] == value
    assert [(r["layer"], r["word"]) for r in got["static_vectors"]] == [
        (r["layer"], r["word"]) for r in want["static_vectors"]
    ]
    for g, w in zip(got["static_vectors"], want["static_vectors"]):
        np.testing.assert_allclose(g["vector"], w["vector"], atol=1e-8)
    assert got["pooling"]["recommended_layer"] == want["pooling"]["recommended_layer"]
    for g, w in zip(got["pooling"]["layers"], want["pooling"]["layers"]):
        assert g == {k: pytest.approx(v, abs=1e-9) if isinstance(v, float) else v for k, v in w.items()}


def test_spark_layer_baselines_only_with_empty_partitions(spark):
    from anisotropy_spark.contextual import contextual_dataframe

    layers, words, sentences, x = token_corpus(seed=5)
    rows = [(int(layer), [float(v) for v in vec]) for layer, vec in zip(layers[::20], x[::20])]
    df = spark.createDataFrame(rows, "layer int, vector array<double>").repartition(12)  # some partitions empty
    got = contextual_dataframe(df, "vector", x.shape[1], word_col=None, sentence_col=None)
    want = contextual_report(x[::20], layers[::20], words[::20], sentences[::20])
    assert got["words"] == [] and got["sentences"] == []
    assert [r["layer"] for r in got["layers"]] == [r["layer"] for r in want["layers"]]
    for g, w in zip(got["layers"], want["layers"]):
        assert g["n"] == w["n"] and g["baseline"] == pytest.approx(w["baseline"], abs=1e-12)


def test_static_vector_points_toward_the_occurrences():
    """The first PC oriented toward the occurrences' mean, whichever sign the eigen-solver returns; the
    seed's sign((X @ u1).sum()) on centred X is a sum that is 0 up to rounding."""
    rng = np.random.default_rng(7)
    direction = np.array([0.6, 0.8, 0.0, 0.0])
    for flip in (1.0, -1.0):
        occ = flip * (np.outer(2.0 + rng.normal(size=60), direction) + 0.05 * rng.normal(size=(60, 4)))
        u1 = static_vector(Moments.of_batch(occ))
        assert abs(abs(u1 @ direction) - 1) < 1e-3
        assert u1 @ occ.mean(axis=0) > 0  # toward the occurrences
        np.testing.assert_allclose(static_vector(occ[:3]), static_vector(Moments.of_batch(occ[:3])), atol=1e-10)
        centred = occ - occ.mean(axis=0)
        assert abs((centred @ u1).sum()) < 1e-10 * np.abs(centred @ u1).sum()  # the seed's rule has no sign
    assert static_vector(np.tile([1.0, 2.0, 3.0], (4, 1))) is None


def test_pooled_anisotropy_model_and_fingerprint():
    """h = c + g, G/C = 0.5: pooled baseline 1/(1 + 0.25/m) — 0.8 for one token, rising with m — recovered
    by a simulation, with the token-count correlation of the pooled u1 as its fingerprint."""
    assert pooled_anisotropy(0.5, 1) == pytest.approx(0.8)
    assert pooled_anisotropy(0.5, 16) == pytest.approx(1 / (1 + 0.25 / 16))
    rng = np.random.default_rng(8)
    d = 256
    shared = rng.normal(size=d)
    shared *= 1.0 / np.linalg.norm(shared)
    rows = []
    for layer, ratio in [(0, 5.0), (1, 0.5), (2, 0.25)]:
        for sentence in range(120):
            m = 2 + sentence % 15
            g = rng.normal(size=(m, d)) * ratio / np.sqrt(d)
            rows += [(layer, f"s{sentence}", shared + gi) for gi in g]
    layers, sentences, x = zip(*rows)
    sums = group_sums(np.stack(x), list(zip(layers, sentences)))
    baselines = {layer: s.average_cosine() for layer, s in group_sums(np.stack(x), list(layers)).items()}
    report = pooling_report(sums, baselines)
    by_layer = {r["layer"]: r for r in report["layers"]}
    assert by_layer[1]["shared_over_idiosyncratic"] == pytest.approx(0.5, rel=0.1)
    assert by_layer[1]["token_baseline"] == pytest.approx(0.8, abs=0.02)
    assert by_layer[1]["pooled_A"] > by_layer[1]["token_baseline"] + 0.1  # pooling amplifies
    assert by_layer[1]["predicted_pooled_A"] == pytest.approx(by_layer[1]["pooled_A"], abs=0.02)
    assert by_layer[0]["u1_token_count_corr"] > 0.5  # the length fingerprint
    assert report["recommended_layer"] == 1  # lowest pooled A above 0
