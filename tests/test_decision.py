"""The chapter-9 decision: every branch on synthetic clouds with known geometry, plus the guards."""

import numpy as np
import pytest

from anisotropy_core import diagnose
from anisotropy_core.artefact_evidence import sample_artefact_test
from anisotropy_core.cluster_diagnostics import cluster_diagnostics, cluster_moments
from anisotropy_core.cluster_recenter import fit_cluster_recenter
from anisotropy_core.kmeans import assign, prepare
from anisotropy_core.decision import DecisionThresholds, recommend, whitening_k
from anisotropy_core.diagnostics import project_on_u1
from anisotropy_core.synthetic import cone, mixture, pencil
from anisotropy_core.transforms import fit_abtt

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
    r = diagnose(cone(N, D, offset=6.0, alpha=0.0, seed=1))  # A ≈ 2.8 isotropic SDs at d = 16
    assert recommend(r).method == "none"
    assert recommend(r, thresholds=DecisionThresholds(offset_sigmas=2.0)).method == "center"


def test_one_dominant_direction_without_evidence_is_a_candidate_not_a_deletion():
    """Issue 43: directions above the Marchenko–Pastur edge are not evidence; they become the candidate grid."""
    r = diagnose(pencil(N, D, length=5.0, seed=3) + 3.0)
    rec = recommend(r)
    assert rec.method == "center" and rec.D is None and rec.verified
    assert any("ABTT D ∈ {1..1}" in reason and "unverified, not applied" in reason for reason in rec.reasons)
    X = np.random.default_rng(4).normal(size=(N, D))
    X[:, :3] *= [3.0, 2.5, 2.2]
    r3 = diagnose(X)
    assert r3["mp_above_upper"] == 3
    rec3 = recommend(r3)
    assert rec3.method == "none" and rec3.directions is None and rec3.verified
    assert rec3.evidence["candidate_D"] == [1, 3] and rec3.evidence["rule_of_thumb_D"] == 1
    assert rec3.evidence["mp_above_upper"] == 3 and "D_rule" not in rec3.evidence
    assert recommend(r3, thresholds=DecisionThresholds(max_D=1)).evidence["candidate_D"] == [1]


def test_steep_spectrum_names_whitening_k_as_an_unverified_candidate():
    r = diagnose(cone(N, D, offset=2.0, alpha=2.0, seed=4))
    rec = recommend(r)
    assert rec.method in ("center", "none") and rec.D is None and rec.k is None
    k = rec.evidence["whitening_k"]
    share = np.cumsum(r["spectrum"]) / r["spectrum"].sum()
    assert share[k - 1] >= 0.95 > share[k - 2]
    assert any(
        reason.startswith("steep spectrum")
        and f"whitening-k (k = {k})" in reason
        and "unverified, not applied" in reason
        for reason in rec.reasons
    )
    shallow = recommend(r, thresholds=DecisionThresholds(steep_alpha=2.5))
    assert shallow.method == rec.method and any(reason.startswith("dominant directions") for reason in shallow.reasons)


def test_whitening_k_is_capped_by_rank():
    assert whitening_k(np.ones(16), n=5, variance=1.0) == 4
    assert whitening_k(np.array([3.0, 1.0, 0.0]), n=100, variance=0.75) == 1
    assert whitening_k(np.array([3.0, 1.0, 0.0]), n=100, variance=0.76) == 2


def test_mixture_gets_cluster_recentering_instead_of_global_abtt():
    X, _ = mixture(N, D, (0.5, 0.5), separation=8.0, seed=5)
    r = diagnose(X)
    assert recommend(r).method != "abtt"  # issue 43: no global deletion without evidence
    rec = recommend(r, clusters_of(X, 2))
    assert rec.method == "cluster_recenter" and rec.k == 2
    assert rec.evidence["clusters_locally_isotropic"] is True
    assert "globally anisotropic, locally isotropic" in rec.reasons[0]


def test_unequal_mixture_is_caught_by_induced_anisotropy():
    """Seed 90/10 arithmetic: global centring leaves population B with induced A ≈ 0.81/1.81 ≈ 0.45."""
    X, _ = mixture(N, D, (0.9, 0.1), separation=6.0, seed=6)
    clusters = clusters_of(X, 2)
    clusters = {**clusters, "locally_isotropic": False}  # isolate the second criterion
    rec = recommend(diagnose(X), clusters)
    assert rec.method == "cluster_recenter"
    assert rec.evidence["worst_induced_A"] >= 0.2 and "induced anisotropy" in rec.reasons[0]


def test_isotropic_clusters_do_not_trigger_cluster_recentering():
    X = np.random.default_rng(7).normal(size=(N, D))
    assert recommend(diagnose(X), clusters_of(X, 2)).method == "none"


