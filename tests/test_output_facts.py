"""The nightly's single output pass: output moments of an affine correction from the input state, and the gate's
facts from that pass equal to those the separate passes (diagnose the output, gate join) compute."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from anisotropy_core.diagnostics import diagnose
from anisotropy_core.evaluation import neighbour_overlap, unit_rows
from anisotropy_core.moments import Moments
from anisotropy_core.output_facts import OutputFacts, OverlapQueries, affine_output_moments
from anisotropy_core.synthetic import cone
from anisotropy_core.transforms import fit_abtt, fit_abtt_pca_abtt, fit_center, fit_whitening
from anisotropy_spark.contract import TransformRowError
from anisotropy_spark.diagnostics import diagnose_dataframe
from anisotropy_spark.estimators import CorrectionModel
from anisotropy_spark.output_pass import OutputPass, output_facts
from anisotropy_spark.worker_errors import worker_error
from jobs.gate import gate
from jobs.nightly_config import NightlyConfig

X = cone(3000, 24, offset=3.0, alpha=1.0, seed=3)
STATE = Moments.of_batch(X)
AFFINE = {
    "center": fit_center(STATE),
    "abtt D=2": fit_abtt(STATE, D=2),
    "whitening k=12": fit_whitening(STATE, k=12),
    "abtt+whitening": fit_whitening(STATE, k=10, exclude=[1]),
    "abtt_pca_abtt": fit_abtt_pca_abtt(STATE, D=1, k=8, D2=1),
}


# counts against a threshold and slopes fitted over them: functions of the spectrum, not its smooth measures (at a
# whitened, flat spectrum erank_alpha is 0 in one and 2e-8 in the other); the moments themselves are compared above
FITTED = ("mp_above_upper", "numerical_rank", "power_law_alpha", "erank_alpha")


def relative(a, b, scale: float | None = None) -> float:
    """max |a − b| relative to max |b|, or to ``scale`` (a centred output's mean is ~0: measured against the spread)."""
    size = scale if scale is not None else float(np.max(np.abs(np.asarray(b))))
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / size)


def spread(state: Moments) -> float:
    """The root mean variance of a state, the scale its mean is compared at."""
    return float(np.sqrt(np.trace(state.covariance()) / state.d))


@pytest.mark.parametrize("name", list(AFFINE))
def test_affine_output_moments_equal_a_pass_over_the_output(name):
    transform = AFFINE[name]
    output = transform.apply(X)
    measured = Moments.of_batch(output)
    derived = affine_output_moments(STATE, transform, measured.sum_unit, measured.sum_norm)
    assert derived.n == measured.n
    assert relative(derived.mean, measured.mean, spread(measured)) < 1e-9
    assert relative(derived.comoment, measured.comoment) < 1e-9
    a, b = diagnose(derived).scalars(), diagnose(measured).scalars()
    for key in a:
        if key in FITTED:
            continue
        assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key


def test_a_correction_that_is_not_affine_has_no_derived_moments():
    normalised = fit_whitening(STATE, k=12, normalize=True)
    assert normalised.linear_map() is None
    assert affine_output_moments(STATE, normalised, np.zeros(12), 0.0) is None


def test_facts_merge_and_travel_as_bytes():
    transform = AFFINE["abtt D=2"]
    queries = OverlapQueries.of(X[:5], transform, 3)
    keys = np.arange(X.shape[0], dtype=np.int64)
    own = np.full(X.shape[0], -1)
    own[:5] = np.arange(5)
    whole = OutputFacts.empty(24, True, queries).add(X, transform.apply(X), keys, queries, own)
    halves = [
        OutputFacts.empty(24, True, queries).add(X[s], transform.apply(X[s]), keys[s], queries, own[s])
        for s in (slice(0, 1000), slice(1000, None))
    ]
    merged = OutputFacts.from_bytes(halves[0].to_bytes()).merge(OutputFacts.from_bytes(halves[1].to_bytes()))
    assert merged.rows == whole.rows == X.shape[0]
    assert relative(merged.sum_unit, whole.sum_unit) < 1e-12
    assert relative(merged.moments.comoment, whole.moments.comoment) < 1e-9
    np.testing.assert_array_equal(merged.raw_top[1], whole.raw_top[1])
    np.testing.assert_array_equal(merged.corrected_top[1], whole.corrected_top[1])
    # the brute-force top-3 of each query, its own row excluded, in both spaces
    for space, top in ((X, whole.raw_top), (transform.apply(X), whole.corrected_top)):
        scores = unit_rows(space[:5]) @ unit_rows(space).T
        scores[np.arange(5), np.arange(5)] = -np.inf
        np.testing.assert_array_equal(np.sort(top[1], axis=1), np.sort(np.argsort(-scores, axis=1)[:, :3], axis=1))


