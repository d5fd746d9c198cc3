"""The Params of every correction, as pyspark.ml's ``_XParams`` mixins shared by each Estimator and its Model.

One name per concept everywhere (Params, job configs, the numpy core): ``D`` directions removed, ``maxD``
(config ``max_D``) the cap on a measured D, ``k`` kept directions (whitening) or clusters (cluster
recentering), ``distanceMeasure`` (config ``distance_measure``). Config keys are the snake_case spelling of
the Param names (:func:`param_name`).
"""
from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasDistanceMeasure, HasInputCol, HasMaxIter, HasOutputCol, HasPredictionCol,
                                     HasSeed, HasTol)

from anisotropy_core.clustering import DEFAULT_INIT_STEPS, DEFAULT_MAX_ITER, DEFAULT_TOL
from anisotropy_core.transforms import DEFAULT_EPS


def param_name(config_key: str) -> str:
    """The Param name of a snake_case config key: ``max_D`` → ``maxD``, ``distance_measure`` → ``distanceMeasure``."""
    head, *rest = config_key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class _CorrectionParams(HasInputCol, HasOutputCol):
    """inputCol (default ``vector``: array<float|double> or VectorUDT), outputCol (default ``corrected``)."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(inputCol="vector", outputCol="corrected")


OUTPUT_DTYPES = {"same", "float32", "float64"}


class HasOutputDtype(Params):
    """outputDtype: element type of outputCol — ``same`` (default: as inputCol; VectorUDT counts as float64),
    ``float32`` or ``float64``."""

    outputDtype = Param(Params._dummy(), "outputDtype",
                        "element type of outputCol: same (as inputCol; VectorUDT counts as float64) | float32 | float64",
                        typeConverter=TypeConverters.toString)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(outputDtype="same")

    def getOutputDtype(self) -> str:
        return self.getOrDefault(self.outputDtype)


class _AllButTheTopParams(_CorrectionParams):
    """``D`` directions removed (None = Marchenko–Pastur count, capped at ``maxD``, default round(d/100))."""

    D = Param(Params._dummy(), "D", "directions to remove; None = Marchenko–Pastur count (capped)",
              typeConverter=TypeConverters.toInt)
    maxD = Param(Params._dummy(), "maxD", "cap on the measured D; None = max(1, round(d/100))",
                 typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(D=None, maxD=None)

    def getD(self) -> int | None:
        return self.getOrDefault(self.D)

    def getMaxD(self) -> int | None:
        return self.getOrDefault(self.maxD)


class _WhiteningParams(_CorrectionParams):
    """Whitening-k: ``k`` kept directions (None = d), ``shrinkage``, ``eps`` clamp, ``zca``, ``normalize``."""

    k = Param(Params._dummy(), "k", "kept directions; None = d", typeConverter=TypeConverters.toInt)
    shrinkage = Param(Params._dummy(), "shrinkage", "α: Σ ← (1−α)Σ + α tr(Σ)/d I",
                      typeConverter=TypeConverters.toFloat)
    eps = Param(Params._dummy(), "eps", "relative eigenvalue clamp (· λ1)", typeConverter=TypeConverters.toFloat)
    zca = Param(Params._dummy(), "zca", "symmetric W = UΛ^-1/2Uᵀ", typeConverter=TypeConverters.toBoolean)
    normalize = Param(Params._dummy(), "normalize", "L2-normalise the output",
                      typeConverter=TypeConverters.toBoolean)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(k=None, shrinkage=0.0, eps=DEFAULT_EPS, zca=False, normalize=False)

    def getK(self) -> int | None:
        return self.getOrDefault(self.k)

    def getShrinkage(self) -> float:
        return self.getOrDefault(self.shrinkage)

    def getEps(self) -> float:
        return self.getOrDefault(self.eps)

    def getZca(self) -> bool:
        return self.getOrDefault(self.zca)

    def getNormalize(self) -> bool:
        return self.getOrDefault(self.normalize)


class _ClusterRecenterParams(_CorrectionParams, HasPredictionCol, HasSeed, HasMaxIter, HasTol, HasDistanceMeasure):
    """Cluster recentering: ``k`` clusters, ``D`` within-cluster directions removed per cluster,
    ``distanceMeasure`` (euclidean | cosine), ``seed``, ``maxIter``, ``tol`` (relative inertia change),
    ``initSteps`` (k-means|| rounds), ``predictionCol`` (the model's cluster-id column, default ``cluster_id``)."""

    k = Param(Params._dummy(), "k", "number of clusters", typeConverter=TypeConverters.toInt)
    D = Param(Params._dummy(), "D", "top within-cluster directions removed per cluster",
              typeConverter=TypeConverters.toInt)
    initSteps = Param(Params._dummy(), "initSteps", "k-means|| rounds", typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(k=8, D=0, distanceMeasure="euclidean", seed=0, maxIter=DEFAULT_MAX_ITER, tol=DEFAULT_TOL,
                         initSteps=DEFAULT_INIT_STEPS, predictionCol="cluster_id")

    def getK(self) -> int:
        return self.getOrDefault(self.k)

    def getD(self) -> int:
        return self.getOrDefault(self.D)

    def getInitSteps(self) -> int:
        return self.getOrDefault(self.initSteps)
