"""ABTT → PCA-k → ABTT (seed ch. 3, "Does it compose?") and the n < d Gram/dual route (seed ch. 6)."""

import time

import numpy as np
import pytest

from anisotropy_core.artifact import load_artifact, save_artifact
from anisotropy_core.contextual import mev
from anisotropy_core.diagnostics import dual_spectrum
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import AbttPcaAbtt, fit, fit_abtt, fit_abtt_pca_abtt, fit_whitening


def cloud(n=400, d=12, seed=0):
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(d, d)))[0]
    return rng.standard_normal((n, d)) * np.geomspace(8.0, 0.5, d) @ basis.T + 3.0


def gram(z):
    """Sign-free comparison of two outputs: their row Gram matrices (n, n)."""
    return z @ z.T


def test_reapplying_the_same_abtt_is_a_no_op_but_refitting_is_not():
    x = cloud()
    first = fit_abtt(Moments.of_batch(x), D=2)
    projector = first.projector()
    np.testing.assert_allclose(projector @ projector, projector, atol=1e-14)  # PP = P
    once = first.apply(x)
    np.testing.assert_allclose(once @ projector, once, atol=1e-12)  # same U again: no-op
    refit = fit_abtt(once, D=1)  # refitted on the output
    twice = refit.apply(once)
    assert np.abs(refit.components @ first.components.T).max() < 1e-10  # a new direction
    removed = np.linalg.norm(once - twice) ** 2 / len(x)
    assert removed == pytest.approx(first.eigenvalues[2], rel=1e-9)  # it removes λ₃ of Σ


def test_composition_equals_the_three_steps_done_by_hand():
    x = cloud()
    t = fit_abtt_pca_abtt(Moments.of_batch(x), D=1, k=6, D2=1)
    assert isinstance(t, AbttPcaAbtt) and (t.d_in, t.d_out) == (12, 6)
    assert t.params() == {"D": 1, "k": 6, "D2": 1, "d_rule": "explicit", "d2_rule": "explicit"}
    centred = x - x.mean(axis=0)
    u = np.linalg.svd(centred, full_matrices=False)[2][:1]
    step1 = centred - centred @ u.T @ u
    step2 = step1 @ np.linalg.svd(step1, full_matrices=False)[2][:6].T
    u2 = np.linalg.svd(step2 - step2.mean(axis=0), full_matrices=False)[2][:1]
    by_hand = step2 - step2 @ u2.T @ u2
    z = t.apply(x)
    np.testing.assert_allclose(gram(z), gram(by_hand), atol=1e-8 * np.abs(gram(by_hand)).max())
    spectrum = np.sort(np.linalg.eigvalsh(np.cov(z.T, bias=True)))[::-1]
    np.testing.assert_allclose(spectrum[:5], t.eigenvalues[2:7], rtol=1e-9)  # λ₃..λ₇ survive
    assert spectrum[5] < 1e-10 * spectrum[0]  # the refitted direction is gone


def test_composition_defaults_rows_route_and_artifact(tmp_path):
    x = cloud(n=300, d=30, seed=1)
    t = fit("abtt_pca_abtt", Moments.of_batch(x))
    assert t.d_out == 10 and t.params()["d_rule"] == t.params()["d2_rule"] == "rule_of_thumb_d/100 (unverified)"
    small = x[:20]  # n < d: Gram route
    by_rows, by_moments = (
        fit_abtt_pca_abtt(small, D=1, k=5, D2=1),
        fit_abtt_pca_abtt(Moments.of_batch(small), D=1, k=5, D2=1),
    )
    np.testing.assert_allclose(gram(by_rows.apply(small)), gram(by_moments.apply(small)), atol=1e-9)
    with pytest.raises(ValueError, match="k=19 must satisfy"):
        fit_abtt_pca_abtt(small, D=1, k=19)
    save_artifact(str(tmp_path / "c"), t, n=300)
    loaded = load_artifact(str(tmp_path / "c")).transform
    np.testing.assert_allclose(loaded.apply(x), t.apply(x), rtol=0, atol=1e-12)  # contiguity changes BLAS order


def test_dual_spectrum_equals_the_d_by_d_route_on_the_nonzero_spectrum():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(30, 200)) * np.linspace(3, 0.1, 200)
    centred = x - x.mean(axis=0)
    lam, q = dual_spectrum(centred)
    full, vecs = np.linalg.eigh(centred.T @ centred / 30)
    full, vecs = full[::-1], vecs[:, ::-1]
    assert lam.shape == (29,) and q.shape == (200, 29)  # rank n − 1 after centring
    np.testing.assert_allclose(lam, full[:29], rtol=1e-9)
    np.testing.assert_allclose(np.abs(np.sum(q * vecs[:, :29], axis=0)), 1.0, atol=1e-8)
    np.testing.assert_allclose(q.T @ q, np.eye(29), atol=1e-10)


def test_dual_route_is_faster_when_n_is_much_smaller_than_d():
    x = np.random.default_rng(3).normal(size=(20, 600))
    centred = x - x.mean(axis=0)

    def best(f):
        times = []
        for _ in range(2):
            start = time.perf_counter()
            f()
            times.append(time.perf_counter() - start)
        return min(times)

    dual = best(lambda: dual_spectrum(centred))
    primal = best(lambda: np.linalg.eigh(centred.T @ centred / 20))
    assert dual * 5 < primal, (dual, primal)


def test_fits_take_the_gram_route_when_n_below_d():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(25, 80)) * np.linspace(4, 0.2, 80) + 1.0
    rows, moments = fit_abtt(x, D=3), fit_abtt(Moments.of_batch(x), D=3)
    np.testing.assert_allclose(rows.apply(x), moments.apply(x), atol=1e-9)
    np.testing.assert_allclose(rows.eigenvalues, moments.eigenvalues, atol=1e-9)
    assert rows.d_rule == "explicit"
    white_rows = fit_whitening(x, k=10, shrinkage=0.1)
    white_moments = fit_whitening(Moments.of_batch(x), k=10, shrinkage=0.1)
    np.testing.assert_allclose(gram(white_rows.apply(x)), gram(white_moments.apply(x)), rtol=1e-7)
    np.testing.assert_allclose(np.cov(fit_whitening(x, k=24).apply(x).T, bias=True), np.eye(24), atol=1e-8)
    with pytest.raises(ValueError, match="k=30 exceeds the 24 directions"):
        fit_whitening(x, k=30)
    assert mev(x)["mev"] == pytest.approx(mev(Moments.of_batch(x))["mev"], rel=1e-10)
    assert mev(x)["mev_floor"] == pytest.approx(1 / 24)