def test_label_along_u1_warns_and_protects_the_direction():
    """u1 carries the topic label and also tracks a length column: artefact and signal at once. The label's
    separation is significant under its permutation null, so protect_label_direction keeps u1."""
    X, labels = two_topics()
    r = diagnose(X)
    length = project_on_u1(X, r) * 3.0 + np.random.default_rng(1).normal(size=N)
    artefact = sample_artefact_test(X, {"length": length, "topic": labels}, r, ["length"], "topic", directions=4)
    assert artefact["directions"][0]["significant"] and artefact["directions"][0]["label_significant"]
    rec = recommend(r, artefact=artefact)
    assert rec.method in ("center", "none") and rec.D is None
    assert any("the direction may be the answer" in w and "artefact and signal at once" in w for w in rec.warnings)
    assert any("protect_label_direction keeps principal direction(s) [1]" in reason for reason in rec.reasons)
    assert rec.evidence["label_separation"] == pytest.approx(4.0 / np.sqrt(r["spectrum"][0]), rel=0.05)
    unprotected = recommend(r, artefact=artefact, thresholds=DecisionThresholds(protect_label_direction=False))
    assert unprotected.method == "abtt" and unprotected.directions == [1] and unprotected.warnings
    labels_only = recommend(r, artefact=sample_artefact_test(X, {"topic": labels}, r, [], "topic", directions=4))
    assert labels_only.method != "abtt" and any("the direction may be the answer" in w for w in labels_only.warnings)


def test_length_artefact_supports_removal_only_with_its_null():
    X = pencil(N, D, length=5.0, seed=3) + 3.0
    r = diagnose(X)
    token_count = np.exp(project_on_u1(X, r) / 5.0) * 40  # curved in the projection: Spearman ≈ 1
    rec = recommend(r, artefact=sample_artefact_test(X, {"token_count": token_count}, r, ["token_count"], None))
    assert rec.method == "abtt" and rec.directions == [1] and rec.verified
    assert rec.evidence["D_rule"] == "artefact" and rec.evidence["candidate_D"] == [1]
    reason = next(reason for reason in rec.reasons if "u1 is an artefact" in reason)
    assert "token_count" in reason and "permutation-adjusted p = 0.001" in reason
    assert "no label column was given" in reason and "no label separates" not in reason
    legacy = recommend(r, artefact={"abs_corr": {"token_count": 0.78, "char_length": None}, "label_means": {}})
    assert legacy.method == "center"  # |corr| without a null is reported, not evidence
    assert any("no permutation null was run" in reason and "not evidence" in reason for reason in legacy.reasons)


def test_small_sample_and_rank_collapse_warnings():
    X = cone(12, D, offset=12.0, seed=8)
    rec = recommend(diagnose(X))
    assert any("n = 12" in w for w in rec.warnings)
    assert any("rank collapse" in w for w in rec.warnings)


@pytest.mark.parametrize(
    "field,value", [("spike_top1", 1.5), ("whitening_variance", 0.0), ("max_D", -1), ("steep_alpha", -0.1)]
)
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
    assert recommend(r).method == "center"  # issue 43: steep, no artefact evidence
    u1 = {"index": 1, "eigenvalue": float(r["spectrum"][0]), "abs_corr": {"token_count": 0.78}, "p_adjusted": 0.001}
    rec = recommend(r, artefact={"directions": [u1]})
    assert rec.method == "abtt" and rec.directions == [1] and rec.D == 1
    assert rec.evidence["D_rule"] == "artefact"
    assert any("u1 is an artefact" in reason for reason in rec.reasons)
    assert any("ABTT of these directions then whitening-k" in reason for reason in rec.reasons)


def test_artefact_on_pc3_removes_pc3_only():
    X = np.random.default_rng(4).normal(size=(N, D))
    X[:, :3] *= [3.0, 2.5, 2.2]
    r = diagnose(X)
    directions = [
        {
            "index": j,
            "eigenvalue": float(r["spectrum"][j - 1]),
            "label_separation": None,
            "abs_corr": {"word_frequency": corr},
            "p_adjusted": p,
        }
        for j, corr, p in ((1, 0.41, 0.01), (2, 0.05, 1.0), (3, 0.65, 0.001))
    ]
    rec = recommend(r, artefact={"directions": directions})
    assert rec.method == "abtt" and rec.directions == [3]
    assert any("u3 is an artefact" in reason and "word_frequency" in reason for reason in rec.reasons)
    below_edge = [{**row, "index": 9} for row in directions[2:]]  # not above the MP edge: not evidence
    assert recommend(r, artefact={"directions": below_edge}).directions is None
    chance = [{**directions[2], "p_adjusted": 0.2}]  # large |corr| the null does not support
    rec = recommend(r, artefact={"directions": chance})
    assert rec.method == "none" and any("p = 0.2 ≥ 0.05" in reason for reason in rec.reasons)


def test_reasons_describe_what_the_method_does():
    r = diagnose(chapter9_like())
    rec = recommend(r)
    assert rec.method == "center"
    assert "centring subtracts the mean and deletes no direction" in rec.reasons[0]
    assert "unverified, not applied" in rec.reasons[1] and "whitening-k" in rec.reasons[1]


