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
from typing import Literal

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import SparkSession

from anisotropy_core.artifact import load_artifact
from anisotropy_core.transforms import DEFAULT_EPS
from anisotropy_spark.contract import require_schema
from anisotropy_spark.estimators import CorrectionEstimator, estimator_for, method_params, registered_methods
from anisotropy_spark.io import as_vector_array, read_table, validate
from anisotropy_spark.session import get_spark
from jobs.cli import run
from jobs.config import InputSettings, flow_problems, parse_args


@dataclasses.dataclass(kw_only=True)
class FitConfig(InputSettings):
    """Settings of the fit job (conf/fit.yaml). The method settings are its Estimator's Params in snake_case
    (:func:`anisotropy_spark.params.param_name`); only those of ``method`` are used: ``D``/``max_D`` (abtt),
    ``k``…``normalize`` (whitening), ``k``, ``D``, ``distance_measure``, ``seed``, ``task_memory``
    (cluster_recenter), ``D``, ``k``, ``D2``, ``max_D`` (abtt_pca_abtt), ``sample_size``…``learning_rate``,
    ``seed`` (flow)."""

    artifact: str
    method: str = "abtt"
    input_version: int | None = None
    D: int | None = None
    max_D: int | None = None
    k: int | None = None
    shrinkage: float = 0.0
    eps: float = DEFAULT_EPS
    zca: bool = False
    normalize: bool = False
    distance_measure: Literal["euclidean", "cosine"] = "euclidean"
    task_memory: int = 0
    D2: int | None = None
    sample_size: int = 5000
    steps: int = 300
    couplings: int = 4
    hidden: int = 32
    batch_size: int = 256
    learning_rate: float = 1e-2
    seed: int = 0
    master: str | None = None

    def check(self) -> list[str]:
        problems = self.input_problems()
        if self.method not in registered_methods():
            problems.append(f"method: {self.method!r} is not one of {registered_methods()}")
        if any(v is not None and v < 0 for v in (self.D, self.max_D, self.D2)):
            problems.append("D, D2 and max_D must be >= 0")
        problems += flow_problems(self)
        if self.k is not None and self.k < 1:
            problems.append(f"k must be >= 1, got {self.k}")
        if self.task_memory < 0:
            problems.append(f"task_memory must be >= 0 bytes, got {self.task_memory}")
        if not 0.0 <= self.shrinkage <= 1.0:
            problems.append(f"shrinkage must be in [0, 1], got {self.shrinkage}")
        if not self.eps > 0:
            problems.append(f"eps must be > 0, got {self.eps}")
        return problems

    def estimator(self) -> CorrectionEstimator:
        """The Estimator of ``method`` with this config's settings for it, reading ``vector_col``."""
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return estimator_for(self.method, method_params(self.method, settings), self.vector_col)


def run_fit(spark: SparkSession, config: FitConfig) -> dict:
    """Fit and save; returns the saved (hash-verified, reloaded) manifest."""
    df, ref = read_table(spark, config.input, config.input_version)
    require_schema(df.columns, config.named_columns())
    estimator = config.estimator()
    checked = validate(as_vector_array(df, config.vector_col), config.vector_col, config.id_col, config.dimension,
                       config.on_invalid, config.quarantine_path, input_version=ref.version,
                       with_moments=estimator.moment_based,   # a moment-based fit then needs no second pass
                       max_norm_ratio=config.max_norm_ratio)
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
