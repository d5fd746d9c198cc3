"""Seed golden numbers (chapters 3 and 6) and invariants of the numpy corrections and artifacts."""

import json
import os

import numpy as np
import pytest

from anisotropy_core import synthetic
from anisotropy_core.artifact import ArtifactError, load_artifact, save_artifact
from anisotropy_core.diagnostics import diagnose
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import (
    APPLY_BLOCK_ROWS,
    AllButTheTop,
    NonFiniteOutputError,
    TransformInputError,
    choose_d,
    choose_directions,
    fit,
    fit_abtt,
    fit_center,
    fit_whitening,
    from_parts,
)

# chapter 3: raw vectors = centred vectors + mean (3, 0, 0)
WORDS = np.array(
    [
        [4.6, 1.0, 0.5],  # cat
        [1.4, 0.8, 0.9],  # dog
        [1.4, -0.9, -0.6],  # car
        [4.6, -0.9, -0.8],
    ]
)  # truck
# chapter 6: centred (4,3),(2,2),(0,1),(-2,-2),(-4,-4) + mean (6, 5); norms 12.80625 … 2.23607
SENTENCES = np.array([[10.0, 8.0], [8.0, 7.0], [6.0, 6.0], [4.0, 3.0], [2.0, 1.0]])


def cosines(x):
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    return unit @ unit.T


def mean_offdiag(c):
    return c[np.triu_indices(c.shape[0], 1)].mean()


def state(x):
    return Moments.of_batch(x)


# ------------------------------------------------------------------------- chapter 3: cat/dog/car/truck


def test_words_mean_and_scatter_eigenvalue():
    s = state(WORDS)
    assert np.allclose(s.mean, [3.0, 0.0, 0.0], atol=1e-12)
    assert np.linalg.norm(s.mean) == pytest.approx(3.0, abs=1e-12)
    scatter = s.comoment  # S = Σ ṽṽᵀ = 4 × covariance
    assert np.allclose(scatter, [[10.24, 0.32, -0.96], [0.32, 3.26, 2.48], [-0.96, 2.48, 2.06]], atol=1e-12)
    abtt = fit_abtt(s, D=1)
    assert abtt.eigenvalues[0] * s.n == pytest.approx(10.3513, abs=5e-5)
    # u* = (0.9936, 0.0060, -0.1129) up to sign
    assert abs(abtt.components[0] @ np.array([0.9936, 0.0060, -0.1129])) == pytest.approx(1.0, abs=1e-4)


def test_words_post_abtt_cosines_with_the_books_rounded_u1():
    """The seed does its arithmetic with u1 rounded to (0.994, 0.006, -0.113): reproduce its digits."""
    rounded = AllButTheTop(state(WORDS).mean, np.array([[0.994, 0.006, -0.113]]), np.zeros(3))
    out = rounded.apply(WORDS)
    assert np.allclose(np.linalg.norm(out, axis=1), [1.200293, 1.079543, 1.182023, 1.097905], atol=1e-5)
    c = cosines(out)
    assert c[0, 1] == pytest.approx(0.99253, abs=5e-6)
    assert c[0, 3] == pytest.approx(-0.99998, abs=5e-6)
    assert mean_offdiag(c) == pytest.approx(-0.33332, abs=5e-6)


def test_words_post_abtt_cosines_with_the_exact_u1():
    """Exact eigenvector: same verdicts; differences to the book are only its 3-decimal u1 (≤ 4e-5)."""
    c = cosines(fit_abtt(state(WORDS), D=1).apply(WORDS))
    assert c[0, 1] == pytest.approx(0.992498, abs=1e-6)
    assert c[0, 3] == pytest.approx(-0.999982, abs=1e-6)
    assert mean_offdiag(c) == pytest.approx(-0.333323, abs=1e-6)
    assert np.argmax(np.where(np.eye(4, dtype=bool), -2, c)[0]) == 1  # cat's nearest is dog
    assert abs(c[np.triu_indices(4, 1)]).min() > 0.99  # the over-correction symptom