def test_label_direction_is_kept_out_of_a_non_contiguous_set():
    X = np.random.default_rng(4).normal(size=(N, D))
    X[:, :3] *= [3.0, 2.5, 2.2]
    r = diagnose(X)
    directions = [
        {"index": 1, "abs_corr": {"len": 0.9}, "p_adjusted": 0.001, "label_separation": 2.0, "label_p_adjusted": 0.001},
        {"index": 3, "abs_corr": {"len": 0.9}, "p_adjusted": 0.001, "label_separation": 0.1, "label_p_adjusted": 0.9},
    ]
    rec = recommend(r, artefact={"directions": directions})
    assert rec.method == "abtt" and rec.directions == [3]
    assert any("artefact and signal at once" in w and "u1" in w for w in rec.warnings)


def test_non_negative_data_measures_the_offset_from_the_sign_structure_null():
    from anisotropy_core.isotropy_measures import sign_structure_null

    X = np.maximum(np.random.default_rng(9).normal(size=(N, 256)), 0.0)  # dense ReLU: A ≈ 1/π
    r = diagnose(X)
    assert r["anisotropy_A"] == pytest.approx(1 / np.pi, abs=0.03)
    assert recommend(r).method == "center"  # measured from 0: a false offset
    null = sign_structure_null(X)
    assert null["regime"] == "dense"
    rec = recommend(r, A_sign_null=null["null"])
    assert rec.method == "none" and rec.evidence["A_null"] == pytest.approx(1 / np.pi, abs=0.005)  # measured m²/s


def test_default_steep_alpha_follows_the_textbook():
    assert DecisionThresholds().steep_alpha == 1.5


# --- issue 43: evidence before deletion -----------------------------------------------------------------


@pytest.mark.parametrize("d", [128, 384])
@pytest.mark.parametrize("alpha", [1.0, 0.8])
def test_healthy_spectrum_with_an_offset_is_centred_and_a_default_abtt_removes_at_most_d_over_100(d, alpha):
    X = cone(10 * d, d, offset=6.0, alpha=alpha, seed=d)
    r = diagnose(X)
    assert r["mp_above_upper"] > max(1, round(d / 100))  # the MP count would delete many more
    rec = recommend(r)
    assert rec.method in ("center", "none") and rec.directions is None and rec.verified
    assert rec.evidence["rule_of_thumb_D"] == max(1, round(d / 100))
    assert rec.evidence["candidate_D"] == sorted({*range(1, max(1, round(d / 100)) + 1), r["mp_above_upper"]})
    default = fit_abtt(X)
    assert default.D <= max(1, round(d / 100)) and default.d_rule == "rule_of_thumb_d/100 (unverified)"


def test_chapter7_ninety_ten_mixture_is_recentred_per_cluster():
    """Seed chapter 7, failure 2½: populations 90/10, means at distance 1, residuals of norm 1; a global mean
    leaves the minority with induced A = 0.81/1.81 = 0.448 — whatever the global spectrum looks like."""
    rng = np.random.default_rng(7)
    n, d = 4000, 64
    ids = (np.arange(n) >= 0.9 * n).astype(int)
    X = rng.normal(scale=1 / np.sqrt(d), size=(n, d))
    X[:, 0] += ids  # ‖a − b‖ = 1
    r = diagnose(X)
    assert r["top1_var"] < DecisionThresholds().spike_top1  # not concentrated: the old gate skipped the check
    clusters = cluster_diagnostics(cluster_moments(X, ids, 2))
    rec = recommend(r, clusters)
    assert rec.method == "cluster_recenter" and rec.k == 2 and rec.verified
    assert rec.evidence["worst_induced_A"] == pytest.approx(0.81 / 1.81, abs=0.02)
    assert "induced anisotropy 0.44" in rec.reasons[0] or "induced anisotropy 0.45" in rec.reasons[0]


def test_mixture_check_has_a_null_one_elongated_population_is_no_mixture():
    """issue 43: k-means splits one elongated blob into offset, flatter clusters (induced A and 'locally isotropic'
    both fire), so the sample's mixture check carries a null: the within-cluster share of a Gaussian population of
    the same shape. The seed's 90/10 mixture (means 1 apart, residuals of norm 1) beats every reference (p = 0.05);
    one pencil-shaped population does not, and is not recentred per cluster."""
    from anisotropy_core.mixture_evidence import mixture_check

    blob = pencil(1500, 8, length=2.0, seed=1) + 4.0
    _, clusters = mixture_check(blob, 8)
    assert (
        clusters["locally_isotropic"] or max(r["induced_A_global_centring"] or 0 for r in clusters["clusters"]) >= 0.2
    )
    assert clusters["mixture_p"] > 0.05
    rec = recommend(diagnose(blob), clusters)
    assert rec.method != "cluster_recenter" and "mixture null p" in rec.evidence["mixture_unverified"]

    rng = np.random.default_rng(2)
    minority = rng.random(1500) < 0.1
    X = rng.normal(size=(1500, 64))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    X[minority, 0] += 1.0
    _, clusters = mixture_check(X, 2)
    assert clusters["mixture_p"] == pytest.approx(0.05)
    assert recommend(diagnose(X), clusters).method == "cluster_recenter"
