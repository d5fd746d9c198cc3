"""Partition-function ratio, IsoScore (against the isoscore package's golden values), the chapter-8
sign-structure null, and the isotropic sampling-noise references of chapter 1."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

from anisotropy_core.diagnostics import anisotropy_from_offset, diagnose
from anisotropy_core.isotropy_measures import (
    alignment,
    amplified_anisotropy,
    isoscore,
    isoscore_from_spectrum,
    isotropic_anisotropy_se,
    mp_effective_rank,
    nonnegative_null,
    null_effective_rank,
    partition_ratio,
    sampling_noise,
    sign_structure_null,
    uniformity,
    uniformity_isotropic,
    uniformity_tight_cone,
)
from anisotropy_core.moments import Moments
from anisotropy_core.synthetic import cone

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "fixtures" / "isoscore_golden.json"


def load_make_golden():
    spec = importlib.util.spec_from_file_location("make_golden", ROOT / "tools" / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def anisotropy(x):
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    return anisotropy_from_offset(len(u), float(np.linalg.norm(u.mean(0))))


# --- IsoScore -------------------------------------------------------------------------------------------


def test_isoscore_matches_reference_package():
    golden = json.loads(GOLDEN.read_text())
    make_cloud = load_make_golden().make_cloud
    assert len(golden["clouds"]) >= 8
    for entry in golden["clouds"]:
        cloud = make_cloud(entry["generator"], entry["kwargs"])
        assert isoscore(cloud) == pytest.approx(entry["isoscore"], abs=1e-6), entry["name"]
        # same value from a merged streaming state (what the Spark job produces)
        half = len(cloud) // 2
        merged = Moments.of_batch(cloud[:half]).merge(Moments.of_batch(cloud[half:]))
        assert isoscore(merged) == pytest.approx(entry["isoscore"], abs=1e-6), entry["name"]


@pytest.mark.parametrize("k, d", [(1, 10), (4, 20), (10, 10), (37, 768)])
def test_isoscore_k_of_d_dimensions(k, d):
    lam = np.zeros(d)
    lam[:k] = 2.5
    assert isoscore_from_spectrum(lam) == pytest.approx((k - 1) / (d - 1), abs=1e-12)


def test_isoscore_is_scale_and_rotation_invariant():
    rng = np.random.default_rng(0)
    x = cone(400, 12, offset=3.0, alpha=1.0, seed=2)
    q, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    assert isoscore(7.0 * x @ q) == pytest.approx(isoscore(x), abs=1e-12)
    with pytest.raises(ValueError, match="zero covariance"):
        isoscore(np.ones((5, 3)))


# --- partition-function ratio --------------------------------------------------------------------------


def test_partition_ratio_matches_direct_sum_and_is_sign_free():
    x = cone(300, 8, offset=0.8, spread=0.3, seed=1)
    got = partition_ratio(x)
    _, vecs = np.linalg.eigh(x.T @ x)
    z = np.array([np.exp(x @ c).sum() for c in np.concatenate([vecs, -vecs], axis=1).T])
    assert got["I"] == pytest.approx(z.min() / z.max(), rel=1e-12)
    assert partition_ratio(-x)["I"] == pytest.approx(got["I"], rel=1e-12)
    assert 0 < got["I"] < 1


def test_partition_ratio_is_stable_for_long_vectors():
    x = cone(300, 8, offset=0.8, spread=0.3, seed=1)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.exp(x * 2000.0).sum())  # the naive route overflows
    got = partition_ratio(x * 2000.0)
    assert np.isfinite(got["log_Z"]).all() and 0.0 <= got["I"] < 1e-100


def test_partition_ratio_isotropic_vs_cone():
    rng = np.random.default_rng(3)
    iso = rng.normal(size=(20000, 10)) * 0.3
    assert partition_ratio(iso)["I"] > 0.95
    assert partition_ratio(cone(20000, 10, offset=1.0, spread=0.3, seed=3))["I"] < 0.2
    # centring removes the offset's contribution
    assert partition_ratio(cone(20000, 10, offset=1.0, spread=0.3, seed=3), centre=True)["I"] > 0.95


# --- chapter 8 sign-structure null ---------------------------------------------------------------------


def test_dense_relu_null_is_one_over_pi():
    rng = np.random.default_rng(4)
    acts = np.maximum(rng.normal(size=(1500, 768)), 0.0)
    null = sign_structure_null(acts)
    assert null["nonnegative"] and null["regime"] == "dense"
    assert null["null"] == pytest.approx(1 / np.pi, abs=0.005)  # issue 43: m²/s measured from the data
    assert null["null"] == nonnegative_null(null["mean_coordinate"], null["second_moment"])
    assert null["active_rate"] == pytest.approx(0.5, abs=0.01)
    assert nonnegative_null(1 / np.sqrt(2 * np.pi), 0.5) == pytest.approx(1 / np.pi, rel=1e-15)
    assert anisotropy(acts) == pytest.approx(1 / np.pi, abs=0.01)  # what unrelated vectors score


def test_sparse_code_null_is_half_the_rate():
    rng = np.random.default_rng(5)
    q, d = 0.04, 2048
    codes = rng.exponential(size=(1500, d)) * (rng.random(size=(1500, d)) < q)
    null = sign_structure_null(codes)
    assert null["regime"] == "sparse"
    assert null["active_rate"] == pytest.approx(q, rel=0.03)
    assert null["K"] == pytest.approx(q * d, rel=0.03)
    assert null["null"] == pytest.approx(null["active_rate"] / 2, rel=0.05)  # issue 43: m²/s = q/2, measured
    assert null["null"] == nonnegative_null(null["mean_coordinate"], null["second_moment"])
    assert nonnegative_null(q * 1.0, q * 2.0) == pytest.approx(q / 2)
    assert anisotropy(codes) == pytest.approx(q / 2, abs=0.003)


def test_dense_exponential_null_is_measured_one_half_not_one_over_pi():
    """Issue 43 / chapter 8: dense Exp(1) coordinates, m = 1, s = 2: unrelated vectors score m²/s = ½."""
    codes = np.random.default_rng(8).exponential(size=(1500, 256))
    null = sign_structure_null(codes)
    assert null["regime"] == "dense" and null["null"] == pytest.approx(0.5, abs=0.01)
    assert anisotropy(codes) == pytest.approx(0.5, abs=0.01) == null["null"]


def test_sign_symmetric_null_is_zero():
    rng = np.random.default_rng(6)
    null = sign_structure_null(rng.normal(size=(200, 50)))
    assert not null["nonnegative"] and null["null"] == 0.0 and null["K"] is None


def test_amplification_law():
    assert amplified_anisotropy(82, 0.0) == 0.0
    k = 82 * 0.05 / 2
    assert amplified_anisotropy(82, 0.05) == pytest.approx(k / (1 + k))


# --- isotropic sampling noise --------------------------------------------------------------------------


def test_standard_error_of_A_under_isotropy_by_simulation():
    rng = np.random.default_rng(7)
    n, d, reps = 40, 30, 3000
    x = rng.normal(size=(reps, n, d))
    u = x / np.linalg.norm(x, axis=2, keepdims=True)
    a = (n * (u.mean(axis=1) ** 2).sum(axis=1) - 1) / (n - 1)
    # sd of a sample sd over 3000 reps is ~1.3 %; 5 % is a 4-sigma band
    assert a.std(ddof=1) == pytest.approx(isotropic_anisotropy_se(n, d), rel=0.05)
    assert abs(a.mean()) < 4 * isotropic_anisotropy_se(n, d) / np.sqrt(reps)


@pytest.mark.parametrize("n, seed_value", [(5000, 711), (2000, 633)])
def test_null_effective_rank_matches_seed(n, seed_value):
    # the seed quotes integer parts (711.1, 633.5 → 711, 633); draw-to-draw sd is ≈ 0.3 at these sizes
    sim = null_effective_rank(n, 768, trials=1, seed=1)["mean"]
    assert int(sim) == seed_value
    assert mp_effective_rank(n, 768) == pytest.approx(sim, abs=1.0)


def test_sampling_noise_flags_a_cone_but_not_noise():
    rng = np.random.default_rng(8)
    noise = sampling_noise(diagnose(rng.normal(size=(3000, 64))))
    assert not noise["A_exceeds_noise"] and abs(noise["erank_deficit"]) < 0.01
    assert noise["null_effective_rank_method"] == "simulation"
    shaped = sampling_noise(diagnose(cone(3000, 64, offset=2.0, alpha=1.5, seed=8)))
    assert shaped["A_exceeds_noise"] and shaped["A_z"] > 100 and shaped["erank_deficit"] > 0.5
    big = sampling_noise({"n": 10_000_000, "d": 768, "anisotropy_A": 0.0, "effective_rank": 700.0})
    assert big["null_effective_rank_method"] == "marchenko-pastur"
    assert big["null_effective_rank"] == pytest.approx(768 * np.exp(-768 / 10_000_000 / 2), rel=1e-3)


def test_sampling_noise_z_is_measured_from_the_sign_structure_null():
    """Issue 13: dense ReLU data has A ≈ 1/π by its sign structure alone; A_z must measure from that zero."""
    X = np.maximum(np.random.default_rng(3).normal(size=(2000, 128)), 0.0)
    report = diagnose(X)
    from_zero = sampling_noise(report)["A_z"]
    null = sign_structure_null(X)["null"]
    from_null = sampling_noise(report, A_sign_null=null)["A_z"]
    assert from_zero > 1000
    assert from_null == pytest.approx((report["anisotropy_A"] - null) / isotropic_anisotropy_se(2000, 128))
    assert abs(from_null) < abs(from_zero) / 10


def test_uniformity_chapter7_numbers_and_identity():
    """Uniform on the sphere at d = 768: −4 + 16·(1/768)/2 = −3.990; a tight cone with A = 0.99: −0.040; and
    in general −4(1 − A) when the cosines are tight around A (a lower bound otherwise, by Jensen)."""
    assert round(uniformity_isotropic(768), 3) == -3.990
    assert round(uniformity_tight_cone(0.99), 3) == -0.040
    rng = np.random.default_rng(0)
    iso = uniformity(rng.standard_normal((600, 768)))
    assert iso["sample_size"] == 600 and iso["t"] == 2.0
    assert iso["uniformity"] == pytest.approx(-3.990, abs=0.005)
    direction = rng.standard_normal(768)
    direction /= np.linalg.norm(direction)
    noise = rng.standard_normal((300, 768))
    noise -= np.outer(noise @ direction, direction)
    tight = direction + 0.1005 * noise / np.linalg.norm(noise, axis=1, keepdims=True)  # cos ≈ 0.99 to every other
    measured = uniformity(tight)["uniformity"]
    a = diagnose(tight)["anisotropy_A"]
    assert a == pytest.approx(0.99, abs=0.001)
    assert measured == pytest.approx(uniformity_tight_cone(a), abs=1e-3)
    assert measured == pytest.approx(-0.040, abs=0.005)
    spread = rng.standard_normal((200, 5)) + [2, 0, 0, 0, 0]
    assert uniformity(spread)["uniformity"] >= uniformity_tight_cone(diagnose(spread)["anisotropy_A"]) - 1e-12
    pair_brute = np.mean(
        [
            np.exp(-2 * np.sum((u - v) ** 2))
            for i, u in enumerate(spread[:40] / np.linalg.norm(spread[:40], axis=1, keepdims=True))
            for v in (spread[i + 1 : 40] / np.linalg.norm(spread[i + 1 : 40], axis=1, keepdims=True))
        ]
    )
    assert uniformity(spread[:40])["uniformity"] == pytest.approx(np.log(pair_brute), abs=1e-12)


def test_alignment_of_positive_pairs():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 8))
    assert alignment(x, 3 * x)["alignment"] == pytest.approx(0.0, abs=1e-24)
    assert alignment(x, -x)["alignment"] == pytest.approx(4.0)
    y = x + 0.3 * rng.standard_normal((50, 8))
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)  # noqa: E731
    expected = np.mean(np.sum((unit(x) - unit(y)) ** 2, axis=1))
    assert alignment(x, y) == {"alignment": pytest.approx(expected, abs=1e-14), "alpha": 2.0, "pairs": 50}
    with pytest.raises(ValueError, match="row 3 has zero length"):
        alignment(x, np.where(np.arange(50)[:, None] == 3, 0.0, y))