def dirty_table(spark):
    """float64 rows with an invalid vector of each kind, an id held by two rows and a norm outlier."""
    rows = [(int(i), [float(v) for v in X[i]]) for i in range(400)]
    rows += [
        (1000, None),
        (1001, [1.0, 2.0]),
        (1002, [float("nan")] * 24),
        (1003, [0.0] * 24),
        (7, [float(v) for v in X[8]]),
        (1004, [1e6] * 24),
    ]
    return spark.createDataFrame(rows, "id long, vector array<double>")


def test_gate_facts_of_the_single_pass_equal_those_of_the_separate_passes(spark):
    df = dirty_table(spark)
    transform = AFFINE["abtt D=2"]
    max_norm = 1e5
    duplicate_ids = pa.array([7], pa.int64())
    overlap_rows = X[[3, 50, 120]]
    spec = OutputPass(
        "vector",
        "id",
        24,
        transform,
        np.float64,
        max_norm,
        duplicate_ids,
        OverlapQueries.of(overlap_rows, transform, 5),
        pa.array([3, 50, 120], pa.int64()),
    )
    facts, reader = output_facts(df, None, spec)
    assert reader == "spark"
    # the separate passes: the valid rows, their transform, the output's diagnosis, the gate's join
    valid = df.where("id < 400 AND id != 7")
    model = CorrectionModel(transform, n=400)._set(inputCol="vector", outputCol="vector")
    candidate = model.transform(valid)
    counts = gate(candidate, valid, NightlyConfig(input="in", output="out"), transform.d_out, None, None)
    assert counts["output_rows"] == facts.rows == counts["valid_rows"] == 399
    assert counts["missing_ids"] == counts["unexpected_ids"] == counts["wrong_dimension"] == counts["non_finite"] == 0
    kept = np.array([i for i in range(400) if i != 7])
    input_state = Moments.of_batch(X[kept])
    separate = diagnose_dataframe(candidate, "vector", transform.d_out).scalars()
    single = diagnose(facts.output_moments(input_state, transform)).scalars()
    for key in separate:
        if key in FITTED:
            continue
        assert single[key] == pytest.approx(separate[key], rel=1e-9, abs=1e-12), key
    # the overlap of the three sampled rows, own row excluded, against brute force over the valid rows
    corrected = transform.apply(X[kept])
    expected = []
    for space, queries in ((X[kept], overlap_rows), (corrected, transform.apply(overlap_rows))):
        scores = unit_rows(queries) @ unit_rows(space).T
        scores[np.arange(3), np.searchsorted(kept, [3, 50, 120])] = -np.inf
        expected.append(np.argsort(-scores, axis=1)[:, :5])
    found = neighbour_overlap(facts.raw_top[1], facts.corrected_top[1])
    np.testing.assert_allclose(found, neighbour_overlap(expected[0], expected[1]))


def test_a_row_the_transform_cannot_map_is_named(spark):
    """array<double> rows of 1e39 written as float32: the pass raises TransformRowError naming the row's id, the
    error the gate turns into its refusal (and the write would raise)."""
    rows = [(int(i), [float(v) for v in X[i]]) for i in range(50)] + [(77, [1e39] * 24)]
    df = spark.createDataFrame(rows, "id long, vector array<double>")
    spec = OutputPass("vector", "id", 24, AFFINE["center"], np.float32)
    with pytest.raises(Exception) as caught:
        output_facts(df, None, spec)
    found = worker_error(caught.value)
    assert isinstance(found, TransformRowError) and "'id': 77" in str(found)
