"""k-means and cluster-wise recentering in numpy (seed chapter 7, "the mean belongs to nobody")."""

import numpy as np
import pytest

from anisotropy_core.artifact import load_artifact, save_artifact
from anisotropy_core.cluster_diagnostics import cluster_diagnostics, cluster_moments, induced_anisotropy
from anisotropy_core.cluster_recenter import ClusterRecenter, fit_cluster_recenter
from anisotropy_core.kmeans import ClusterState, assign, kmeans, lloyd, prepare, sample_corrected_step, update_centroids
from anisotropy_core.diagnostics import centred_spectrum, diagnose
from anisotropy_core.moments import InvalidVectorsError, Moments
from anisotropy_core.synthetic import cone, mixture, random_rotation
from anisotropy_core.transforms import APPLY_BLOCK_ROWS, TransformInputError


def two_populations(d=200, n=10_000, seed=0):
    """Seed chapter 7: populations at a and b, ‖a − b‖ = 1, proportions 0.9 / 0.1, residuals of norm ≈ 1.

    Both sit far out along a shared direction (a narrow cone, like real embeddings).
    Returns (X (n, d), labels (n,)) with label 1 = population B.
    """
    rng = np.random.default_rng(seed)
    basis = random_rotation(d, rng)
    a = 3.0 * basis[0]
    b = a + basis[1]  # ‖a − b‖ = 1
    labels = (np.arange(n) >= int(0.9 * n)).astype(int)
    X = np.where(labels[:, None] == 1, b, a) + rng.normal(size=(n, d)) / np.sqrt(d)
    return X, labels


def test_global_mean_induces_anisotropy_in_the_minority_and_cluster_centring_removes_it():
    X, labels = two_populations()
    B, A = labels == 1, labels == 0
    globally = X - X.mean(axis=0)
    # b − μ = 0.9(b − a): ‖δ‖ = 0.9 on residuals of norm 1 → A_B = 0.81/1.81; population A: 0.01/1.01
    assert induced_anisotropy(0.9, 1.0) == pytest.approx(0.81 / 1.81)
    a_b_global = diagnose(globally[B])["anisotropy_A"]
    a_a_global = diagnose(globally[A])["anisotropy_A"]
    assert a_b_global == pytest.approx(0.4475, abs=0.01)  # O(1/d) corrections to the approximation
    assert a_a_global == pytest.approx(0.0099, abs=0.003)

    fit, result = fit_cluster_recenter(X, k=2, seed=0)
    corrected, ids = fit.apply_with_clusters(X)
    assert result.converged
    # the clusters are the populations (up to the id permutation)
    b_id = np.bincount(ids[B]).argmax()
    assert (ids[B] == b_id).all() and (ids[A] != b_id).all()
    a_b_local = diagnose(corrected[B])["anisotropy_A"]
    a_a_local = diagnose(corrected[A])["anisotropy_A"]
    # centred within its own cluster: A = −1/(n−1) for equal norms, here ≈ −0.001 and −0.0001
    assert abs(a_b_local) < 0.002 and abs(a_a_local) < 0.002
    assert a_b_global > 200 * abs(a_b_local)

    # the per-cluster table predicts the induced anisotropy from the moments alone
    table = cluster_diagnostics(cluster_moments(X, ids, 2))
    row_b = table["clusters"][b_id]
    assert row_b["size"] == B.sum() and row_b["share"] == pytest.approx(0.1)
    assert row_b["induced_A_global_centring"] == pytest.approx(a_b_global, abs=0.01)


