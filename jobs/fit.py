"""Fit job: fit a correction on an embedding table and save it as a versioned transform artifact.

    anisotropy fit --conf conf/fit.yaml [--method abtt|whitening|center|cluster_recenter|abtt_pca_abtt|flow] [--D 3] ...
    python -m jobs.fit --conf conf/fit.yaml ...

One pass over ``input`` (pinned Delta version; the io validation contract) plus a driver ``eigh`` (``flow``:
a uniform sample of ``sample_size`` rows trained on the driver for ``steps`` Adam steps). The
artifact directory ``artifact`` holds ``manifest.json`` + ``arrays.npz`` (see anisotropy_core.artifact)
and the pyspark.ml ``metadata/``; it records the fitted-on table path and version. Prints the manifest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Literal

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import SparkSession

from anisotropy_core.artifact import load_artifact
from anisotropy_core.methods import SETTINGS, Method
from anisotropy_spark.contract import require_schema
from anisotropy_spark.estimators import CorrectionEstimator, estimator_for, method_params, registered_methods
from anisotropy_spark.io import as_vector_array, read_table, validate
from anisotropy_spark.session import get_spark
from jobs.cli import run
from jobs.config import InputSettings, parse_args, setting_field, setting_problems


def method_field(key: str) -> Any:
    """The fit config's field for setting ``key`` of every method that declares it (:data:`SETTINGS`); where
    their defaults differ (``k``, ``D``) the default is None: each method's own."""
    declared = [s for settings in SETTINGS.values() for s in settings.settings() if s.key == key]
    if len({repr(s.default) for s in declared}) == 1:
        return setting_field(*declared)
    return setting_field(*declared, default=None)


@dataclasses.dataclass(kw_only=True)
class FitConfig(InputSettings):
    """Settings of the fit job (conf/fit.yaml): ``method`` and the settings of every method, flat under their
    own keys (the fields of :mod:`anisotropy_core.methods`' settings classes, a key shared by several methods
    once); only those of ``method`` are used. Their defaults, constraints and ``--help`` come from those
    declarations (:func:`method_field`)."""

    artifact: str
    method: Method = Method.ABTT
    input_version: int | None = None
    D: int | None = method_field("D")
    max_D: int | None = method_field("max_D")
    directions: list[int] | None = method_field("directions")
    k: int | None = method_field("k")
    shrinkage: float = method_field("shrinkage")
    eps: float = method_field("eps")
    zca: bool = method_field("zca")
    normalize: bool = method_field("normalize")
    exclude: list[int] | None = method_field("exclude")
    D2: int | None = method_field("D2")
    distance_measure: Literal["euclidean", "cosine"] = method_field("distance_measure")
    max_iter: int = method_field("max_iter")
    tol: float = method_field("tol")
    init_steps: int = method_field("init_steps")
    task_memory: int = method_field("task_memory")
    sample_size: int = method_field("sample_size")
    steps: int = method_field("steps")
    couplings: int = method_field("couplings")
    hidden: int = method_field("hidden")
    batch_size: int = method_field("batch_size")
    learning_rate: float = method_field("learning_rate")
    seed: int = method_field("seed")
    master: str | None = None

    def check(self) -> list[str]:
        problems = self.input_problems()
        if self.method not in registered_methods():
            problems.append(f"method: {self.method!r} is not one of {registered_methods()}")
        return problems + setting_problems(self)

    def estimator(self) -> CorrectionEstimator:
        """The Estimator of ``method`` with this config's settings for it, reading ``vector_col``."""
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return estimator_for(self.method, method_params(self.method, settings), self.vector_col)


def run_fit(spark: SparkSession, config: FitConfig) -> dict:
    """Fit and save; returns the saved (hash-verified, reloaded) manifest."""
    df, ref = read_table(spark, config.input, config.input_version)
    require_schema(df.columns, config.named_columns())
    estimator = config.estimator()
    checked = validate(
        as_vector_array(df, config.vector_col),
        config.vector_col,
        config.id_col,
        config.dimension,
        config.on_invalid,
        config.quarantine_path,
        input_version=ref.version,
        with_moments=estimator.moment_based,  # a moment-based fit then needs no second pass
        max_norm_ratio=config.max_norm_ratio,
    )
    model = estimator.fitWithMoments(checked.valid, checked.moments).setFittedOn(ref)
    model.write().overwrite().save(config.artifact)
    return load_artifact(config.artifact).manifest


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_args(FitConfig, argv, "Fit an anisotropy correction and save it as an artifact")
    spark = get_spark("anisotropy-fit", master=config.master)
    print(json.dumps(run_fit(spark, config), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
