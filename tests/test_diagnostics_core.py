"""Golden numbers of seed chapters 1 and 9, and the numerics of the mergeable moments."""

import numpy as np
import pytest

from anisotropy_core import Moments, artefact_test, diagnose
from anisotropy_core.diagnostics import effective_rank, marchenko_pastur_edges, power_law_fit, project_on_u1
from anisotropy_core.moments import InvalidVectorsError
from anisotropy_core.synthetic import power_law

SIX = np.array([[3, 1, 0], [3, 0, 1], [3, -1, 0], [3, 0, -1], [4, 0.5, 0.5], [2, -0.5, -0.5]], dtype=float)
SIX_LENGTHS = np.array([10, 10, 10, 10, 14, 6], dtype=float)


def test_diagnose_golden():
    r = diagnose(SIX)
    assert abs(r["offset_ratio"] - 0.954082) < 1e-5
    assert abs(r["anisotropy_A"] - 0.892325) < 1e-5
    assert abs(r["top1_var"] - 4 / 7) < 1e-6
    assert abs(r["effective_rank"] - 2.6005) < 1e-3
    n = SIX.shape[0]
    assert abs(r["anisotropy_A"] - (n * r["offset_ratio"] ** 2 - 1) / (n - 1)) < 1e-12
    proj = project_on_u1(SIX, r)
    assert abs(abs(np.corrcoef(proj, SIX_LENGTHS)[0, 1]) - 0.816497) < 1e-5


def test_six_vectors_every_longhand_number():
    r = diagnose(SIX)
    np.testing.assert_allclose(r["spectrum"], [2 / 3, 1 / 3, 1 / 6], atol=1e-12)
    np.testing.assert_allclose(r["u1"], np.ones(3) / np.sqrt(3), atol=1e-12)  # canonical sign: positive
    np.testing.assert_allclose(r["mean"], [3, 0, 0], atol=1e-12)
    assert abs(r["isotropic_sd"] - 0.577350) < 1e-6
    # brute force: thirty ordered pairwise cosines sum to 26.769756
    unit = SIX / np.linalg.norm(SIX, axis=1, keepdims=True)
    cos = unit @ unit.T
    pair_sum = cos.sum() - np.trace(cos)
    assert abs(pair_sum / 30 - r["anisotropy_A"]) < 1e-12  # brute force == identity, to machine precision
    assert abs(pair_sum - 26.769756) < 5e-5  # the seed's longhand sum (rounded inputs)
    proj = project_on_u1(SIX, r)
    np.testing.assert_allclose(np.abs(proj), [0.577350] * 4 + [1.154701] * 2, atol=1e-6)
    art = artefact_test(proj, {"length": SIX_LENGTHS, "constant": np.ones(6)}, labels=np.array(list("aaaabc")))
    assert abs(art["abs_corr"]["length"] - 0.816497) < 1e-5
    assert art["abs_corr"]["constant"] is None
    assert abs(abs(art["label_means"]["b"]) - 1.154701) < 1e-6


def test_five_plane_vectors_A_and_offset():
    angles = np.deg2rad([10, 25, 40, 5, 30])
    r = diagnose(np.stack([np.cos(angles), np.sin(angles)], axis=1))
    assert abs(r["anisotropy_A"] - 0.93799) < 1e-5
    assert abs(r["offset_ratio"] - 0.9749) < 1e-4


def test_effective_rank_worked_examples():
    assert abs(effective_rank(np.array([0.90, 0.06, 0.04])) - 1.48) < 5e-3
    harmonic = 1 / np.arange(1, 6)
    assert abs(effective_rank(harmonic) - 4.181) < 1e-3
    assert abs(np.log(effective_rank(harmonic)) - 1.430558) < 1e-6
    assert abs(harmonic[0] / harmonic.sum() - 0.437956) < 1e-6
    assert effective_rank(np.array([1.0, 1.0, 0.0])) == pytest.approx(2.0)


def test_two_separated_clusters_top1_and_erank():
    """Seed ch. 7: clusters at (±2, 0, 0), isotropic σ = 0.5, equal sizes → λ = (4.25, 0.25, 0.25)."""
    lam = np.array([4.25, 0.25, 0.25])
    assert abs(lam[0] / lam.sum() - 0.895) < 5e-4
    assert abs(effective_rank(lam) - 1.506) < 5e-4
    rng = np.random.default_rng(11)
    centres = np.repeat([[2.0, 0, 0], [-2.0, 0, 0]], 100_000, axis=0)
    r = diagnose(centres + 0.5 * rng.normal(size=centres.shape))
    assert abs(r["top1_var"] - 0.895) < 2e-3 and abs(r["effective_rank"] - 1.506) < 5e-3
    assert abs(abs(r["u1"][0]) - 1) < 1e-3