def test_abtt_uses_centred_not_uncentred_covariance():
    s = state(WORDS)
    u_centred = fit_abtt(s, D=1).components[0]
    _, vecs = np.linalg.eigh(s.second_moment())
    u_raw = vecs[:, -1]
    # the top direction of S = Σ + μμᵀ is essentially μ/‖μ‖ = e1; of Σ it is (0.9936, 0.0060, -0.1129)
    assert abs(u_raw[0]) > 0.999
    assert abs(u_centred @ u_raw) < 0.9999
    assert not np.allclose(
        fit_abtt(s, D=1).apply(WORDS), AllButTheTop(s.mean, u_raw[None, :], np.zeros(3)).apply(WORDS), atol=1e-3
    )


def test_abtt_projector_idempotent_and_symmetric():
    x = synthetic.cone(300, 20, offset=4.0, alpha=1.0, seed=1)
    abtt = fit_abtt(state(x), D=3)
    p = abtt.projector()
    assert np.allclose(p @ p, p, atol=1e-12) and np.allclose(p, p.T, atol=1e-15)
    once = abtt.apply(x)
    assert np.allclose(once - (once @ abtt.components.T) @ abtt.components, once, atol=1e-12)


def test_abtt_no_reindex_identity():
    x = synthetic.cone(200, 16, offset=5.0, alpha=1.0, seed=2)
    docs, queries = x[:150], x[150:] + 0.3  # queries from a shifted distribution: identity still exact
    abtt = fit_abtt(state(docs), D=2)
    exact = abtt.apply(docs) @ abtt.apply(queries).T  # (150, 50)
    q_prime, offset = abtt.query_side(queries)
    assert np.allclose(docs @ q_prime.T - offset, exact, atol=1e-10)
    raw_scores = docs @ q_prime.T  # per-query constant shift: same ranking
    assert (np.argsort(-raw_scores, axis=0) == np.argsort(-exact, axis=0)).all()


def test_choose_d_rules():
    """Issue 43: without D the default is the textbook's starting point max(1, round(d/100)), recorded
    unverified; the Marchenko–Pastur count (above the edge) is a diagnostic, not the default."""
    x = synthetic.cone(2000, 50, offset=3.0, alpha=1.5, seed=3)
    lam = diagnose(x)["spectrum"]
    above = diagnose(x)["mp_above_upper"]
    assert above > 1
    assert choose_d(lam, 2000, 50) == (1, "rule_of_thumb_d/100 (unverified)")
    assert choose_d(lam, 2000, 50, max_D=0) == (0, "rule_of_thumb_d/100 (unverified)")
    assert choose_d(lam, 2000, 50, D=4) == (4, "explicit")
    assert choose_d(lam[:40], 30, 400) == (4, "rule_of_thumb_d/100 (unverified)")  # n ≤ d
    assert choose_directions(lam, 2000, 50, "marchenko_pastur") == (list(range(1, above + 1)), "marchenko_pastur")
    with pytest.raises(ValueError, match="D=50"):
        choose_d(lam, 2000, 50, D=50)
    big = synthetic.cone(3000, 300, offset=3.0, alpha=1.0, seed=5)
    model = fit_abtt(state(big))
    assert model.params() == {"D": 3, "d_rule": "rule_of_thumb_d/100 (unverified)", "directions": [1, 2, 3]}
    assert diagnose(big)["mp_above_upper"] > 3  # what the old default removed
    assert fit_abtt(state(big), max_D=2).directions == [1, 2]


# ------------------------------------------------------------------------ chapter 6: five sentences


