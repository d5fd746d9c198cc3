"""Fit job: fit a correction on an embedding table and save it as a versioned transform artifact.

    python -m jobs.fit --conf conf/fit.yaml [--method abtt|whitening|center|abtt_pca_abtt|flow] [--D 3] [--k 256] ...

One pass over ``input`` (pinned Delta version; the io validation contract) plus a driver ``eigh`` (``flow``:
a uniform sample of ``flow_sample_size`` rows trained on the driver for ``flow_steps`` Adam steps). The
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
from anisotropy_spark.estimators import (AbttPcaAbttEstimator, AllButTheTopEstimator, CenterEstimator,
                                         CorrectionEstimator, FlowEstimator, WhiteningEstimator)
from anisotropy_spark.io import as_double_array, read_table, validate
from anisotropy_spark.kmeans import ClusterRecenterEstimator
from anisotropy_spark.session import get_spark
from jobs.config import parse_args, quarantine_problems


@dataclasses.dataclass
class FitConfig:
    """Settings of the fit job (conf/fit.yaml). D/max_D apply to abtt; k…normalize to whitening;
    clusters, cluster_metric, D_per_cluster and seed to cluster_recenter; D, k, D2 and max_D to abtt_pca_abtt;
    flow_* and seed to flow."""

    input: str
    artifact: str
    method: Literal["center", "abtt", "whitening", "cluster_recenter", "abtt_pca_abtt", "flow"] = "abtt"
    input_version: int | None = None
    vector_col: str = "vector"
    id_col: str = "id"
    D: int | None = None
    max_D: int | None = None
    k: int | None = None
    shrinkage: float = 0.0
    eps: float = DEFAULT_EPS
    zca: bool = False
    normalize: bool = False
    clusters: int = 8
    cluster_metric: Literal["euclidean", "cosine"] = "euclidean"
    D_per_cluster: int = 0
    D2: int | None = None
    flow_sample_size: int = 5000
    flow_steps: int = 300
    flow_couplings: int = 4
    flow_hidden: int = 32
    flow_batch_size: int = 256
    flow_learning_rate: float = 1e-2
    seed: int = 0
    on_invalid: Literal["error", "quarantine"] = "error"
    quarantine_path: str | None = None
    master: str | None = None

    def check(self) -> list[str]:
        problems = quarantine_problems(self)
        if any(v is not None and v < 0 for v in (self.D, self.max_D, self.D2)):
            problems.append("D, D2 and max_D must be >= 0")
        flow_sizes = {k: getattr(self, k) for k in ("flow_sample_size", "flow_steps", "flow_couplings",
                                                      "flow_hidden", "flow_batch_size")}
        problems += [f"{k} must be >= 1, got {v}" for k, v in flow_sizes.items() if v < 1]
        if self.flow_sample_size < 2 or not self.flow_learning_rate > 0:
            problems.append(f"flow_sample_size must be >= 2 and flow_learning_rate > 0, got "
                            f"{self.flow_sample_size}, {self.flow_learning_rate}")
        if self.k is not None and self.k < 1:
            problems.append(f"k must be >= 1, got {self.k}")
        if not 0.0 <= self.shrinkage <= 1.0:
            problems.append(f"shrinkage must be in [0, 1], got {self.shrinkage}")
        if self.clusters < 1 or self.D_per_cluster < 0:
            problems.append(f"clusters must be >= 1 and D_per_cluster >= 0, got {self.clusters}, {self.D_per_cluster}")
        if not self.eps > 0:
            problems.append(f"eps must be > 0, got {self.eps}")
        return problems


def estimator_for(config: FitConfig) -> CorrectionEstimator:
    """The Estimator the config asks for, reading ``vector_col``."""
    if config.method == "center":
        return CenterEstimator(inputCol=config.vector_col)
    if config.method == "abtt":
        return AllButTheTopEstimator(inputCol=config.vector_col, D=config.D, maxD=config.max_D)
    if config.method == "abtt_pca_abtt":
        return AbttPcaAbttEstimator(inputCol=config.vector_col, D=config.D, k=config.k, D2=config.D2,
                                    maxD=config.max_D)
    if config.method == "flow":
        return FlowEstimator(inputCol=config.vector_col, sampleSize=config.flow_sample_size,
                             steps=config.flow_steps, couplings=config.flow_couplings, hidden=config.flow_hidden,
                             batchSize=config.flow_batch_size, learningRate=config.flow_learning_rate,
                             seed=config.seed)
    if config.method == "cluster_recenter":
        return ClusterRecenterEstimator(inputCol=config.vector_col, k=config.clusters, D=config.D_per_cluster,
                                        distanceMeasure=config.cluster_metric, seed=config.seed)
    return WhiteningEstimator(inputCol=config.vector_col, k=config.k, shrinkage=config.shrinkage,
                              eps=config.eps, zca=config.zca, normalize=config.normalize)


def run_fit(spark: SparkSession, config: FitConfig) -> dict:
    """Fit and save; returns the saved (hash-verified, reloaded) manifest."""
    df, ref = read_table(spark, config.input, config.input_version)
    checked = validate(as_double_array(df, config.vector_col), config.vector_col, config.id_col, None,
                       config.on_invalid, config.quarantine_path)
    try:
        model = estimator_for(config).fit(checked.valid).setFittedOn(ref)
    finally:
        checked.release()
    model.write().overwrite().save(config.artifact)
    return load_artifact(config.artifact).manifest


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_args(FitConfig, argv, "Fit an anisotropy correction and save it as an artifact")
    spark = get_spark("anisotropy-fit", master=config.master)
    print(json.dumps(run_fit(spark, config), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