def test_marchenko_pastur_worked_example_and_simulation():
    lower, upper = marchenko_pastur_edges(5000, 768)
    assert abs(upper - 1.937) < 1e-3 and abs(lower - 0.370) < 1e-3
    rng = np.random.default_rng(7)
    r = diagnose(rng.normal(size=(5000, 768)))
    assert abs(r["spectrum"][0] - 1.937) < 0.03  # seed's simulation: 1.934
    assert abs(r["spectrum"][-1] - 0.370) < 0.03  # seed's simulation: 0.367
    assert r["mp_above_upper"] <= 2  # pure noise: essentially nothing above the edge
    assert abs(r["effective_rank"] - 711) < 5  # seed: 711 at n = 5000


def test_moments_merge_is_exact_for_huge_offsets():
    """Mean norm 10⁴ × spread: Chan merge keeps covariance to 1e-9, the naive gram/n − μμᵀ does not."""
    rng = np.random.default_rng(0)
    d = 16
    cloud = power_law(20000, d, alpha=1.0, seed=3)
    direction = rng.normal(size=d)
    spread = np.sqrt(np.trace(np.cov(cloud.T, bias=True)))
    X = cloud + 1e4 * spread * direction / np.linalg.norm(direction)
    reference = np.cov(X.T, bias=True)  # float64 two-pass
    state = Moments.empty(d)
    for chunk in np.array_split(X, 37):
        state = state.merge(Moments.of_batch(chunk))
    rel = np.linalg.norm(state.covariance() - reference) / np.linalg.norm(reference)
    assert rel <= 1e-9
    gram, total = np.zeros((d, d)), np.zeros(d)
    for chunk in np.array_split(X, 37):
        gram += chunk.T @ chunk
        total += chunk.sum(0)
    mu = total / len(X)
    naive = gram / len(X) - np.outer(mu, mu)
    assert np.linalg.norm(naive - reference) / np.linalg.norm(reference) > 1e-9  # the seed's sketch fails the bound


def test_batch_moments_match_the_textbook_forms_and_leave_the_input_alone():
    """Each field of one batch's state against its definition (seed chapter 1), for float64 and float32 input;
    the caller's array is not centred in place."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(257, 9)) * rng.uniform(0.1, 3.0, size=9) + 7.0
    for batch in (X, X.astype(np.float32)):
        kept = batch.copy()
        state = Moments.of_batch(batch)
        x = batch.astype(np.float64)
        norms = np.linalg.norm(x, axis=1)
        np.testing.assert_array_equal(batch, kept)
        assert state.n == 257
        np.testing.assert_allclose(state.mean, x.mean(axis=0), rtol=1e-14)
        np.testing.assert_allclose(state.sum_unit, (x / norms[:, None]).sum(axis=0), rtol=1e-13)
        assert state.sum_norm == pytest.approx(norms.sum(), rel=1e-14)
        reference = np.cov(x.T, bias=True) * 257  # float64 two-pass
        assert np.linalg.norm(state.comoment - reference) <= 1e-13 * np.linalg.norm(reference)
        np.testing.assert_array_equal(state.comoment, state.comoment.T)


def test_merge_order_and_wire_format():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 5)) + 3
    a, b, c = (Moments.of_batch(p) for p in np.array_split(X, 3))
    left, right = a.merge(b).merge(c), a.merge(b.merge(c))
    np.testing.assert_allclose(left.comoment, right.comoment, rtol=1e-12)
    back = Moments.from_bytes(left.to_bytes())
    assert (
        back.n == 300 and np.array_equal(back.comoment, left.comoment) and np.array_equal(back.sum_unit, left.sum_unit)
    )
    assert Moments.empty(5).merge(a) is a and a.merge(Moments.empty(5)) is a
    with pytest.raises(ValueError, match="dimension"):
        a.merge(Moments.empty(4))


def test_report_has_every_key_and_rank_collapse():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(500, 3)) @ rng.normal(size=(3, 10))  # rank 3 in 10 dimensions
    r = diagnose(X)
    for key in [
        "n",
        "d",
        "offset_ratio",
        "anisotropy_A",
        "isotropic_sd",
        "top1_var",
        "top10_var",
        "effective_rank",
        "erank_frac",
        "spectrum",
        "raw_top1_share",
        "numerical_rank",
        "mp_lower",
        "mp_upper",
        "mp_above_upper",
        "power_law_alpha",
        "u1",
    ]:
        assert key in r
    assert r["numerical_rank"] == 3
    assert r["spectrum"].shape == (10,) and np.all(np.diff(r["spectrum"]) <= 0)


def test_power_law_fit_recovers_the_exponent():
    lam = 3.0 * np.arange(1, 101, dtype=float) ** -1.6
    alpha, scale = power_law_fit(np.concatenate([lam, np.zeros(5)]))  # zero eigenvalues are left out
    assert abs(alpha - 1.6) < 1e-9 and abs(scale - 3) < 1e-9
    assert np.isnan(power_law_fit(np.array([1.0, 0.0]))[0])


def test_raw_second_moment_sees_the_offset():
    """S = Σ + μμᵀ: a large offset makes the raw top-1 share ≈ 1 while the centred shape is isotropic."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(4000, 20)) + 10 * np.eye(20)[0]
    r = diagnose(X)
    assert r["raw_top1_share"] > 0.8 and r["top1_var"] < 0.1


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.array([[1.0, np.nan], [1.0, 2.0]]), "non-finite"),
        (np.array([[0.0, 0.0], [1.0, 2.0]]), "zero-length"),
        (np.array([[1.0, 2.0], [1.0, np.inf], [1.0, 1.0]]), "non-finite value in batch row 1"),
        (np.array([[1.0, 2.0], [3e154, 1.0], [1.0, 1.0]]), "squared length overflows float64 in batch row 1"),
    ],
)
def test_bad_batches_are_named(bad, message):
    with pytest.raises(InvalidVectorsError, match=message):
        Moments.of_batch(bad)


