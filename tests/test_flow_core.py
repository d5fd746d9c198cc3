"""BERT-flow (seed chapter 5): the chapter's worked numbers, hand-written gradients, exact inverse, training."""

import math

import numpy as np
import pytest

from anisotropy_core.artifact import load_artifact, save_artifact
from anisotropy_core.flow import (
    Flow,
    FlowArchitecture,
    FlowTransform,
    change_of_variables_density,
    fit_flow,
    gaussian_shell,
    init_parameters,
    scalar_flow_objective,
    scalar_flow_optimum,
    standard_normal_density,
)


def test_change_of_variables_n34():
    """z ~ N(0,1), u = 2z + 3 ~ N(3, 4): p(3) = 0.199471, p(5) = 0.120985, equal to the N(3,4) density."""
    density = change_of_variables_density(
        np.array([3.0, 5.0]), lambda u: (u - 3) / 2, lambda u: 0.5 + 0 * u, standard_normal_density
    )
    assert density == pytest.approx([0.199471, 0.120985], abs=5e-7)
    true = np.exp(-((np.array([3.0, 5.0]) - 3) ** 2) / 8) / (2 * math.sqrt(2 * math.pi))
    assert density == pytest.approx(true, abs=1e-15)


def one_coupling(d=4, permutation=None):
    """A flow of exactly one additive coupling (identity ActNorms, identity permutation)."""
    arch = FlowArchitecture(d, couplings=1, hidden=3)
    params = init_parameters(arch, np.random.default_rng(0).normal(size=(10, d)))
    params["actnorm0_log_scale"] = np.zeros(d)
    params["permutations"] = np.arange(d, dtype=np.float64)[None, :] if permutation is None else permutation
    return Flow(arch, params)


def test_additive_coupling_worked_example():
    """u = (1,2,3,4), m(a) = (0.5a1 + a2, a1 − 0.5a2) → v = (1, 2, 5.5, 4.0), back exactly; unit-diagonal
    lower-triangular Jacobian with the chapter's rows, log|det| = 0."""
    flow = one_coupling()
    flow.params["coupling0_L"] = np.array([[0.5, 1.0], [1.0, -0.5]])  # a @ L = (0.5a1 + a2, a1 − 0.5a2)
    u = np.array([[1.0, 2.0, 3.0, 4.0]])
    v = flow.forward(u)
    assert v[0] == pytest.approx([1.0, 2.0, 5.5, 4.0], abs=1e-15)
    assert flow.inverse(v)[0] == pytest.approx([1.0, 2.0, 3.0, 4.0], abs=1e-15)
    eps = 1e-6
    jac = np.stack([(flow.forward(u + eps * e) - flow.forward(u - eps * e))[0] / (2 * eps) for e in np.eye(4)], axis=1)
    expected = [[1, 0, 0, 0], [0, 1, 0, 0], [0.5, 1.0, 1, 0], [1.0, -0.5, 0, 1]]
    assert jac == pytest.approx(np.array(expected, dtype=float), abs=1e-8)
    assert flow.log_det() == 0.0


def test_scalar_flow_objective_and_optimum():
    """d = 768, r = 12: L = 258.80 at s = √d/r = 2.3094, −72.00 at s = 1, −1769.11 at s = 0.1; without the
    log-det term s = 0.1 would look best (the collapse)."""
    d, r = 768, 12.0
    best = scalar_flow_optimum(r, d)
    assert best == pytest.approx(2.3094, abs=5e-5)
    # the chapter writes ln 2.3094 = 0.83698 (5 decimals): 768 × 0.83698 = 642.80; unrounded 642.807 → 258.807
    assert scalar_flow_objective(best, r, d) == pytest.approx(258.80, abs=0.01)
    assert -((best * r) ** 2) / 2 + 768 * 0.83698 == pytest.approx(258.80, abs=0.005)
    assert scalar_flow_objective(1.0, r, d) == pytest.approx(-72.00, abs=1e-12)
    assert scalar_flow_objective(0.1, r, d) == pytest.approx(-1769.11, abs=0.005)
    grid = np.linspace(0.5, 5.0, 2001)
    assert grid[np.argmax([scalar_flow_objective(s, r, d) for s in grid])] == pytest.approx(best, abs=3e-3)
    assert -((0.1 * r) ** 2) / 2 > -((best * r) ** 2) / 2  # the likelihood term alone prefers shrinking


def test_gaussian_shell_at_768():
    """‖z‖ = 27.71 ± 0.71 for z ~ N(0, I_768); a simulated sample agrees."""
    mean, sd = gaussian_shell(768)
    assert (round(mean, 2), round(sd, 2)) == (27.71, 0.71)
    norms = np.linalg.norm(np.random.default_rng(0).standard_normal((4000, 768)), axis=1)
    assert norms.mean() == pytest.approx(mean, abs=0.05) and norms.std() == pytest.approx(sd, abs=0.03)


