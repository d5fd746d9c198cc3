"""The per-direction artefact test's permutation null (issue 43): family-wise error held at small n, curved artefacts
caught by Spearman, label separation with a null of its own."""

import json

import numpy as np
import pytest

from anisotropy_core import diagnose
from anisotropy_core.artefact_evidence import direction_test, max_t_pvalues, ranks, sample_artefact_test


def test_permutation_null_holds_the_family_wise_rate_at_small_n_where_pearson_alone_does_not():
    """n = 20 rows, 10 directions × 2 columns of independent noise, 200 repetitions: the maxT null flags about
    5 % of repetitions; the old rule (any |Pearson| ≥ 0.5, no null) flags far more."""
    rng = np.random.default_rng(0)
    flagged = old_rule = 0
    for repetition in range(200):
        projections = rng.normal(size=(20, 10))
        metadata = {"token_count": rng.normal(size=20), "char_length": rng.normal(size=20)}
        result = direction_test(projections, np.ones(10), metadata, permutations_count=199, seed=repetition)
        flagged += any(row["p_adjusted"] < 0.05 for row in result["directions"])
        old_rule += any(max(row["abs_corr"].values()) >= 0.5 for row in result["directions"])
    assert flagged / 200 <= 0.08
    assert old_rule / 200 >= 0.25 and old_rule >= 4 * flagged


def test_curved_artefact_is_caught_by_spearman_where_pearson_is_weak():
    """projection = log(token_count) + noise, token counts heavy-tailed (lognormal σ = 2): Pearson ≈ 0.27."""
    rng = np.random.default_rng(1)
    token_count = np.exp(rng.normal(scale=2.0, size=400))
    projections = rng.normal(size=(400, 5))
    projections[:, 1] = np.log(token_count) + rng.normal(scale=0.3, size=400)
    result = direction_test(projections, np.ones(5), {"token_count": token_count}, seed=2)
    u2 = result["directions"][1]
    assert u2["abs_corr"]["token_count"] < 0.5 < 0.9 < u2["abs_spearman"]["token_count"]
    assert u2["p_adjusted"] == pytest.approx(1 / 1000) and u2["significant"]
    assert [row["significant"] for row in result["directions"]] == [False, True, False, False, False]


def test_label_separation_null_fires_rarely_on_noise():
    """50 labels × 20 rows of pure noise: the raw spread of 50 label means exceeds 1 SD routinely (the old rule
    fired), the permutation null in ≤ ~8 % of repetitions."""
    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(50), 20)
    fired = raw = 0
    for repetition in range(100):
        result = direction_test(
            rng.normal(size=(1000, 10)), np.ones(10), labels=labels, permutations_count=199, seed=repetition
        )
        fired += any(row["label_significant"] for row in result["directions"])
        raw += any(row["label_separation"] >= 1.0 for row in result["directions"])
    assert fired / 100 <= 0.08 and raw / 100 >= 0.5


def test_real_label_separation_is_significant_and_the_result_is_json_safe():
    rng = np.random.default_rng(4)
    labels = np.repeat(["sports", "finance"], 100)
    projections = rng.normal(size=(200, 3))
    projections[:, 0] += np.where(labels == "sports", 1.5, -1.5)
    result = direction_test(projections, [3.25, 1.0, 1.0], {"length": rng.normal(size=200)}, labels=labels)
    u1 = result["directions"][0]
    assert u1["label_significant"] and u1["label_p_adjusted"] == pytest.approx(1 / 1000)
    assert u1["label_separation"] == pytest.approx(3.0 / np.sqrt(3.25), rel=0.1)
    assert set(result["label_means"]) == {"sports", "finance"} and result["null"]["label_column_given"]
    assert json.loads(json.dumps(result)) == result


def test_max_t_pvalues_and_average_ranks():
    assert max_t_pvalues(np.array([0.5, 0.1]), np.array([0.2, 0.6, 0.05])).tolist() == [0.5, 0.75]
    assert ranks(np.array([[3.0], [1.0], [3.0], [2.0]]))[:, 0].tolist() == [3.5, 1.0, 3.5, 2.0]


def test_missing_metadata_rows_are_counted_constant_columns_undefined_and_bad_columns_named():
    rng = np.random.default_rng(5)
    projections = rng.normal(size=(50, 2))
    length = projections[:, 0] * 2.0
    length[[3, 7]] = np.nan
    result = direction_test(projections, [1.0, 1.0], {"length": length, "constant": np.ones(50)})
    assert result["null"]["rows_missing_metadata"] == 2
    assert result["directions"][0]["abs_corr"]["length"] == pytest.approx(1.0)
    assert result["directions"][0]["abs_corr"]["constant"] is None
    assert result["directions"][0]["p_adjusted_by_column"]["constant"] is None
    with pytest.raises(ValueError, match="'title' is not numeric"):
        direction_test(projections, [1.0, 1.0], {"title": np.array(["a"] * 50, dtype=object)})
    with pytest.raises(ValueError, match="'length' has shape"):
        direction_test(projections, [1.0, 1.0], {"length": np.ones(3)})


def test_sample_artefact_test_projects_the_sample_on_the_report_directions():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(500, 6)) * [3.0, 2.0, 1.5, 1, 1, 1]
    frequency = X[:, 1] * 4 + 10
    report = diagnose(X)
    result = sample_artefact_test(X, {"frequency": frequency}, report, ["frequency"], None, directions=3)
    assert [row["index"] for row in result["directions"]] == [1, 2, 3]
    assert [row["significant"] for row in result["directions"]] == [False, True, False]
    proj = (X - report["mean"]) @ report["principal_directions"][:, 1]
    assert result["directions"][1]["abs_corr"]["frequency"] == pytest.approx(abs(np.corrcoef(proj, frequency)[0, 1]))
    assert result["directions"][1]["eigenvalue"] == report["spectrum"][1]
    assert not result["null"]["label_column_given"]