def test_n_equal_one_and_identical_vectors_are_clear_errors():
    with pytest.raises(ValueError, match="at least 2"):
        diagnose(np.array([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="identical"):
        diagnose(np.ones((4, 3)))
    with pytest.raises(ValueError, match="identical"):  # a mean that rounds: tiny positive variance
        diagnose(np.tile([0.1, 0.7, 1e3 / 3], (7, 1)))


def test_n_smaller_than_d_is_finite():
    rng = np.random.default_rng(5)
    r = diagnose(rng.normal(size=(10, 50)))
    assert r["numerical_rank"] == 9
    assert all(np.isfinite(r[k]) for k in ["anisotropy_A", "effective_rank", "top1_var", "mp_upper", "erank_alpha"])
    # issue 13: α is fitted over the eigenvalues above the MP edge only; pure noise has none, so α is undefined
    assert r["power_law_range"][1] < 3 and np.isnan(r["power_law_alpha"])


# --- issue 13: a spectrum slope that real spectra cannot fool --------------------------------------------

from anisotropy_core.diagnostics import alpha_from_effective_rank, power_law_effective_rank  # noqa: E402
from anisotropy_core.synthetic import power_law as power_law_cloud  # noqa: E402


@pytest.mark.parametrize("alpha,erank", [(1.0, 152.0), (2.0, 5.08), (1.6, 12.86)])
def test_textbook_effective_rank_of_768_power_law(alpha, erank):
    """Seed chapter 1: over 768 eigenvalues α = 1 → ≈ 152, α = 2 → ≈ 5.1, α = 1.6 → ≈ 12.9."""
    assert power_law_effective_rank(alpha, 768) == pytest.approx(erank, abs=0.05)
    assert alpha_from_effective_rank(power_law_effective_rank(alpha, 768), 768) == pytest.approx(alpha, abs=1e-9)


@pytest.mark.parametrize("n,d", [(1300, 384), (1536, 768)])
@pytest.mark.parametrize("alpha", [0.5, 0.8, 1.6])
def test_power_law_alpha_of_gaussian_clouds_is_within_008(n, d, alpha):
    r = diagnose(power_law_cloud(n, d, alpha, seed=0))
    assert abs(r["power_law_alpha"] - alpha) < 0.08
    k_lo, k_hi = r["power_law_range"]
    assert k_lo == 1 and k_hi == r["mp_above_upper"] >= 3
    assert np.isfinite(r["erank_alpha"])


def test_healthy_and_spiked_spectra_are_not_steep():
    from anisotropy_core.decision import DecisionThresholds, recommend

    steep = DecisionThresholds().steep_alpha
    assert diagnose(power_law_cloud(1300, 384, 0.8, seed=1))["power_law_alpha"] < steep
    spike = np.random.default_rng(2).normal(size=(2000, 64))
    spike[:, 0] *= 6.0  # one spike over a flat bulk
    r = diagnose(spike)
    assert r["mp_above_upper"] == 1 and not r["power_law_alpha"] >= steep
    rec = recommend(r)  # issue 43: a spike is a candidate, not evidence
    assert rec.method == "none" and any(reason.startswith("dominant directions") for reason in rec.reasons)


def test_chapter2_three_tokens_softmax_gauge_and_spectrum():
    """Chapter 2: h = (1, 2), e_a = (1, 0), e_b = (0, 1), e_c = (−1, 0); adding c = (3, 3) to every row shifts
    every logit by h·c = 9 and leaves p = (0.259501, 0.705385, 0.035119). After the push/pull drift the
    vocabulary e_f, e_1, e_2 has S eigenvalues 1.948561 / 0.002639, top-1 99.86 %, erank 1.010 and A = −0.335."""
    h = np.array([1.0, 2.0])
    table = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])

    def softmax(logits):
        shifted = np.exp(logits - logits.max())
        return shifted / shifted.sum()

    before, after = softmax(table @ h), softmax((table + [3.0, 3.0]) @ h)
    assert (table + [3.0, 3.0]) @ h - table @ h == pytest.approx([9.0, 9.0, 9.0])
    # the chapter's p_a = 0.259501 is e⁻¹/1.417666 = 0.259496 mis-rounded (its three p sum to 1.000005)
    assert before == pytest.approx([0.259501, 0.705385, 0.035119], abs=6e-6)
    assert before[1:] == pytest.approx([0.705385, 0.035119], abs=5e-7)
    assert np.abs(after - before).max() < 1e-15
    drifted = np.array([[1.59, 1.17], [-0.75, -0.63], [-0.84, -0.54]])
    r = diagnose(drifted)
    raw = np.linalg.eigvalsh(drifted.T @ drifted / 3)[::-1]
    assert raw == pytest.approx([1.948561, 0.002639], abs=5e-7)
    assert r["raw_top1_share"] == pytest.approx(0.9986, abs=5e-5)
    assert effective_rank(raw) == pytest.approx(1.010, abs=5e-4)
    assert r["anisotropy_A"] == pytest.approx(-0.335, abs=5e-4)
    initial = np.array([[-0.01, -0.03], [0.05, -0.03], [-0.04, 0.06]])
    assert np.linalg.eigvalsh(initial.T @ initial / 3)[::-1] == pytest.approx([0.002817, 0.000383], abs=5e-7)