def test_sentences_whitening_matrix_and_identity_covariance():
    s = state(SENTENCES)
    assert np.allclose(s.covariance(), [[8.0, 7.2], [7.2, 6.8]], atol=1e-12)
    w = fit_whitening(s)
    assert np.allclose(w.eigenvalues, [14.62496, 0.17504], atol=5e-6)
    book = np.array([[0.192425, -1.618401], [0.177056, 1.758878]])
    signs = np.sign(np.sum(w.matrix * book, axis=0))  # columns only up to sign
    assert np.allclose(w.matrix * signs, book, atol=1e-6)
    z = w.apply(SENTENCES)
    assert np.allclose(np.abs(z[0]), [1.30087, 1.19697], atol=5e-6)
    assert np.allclose(np.cov(z.T, bias=True), np.eye(2), atol=1e-5)
    c = cosines(z)
    assert c[1, 3] == pytest.approx(-1.0, abs=1e-12)  # s2, s4, s5 collinear after centring
    assert c[1, 4] == pytest.approx(-1.0, abs=1e-12)
    assert c[3, 4] == pytest.approx(1.0, abs=1e-12)
    r5 = 1 / np.sqrt(5)  # the recurring ±0.44721
    assert np.allclose([c[0, 1], c[0, 3], c[0, 4], c[1, 2], c[2, 3], c[2, 4]], [r5, -r5, -r5, r5, -r5, -r5], atol=1e-12)
    assert c[0, 2] == pytest.approx(-0.6, abs=1e-12)


def test_whitening_rotation_freedom_and_zca():
    x = synthetic.cone(500, 8, offset=3.0, alpha=1.0, seed=5)
    w = fit_whitening(state(x))
    r = synthetic.random_rotation(8, np.random.default_rng(0))
    z, zr = w.apply(x), (x - w.mean) @ (w.matrix @ r)
    assert np.allclose(np.cov(zr.T, bias=True), np.eye(8), atol=1e-9)
    assert np.allclose(cosines(z), cosines(zr), atol=1e-10)
    zca = fit_whitening(state(x), zca=True)
    assert np.allclose(zca.matrix, zca.matrix.T, atol=1e-10)
    assert np.allclose(cosines(zca.apply(x)), cosines(z), atol=1e-10)  # ZCA = W Uᵀ: one more rotation


def test_whitening_k_shrinkage_normalize():
    x = synthetic.cone(1000, 12, offset=3.0, alpha=1.0, seed=6)
    w = fit_whitening(state(x), k=4)
    z = w.apply(x)
    assert z.shape == (1000, 4) and w.d_out == 4
    assert np.allclose(np.cov(z.T, bias=True), np.eye(4), atol=1e-9)
    shrunk = fit_whitening(state(x), shrinkage=0.5)
    cov = state(x).covariance()
    target = 0.5 * cov + 0.5 * np.trace(cov) / 12 * np.eye(12)
    assert np.allclose(shrunk.matrix.T @ target @ shrunk.matrix, np.eye(12), atol=1e-9)
    unit = fit_whitening(state(x), k=4, normalize=True).apply(x)
    assert np.allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-12)
    with pytest.raises(NonFiniteOutputError, match="row 0"):
        fit_whitening(state(x), normalize=True).apply(state(x).mean)  # a vector equal to μ


def test_whitening_n_less_than_d_has_no_inf_or_nan():
    x = synthetic.cone(10, 40, offset=2.0, alpha=1.0, seed=7)  # covariance rank ≤ 9
    full = fit_whitening(state(x))
    assert full.k == 9 and full.clamped == 0  # issue 43: from moments too, k is capped at the rank n − 1
    assert np.isfinite(full.matrix).all() and np.isfinite(full.apply(x)).all()
    with pytest.raises(ValueError, match="span"):
        fit_whitening(state(x), k=20)
    k = fit_whitening(state(x), k=5)  # k < n: exactly white in 5 dims
    assert k.clamped == 0
    assert np.allclose(np.cov(k.apply(x).T, bias=True), np.eye(5), atol=1e-8)
    shrunk = fit_whitening(state(x), shrinkage=0.1)
    assert shrunk.clamped == 0 and np.isfinite(shrunk.apply(x)).all()
    abtt = fit_abtt(state(x))
    assert abtt.d_rule == "rule_of_thumb_d/100 (unverified)" and np.isfinite(abtt.apply(x)).all()