def separated_clusters(n=2000, seed=0):
    """Seed chapter 7: clusters at (±2, 0, 0) with isotropic σ = 0.5, equal sizes. (X (n, 3), labels (n,))."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(n) % 2
    X = np.where(labels[:, None] == 0, 2.0, -2.0) * np.array([1.0, 0.0, 0.0]) + 0.5 * rng.normal(size=(n, 3))
    return X, labels


def nearest_mean_accuracy(features, labels):
    """Train a nearest-class-mean classifier on even rows, return its accuracy on odd rows."""
    train, test = np.arange(len(labels)) % 2 == 0, np.arange(len(labels)) % 2 == 1
    means = np.stack([features[train & (labels == c)].mean(axis=0) for c in (0, 1)])
    predicted = np.argmin(((features[test][:, None, :] - means) ** 2).sum(axis=2), axis=1)
    return float((predicted == labels[test]).mean())


def test_global_abtt_destroys_the_cluster_label_and_cluster_recentering_keeps_it():
    X, labels = separated_clusters(n=4000)
    report = diagnose(X)
    assert report["top1_var"] == pytest.approx(4.25 / 4.75, abs=0.01)  # seed: 89.5 %
    assert report["effective_rank"] == pytest.approx(1.506, abs=0.03)
    assert nearest_mean_accuracy(X, labels) > 0.99

    # global ABTT, D = 1: centre, project out the top principal direction (it is the label axis x)
    state = Moments.of_batch(X)
    u1 = centred_spectrum(state)[1][:, :1]
    abtt = (X - state.mean) - (X - state.mean) @ u1 @ u1.T
    accuracy = nearest_mean_accuracy(abtt, labels)
    assert abs(accuracy - 0.5) < 0.04  # chance: 2000 test rows, sd 0.011

    fit, _ = fit_cluster_recenter(X, k=2, n_directions=1, seed=0)
    corrected, ids = fit.apply_with_clusters(X)
    # the cluster id written alongside each vector carries the label; the mapping id → label is learned
    # on the even rows like the classifier above and scored on the odd rows
    id_accuracy = nearest_mean_accuracy(np.eye(2)[ids], labels)
    assert id_accuracy > 0.999
    # and inside each cluster the geometry is the cluster's own: its mean is 0 and its top direction gone
    for c in (0, 1):
        assert np.allclose(corrected[ids == c].mean(axis=0), 0.0, atol=1e-12)
        assert np.allclose(corrected[ids == c] @ fit.directions[c].T, 0.0, atol=1e-12)


def test_state_merge_equals_one_batch_and_survives_bytes():
    X, _ = mixture(600, 5, (0.5, 0.5), separation=3.0, seed=3)
    C = X[:4]
    whole = ClusterState.of_batch(X, C, "euclidean")
    merged = ClusterState.of_batch(X[:250], C, "euclidean").merge(ClusterState.of_batch(X[250:], C, "euclidean"))
    back = ClusterState.from_bytes(merged.to_bytes())
    assert len(merged.to_bytes()) == ClusterState.max_wire_bytes(4, 5)  # 4 far points: the largest state
    for state in (merged, back):
        assert np.allclose(state.sums, whole.sums, rtol=1e-12)
        assert np.array_equal(state.counts, whole.counts)
        assert state.inertia == pytest.approx(whole.inertia, rel=1e-12)
        assert np.array_equal(state.far_points, whole.far_points)
    distances = ((X[:, None, :] - C) ** 2).sum(axis=2)
    assert whole.inertia == pytest.approx(distances.min(axis=1).sum(), rel=1e-12)
    farthest = np.argsort(-distances.min(axis=1))[:4]
    assert np.array_equal(whole.far_points, X[farthest])


def test_empty_cluster_is_reseeded_at_the_farthest_point():
    X, labels = mixture(900, 4, (0.5, 0.5), separation=8.0, seed=4)
    far_away = np.full(4, 1e3)
    init = np.stack([X[0], X[0], far_away])  # duplicate → empty, far away → empty
    state = ClusterState.of_batch(X, init, "euclidean")
    assert state.counts.tolist() == [900, 0, 0]  # ties go to the lower id
    updated, reseeded = update_centroids(state, init, "euclidean")
    assert reseeded == [1, 2]
    assert np.array_equal(updated[1:], state.far_points[:2])
    assert np.isfinite(updated).all()
    # k = 2 from [one point of population 0, a point nobody is near]: the empty cluster is re-seeded at the
    # point farthest from X[0] — in the other population — and Lloyd then separates the two exactly
    result = kmeans(X, 2, init=init[[0, 2]])
    assert result.converged and result.history[0] > result.inertia
    ids = assign(X, result.centroids, "euclidean")[0]
    assert np.array_equal(ids == ids[0], labels == labels[0])
    with pytest.raises(ValueError, match="k exceeds the number of rows"):
        update_centroids(ClusterState.of_batch(X[:1], init, "euclidean"), init, "euclidean")


def test_kmeans_is_deterministic_and_recovers_separated_clusters():
    X, labels = mixture(3000, 16, (0.5, 0.3, 0.2), separation=8.0, seed=5)
    first, second = kmeans(X, 3, seed=11), kmeans(X, 3, seed=11)
    assert np.array_equal(first.centroids, second.centroids) and first.history == second.history
    ids = assign(X, first.centroids, "euclidean")[0]
    purity = sum(np.bincount(labels[ids == c]).max() for c in range(3)) / len(labels)
    assert purity > 0.99  # the populations overlap slightly: the Bayes error is not 0
    oracle = kmeans(X, 3, init=np.stack([X[labels == c].mean(axis=0) for c in range(3)]))
    assert first.inertia <= oracle.inertia * (1 + 1e-9)  # as good as Lloyd started from the truth
    assert all(b <= a * (1 + 1e-12) for a, b in zip(first.history, first.history[1:]))  # Lloyd never worsens
    # Lloyd does not depend on how the rows are split into partitions (same start, same passes)
    split = kmeans([X[:1000], X[1000:2500], X[2500:]], 3, init=X[:3], tol=0.0)
    whole = kmeans(X, 3, init=X[:3], tol=0.0)
    assert split.n_iter == whole.n_iter and np.array_equal(split.counts, whole.counts)
    assert np.allclose(split.centroids, whole.centroids, rtol=0, atol=1e-12)


def test_cosine_kmeans_clusters_directions_not_lengths():
    rng = np.random.default_rng(6)
    directions = random_rotation(8, rng)[:2]
    labels = np.arange(1000) % 2
    lengths = rng.uniform(0.5, 5.0, size=1000)[:, None]  # lengths vary tenfold inside each cluster
    X = lengths * (directions[labels] + 0.1 * rng.normal(size=(1000, 8)))
    result = kmeans(X, 2, metric="cosine", seed=0)
    assert np.allclose(np.linalg.norm(result.centroids, axis=1), 1.0)
    ids = assign(prepare(X, "cosine"), result.centroids, "cosine")[0]
    assert abs(np.corrcoef(ids, labels)[0, 1]) == pytest.approx(1.0)
    unit = prepare(X, "cosine")
    assert result.inertia == pytest.approx((1 - (unit @ result.centroids.T).max(axis=1)).sum(), rel=1e-9)


def test_invalid_vectors_are_rejected_not_propagated():
    X = np.ones((4, 3))
    X[2, 1] = np.nan
    with pytest.raises(InvalidVectorsError, match="row 2"):
        kmeans(X, 2)
    with pytest.raises(InvalidVectorsError, match="zero-length"):
        prepare(np.zeros((2, 3)), "cosine")
    with pytest.raises(ValueError, match="metric"):
        kmeans(np.ones((4, 3)), 2, metric="manhattan")


def test_cluster_recenter_artifact_round_trip(tmp_path):
    X, _ = mixture(1500, 6, (0.7, 0.3), separation=5.0, seed=7)
    fit, result = fit_cluster_recenter(X, k=2, n_directions=2, metric="cosine", seed=1)
    manifest = save_artifact(str(tmp_path / "cr"), fit, n=int(fit.sizes.sum()))
    assert manifest["method"] == "cluster_recenter" and manifest["params"]["D_per_cluster"] == 2
    loaded = load_artifact(str(tmp_path / "cr"), expected_dimension=6).transform
    assert isinstance(loaded, ClusterRecenter) and loaded.metric == "cosine"
    assert np.array_equal(loaded.sizes, fit.sizes) and loaded.fit_info == fit.fit_info
    out, ids = loaded.apply_with_clusters(X)
    expected, expected_ids = fit.apply_with_clusters(X)
    assert np.array_equal(ids, expected_ids)
    assert np.allclose(out, expected, rtol=0, atol=1e-13)
    assert np.allclose(loaded.apply(X[3]), expected[3], atol=1e-13)


def test_cluster_diagnostics_globally_anisotropic_locally_isotropic():
    X, labels = separated_clusters(n=2000)
    table = cluster_diagnostics(cluster_moments(X, labels, 2))
    assert table["global"]["top1_var"] == pytest.approx(0.895, abs=0.01)
    for row in table["clusters"]:
        assert row["size"] == 1000 and row["top1_var"] < 0.4 and row["effective_rank"] > 2.9
    assert table["locally_isotropic"] is True
    # a single-vector cluster has no shape: None, never NaN
    lonely = cluster_diagnostics([Moments.of_batch(X[:1]), Moments.of_batch(X[1:])])
    assert lonely["clusters"][0]["effective_rank"] is None and lonely["clusters"][0]["size"] == 1


def test_lloyd_stops_at_max_iter_and_reports_it():
    X, _ = mixture(500, 4, (0.5, 0.5), separation=0.5, seed=8)
    result = lloyd(lambda c: ClusterState.of_batch(X, c, "euclidean"), X[:5], "euclidean", max_iter=2, tol=0.0)
    assert result.n_iter == 2 and not result.converged and len(result.history) == 2


def test_shifted_state_moves_each_non_empty_cluster_mean_by_the_shift():
    rng = np.random.default_rng(3)
    x, centroids = rng.normal(size=(200, 5)), rng.normal(size=(4, 5))
    centroids[3] = 100.0  # far from every row: an empty cluster
    state = ClusterState.of_batch(x, centroids, "euclidean")
    shift = rng.normal(size=(4, 5))
    moved = state.shifted(shift)
    live = state.counts > 0
    assert not live[3] and live[:3].all()
    np.testing.assert_allclose(
        moved.sums[live] / moved.counts[live, None],
        state.sums[live] / state.counts[live, None] + shift[live],
        rtol=1e-12,
    )
    assert np.array_equal(moved.sums[3], np.zeros(5)) and np.array_equal(moved.counts, state.counts)
    assert moved.inertia == state.inertia and np.array_equal(moved.far_points, state.far_points)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_corrected_sample_updates_with_the_whole_table_as_sample_are_plain_lloyd(metric):
    # the sample's bias at the full pass is then 0, so each corrected update is one more Lloyd update
    X, _ = mixture(600, 6, (0.5, 0.3, 0.2), separation=2.0, seed=4)
    x = prepare(X, metric)
    table_pass = lambda c: ClusterState.of_batch(x, c, metric)  # noqa: E731
    start = x[:3].copy()
    state = table_pass(start)
    updated, _ = update_centroids(state, start, metric)
    stepped = sample_corrected_step(table_pass, metric, 4)(state, start, updated)
    plain = lloyd(table_pass, start, metric, max_iter=6, tol=0.0)  # centroids after 5 updates
    np.testing.assert_allclose(stepped, plain.centroids, rtol=0, atol=1e-12)
    assert np.array_equal(sample_corrected_step(table_pass, metric, 0)(state, start, updated), updated)


def test_corrected_sample_updates_lower_the_table_inertia_of_a_sample_fit():
    # narrow-cone corpora (weak cluster structure, the bench's kind), 60,000 × 32 in 4 partitions, k = 16, an
    # 8,000-row sample (500 rows per cluster; the default's 131,072 rows give 2,048 per cluster at k = 64),
    # 20 sample updates + 2 full passes: 10 bias-corrected sample updates between the passes end lower over
    # the whole table than the plain Lloyd update, for every seed (measured 2026-12-06 over 12 seeds: −0.065 %
    # to −0.19 %). With 125 sample rows per cluster (20,000 × 32, k = 16, 2,000 rows) it is a coin flip: 6 of
    # 12 seeds lower, 6 higher, from −0.19 % to +0.14 %
    for seed in range(8):
        parts = np.array_split(cone(60_000, 32, offset=4.0, alpha=1.0, seed=seed).astype(np.float32), 4)

        def fit(corrected, parts=parts, seed=seed):
            return kmeans(parts, 16, seed=seed, max_iter=20, tol=0.0, sample_size=8000, corrected_iter=corrected)

        plain, corrected = fit(0), fit(10)
        assert corrected.inertia < plain.inertia * (1 - 5e-4), seed
        assert corrected.counts.sum() == plain.counts.sum() == 60_000 and len(corrected.history) == 2
    with pytest.raises(ValueError, match="corrected_iter must be ≥ 0"):
        kmeans(parts, 16, sample_size=8000, corrected_iter=-1)


def test_cluster_state_matches_direct_formulas():
    # the pass's fast paths (per-cluster sums by one gather per cluster, precomputed ‖x‖²) against the plain definitions
    rng = np.random.default_rng(7)
    x, centroids, w = rng.normal(size=(300, 5)), rng.normal(size=(8, 5)), rng.uniform(0.5, 2.0, size=300)
    direct = ((x[:, None, :] - centroids[None]) ** 2).sum(axis=2)  # (B, k)
    ids = np.argmin(direct, axis=1)
    sums = np.zeros((8, 5))
    np.add.at(sums, ids, w[:, None] * x)
    state = ClusterState.of_batch(x, centroids, "euclidean", w, x_sq=(x * x).sum(axis=1))
    assert np.array_equal(assign(x, centroids, "euclidean")[0], ids)
    assert np.allclose(state.sums, sums, rtol=0, atol=1e-12)
    assert np.array_equal(state.counts, np.bincount(ids, weights=w, minlength=8))
    assert state.inertia == pytest.approx(float(w @ direct[np.arange(300), ids]), rel=1e-12)
    plain = ClusterState.of_batch(x, centroids, "euclidean", w)
    assert np.array_equal(plain.sums, state.sums) and plain.inertia == pytest.approx(state.inertia, rel=1e-12)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_blocked_cluster_recentering_equals_the_per_row_formula(metric):
    """Issue 9: apply_with_clusters runs in blocks of APPLY_BLOCK_ROWS rows, in float64 whatever the input's
    precision, then casts; ids and rows equal the formula applied row by row to the whole batch."""
    X, _ = mixture(2 * APPLY_BLOCK_ROWS + 300, 6, (0.6, 0.4), separation=4.0, seed=2)
    fit, _ = fit_cluster_recenter(X, k=3, n_directions=1, metric=metric, seed=0)
    x32 = X.astype(np.float32)
    x64 = x32.astype(np.float64)
    want_ids = assign(prepare(x64, metric), fit.centroids, metric)[0]
    centred = x64 - fit.means[want_ids]
    u = fit.directions[want_ids, 0]  # (n, d): the one direction per cluster
    want = centred - np.sum(centred * u, axis=1, keepdims=True) * u
    out, ids = fit.apply_with_clusters(x32)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    out32, ids32 = fit.apply_with_clusters(x32, np.float32)
    assert out32.dtype == np.float32
    np.testing.assert_array_equal(ids32, want_ids)
    np.testing.assert_array_equal(out32, out.astype(np.float32))
    before = x64.copy()
    np.testing.assert_array_equal(fit.apply_with_clusters(x64)[0], out)  # float64 in: the caller's rows untouched
    np.testing.assert_array_equal(x64, before)
    bad = x64.copy()
    bad[APPLY_BLOCK_ROWS + 5, 2] = np.nan
    with pytest.raises(TransformInputError, match=f"row {APPLY_BLOCK_ROWS + 5}, column 2"):
        fit.apply(bad)