CAT_DOG_CAR_TRUCK = np.array([[4.6, 1.0, 0.5], [1.4, 0.8, 0.9], [1.4, -0.9, -0.6], [4.6, -0.9, -0.8]])


def test_chapter3_spectrum_table_raw_centred_abtt():
    """Chapter 3 (μ = (3, 0, 0), centred rows as printed): top-1 89.7 % → 66.5 % → 99.6 %, erank 1.41 → 1.91
    → 1.02. The raw erank is 1.4047 from the exact shares; the chapter's 1.41 comes from shares rounded to
    (0.897, 0.101, 0.002)."""
    from anisotropy_core.transforms import fit_abtt

    r = diagnose(CAT_DOG_CAR_TRUCK)
    raw = np.linalg.eigvalsh(CAT_DOG_CAR_TRUCK.T @ CAT_DOG_CAR_TRUCK / 4)[::-1]
    assert r["raw_top1_share"] == pytest.approx(0.897, abs=5e-4)
    assert effective_rank(raw) == pytest.approx(1.41, abs=0.006)
    assert effective_rank(np.array([0.897, 0.101, 0.002])) == pytest.approx(1.41, abs=5e-3)
    assert r["top1_var"] == pytest.approx(0.665, abs=5e-4)
    assert r["effective_rank"] == pytest.approx(1.91, abs=5e-3)
    after = diagnose(fit_abtt(Moments.of_batch(CAT_DOG_CAR_TRUCK), D=1).apply(CAT_DOG_CAR_TRUCK))
    assert after["top1_var"] == pytest.approx(0.996, abs=5e-4)
    assert after["effective_rank"] == pytest.approx(1.02, abs=5e-3)
    assert after["anisotropy_A"] == pytest.approx(-0.333323, abs=5e-6)  # the chapter: −0.333323, not −1/3


def test_chapter9_A_in_isotropic_standard_deviations():
    """A = 0.892 is 1.5 isotropic SDs at d = 3 and 24.7 at d = 768 — the line the diagnosis report prints."""
    from jobs.diagnose import SCALAR_METRICS, markdown_summary

    A = diagnose(SIX)["anisotropy_A"]
    assert A / diagnose(SIX)["isotropic_sd"] == pytest.approx(1.5, abs=0.05)
    metrics = {key: 0.0 for key in SCALAR_METRICS}
    metrics.update(anisotropy_A=A, isotropic_sd=1 / np.sqrt(768))
    from anisotropy_core.decision import recommend

    result = {
        "metrics": metrics,
        "input": {"path": "t", "version": None},
        "run_id": "r",
        "created_at": "now",
        "invalid_rows": 0,
        "artefact": {"abs_corr": {}, "label_means": {}},
        "per_cluster": None,
        "sample_size": 6,
        "recommendation": recommend(diagnose(SIX)).to_dict(),
        "power_law_range": [1, 0],
    }
    # the null A is measured from is 0 here (A_sign_null = 0: sign-symmetric data)
    assert "A is 24.7 isotropic standard deviations above its null 0." in markdown_summary(result)