def test_whitening_from_moments_with_n_below_d_keeps_held_out_norms_moderate():
    """Seed chapter 6: with n < d, clamping the d − n + 1 zero eigenvalues to eps·λ₁ scales a held-out vector's
    component in those null directions by 1/√(eps·λ₁) — its whitened norm explodes. The rank cap keeps it."""
    rows = synthetic.cone(80, 100, offset=2.0, alpha=1.0, seed=12)
    corpus, held_out = rows[:60], rows[60:]  # same distribution, not in the fit
    capped = fit_whitening(state(corpus))
    assert capped.k == 59 and capped.d_out == 59
    clamp_only = fit_whitening(state(corpus), k=100, shrinkage=1e-12)  # a vanishing shrinkage lifts the cap:
    # all d directions kept, the null ones only clamped — the fit a moments state gave before issue 43
    assert clamp_only.k == 100
    train = np.linalg.norm(capped.apply(corpus), axis=1).mean()  # ≈ √k: unit variance in k directions
    assert np.linalg.norm(capped.apply(held_out), axis=1).max() < 10 * train
    assert np.linalg.norm(clamp_only.apply(held_out), axis=1).min() > 1e4 * train


def test_center_and_input_errors():
    c = fit("center", state(WORDS))
    assert np.allclose(c.apply(WORDS).mean(axis=0), 0.0, atol=1e-12)
    assert c.apply(WORDS[0]).shape == (3,)
    with pytest.raises(TransformInputError, match="dimension 3"):
        c.apply(np.ones((2, 4)))
    bad = WORDS.copy()
    bad[2, 1] = np.nan
    with pytest.raises(TransformInputError, match="row 2, column 1"):
        c.apply(bad)
    with pytest.raises(ValueError, match="identical"):
        fit_center(state(np.ones((3, 2))))
    with pytest.raises(ValueError, match="unknown method"):
        fit("flow", state(WORDS))


# ------------------------------------------------------------------------------------------ artifact


@pytest.mark.parametrize(
    "method,params", [("center", {}), ("abtt", {"D": 2}), ("whitening", {"k": 3, "shrinkage": 0.1, "zca": True})]
)
def test_artifact_roundtrip(tmp_path, method, params):
    x = synthetic.cone(200, 6, offset=3.0, alpha=1.0, seed=8)
    t = fit(method, state(x), **params)
    on = {"path": "/data/t", "format": "delta", "version": 3}
    manifest = save_artifact(str(tmp_path), t, n=200, fitted_on=on)
    loaded = load_artifact(str(tmp_path), expected_dimension=6)
    assert loaded.transform_version == manifest["transform_version"]
    assert loaded.transform_version.startswith(method + "-")
    assert loaded.manifest["fitted_on"] == on and loaded.manifest["n"] == 200
    assert loaded.transform.params() == t.params()
    assert np.array_equal(loaded.transform.apply(x), t.apply(x))
    # deterministic content hash: same numbers, same version
    assert save_artifact(str(tmp_path / "again"), t, 200, on)["content_sha256"] == manifest["content_sha256"]


def test_artifact_tamper_and_dimension(tmp_path):
    t = fit_abtt(state(WORDS), D=1)
    save_artifact(str(tmp_path), t, n=4)
    with pytest.raises(ArtifactError, match="dimension 5"):
        load_artifact(str(tmp_path), expected_dimension=5)
    arrays = dict(np.load(tmp_path / "arrays.npz"))
    arrays["mean"] = arrays["mean"] + 1e-9
    np.savez(tmp_path / "arrays.npz", **arrays)
    with pytest.raises(ArtifactError, match="hash mismatch"):
        load_artifact(str(tmp_path))
    save_artifact(str(tmp_path), t, n=4)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["params"]["D"] = 0
    manifest["n"] = 5
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="hash mismatch"):
        load_artifact(str(tmp_path))
    with pytest.raises(ArtifactError, match="not found"):
        load_artifact(os.path.join(str(tmp_path), "missing"))


