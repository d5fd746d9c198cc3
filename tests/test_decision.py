"""The chapter-9 decision: every branch on synthetic clouds with known geometry, plus the guards."""
import numpy as np
import pytest

from anisotropy_core import diagnose
from anisotropy_core.clustering import assign, cluster_diagnostics, cluster_moments, fit_cluster_recenter, prepare
from anisotropy_core.decision import DecisionThresholds, recommend, whitening_k
from anisotropy_core.diagnostics import artefact_test, project_on_u1
from anisotropy_core.synthetic import cone, mixture, pencil

N, D = 2000, 16


def clusters_of(X, k, seed=0):
    """Per-cluster diagnostics of (n, d) X for a k-means fit (what the nightly job passes in)."""
    _, result = fit_cluster_recenter(X, k, seed=seed)
    ids = assign(prepare(X, "euclidean"), result.centroids, "euclidean")[0]
    return cluster_diagnostics(cluster_moments(X, ids, k))


def two_topics(n=N, d=D, seed=0):
    """The seed's chapter-7 example lifted to d dims: clusters at ±2·e1, isotropic σ = 0.5; labels 0/1."""
    rng = np.random.default_rng(seed)
    labels = np.repeat([0, 1], n // 2)
    X = rng.normal(scale=0.5, size=(n, d))
    X[:, 0] += np.where(labels == 0, 2.0, -2.0)
    return X, labels


def test_isotropic_embedder_gets_nothing():
    rec = recommend(diagnose(np.random.default_rng(0).normal(size=(N, D))))
    assert rec.method == "none" and rec.D is None and rec.k is None
    assert "already isotropic" in rec.reasons[0] and "failure six" in rec.reasons[0]
    assert rec.warnings == []


def test_offset_only_cloud_is_centred():
    r = diagnose(cone(N, D, offset=12.0, alpha=0.0, seed=1))
    assert r["anisotropy_A"] / r["isotropic_sd"] > 3.0 and r["mp_above_upper"] == 0
    rec = recommend(r)
    assert rec.method == "center"
    assert "offset dominates" in rec.reasons[0]


def test_offset_within_threshold_is_left_alone_and_threshold_is_configurable():
    r = diagnose(cone(N, D, offset=6.0, alpha=0.0, seed=1))          # A ≈ 2.8 isotropic SDs at d = 16
    assert recommend(r).method == "none"
    assert recommend(r, thresholds=DecisionThresholds(offset_sigmas=2.0)).method == "center"


def test_one_dominant_direction_gets_abtt_with_measured_D():
    r = diagnose(pencil(N, D, length=5.0, seed=3) + 3.0)
    rec = recommend(r)
    assert rec.method == "abtt" and rec.D == 1 == r["mp_above_upper"]
    assert rec.evidence["D_rule"] == "marchenko_pastur"
    # issue 13: the Marchenko–Pastur count is uncapped by default (three spikes → D = 3); max_D is an optional cap
    X = np.random.default_rng(4).normal(size=(N, D))
    X[:, :3] *= [3.0, 2.5, 2.2]
    r3 = diagnose(X)
    assert r3["mp_above_upper"] == 3
    assert recommend(r3).D == 3 and recommend(r3).evidence["D_rule"] == "marchenko_pastur"
    assert recommend(r3).directions == [1, 2, 3]
    capped = recommend(r3, thresholds=DecisionThresholds(max_D=1))
    assert capped.D == 1 and capped.evidence["D_rule"] == "marchenko_pastur_capped"


def test_steep_spectrum_gets_whitening_k():
    r = diagnose(cone(N, D, offset=2.0, alpha=2.0, seed=4))
    rec = recommend(r)
    assert rec.method == "whitening" and rec.D is None
    share = np.cumsum(r["spectrum"]) / r["spectrum"].sum()
    assert share[rec.k - 1] >= 0.95 > share[rec.k - 2]
    assert recommend(r, thresholds=DecisionThresholds(steep_alpha=2.5)).method == "abtt"


def test_whitening_k_is_capped_by_rank():
    assert whitening_k(np.ones(16), n=5, variance=1.0) == 4
    assert whitening_k(np.array([3.0, 1.0, 0.0]), n=100, variance=0.75) == 1
    assert whitening_k(np.array([3.0, 1.0, 0.0]), n=100, variance=0.76) == 2


def test_mixture_gets_cluster_recentering_instead_of_global_abtt():
    X, _ = mixture(N, D, (0.5, 0.5), separation=8.0, seed=5)
    r = diagnose(X)
    assert recommend(r).method == "abtt"              # without cluster diagnostics: the dangerous answer
    rec = recommend(r, clusters_of(X, 2))
    assert rec.method == "cluster_recenter" and rec.k == 2
    assert rec.evidence["clusters_locally_isotropic"] is True
    assert "globally anisotropic, locally isotropic" in rec.reasons[0]


def test_unequal_mixture_is_caught_by_induced_anisotropy():
    """Seed 90/10 arithmetic: global centring leaves population B with induced A ≈ 0.81/1.81 ≈ 0.45."""
    X, _ = mixture(N, D, (0.9, 0.1), separation=6.0, seed=6)
    clusters = clusters_of(X, 2)
    clusters = {**clusters, "locally_isotropic": False}        # isolate the second criterion
    rec = recommend(diagnose(X), clusters)
    assert rec.method == "cluster_recenter"
    assert rec.evidence["worst_induced_A"] >= 0.2 and "induced anisotropy" in rec.reasons[0]


def test_isotropic_clusters_do_not_trigger_cluster_recentering():
    X = np.random.default_rng(7).normal(size=(N, D))
    assert recommend(diagnose(X), clusters_of(X, 2)).method == "none"


def test_label_along_u1_warns_and_protects_the_direction():
    X, labels = two_topics()
    r = diagnose(X)
    artefact = artefact_test(project_on_u1(X, r), labels=labels)
    rec = recommend(r, artefact=artefact)
    assert rec.method == "center" and rec.D is None
    assert any("the direction may be the answer" in w for w in rec.warnings)
    assert rec.evidence["label_separation"] == pytest.approx(4.0 / np.sqrt(r["spectrum"][0]), rel=0.05)
    unprotected = recommend(r, artefact=artefact, thresholds=DecisionThresholds(protect_label_direction=False))
    assert unprotected.method == "abtt" and unprotected.warnings


def test_length_artefact_supports_removal_and_both_at_once_warns():
    r = diagnose(pencil(N, D, length=5.0, seed=3) + 3.0)
    rec = recommend(r, artefact={"abs_corr": {"token_count": 0.78, "char_length": None}, "label_means": {}})
    assert rec.method == "abtt"
    assert any("u1 is an artefact" in reason and "token_count" in reason for reason in rec.reasons)
    X, labels = two_topics()
    r2 = diagnose(X)
    both = {"abs_corr": {"token_count": 0.7}, "label_means": artefact_test(project_on_u1(X, r2), labels=labels)["label_means"]}
    warning = recommend(r2, artefact=both).warnings[0]
    assert "artefact and signal at once" in warning


def test_small_sample_and_rank_collapse_warnings():
    X = cone(12, D, offset=12.0, seed=8)
    rec = recommend(diagnose(X))
    assert any("n = 12" in w for w in rec.warnings)
    assert any("rank collapse" in w for w in rec.warnings)


@pytest.mark.parametrize("field,value", [("spike_top1", 1.5), ("whitening_variance", 0.0), ("max_D", -1),
                                         ("steep_alpha", -0.1)])
def test_impossible_thresholds_are_reported_by_name(field, value):
    problems = DecisionThresholds(**{field: value}).check()
    assert len(problems) == 1 and field in problems[0]


# --- issue 13: decisions on evidence -------------------------------------------------------------------


def chapter9_like(seed=0):
    """A k^−1.6 cloud with an offset: the seed's chapter-9 report shape (steep, top-1 share ≈ 0.4)."""
    return cone(N, 64, offset=4.0, alpha=1.6, seed=seed)


def test_artefact_u1_is_removed_by_abtt_never_whitening():
    r = diagnose(chapter9_like())
    assert r["power_law_alpha"] >= 1.5 and r["top1_var"] > 0.3
    assert recommend(r).method == "whitening"                     # steep, no artefact evidence
    rec = recommend(r, artefact={"abs_corr": {"token_count": 0.78}, "label_means": {}})
    assert rec.method == "abtt" and rec.directions == [1] and rec.D == 1
    assert rec.evidence["D_rule"] == "artefact"
    assert any("u1 is an artefact" in reason for reason in rec.reasons)
    assert any("ABTT of these directions then whitening-k" in reason for reason in rec.reasons)


def test_artefact_on_pc3_removes_pc3_only():
    X = np.random.default_rng(4).normal(size=(N, D))
    X[:, :3] *= [3.0, 2.5, 2.2]
    r = diagnose(X)
    directions = [{"index": j, "eigenvalue": float(r["spectrum"][j - 1]), "label_separation": None,
                   "abs_corr": {"word_frequency": corr}} for j, corr in ((1, 0.41), (2, 0.05), (3, 0.65))]
    rec = recommend(r, artefact={"directions": directions})
    assert rec.method == "abtt" and rec.directions == [3]
    assert any("u3 is an artefact" in reason and "word_frequency" in reason for reason in rec.reasons)
    below_edge = [{**row, "index": 9} for row in directions[2:]]      # not above the MP edge: not evidence
    assert recommend(r, artefact={"directions": below_edge}).directions == [1, 2, 3]


def test_reasons_describe_what_the_method_does():
    r = diagnose(chapter9_like())
    rec = recommend(r)
    assert rec.method == "whitening"
    assert all("remov" not in reason for reason in rec.reasons)
    assert "rescales each to unit variance" in rec.reasons[0]


def test_label_direction_is_kept_out_of_a_non_contiguous_set():
    X = np.random.default_rng(4).normal(size=(N, D))
    X[:, :3] *= [3.0, 2.5, 2.2]
    r = diagnose(X)
    directions = [{"index": 1, "abs_corr": {"len": 0.9}, "label_separation": 2.0},
                  {"index": 3, "abs_corr": {"len": 0.9}, "label_separation": 0.1}]
    rec = recommend(r, artefact={"directions": directions})
    assert rec.method == "abtt" and rec.directions == [3]
    assert any("artefact and signal at once" in w and "u1" in w for w in rec.warnings)


def test_non_negative_data_measures_the_offset_from_the_sign_structure_null():
    from anisotropy_core.isotropy_measures import sign_structure_null
    X = np.maximum(np.random.default_rng(9).normal(size=(N, 256)), 0.0)   # dense ReLU: A ≈ 1/π
    r = diagnose(X)
    assert r["anisotropy_A"] == pytest.approx(1 / np.pi, abs=0.03)
    assert recommend(r).method == "center"                               # measured from 0: a false offset
    null = sign_structure_null(X)
    assert null["regime"] == "dense"
    rec = recommend({**r, "A_sign_null": null["null"]})
    assert rec.method == "none" and rec.evidence["A_null"] == pytest.approx(1 / np.pi)


def test_default_steep_alpha_follows_the_textbook():
    assert DecisionThresholds().steep_alpha == 1.5
