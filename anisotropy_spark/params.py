"""The Params of every correction, as pyspark.ml's ``_XParams`` mixins shared by each Estimator and its Model,
generated from the settings declared once in :mod:`anisotropy_core.methods`.

Each setting becomes a Param of the camelCase spelling of its config key (``max_D`` → ``maxD``,
``distance_measure`` → ``distanceMeasure``: :func:`~anisotropy_core.methods.param_name`) with the setting's
default, a doc stating default and constraint, a ``get<Name>`` getter and a ``typeConverter`` that enforces
the constraint (:func:`converter`): a bad value raises wherever it is set — a setter, ``setParams``,
``fit``/``transform`` extra params, ``copy(extra)`` and ``load``.

The Params of a fitted model's output (``outputDtype``, ``handleInvalid``, ``idCol``, ``maxNorm``) are declared
here the same way (:data:`TRANSFORM_SETTINGS`).
"""

from __future__ import annotations

import typing
from typing import Any, Callable, ClassVar, Literal, Sequence

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasOutputCol, HasPredictionCol

from anisotropy_core.methods import (
    AbttPcaAbttSettings,
    AbttSettings,
    ClusterRecenterSettings,
    FlowSettings,
    MethodSettings,
    OutputDtype,
    Setting,
    WhiteningSettings,
)

HandleInvalid = Literal["unchecked", "error", "keep"]

TRANSFORM_SETTINGS = (
    Setting(
        "output_dtype",
        OutputDtype,
        "same",
        "element type of outputCol: same (as inputCol; VectorUDT counts as float64) | float32 | float64",
    ),
    Setting(
        "handle_invalid",
        HandleInvalid,
        "unchecked",
        "rows breaking the input contract (anisotropy_spark.contract): unchecked = not checked (a row the "
        "transform cannot map fails the action) | error = checked, the first invalid row fails the action "
        "naming its idCol | keep = checked, kept with a null outputCol and the reason in invalid_reason",
    ),
    Setting("id_col", str, "id", "id column named by handleInvalid's errors (a null id is an invalid row)"),
    Setting(
        "max_norm",
        float | None,
        None,
        "with handleInvalid error or keep, rows longer than this are invalid "
        "(norm_outlier; the nightly's norm-outlier limit); None = no limit",
        gt=0.0,
    ),
)


def converter(declared: Setting) -> Callable[[Any], Any]:
    """The ``typeConverter`` of the Param of ``declared``: pyspark's converter of its type (TypeError for a value
    of another type), then its constraint (:class:`~anisotropy_core.methods.SettingError`, a ValueError naming
    the Param). None passes where the setting allows it."""
    base = declared.base
    to_type: Callable[[Any], Any]
    if typing.get_origin(base) is list:
        to_type = TypeConverters.toListInt
    elif declared.choices is not None:
        to_type = TypeConverters.toString
    else:
        to_type = {
            int: TypeConverters.toInt,
            float: TypeConverters.toFloat,
            bool: TypeConverters.toBoolean,
            str: TypeConverters.toString,
        }[base]

    def convert(value: Any) -> Any:
        if value is None and declared.optional:
            return None
        return declared.validate(to_type(value), declared.param)

    return convert


def _getter(name: str) -> Callable[[Params], Any]:
    def get(self: Params) -> Any:
        return self.getOrDefault(name)

    get.__name__ = "get" + name[:1].upper() + name[1:]
    get.__doc__ = f"The value of {name} (set, else its default)."
    return get


class _DeclaredParams(Params):
    """Base of a Params mixin generated from declared settings: a subclass passes ``settings=`` (a method's
    :class:`~anisotropy_core.methods.MethodSettings`, kept as ``method_settings``) or ``declared=`` (the
    :class:`~anisotropy_core.methods.Setting` records) and gets one Param, default and getter per setting."""

    method_settings: ClassVar[type[MethodSettings] | None] = None
    _declared: ClassVar[tuple[Setting, ...]]  # set on each subclass by __init_subclass__

    def __init_subclass__(
        cls, settings: type[MethodSettings] | None = None, declared: Sequence[Setting] = (), **kwargs: Any
    ):
        super().__init_subclass__(**kwargs)
        if settings is not None:
            cls.method_settings = settings
            declared = settings.settings()
        cls._declared = tuple(declared)
        for item in declared:
            setattr(
                cls,
                item.param,
                Param(Params._dummy(), item.param, item.describe(with_default=False), typeConverter=converter(item)),
            )
            setattr(cls, _getter(item.param).__name__, _getter(item.param))

    def __init__(self, *args: Any):
        super().__init__(*args)
        for klass in type(self).__mro__:
            for item in vars(klass).get("_declared", ()):
                self._setDefault(**{item.param: item.default})