def test_artifact_refuses_pickled_arrays(tmp_path):
    save_artifact(str(tmp_path), fit_center(state(WORDS)), n=4)
    np.savez(tmp_path / "arrays.npz", mean=np.array([object()], dtype=object))
    with pytest.raises(ValueError, match="pickle"):
        load_artifact(str(tmp_path))


# --- issue 13: ABTT of any set of principal directions, chosen by an explicit rule -----------------------


def test_abtt_of_pc1_and_pc3_keeps_the_no_reindex_identity():
    x = synthetic.cone(400, 16, offset=5.0, alpha=1.0, seed=2)
    docs, queries = x[:300], x[300:] + 0.3
    abtt = fit_abtt(state(docs), directions=[3, 1])
    lam, vecs = np.linalg.eigh(state(docs).covariance())
    assert abtt.directions == [1, 3] and abtt.d_rule == "explicit"
    assert np.allclose(np.abs(abtt.components @ vecs[:, ::-1][:, [0, 2]]), np.eye(2), atol=1e-8)
    exact = abtt.apply(docs) @ abtt.apply(queries).T
    q_prime, offset = abtt.query_side(queries)
    assert np.allclose(docs @ q_prime.T - offset, exact, atol=1e-10)
    # PC2 survives untouched, PC1 and PC3 are gone
    out = abtt.apply(docs)
    assert np.allclose(out @ abtt.components.T, 0.0, atol=1e-10)
    assert np.var(out @ vecs[:, ::-1][:, 1]) == pytest.approx(lam[::-1][1], rel=1e-8)
    again = from_parts("abtt", abtt.params(), abtt.arrays())
    assert again.directions == [1, 3] and np.allclose(again.apply(queries), abtt.apply(queries))


def test_direction_rules():
    x = synthetic.cone(2000, 50, offset=3.0, alpha=1.5, seed=3)
    r = diagnose(x)
    lam, above = r["spectrum"], r["mp_above_upper"]
    assert choose_directions(lam, 2000, 50, "explicit", indices=[1, 3]) == ([1, 3], "explicit")
    assert choose_directions(lam, 2000, 50, "marchenko_pastur") == (list(range(1, above + 1)), "marchenko_pastur")
    assert choose_directions(lam, 2000, 50, "marchenko_pastur", max_D=2) == ([1, 2], "marchenko_pastur_capped")
    assert choose_directions(lam, 2000, 50, "rule_of_thumb") == ([1], "rule_of_thumb_d/100 (unverified)")
    assert choose_directions(lam, 2000, 50) == ([1], "rule_of_thumb_d/100 (unverified)")  # issue 43: the default
    spearman_only = [{"index": 2, "abs_corr": {"len": 0.3}, "abs_spearman": {"len": 0.8}}]
    assert choose_directions(lam, 2000, 50, "artefact", artefact_directions=spearman_only) == ([2], "artefact")
    rows = [
        {"index": 1, "abs_corr": {"len": 0.2}},
        {"index": 3, "abs_corr": {"len": -0.0, "freq": 0.7}},
        {"index": 49, "abs_corr": {"freq": 0.9}},
    ]  # 49 is below the MP edge: never evidence
    assert choose_directions(lam, 2000, 50, "artefact", artefact_directions=rows) == ([3], "artefact")
    assert choose_directions(lam, 2000, 50, "artefact", artefact_directions=rows, artefact_corr=0.1)[0] == [1, 3]
    with pytest.raises(ValueError, match="1..50"):
        choose_directions(lam, 2000, 50, "explicit", indices=[0, 3])
    with pytest.raises(ValueError, match="unknown direction rule"):
        choose_directions(lam, 2000, 50, "largest")