def random_flow(d=7, couplings=3, hidden=5, seed=0):
    rng = np.random.default_rng(seed)
    arch = FlowArchitecture(d, couplings, hidden)
    params = init_parameters(arch, rng.normal(size=(50, d)) * rng.uniform(0.5, 3, size=d), seed)
    for name, value in params.items():
        if name != "permutations":
            params[name] = value + 0.3 * rng.standard_normal(value.shape)
    return Flow(arch, params), rng


def test_hand_written_gradients_match_finite_differences():
    flow, rng = random_flow()
    x = rng.normal(size=(40, 7)) * 2
    _, grads = flow.backward(x)
    assert set(grads) == {k for k in flow.params if k != "permutations"}
    eps = 1e-6
    for name, grad in grads.items():
        for index in [
            np.unravel_index(i, grad.shape) for i in rng.choice(grad.size, size=min(4, grad.size), replace=False)
        ]:
            original = flow.params[name][index]
            flow.params[name][index] = original + eps
            up = flow.nll(x)
            flow.params[name][index] = original - eps
            down = flow.nll(x)
            flow.params[name][index] = original
            assert grad[index] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-8), (name, index)


def test_exact_inverse_round_trip():
    flow, rng = random_flow(d=9, couplings=4)
    x = rng.normal(size=(200, 9)) * 5 + 1
    back = flow.inverse(flow.forward(x))
    assert np.abs(back - x).max() <= 1e-9 * np.abs(x).max()


def test_log_det_is_the_actnorm_scales():
    flow, rng = random_flow(d=6, couplings=2)
    x = rng.normal(size=(1, 6))
    eps = 1e-6
    jac = np.stack([(flow.forward(x + eps * e) - flow.forward(x - eps * e))[0] / (2 * eps) for e in np.eye(6)], axis=1)
    assert np.linalg.slogdet(jac)[1] == pytest.approx(flow.log_det(), abs=1e-6)


def anisotropic_cloud(n=1500, d=8, seed=0):
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(d, d)))[0]
    return rng.standard_normal((n, d)) * np.geomspace(6.0, 0.3, d) @ basis.T + 4.0


def test_trained_flow_whitens_an_anisotropic_cloud_without_collapse():
    """Covariance of the output within 0.06 of I entrywise. Why 0.06: the cloud is Gaussian, so the maximum
    likelihood flow is a whitening map, but it is trained on mini-batches of 256 (an entry of a 256-row
    covariance has sd ≈ 1/√256 ≈ 0.06) for a finite number of steps; raw, the cloud's covariance spans
    0.09 … 36. No collapse: the log-det keeps every output variance near 1 instead of driving it to 0, and
    the likelihood reaches that of the best Gaussian fit."""
    x = anisotropic_cloud()
    transform = fit_flow(x, couplings=4, hidden=16, steps=500, batch_size=256, learning_rate=1e-2, seed=1)
    z = transform.apply(x)
    cov = np.cov(z.T, bias=True)
    assert np.abs(cov - np.eye(8)).max() < 0.06
    assert np.linalg.eigvalsh(cov).min() > 0.85
    assert np.abs(z.mean(axis=0)).max() < 0.06
    assert transform.training["final_nll"] < transform.training["initial_nll"]
    gaussian_nll = 0.5 * np.linalg.slogdet(2 * math.pi * math.e * np.cov(x.T, bias=True))[1]
    assert transform.training["final_nll"] == pytest.approx(gaussian_nll, abs=0.1)  # the best a Gaussian model can do
    back = transform.inverse(z)
    assert np.abs(back - x).max() <= 1e-9 * np.abs(x).max()


def test_artifact_round_trip_and_query_side(tmp_path):
    x = anisotropic_cloud(n=300, d=6, seed=2)
    transform = fit_flow(x, couplings=2, hidden=4, steps=20, seed=3)
    manifest = save_artifact(str(tmp_path / "flow"), transform, n=300)
    assert manifest["method"] == "flow"
    assert {"couplings", "hidden", "split", "sample_size", "steps", "seed"} <= set(manifest["params"])
    assert "permutations" in manifest["arrays"] and "coupling1_W1" in manifest["arrays"]
    loaded = load_artifact(str(tmp_path / "flow")).transform
    assert isinstance(loaded, FlowTransform)
    np.testing.assert_array_equal(loaded.apply(x), transform.apply(x))
    assert loaded.apply(x[0]) == pytest.approx(transform.apply(x[:1])[0], abs=0)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="coordinate 2 is constant"):
        fit_flow(np.c_[np.random.default_rng(0).normal(size=(20, 2)), np.ones(20)], steps=1)
    x = anisotropic_cloud(n=50, d=4)
    x[7, 1] = np.nan
    with pytest.raises(ValueError, match="row 7, column 1"):
        fit_flow(x, steps=1)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        fit_flow(anisotropic_cloud(n=50, d=4), steps=0)
