"""The Params of every correction, as pyspark.ml's ``_XParams`` mixins shared by each Estimator and its Model.

One name per concept everywhere (Params, job configs, the numpy core): ``D`` directions removed, ``maxD``
(config ``max_D``) the cap on a default D, ``k`` kept directions (whitening) or clusters (cluster
recentering), ``distanceMeasure`` (config ``distance_measure``). Config keys are the snake_case spelling of
the Param names (:func:`param_name`).
"""
from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasDistanceMeasure, HasInputCol, HasMaxIter, HasOutputCol, HasPredictionCol,
                                     HasSeed, HasTol)

from anisotropy_core.kmeans import DEFAULT_INIT_STEPS, DEFAULT_MAX_ITER, DEFAULT_TOL
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
    """``D`` directions removed (None = the textbook's starting point max(1, round(d/100)), at most ``maxD``,
    recorded as d_rule "rule_of_thumb_d/100 (unverified)"), or ``directions``: the 1-based principal-component
    indices to remove (any set, e.g. [1, 3]; overrides ``D``)."""

    D = Param(Params._dummy(), "D", "directions to remove; None = max(1, round(d/100)), unverified",
              typeConverter=TypeConverters.toInt)
    maxD = Param(Params._dummy(), "maxD", "cap on the default D; None = uncapped",
                 typeConverter=TypeConverters.toInt)
    directions = Param(Params._dummy(), "directions", "1-based principal directions to remove; None = the top D",
                       typeConverter=TypeConverters.toListInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(D=None, maxD=None, directions=None)

    def getD(self) -> int | None:
        return self.getOrDefault(self.D)

    def getMaxD(self) -> int | None:
        return self.getOrDefault(self.maxD)

    def getDirections(self) -> list[int] | None:
        return self.getOrDefault(self.directions)


class _WhiteningParams(_CorrectionParams):
    """Whitening-k: ``k`` kept directions (None = d, or the rank n − 1 when n ≤ d without shrinkage),
    ``shrinkage``, ``eps`` clamp, ``zca``, ``normalize``."""

    k = Param(Params._dummy(), "k", "kept directions; None = min(d, n - 1)", typeConverter=TypeConverters.toInt)
    shrinkage = Param(Params._dummy(), "shrinkage", "α: Σ ← (1−α)Σ + α tr(Σ)/d I",
                      typeConverter=TypeConverters.toFloat)
    eps = Param(Params._dummy(), "eps", "relative eigenvalue clamp (· λ1)", typeConverter=TypeConverters.toFloat)
    zca = Param(Params._dummy(), "zca", "symmetric W = UΛ^-1/2Uᵀ", typeConverter=TypeConverters.toBoolean)
    normalize = Param(Params._dummy(), "normalize", "L2-normalise the output",
                      typeConverter=TypeConverters.toBoolean)
    exclude = Param(Params._dummy(), "exclude", "1-based principal directions dropped first (ABTT then whitening)",
                    typeConverter=TypeConverters.toListInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(k=None, shrinkage=0.0, eps=DEFAULT_EPS, zca=False, normalize=False, exclude=None)

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

    def getExclude(self) -> list[int] | None:
        return self.getOrDefault(self.exclude)


class _AbttPcaAbttParams(_CorrectionParams):
    """ABTT → PCA-k → ABTT (seed ch. 3): ``D`` removed first, ``k`` PCA dimension kept (None = ⌈d/3⌉), ``D2``
    removed after the PCA (None = max(1, round(k/100)), unverified), ``maxD`` cap on both default counts
    (None = uncapped)."""

    D = Param(Params._dummy(), "D", "directions removed first; None = max(1, round(d/100)), unverified",
              typeConverter=TypeConverters.toInt)
    k = Param(Params._dummy(), "k", "PCA dimension kept; None = ceil(d/3)", typeConverter=TypeConverters.toInt)
    D2 = Param(Params._dummy(), "D2", "directions removed after the PCA; None = max(1, round(k/100)), unverified",
               typeConverter=TypeConverters.toInt)
    maxD = Param(Params._dummy(), "maxD", "cap on the default D and D2; None = uncapped",
                 typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(D=None, k=None, D2=None, maxD=None)

    def getD(self) -> int | None:
        return self.getOrDefault(self.D)

    def getK(self) -> int | None:
        return self.getOrDefault(self.k)

    def getD2(self) -> int | None:
        return self.getOrDefault(self.D2)

    def getMaxD(self) -> int | None:
        return self.getOrDefault(self.maxD)


class _FlowParams(_CorrectionParams, HasSeed):
    """BERT-flow (seed ch. 5): trained on ``sampleSize`` rows sampled to the driver, ``steps`` Adam steps of
    ``batchSize`` rows at ``learningRate``; ``couplings`` additive couplings with an MLP of width ``hidden``."""

    sampleSize = Param(Params._dummy(), "sampleSize", "rows sampled to the driver for training",
                       typeConverter=TypeConverters.toInt)
    steps = Param(Params._dummy(), "steps", "Adam steps", typeConverter=TypeConverters.toInt)
    couplings = Param(Params._dummy(), "couplings", "additive coupling layers", typeConverter=TypeConverters.toInt)
    hidden = Param(Params._dummy(), "hidden", "hidden width of each coupling's MLP", typeConverter=TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "mini-batch size", typeConverter=TypeConverters.toInt)
    learningRate = Param(Params._dummy(), "learningRate", "Adam step size", typeConverter=TypeConverters.toFloat)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(sampleSize=5000, steps=300, couplings=4, hidden=32, batchSize=256, learningRate=1e-2,
                         seed=0)

    def getSampleSize(self) -> int:
        return self.getOrDefault(self.sampleSize)

    def getSteps(self) -> int:
        return self.getOrDefault(self.steps)

    def getCouplings(self) -> int:
        return self.getOrDefault(self.couplings)

    def getHidden(self) -> int:
        return self.getOrDefault(self.hidden)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def getLearningRate(self) -> float:
        return self.getOrDefault(self.learningRate)


class _ClusterRecenterParams(_CorrectionParams, HasPredictionCol, HasSeed, HasMaxIter, HasTol, HasDistanceMeasure):
    """Cluster recentering: ``k`` clusters, ``D`` within-cluster directions removed per cluster,
    ``distanceMeasure`` (euclidean | cosine), ``seed``, ``maxIter``, ``tol`` (relative inertia change),
    ``initSteps`` (k-means|| rounds), ``taskMemory`` (bytes of rows a task may hold to refine k-means in memory,
    0 = stream; see ``anisotropy_spark.kmeans``), ``predictionCol`` (the model's cluster-id column, default
    ``cluster_id``)."""

    k = Param(Params._dummy(), "k", "number of clusters", typeConverter=TypeConverters.toInt)
    D = Param(Params._dummy(), "D", "top within-cluster directions removed per cluster",
              typeConverter=TypeConverters.toInt)
    initSteps = Param(Params._dummy(), "initSteps", "k-means|| rounds", typeConverter=TypeConverters.toInt)
    taskMemory = Param(Params._dummy(), "taskMemory", "bytes of rows a task may hold to refine k-means in memory "
                       "(barrier stage); 0 re-reads the table", typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(k=8, D=0, distanceMeasure="euclidean", seed=0, maxIter=DEFAULT_MAX_ITER, tol=DEFAULT_TOL,
                         initSteps=DEFAULT_INIT_STEPS, taskMemory=0, predictionCol="cluster_id")

    def getK(self) -> int:
        return self.getOrDefault(self.k)

    def getD(self) -> int:
        return self.getOrDefault(self.D)

    def getInitSteps(self) -> int:
        return self.getOrDefault(self.initSteps)

    def getTaskMemory(self) -> int:
        return self.getOrDefault(self.taskMemory)