def test_whitening_after_abtt_drops_the_removed_directions():
    x = synthetic.cone(2000, 12, offset=3.0, alpha=1.2, seed=6)
    s = state(x)
    both = fit_whitening(s, k=5, exclude=[1, 3])
    abtt = fit_abtt(s, directions=[1, 3])
    direct = fit_whitening(Moments.of_batch(abtt.apply(x)), k=5)  # ABTT, then whiten what is left
    assert np.allclose(np.abs(both.apply(x).T @ direct.apply(x)) / x.shape[0], np.eye(5), atol=1e-6)
    assert np.allclose(np.cov(both.apply(x), rowvar=False, bias=True), np.eye(5), atol=1e-8)
    with pytest.raises(ValueError, match="k=11"):
        fit_whitening(s, k=11, exclude=[1, 3])


# ------------------------------------------------------------------------- blocked apply (issue 9)


def batch_of_blocks(d=12, seed=3):
    """float32 rows spanning three apply blocks (the last one partial), and their float64 copy."""
    x = synthetic.cone(2 * APPLY_BLOCK_ROWS + 300, d, offset=3.0, alpha=1.0, seed=seed).astype(np.float32)
    return x, x.astype(np.float64)


@pytest.mark.parametrize(
    "method, params", [("center", {}), ("abtt", {"D": 2}), ("whitening", {"k": 5}), ("whitening", {"normalize": True})]
)
def test_blocked_apply_equals_the_whole_batch_formula_for_float32_and_float64(method, params):
    x32, x64 = batch_of_blocks()
    t = fit(method, state(x64), **params)
    whole = t._map(x64 - t.mean)  # the formula on the whole batch at once
    if params.get("normalize"):
        whole = (x64 - t.mean) @ t.matrix
        whole /= np.linalg.norm(whole, axis=1, keepdims=True)
    out64 = t.apply(x64)
    assert out64.dtype == np.float64 and out64.shape == (x64.shape[0], t.d_out)
    np.testing.assert_allclose(out64, whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(t.apply(x32), out64)  # float32 in: the same float64 numbers
    out32 = t.apply(x32, np.float32)
    assert out32.dtype == np.float32
    np.testing.assert_array_equal(out32, out64.astype(np.float32))  # computed in float64, then cast
    assert t.apply(x32[7], np.float32).shape == (t.d_out,)


@pytest.mark.parametrize("method, params", [("center", {}), ("abtt", {"D": 2}), ("whitening", {"k": 5})])
def test_blocked_apply_overwrites_its_scratch_never_the_callers_rows(method, params):
    """map_blocks hands each block to the transform as a float64 scratch copy that the map overwrites in place:
    the caller's rows (float64 too, where no conversion copy is needed) and every earlier block's output stay
    as they were, and a second apply gives the same numbers."""
    x32, x64 = batch_of_blocks()
    t = fit(method, state(x64), **params)
    before = x64.copy()
    first = t.apply(x64)
    np.testing.assert_array_equal(x64, before)
    np.testing.assert_array_equal(t.apply(x64), first)
    np.testing.assert_array_equal(t.apply(x64[APPLY_BLOCK_ROWS:]), first[APPLY_BLOCK_ROWS:])


def test_blocked_apply_errors_name_the_row_of_the_batch_not_of_the_block():
    x32, x64 = batch_of_blocks()
    row = APPLY_BLOCK_ROWS + 17  # in the second block
    bad = x64.copy()
    bad[row, 4] = np.inf
    with pytest.raises(TransformInputError, match=f"row {row}, column 4") as info:
        fit("abtt", state(x64), D=1).apply(bad)
    assert info.value.row == row
    white = fit_whitening(state(x64), normalize=True)
    at_mean = x64.copy()
    at_mean[row] = white.mean
    with pytest.raises(NonFiniteOutputError, match=f"whitening: row {row} equals the fitted mean") as info:
        white.apply(at_mean)
    assert info.value.row == row
    huge = x64.copy()
    huge[row] = 1e39  # finite in float64, not in float32
    centre = fit("center", state(x64))
    assert np.isfinite(centre.apply(huge)).all()
    with pytest.raises(
        NonFiniteOutputError, match=f"center: row {row}: non-finite output value after the cast to float32"
    ) as info:
        centre.apply(huge, np.float32)
    assert info.value.row == row
