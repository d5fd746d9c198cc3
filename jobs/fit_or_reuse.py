"""Fit-or-reuse for the nightly job: the fit parameters of a method, whether the last published transform may
be reused (same method and parameters, diagnosis within the drift thresholds), and saving a new fit.

Artifacts live in ``artifacts_dir/<transform_version>/`` (any path or URI of :mod:`anisotropy_core.storage`):
the transform artifact plus ``fit_report.json`` — the method, its parameters and the input metrics it was
fitted on, which the drift test compares against, and (:func:`mark_rejected`) ``rejected``: the run whose gate
refused the output made with it, and why. A rejected fit is kept for inspection and never reused.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pyspark.sql import DataFrame

from anisotropy_core import storage
from anisotropy_core.artifact import Artifact, ArtifactError, load_artifact, save_artifact
from anisotropy_core.candidates import ABTT_WHITENING
from anisotropy_core.decision import Recommendation
from anisotropy_core.methods import Method
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import AllButTheTop, FittedTransform, Whitening
from anisotropy_spark.estimators import CorrectionModel, estimator_for, model_class_for
from anisotropy_spark.io import TableRef
from jobs.nightly_config import NIGHTLY_KEYS, NightlyConfig

FIT_REPORT = "fit_report.json"
_Fitted = TypeVar("_Fitted", bound=FittedTransform)


def fit_params(config: NightlyConfig, method: str, rec: Recommendation) -> dict:
    """The parameters (config keys of :func:`~anisotropy_spark.estimators.estimator_for`) a fit of ``method``
    uses: the config's values under their nightly keys (:data:`~jobs.nightly_config.NIGHTLY_KEYS`), else the
    recommendation's directions / k, and the ``decision`` block's ``max_D`` (abtt, abtt_pca_abtt). ABTT without
    ``abtt_D`` removes the artefact test's significant directions (``evidence["artefact_directions"]``) when there
    are any, else the estimator's default: the top max(1, round(d/100)), recorded as d_rule
    "rule_of_thumb_d/100 (unverified)". Whitening without ``whitening_k`` keeps the candidate k
    (``evidence["whitening_k"]``: the directions holding ``whitening_variance`` of the variance, at most n − 1)."""
    params = {setting: getattr(config, key) for setting, key in NIGHTLY_KEYS.get(method, {}).items()}
    if method in (Method.ABTT, Method.ABTT_PCA_ABTT):
        params["max_D"] = config.decision.max_D
    if method == Method.ABTT:
        evidence = list(rec.evidence.get("artefact_directions") or [])
        directions = evidence if params["D"] is None and evidence else None
        if directions == list(range(1, len(directions or []) + 1)):  # the top D: stated as D, canonical
            return params | {"D": len(directions), "directions": None}
        params["directions"] = directions
    if method == Method.WHITENING and params["k"] is None:
        params["k"] = rec.evidence.get("whitening_k")
    return params


def candidate_fit(
    name: str, transform: FittedTransform | None, directions: list[int], config: NightlyConfig, rec: Recommendation
) -> tuple[str, dict]:
    """(method, fit parameters) of evaluation candidate ``name`` (see :mod:`anisotropy_core.candidates`), as
    :func:`fit_params` would state them: ``abtt+whitening`` is whitening with the ABTT ``directions`` excluded."""
    if name in (Method.NONE, Method.CENTER):
        return name, {}
    if name == Method.ABTT:
        abtt = _fitted_candidate(name, transform, AllButTheTop)
        return Method.ABTT, {"D": None, "directions": list(abtt.directions), "max_D": None}
    if name in (Method.WHITENING, ABTT_WHITENING):
        whitening = _fitted_candidate(name, transform, Whitening)
        return Method.WHITENING, {
            "k": whitening.k,
            "shrinkage": 0.0,
            "normalize": False,
            "exclude": list(directions) if name == ABTT_WHITENING else None,
        }
    return name, fit_params(config, name, rec)


def _fitted_candidate(name: str, transform: FittedTransform | None, kind: type[_Fitted]) -> _Fitted:
    """The fitted ``transform`` of candidate ``name``, which its family fits as a ``kind``; TypeError otherwise."""
    if not isinstance(transform, kind):
        raise TypeError(
            f"evaluation candidate {name}: expected a fitted {kind.__name__}, got {type(transform).__name__}"
        )
    return transform


def fit_model(
    config: NightlyConfig, method: str, params: dict, valid: DataFrame, ref: TableRef, moments: Moments
) -> CorrectionModel:
    """Fit ``method`` with ``params`` on the valid rows, whose merged ``moments`` the diagnosis computed: a
    moment-based method with n ≥ d fits from them (no second pass over the table), any other reads ``valid``.
    The model writes ``out_col`` and records ``ref``."""
    estimator = estimator_for(method, params, config.vector_col)
    model = estimator.fitWithMoments(valid, moments).setFittedOn(ref)
    return model.setOutputCol(config.out_col)


def model_of(transform: FittedTransform, n: int, config: NightlyConfig, ref: TableRef) -> CorrectionModel:
    """The Spark model of an already fitted ``transform`` (an evaluation candidate) fitted on ``n`` rows of
    ``ref``: no second fit pass."""
    model = model_class_for(transform.method)(transform, n=n).withFittedParams().setFittedOn(ref)
    return model.setInputCol(config.vector_col).setOutputCol(config.out_col)


def model_from(artifact: Artifact, config: NightlyConfig) -> CorrectionModel:
    """The Spark model of ``artifact`` (its method's model class: cluster recentering also writes cluster ids)."""
    return CorrectionModel.from_artifact(artifact, config.vector_col, config.out_col)


def serving_artifact(previous: dict | None) -> Artifact | None:
    """The artifact the output's current state was published with (``previous``: its publish metadata), loaded
    and verified by :func:`~anisotropy_core.artifact.load_artifact` (its content hash) and matched against the
    ``transform_version`` the published rows carry; None when that state has no artifact (nothing published, or
    method none). Raises :class:`ArtifactError` naming the path and the problem (missing, unreadable, corrupt)."""
    if not previous or not previous.get("artifact"):
        return None
    artifact = load_artifact(previous["artifact"])
    if artifact.transform_version != previous.get("transform_version"):
        raise ArtifactError(
            f"{previous['artifact']}: holds transform {artifact.transform_version}, but the published "
            f"rows carry {previous.get('transform_version')}"
        )
    return artifact


def reusable(
    config: NightlyConfig, previous: dict | None, method: str, params: dict, d: int, metrics: dict
) -> tuple[Artifact | None, str]:
    """(the artifact to reuse or None, why). Reuse needs ``refit: on_drift``, a previously published artifact
    (:func:`serving_artifact`) of the same method, dimension and fit parameters, not marked rejected, and every
    ``drift`` metric within its threshold."""
    if config.refit == "always":
        return None, "refit: always"
    if not previous or not previous.get("artifact"):
        return None, "no previously published transform"
    try:
        artifact = serving_artifact(previous)
        if artifact is None:  # not reached: previous names an artifact (checked above)
            return None, "no previously published transform"
        artifact.check_dimension(d)
        fitted = json.loads(storage.read_text(storage.join(previous["artifact"], FIT_REPORT)))
    except (OSError, ValueError) as exc:
        return None, f"previous artifact unusable ({exc})"
    if fitted.get("rejected"):
        rejected = fitted["rejected"]
        return None, (
            f"previous artifact {previous['artifact']} is marked rejected (run {rejected.get('run_id')}: "
            f"{rejected.get('reason')})"
        )
    if fitted.get("method") != method or fitted.get("params") != params:
        return None, f"method/params changed ({fitted.get('method')} {fitted.get('params')} → {method} {params})"
    moved = {k: abs(metrics[k] - fitted["metrics"][k]) for k in config.drift}
    over = {k: v for k, v in moved.items() if v > config.drift[k]}
    if over:
        return None, "diagnosis drifted beyond thresholds: " + ", ".join(
            f"{k} moved {v:.4g} > {config.drift[k]}" for k, v in over.items()
        )
    return artifact, "diagnosis within drift thresholds: " + ", ".join(f"{k} moved {v:.4g}" for k, v in moved.items())


def mark_rejected(path: str, run_id: str, reason: str) -> None:
    """Mark the fit saved at ``path`` rejected (by run ``run_id``'s gate, for ``reason``) in its fit report: the
    artifact stays for inspection, :func:`reusable` refuses it. A later run that fits the same numbers saves
    the fit again (:func:`save_fit`), which clears the mark."""
    report_path = storage.join(path, FIT_REPORT)
    report = json.loads(storage.read_text(report_path))
    report["rejected"] = {"run_id": run_id, "reason": reason}
    storage.write_atomic(report_path, json.dumps(report, indent=2, sort_keys=True))


def save_fit(config: NightlyConfig, model: CorrectionModel, method: str, params: dict, metrics: dict) -> str:
    """Save the fitted transform (artifact, then fit_report.json) under artifacts_dir; returns its path."""
    path = storage.join(config.artifacts_dir, model.transform_version)
    save_artifact(path, model.transform_, model.n, model.fitted_on)
    storage.write_atomic(
        storage.join(path, FIT_REPORT),
        json.dumps({"method": method, "params": params, "metrics": metrics}, indent=2, sort_keys=True),
    )
    return path