class _CorrectionParams(HasInputCol, HasOutputCol):
    """inputCol (default ``vector``: array<float|double> or VectorUDT), outputCol (default ``corrected``)."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(inputCol="vector", outputCol="corrected")


class _TransformParams(_DeclaredParams, declared=TRANSFORM_SETTINGS):
    """A fitted model's output Params: ``outputDtype``, ``handleInvalid``, ``idCol``, ``maxNorm``
    (:data:`TRANSFORM_SETTINGS`)."""

    # the getters __init_subclass__ generates, typed
    getOutputDtype: Callable[[], OutputDtype]
    getHandleInvalid: Callable[[], HandleInvalid]
    getIdCol: Callable[[], str]
    getMaxNorm: Callable[[], float | None]


class _AllButTheTopParams(_CorrectionParams, _DeclaredParams, settings=AbttSettings):
    """:class:`~anisotropy_core.methods.AbttSettings`: ``D``, ``maxD``, ``directions``."""

    # the getters __init_subclass__ generates, typed
    getD: Callable[[], int | None]
    getMaxD: Callable[[], int | None]
    getDirections: Callable[[], list[int] | None]


class _WhiteningParams(_CorrectionParams, _DeclaredParams, settings=WhiteningSettings):
    """:class:`~anisotropy_core.methods.WhiteningSettings`: ``k``, ``shrinkage``, ``eps``, ``zca``, ``normalize``,
    ``exclude``."""

    # the getters __init_subclass__ generates, typed
    getK: Callable[[], int | None]
    getShrinkage: Callable[[], float]
    getEps: Callable[[], float]
    getZca: Callable[[], bool]
    getNormalize: Callable[[], bool]
    getExclude: Callable[[], list[int] | None]


class _AbttPcaAbttParams(_CorrectionParams, _DeclaredParams, settings=AbttPcaAbttSettings):
    """:class:`~anisotropy_core.methods.AbttPcaAbttSettings`: ``D``, ``k``, ``D2``, ``maxD``."""

    # the getters __init_subclass__ generates, typed
    getD: Callable[[], int | None]
    getK: Callable[[], int | None]
    getD2: Callable[[], int | None]
    getMaxD: Callable[[], int | None]


class _FlowParams(_CorrectionParams, _DeclaredParams, settings=FlowSettings):
    """:class:`~anisotropy_core.methods.FlowSettings`: ``sampleSize``, ``steps``, ``couplings``, ``hidden``,
    ``batchSize``, ``learningRate``, ``seed``."""

    # the getters __init_subclass__ generates, typed
    getSampleSize: Callable[[], int]
    getSteps: Callable[[], int]
    getCouplings: Callable[[], int]
    getHidden: Callable[[], int]
    getBatchSize: Callable[[], int]
    getLearningRate: Callable[[], float]
    getSeed: Callable[[], int]


class _ClusterRecenterParams(_CorrectionParams, HasPredictionCol, _DeclaredParams, settings=ClusterRecenterSettings):
    """:class:`~anisotropy_core.methods.ClusterRecenterSettings`: ``k``, ``D``, ``distanceMeasure``, ``seed``,
    ``maxIter``, ``tol``, ``initSteps``, ``taskMemory``; and ``predictionCol`` (the model's cluster-id column,
    default ``cluster_id``)."""

    # the getters __init_subclass__ generates, typed
    getK: Callable[[], int]
    getD: Callable[[], int]
    getDistanceMeasure: Callable[[], Literal["euclidean", "cosine"]]
    getSeed: Callable[[], int]
    getMaxIter: Callable[[], int]
    getTol: Callable[[], float]
    getInitSteps: Callable[[], int]
    getTaskMemory: Callable[[], int]

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(predictionCol="cluster_id")
