"""pyspark.ml Estimators and Models for the corrections of :mod:`anisotropy_core.transforms`, and the
method registry (:func:`estimator_for`).

* :class:`CenterEstimator`, :class:`AllButTheTopEstimator`, :class:`WhiteningEstimator`,
  :class:`AbttPcaAbttEstimator` — ``fit(df)`` is one pass (:func:`~anisotropy_spark.moments.corpus_moments`,
  Arrow batches + treeReduce) plus a driver ``eigh`` (the n × n Gram route when n < d); it returns a
  :class:`CorrectionModel` (:class:`AllButTheTopModel`, :class:`WhiteningModel`, …: the Params of
  :mod:`anisotropy_spark.params` on both sides, pyspark.ml style).
* :class:`FlowEstimator` — trains BERT-flow on a uniform driver-side sample; also a :class:`CorrectionModel`.
* :class:`CorrectionModel` — wraps any fitted :class:`~anisotropy_core.transforms.FittedTransform`;
  ``transform(df)`` only builds a plan (no Spark job) that maps Arrow batches through numpy with ``mapInArrow`` (no per-row Python) and writes
  ``outputCol`` (d_out long), keeping every other column. The math runs in float64 inside each batch; the
  output element type follows ``outputDtype``: ``same`` (default: ``array<float>`` in → ``array<float>`` out,
  ``array<double>`` or VectorUDT in → ``array<double>`` out), ``float32`` or ``float64``. Every output value
  is checked finite after that cast (float64 results can overflow float32). ``save(path)`` writes the
  versioned artifact (``manifest.json`` + ``arrays.npz``, see :mod:`anisotropy_core.artifact`) plus the
  pyspark.ml ``metadata/`` folder, so the model also loads as a ``PipelineModel`` stage; ``load(path)``
  accepts either (a bare artifact written by plain numpy loads with default column params). ``handleInvalid``
  (``unchecked`` default | ``error`` | ``keep``, with ``idCol``) checks the rows against the input contract in
  the same pass. The fitted arrays are read-only properties (``mean``, ``components``, ``clusterCenters``, …).

Each method's Params are its settings of :mod:`anisotropy_core.methods` (:mod:`anisotropy_spark.params`):
every Estimator takes them by keyword, has a ``set<Name>`` for each, and refuses a value outside a setting's
constraint wherever it is set.

A new correction plugs in by declaring its settings (:mod:`anisotropy_core.methods`), subclassing
:class:`CorrectionEstimator` (registered with :func:`register_estimator`) and implementing
``_fit_transform(vectors_df, vector_col, d) -> (FittedTransform, n)``. Its model class (``model_class``, registered for its transform method with :func:`register_model_class`
so :meth:`CorrectionModel.from_artifact` and :meth:`CorrectionModel.load` return it) may write more than
``outputCol`` (cluster recentering also writes the cluster id) by overriding
:meth:`CorrectionModel.extra_output_fields` and :meth:`CorrectionModel.batch_outputs`.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

import numpy as np
import pyarrow as pa
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param
from pyspark.ml.util import (
    DefaultParamsReadable,
    DefaultParamsReader,
    DefaultParamsWritable,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import ArrayType, DoubleType, FloatType, StringType, StructField, StructType

from anisotropy_core import storage
from anisotropy_core.artifact import Artifact, ArtifactError, build_manifest, load_artifact, save_artifact
from anisotropy_core.flow import FlowTransform, fit_flow
from anisotropy_core.methods import Method, OutputDtype, param_name, settings_of
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import (
    AbttPcaAbtt,
    AllButTheTop,
    FitData,
    FittedTransform,
    Whitening,
    fit_abtt,
    fit_abtt_pca_abtt,
    fit_center,
    fit_whitening,
)

from .arrow import batch_matrix, matrix_column
from .contract import (
    REASON_COLUMN,
    ForeignDimensionError,
    SchemaError,
    TransformRowError,
    check_batch,
    first_invalid_error,
)
from .diagnostics import sample_rows
from .io import TableRef, as_vector_array, infer_dimension
from .moments import arrow_batch_rows, corpus_moments
from .params import (
    HandleInvalid,
    _AbttPcaAbttParams,
    _AllButTheTopParams,
    _CorrectionParams,
    _FlowParams,
    _TransformParams,
    _WhiteningParams,
)
from .table_files import TableFiles
from .worker_errors import raised_in_workers

# keyed by Method, looked up by its plain name (a Method hashes and compares equal to it)
_MODEL_CLASSES: dict[str, type["CorrectionModel"]] = {}
_ESTIMATOR_CLASSES: dict[str, type["CorrectionEstimator"]] = {}
# methods whose classes live in another module of this package: imported on first use, so
# ``estimator_for`` and ``CorrectionModel.from_artifact`` work without the caller importing that module
_METHOD_MODULES: dict[str, str] = {Method.CLUSTER_RECENTER: "anisotropy_spark.kmeans"}
_Fitted = TypeVar("_Fitted", bound=FittedTransform)


def _registered(table: dict[str, type], method: str) -> type | None:
    if method not in table and method in _METHOD_MODULES:
        importlib.import_module(_METHOD_MODULES[method])
    return table.get(method)


def register_estimator(method: Method) -> Callable[[type], type]:
    """Class decorator: ``estimator_for(method, ...)`` builds this :class:`CorrectionEstimator` subclass.
    A new correction registers its Estimator here and its Model with :func:`register_model_class`."""

    def decorate(estimator_cls: type) -> type:
        _ESTIMATOR_CLASSES[method] = estimator_cls
        return estimator_cls

    return decorate


def estimator_for(
    method: str, params: Mapping[str, Any] | None = None, input_col: str = "vector"
) -> "CorrectionEstimator":
    """The Estimator of correction ``method`` reading ``input_col``, with ``params`` given by config key
    (snake_case, e.g. ``{"D": 3, "max_D": 5}`` or ``{"k": 8, "distance_measure": "cosine"}``: see
    :func:`~anisotropy_core.methods.param_name`); None values keep the Param's default. A value its Param's
    converter refuses (a wrong type, a broken constraint) raises ValueError naming ``<method>.<key>``."""
    estimator_cls = _registered(_ESTIMATOR_CLASSES, method)
    if estimator_cls is None:
        raise ValueError(f"unknown correction method {method!r}; registered: {registered_methods()}")
    estimator = estimator_cls(inputCol=input_col)
    for key, value in (params or {}).items():
        name = param_name(key)
        if not estimator.hasParam(name):
            raise ValueError(f"{method}: unknown parameter {key!r}; known: {sorted(p.name for p in estimator.params)}")
        if value is not None:
            try:
                estimator._set(**{name: value})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{method}.{key}: {exc}") from exc
    return estimator


def method_params(method: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``settings`` (config keys) that are settings of ``method``
    (:func:`~anisotropy_core.methods.settings_of`) — what a job config holding the settings of several methods
    passes to :func:`estimator_for`."""
    return {s.key: settings[s.key] for s in settings_of(method).settings() if s.key in settings}


def registered_methods() -> list[str]:
    """Every correction method with a registered Estimator (including those of lazily imported modules)."""
    for module in set(_METHOD_MODULES.values()):
        importlib.import_module(module)
    return sorted(str(m) for m in _ESTIMATOR_CLASSES)


def register_model_class(method: Method) -> Callable[[type["CorrectionModel"]], type["CorrectionModel"]]:
    """Class decorator: artifacts of transform ``method`` load as this :class:`CorrectionModel` subclass."""

    def decorate(model_cls: type["CorrectionModel"]) -> type["CorrectionModel"]:
        if not issubclass(model_cls, CorrectionModel):
            raise TypeError(f"{model_cls.__name__} is not a CorrectionModel")
        _MODEL_CLASSES[method] = model_cls
        return model_cls

    return decorate


def model_class_for(method: str) -> type["CorrectionModel"]:
    """The model class registered for transform ``method``; :class:`CorrectionModel` for any other method."""
    return _registered(_MODEL_CLASSES, method) or CorrectionModel


def _class_params(cls: type) -> list[str]:
    """The names of the Params ``cls`` declares or inherits."""
    return sorted(name for name in dir(cls) if isinstance(getattr(cls, name, None), Param))


def _setter_name(param: str) -> str:
    return "set" + param[:1].upper() + param[1:]


def _add_setters(cls: type, params: Sequence[str]) -> None:
    """Give ``cls`` a ``set<Name>(value)`` (sets the Param, returns the instance) for each of ``params`` it has no
    setter for."""
    for name in params:
        if not hasattr(cls, _setter_name(name)):

            def set_param(self, value, name=name):
                return self._set(**{name: value})

            set_param.__name__ = _setter_name(name)
            set_param.__doc__ = f"Set {name}; returns this instance."
            setattr(cls, set_param.__name__, set_param)


class CorrectionEstimator(Estimator, _CorrectionParams, DefaultParamsReadable, DefaultParamsWritable):
    """Base Estimator: reads ``inputCol``, infers d, delegates the math to ``_fit_transform``.

    ``model_class``: the :class:`CorrectionModel` (sub)class ``fit`` returns; every param the model shares
    with the estimator by name (the columns and, for a method's own model class, its Params) is copied over.

    Every Param has a setter ``set<Name>`` (written by hand or added when the subclass is defined), and is set
    by keyword at construction or with :meth:`setParams`; see ``explainParams()`` for each one's meaning,
    default and constraint (from :mod:`anisotropy_core.methods`).
    """

    model_class: type["CorrectionModel"]  # set below, once CorrectionModel exists
    moment_based = True  # the fit is a function of the merged moments (see fitMoments)

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        _add_setters(cls, _class_params(cls))

    def __init__(self, **params: Any):
        super().__init__()
        self.setParams(**params)

    def setParams(self, **params: Any) -> "CorrectionEstimator":
        """Set Params by name (e.g. ``inputCol="v", D=2``); an unknown name raises AttributeError."""
        return self._set(**params)

    def _fit(self, dataset: DataFrame) -> "CorrectionModel":
        col = self.getInputCol()
        vectors = as_vector_array(dataset.select(col), col)
        d = infer_dimension(vectors, col)
        transform, n = self._fit_transform(vectors, col, d)
        return self._model(transform, n)

    def fitMoments(self, state: Moments) -> "CorrectionModel":
        """The model :meth:`fit` gives on the rows whose merged moments are ``state`` (n ≥ d), with no Spark pass:
        a job that already ran the moments pass over those rows (the nightly's diagnosis) reuses it. Only for
        ``moment_based`` methods; below n = d, :meth:`fit` takes the Gram route over the rows themselves."""
        if not self.canFitMoments(state):
            raise ValueError(
                f"{type(self).__name__} does not fit from moments; call fit on the rows"
                if not self.moment_based
                else f"fitMoments needs n >= d (got n={state.n}, d={state.d}); call fit on the rows"
            )
        return self._model(self._fit_moments(state), state.n)

    def canFitMoments(self, state: Moments) -> bool:
        """Whether :meth:`fitMoments` applies to ``state``: a ``moment_based`` method and n ≥ d."""
        return self.moment_based and state.n >= state.d

    def fitWithMoments(self, dataset: DataFrame, state: Moments | None) -> "CorrectionModel":
        """:meth:`fitMoments` on ``state``, the merged moments of ``dataset``'s vectors that a job's validation
        pass already computed, when :meth:`canFitMoments`; else (or with ``state`` None) :meth:`fit` on
        ``dataset``. Either way the model :meth:`fit` gives."""
        return self.fitMoments(state) if state is not None and self.canFitMoments(state) else self.fit(dataset)

    def _model(self, transform: FittedTransform, n: int) -> "CorrectionModel":
        """The fitted model of ``transform`` (fitted on ``n`` vectors), with this estimator's Params copied."""
        return self._copyValues(self.model_class(transform, n=n)).withFittedParams()

    def _fit_transform(self, vectors: DataFrame, col: str, d: int) -> tuple[FittedTransform, int]:
        """Fit on ``vectors`` (column ``col`` array<float|double> of length d) → (transform, vectors used).

        One moments pass; when it finds n < d the n rows (fewer than d, so bounded) are collected and the fit
        takes the Gram/dual route (seed ch. 6) instead of the rank-deficient d × d covariance.
        """
        state = corpus_moments(vectors, col, d)
        if state.n < d:
            rows, _ = sample_rows(vectors, col, d, [], state.n)
            return self._fit_moments(rows), state.n
        return self._fit_moments(state), state.n

    def _fit_moments(self, state: FitData) -> FittedTransform:
        """The fitted transform of a merged moments ``state``, or of the rows (n, d) when n < d."""
        raise NotImplementedError


@register_estimator(Method.CENTER)
class CenterEstimator(CorrectionEstimator):
    """Subtract the corpus mean.

    Examples
    --------
    >>> df = spark.createDataFrame([(i, [float(i % 3), float(i % 5), float(i % 7), 1.0 + i / 10])
    ...                             for i in range(40)], "id long, vector array<double>")
    >>> model = CenterEstimator(outputCol="centred").fit(df)
    >>> model.mean.round(2).tolist()
    [0.98, 2.0, 2.88, 2.95]
    >>> out = model.transform(df)
    >>> out.columns
    ['id', 'vector', 'centred']
    >>> model.save(temp_path + "/center")
    >>> CorrectionModel.load(temp_path + "/center").transform_version == model.transform_version
    True
    """

    def _fit_moments(self, state):
        return fit_center(state)


@register_estimator(Method.ABTT)
class AllButTheTopEstimator(CorrectionEstimator, _AllButTheTopParams):
    """Centre, then remove the top-D directions of the centred covariance (seed chapter 3).

    ``D`` (default None = the textbook's starting point max(1, round(d/100)), at most ``maxD``, recorded as
    ``transform_.d_rule`` "rule_of_thumb_d/100 (unverified)": "a starting point, not an answer"), or
    ``directions`` (e.g. the artefact test's significant set). The Marchenko–Pastur count is a diagnostic of
    :func:`anisotropy_core.diagnose`, never the default.

    Examples
    --------
    >>> df = spark.createDataFrame([(i, [float(i % 3), float(i % 5), float(i % 7), 1.0 + i / 10])
    ...                             for i in range(40)], "id long, vector array<double>")
    >>> abtt = AllButTheTopEstimator(D=1, outputCol="out")
    >>> model = abtt.fit(df)
    >>> model.getD(), model.components.shape, model.eigenvalues.shape
    (1, (1, 4), (4,))
    >>> out = np.array([row["out"] for row in model.transform(df).collect()])
    >>> bool(np.allclose(out @ model.components.T, 0))          # nothing left along the removed direction
    True
    >>> model.save(temp_path + "/abtt")
    >>> loaded = AllButTheTopModel.load(temp_path + "/abtt")
    >>> loaded.getD(), loaded.transform_version == model.transform_version
    (1, True)
    """

    def _fit_moments(self, state):
        return fit_abtt(state, D=self.getD(), max_D=self.getMaxD(), directions=self.getDirections())


@register_estimator(Method.WHITENING)
class WhiteningEstimator(CorrectionEstimator, _WhiteningParams):
    """Whitening-k (seed chapter 6): W = U_k Λ_k^{-1/2}, optional shrinkage, clamp, ZCA, L2 output.

    Examples
    --------
    >>> df = spark.createDataFrame([(i, [float(i % 3), float(i % 5), float(i % 7), 1.0 + i / 10])
    ...                             for i in range(40)], "id long, vector array<double>")
    >>> model = WhiteningEstimator(k=2, outputCol="white").fit(df)
    >>> model.getK(), model.matrix.shape, model.numOutputFeatures
    (2, (4, 2), 2)
    >>> out = np.array([row["white"] for row in model.transform(df).collect()])
    >>> bool(np.allclose(np.cov(out.T, bias=True), np.eye(2)))   # unit variance, uncorrelated
    True
    >>> model.save(temp_path + "/white")
    >>> WhiteningModel.load(temp_path + "/white").getK()
    2
    """

    def _fit_moments(self, state):
        return fit_whitening(
            state,
            k=self.getK(),
            shrinkage=self.getShrinkage(),
            eps=self.getEps(),
            zca=self.getZca(),
            normalize=self.getNormalize(),
            exclude=self.getExclude(),
        )


@register_estimator(Method.ABTT_PCA_ABTT)
class AbttPcaAbttEstimator(CorrectionEstimator, _AbttPcaAbttParams):
    """ABTT (D) → PCA-k → ABTT refitted on the reduced output (D2) (seed ch. 3, "Does it compose?").

    ``D``/``D2`` default to the rule of thumb (as :class:`AllButTheTopEstimator`), ``k`` to ⌈d/3⌉; one pass.

    Examples
    --------
    >>> df = spark.createDataFrame([(i, [float(i % 3), float(i % 5), float(i % 7), 1.0 + i / 10])
    ...                             for i in range(40)], "id long, vector array<double>")
    >>> model = AbttPcaAbttEstimator(D=1, k=2, D2=1, outputCol="reduced").fit(df)
    >>> model.firstComponents.shape, model.basis.shape, model.secondComponents.shape
    ((1, 4), (4, 2), (1, 2))
    >>> len(model.transform(df).first()["reduced"])
    2
    >>> model.save(temp_path + "/apa")
    >>> AbttPcaAbttModel.load(temp_path + "/apa").getK()
    2
    """

    def _fit_moments(self, state):
        return fit_abtt_pca_abtt(state, D=self.getD(), k=self.getK(), D2=self.getD2(), max_D=self.getMaxD())


@register_estimator(Method.FLOW)
class FlowEstimator(CorrectionEstimator, _FlowParams):
    """BERT-flow (seed ch. 5): a Glow-style flow (:mod:`anisotropy_core.flow`) trained by maximum likelihood
    on a uniform sample of ``sampleSize`` rows collected on the driver, for ``steps`` Adam steps.

    Examples
    --------
    >>> df = spark.createDataFrame([(i, [float(i % 3), float(i % 5), float(i % 7), 1.0 + i / 10])
    ...                             for i in range(40)], "id long, vector array<double>")
    >>> flow = FlowEstimator(sampleSize=40, steps=5, couplings=1, hidden=4, batchSize=10, seed=0)
    >>> model = flow.setOutputCol("latent").fit(df)
    >>> model.trainingLog["sample_size"], model.trainingLog["steps"]
    (40, 5)
    >>> len(model.transform(df).first()["latent"])
    4
    >>> model.save(temp_path + "/flow")
    >>> FlowModel.load(temp_path + "/flow").transform_version == model.transform_version
    True
    """

    moment_based = False

    def _fit_transform(self, vectors, col, d):
        sample, _ = sample_rows(vectors, col, d, [], self.getSampleSize(), self.getSeed())
        transform = fit_flow(
            sample,
            couplings=self.getCouplings(),
            hidden=self.getHidden(),
            steps=self.getSteps(),
            batch_size=self.getBatchSize(),
            learning_rate=self.getLearningRate(),
            seed=self.getSeed(),
        )
        return transform, int(sample.shape[0])


class CorrectionModel(Model, _CorrectionParams, _TransformParams, MLReadable, MLWritable):
    """A fitted correction applied batch-wise. ``transform_``: the numpy transform; ``n``: fit size;
    ``fitted_on``: {"path", "format", "version"} of the fit table or None (recorded in the artifact).

    Settable Params (each with a setter): ``inputCol``, ``outputCol``, ``outputDtype``, ``handleInvalid``,
    ``idCol`` (and a subclass's own output columns, e.g. ``predictionCol``). The method's Params (``D``, ``k``,
    …) hold the fitted values and are read-only; the fitted arrays are read-only properties (:attr:`mean`, and
    per method e.g. :attr:`AllButTheTopModel.components`).
    """

    # the setters _add_setters gives every model, typed (a subclass adds those of its own output columns)
    setInputCol: Callable[[str], CorrectionModel]
    setOutputCol: Callable[[str], CorrectionModel]
    setOutputDtype: Callable[[OutputDtype], CorrectionModel]
    setHandleInvalid: Callable[[HandleInvalid], CorrectionModel]
    setIdCol: Callable[[str], CorrectionModel]
    setMaxNorm: Callable[[float | None], CorrectionModel]

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        _add_setters(cls, cls._settable_params())

    @classmethod
    def _settable_params(cls) -> list[str]:
        """Every Param of the class but the fitted ones (its method's settings)."""
        fitted = {s.param for s in cls.method_settings.settings()} if cls.method_settings else set()
        return [name for name in _class_params(cls) if name not in fitted]

    def __init__(self, transform: FittedTransform | None = None, n: int = 0, fitted_on: dict | None = None):
        super().__init__()
        self._fitted_transform = transform
        self.n = int(n)
        self.fitted_on = fitted_on

    @property
    def transform_(self) -> FittedTransform:
        """The fitted numpy transform; ValueError for a model made without one."""
        if self._fitted_transform is None:
            raise ValueError(f"this {type(self).__name__} holds no fitted transform (made without one)")
        return self._fitted_transform

    def fitted(self, kind: type[_Fitted]) -> _Fitted:
        """:attr:`transform_` as the :class:`FittedTransform` subclass ``kind`` this model class holds; TypeError
        for another one."""
        transform = self.transform_
        if not isinstance(transform, kind):
            raise TypeError(f"a {type(self).__name__} holds a {kind.__name__}, got {type(transform).__name__}")
        return transform

    @classmethod
    def from_artifact(cls, artifact: Artifact, inputCol: str = "vector", outputCol: str = "corrected"):
        """The model of ``artifact``, of the class registered for its method (:func:`model_class_for`):
        ``CorrectionModel.from_artifact`` of a ``cluster_recenter`` artifact is a ``ClusterRecenterModel``
        (it also writes the cluster-id column). Called on a subclass, the artifact's class must be that
        subclass or below it, else :class:`ArtifactError`."""
        model_cls = model_class_for(artifact.transform.method)
        if not issubclass(model_cls, cls):
            raise ArtifactError(
                f"a {artifact.transform.method} artifact loads as {model_cls.__name__}, not as {cls.__name__}"
            )
        model = model_cls(artifact.transform, artifact.manifest["n"], artifact.manifest["fitted_on"])
        return model.withFittedParams()._set(inputCol=inputCol, outputCol=outputCol)

    def withFittedParams(self) -> "CorrectionModel":
        """Set every Param the fitted transform records (e.g. the measured ``D``, whitening's ``k``)."""
        fitted = {name: value for name, value in self.transform_.params().items() if self.hasParam(name)}
        return self._set(**fitted)

    def setFittedOn(self, table: TableRef) -> "CorrectionModel":
        self.fitted_on = {"path": table.path, "format": table.format, "version": table.version}
        return self

    def setParams(self, **params: Any) -> "CorrectionModel":
        """Set settable Params by name (e.g. ``outputCol="white", outputDtype="float32"``); a fitted Param
        raises ValueError (it is read-only on a model)."""
        fitted = sorted(set(params) - set(self._settable_params()) & {p.name for p in self.params})
        if fitted:
            raise ValueError(f"{fitted} are fitted Params of {type(self).__name__}, read-only on a model")
        return self._set(**params)

    @property
    def mean(self) -> np.ndarray:
        """(d_in,) the mean of the fit rows (read-only)."""
        return read_only(self.transform_.mean)

    @property
    def numFeatures(self) -> int:
        """d_in, the dimension of the input vectors."""
        return self.transform_.d_in

    @property
    def numOutputFeatures(self) -> int:
        """d_out, the dimension of the output vectors."""
        return self.transform_.d_out

    @property
    def transform_version(self) -> str:
        """``<method>-<hash12>``, identical to the saved artifact's."""
        return build_manifest(self.transform_, self.n, self.fitted_on)["transform_version"]

    def extra_output_fields(self) -> list[StructField]:
        """Columns written after ``outputCol`` (none here; ``ClusterRecenterModel``: the cluster id)."""
        return []

    def batch_outputs(self) -> "BatchOutputs | None":
        """Function ((B, d_in) float32|float64 vectors, output dtype) → ((B, d_out) corrected of that dtype,
        finite after the cast, one length-B Arrow array per :meth:`extra_output_fields` entry), run inside the
        Python workers; None = ``transform_.apply`` with no extra columns. It must capture plain data only (e.g.
        ``transform_``), never the model itself."""
        return None

    def _transform(self, dataset: DataFrame) -> DataFrame:
        """Only builds the plan (no Spark job): ``outputCol`` (and :meth:`extra_output_fields`) from ``inputCol``,
        every other column kept, rows checked against the input contract as ``handleInvalid`` says. With
        ``handleInvalid`` ``unchecked``, a vector whose dimension is not the transform's ``d_in`` fails the action that
        runs it, naming the batch row.

        The output vectors are declared ``array<float|double>`` with ``containsNull = false``: a row's vector is
        null (an invalid row) or a whole finite vector. Spark then copies each element out of the workers' Arrow
        batches without a per-element null check; a Delta table written from it keeps nullable element types."""
        df = as_vector_array(dataset, self.getInputCol())
        return df.mapInArrow(*self._batches(df.schema))

    def transform_files(self, spark: SparkSession, files: TableFiles) -> DataFrame:
        """:meth:`transform` of the table whose data files are ``files`` (its vector column an array), with
        pyarrow reading the row groups in the Spark tasks (:meth:`~.table_files.TableFiles.map_batches`), in
        batches of Spark's own Arrow batch size; the same Params apply. Runs the footer job of ``files``; the rest
        is lazy. A file that is not the table's columns fails the action with
        :class:`~.table_files.FileLayoutError`."""
        rows = arrow_batch_rows(spark, self.transform_.d_in, files.item_bytes(self.getInputCol()))
        return files.map_batches(spark, rows, *self._batches(files.schema))

    def _batches(self, schema: StructType) -> tuple[Callable, StructType]:
        """(the ``mapInArrow`` function, its output schema) of :meth:`transform` for input ``schema``."""
        col, out, handle = self.getInputCol(), self.getOutputCol(), self.getHandleInvalid()
        input_type = schema[col].dataType
        if not (isinstance(input_type, ArrayType) and isinstance(input_type.elementType, (FloatType, DoubleType))):
            raise SchemaError(
                f"vector column {col!r} has type {input_type.simpleString()}; expected array<float> or array<double>"
            )
        out_type = output_element_type(self.getOutputDtype(), input_type.elementType)
        extra = self.extra_output_fields()
        reason = [StructField(REASON_COLUMN, StringType(), True)] if handle == "keep" else []
        written = {out, *(f.name for f in extra + reason)}
        fields = [f for f in schema.fields if f.name not in written]
        vectors = StructField(out, ArrayType(out_type, containsNull=False), True)  # null rows, never null elements
        return (
            apply_batches(
                self.transform_,
                col,
                out,
                [f.name for f in extra],
                self.batch_outputs(),
                numpy_dtype(out_type),
                handle,
                self.getIdCol(),
                self.getMaxNorm(),
            ),
            StructType(fields + [vectors] + extra + reason),
        )

    def write(self) -> MLWriter:
        return _CorrectionWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _CorrectionReader(cls)


BatchOutputs = Callable[[np.ndarray, type], "tuple[np.ndarray, list[pa.Array]]"]


def read_only(array: np.ndarray) -> np.ndarray:
    """A read-only view of ``array`` (fitted state exposed by a model's properties)."""
    view = array.view()
    view.flags.writeable = False
    return view


def output_element_type(output_dtype: str, input_type: FloatType | DoubleType) -> FloatType | DoubleType:
    """Spark element type of the output vectors for ``output_dtype`` (same | float32 | float64)."""
    if output_dtype == "same":
        return input_type
    return FloatType() if output_dtype == "float32" else DoubleType()


def numpy_dtype(element_type: FloatType | DoubleType) -> type:
    return np.float32 if isinstance(element_type, FloatType) else np.float64


def apply_batches(
    transform: FittedTransform,
    vector_col: str,
    output_col: str,
    extra_cols: Sequence[str] = (),
    outputs: BatchOutputs | None = None,
    output_dtype: type = np.float64,
    handle_invalid: str = "unchecked",
    id_col: str = "id",
    max_norm: float | None = None,
):
    """``mapInArrow`` function: each batch's (B, d_in) vectors (read in the column's element type) → (B, d_out)
    ``output_col`` of ``output_dtype`` (computed in float64 block by block, then cast and checked finite by
    :func:`~anisotropy_core.transforms.map_blocks`), then the ``extra_cols`` (each a length-B Arrow array),
    replacing input columns of the same names.

    ``handle_invalid`` (a model's ``handleInvalid``): ``unchecked`` maps the rows unchecked; ``error`` and ``keep``
    check each batch against the input contract (:func:`~anisotropy_spark.contract.check_batch`, ``id_col`` named
    in errors; rows longer than ``max_norm`` are invalid too, ``norm_outlier``: None = off). ``error``: the first
    invalid row raises :class:`~anisotropy_spark.contract.InvalidRowError` in the
    worker (``on_invalid: error``); ``keep``: invalid rows are kept with a null output vector and their reason in
    ``invalid_reason`` (for counting and filtering). Either way, a partition whose first Arrow batch holds vectors
    but not one of the transform's dimension is not a few bad rows but a table of another embedding model: the
    worker raises :class:`~anisotropy_spark.contract.ForeignDimensionError` (before any invalid-row error),
    failing the action.

    ``outputs``: :data:`BatchOutputs`; default ``transform.apply`` and no extra columns. A row the transform
    cannot map (e.g. finite in float64, infinite after the cast to float32) raises
    :class:`~anisotropy_spark.contract.TransformRowError` naming the column and the row's other values (e.g. its
    id); the driver receives it as that class (:mod:`.worker_errors`), like the contract's errors.
    """
    d = transform.d_in
    extra_cols = list(extra_cols)
    compute = outputs if outputs is not None else (lambda x, dtype: (transform.apply(x, dtype), []))
    keep = handle_invalid == "keep"
    written = [output_col] + extra_cols + ([REASON_COLUMN] if keep else [])

    @raised_in_workers
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for number, batch in enumerate(batches):
            valid, reasons = None, []
            if handle_invalid == "unchecked":
                matrix = batch_matrix(batch, vector_col, d, dtype=None)
            else:
                checked = check_batch(batch, vector_col, id_col, d, max_norm)
                if number == 0 and checked.foreign_length is not None:
                    raise ForeignDimensionError(length=checked.foreign_length, dimension=d)
                if checked.reasons is not None:
                    if not keep:
                        raise first_invalid_error(checked, batch, vector_col, id_col)
                    valid = checked.valid
                matrix = checked.matrix
                if keep:
                    reasons = [pa.array(checked.reasons if valid is not None else [None] * batch.num_rows, pa.string())]
            result, extra = mapped_rows(compute, matrix, output_dtype, batch, valid, vector_col)
            if len(extra) != len(extra_cols):
                raise ValueError(f"batch function returned {len(extra)} extra columns, expected {extra_cols}")
            names = [n for n in batch.schema.names if n not in written]
            columns = [batch.column(batch.schema.get_field_index(n)) for n in names]
            yield pa.RecordBatch.from_arrays(
                columns + [matrix_column(result, output_dtype, valid)] + [spread(e, valid) for e in extra] + reasons,
                names + written,
            )

    return run


def mapped_rows(
    compute: BatchOutputs,
    matrix: np.ndarray,
    output_dtype: type,
    batch: pa.RecordBatch,
    valid: np.ndarray | None,
    vector_col: str,
) -> "tuple[np.ndarray, list[pa.Array]]":
    """``compute(matrix, output_dtype)`` for the rows ``matrix`` of ``batch`` (the ``valid`` ones; None: all), a
    ValueError naming a row (e.g. a non-finite output after the cast) re-raised as
    :class:`~anisotropy_spark.contract.TransformRowError` naming the column and that row's other values."""
    try:
        return compute(matrix, output_dtype)
    except ValueError as exc:
        row = getattr(exc, "row", None)
        if row is not None and valid is not None:
            row = int(np.flatnonzero(valid)[row])
        raise TransformRowError(column=vector_col, row=row_values(batch, row, vector_col), reason=str(exc)) from exc


def spread(values: pa.Array, valid: np.ndarray | None) -> pa.Array:
    """A per-valid-row array placed back at the ``valid`` rows of the batch, null elsewhere (None: as is)."""
    if valid is None:
        return values
    index = np.zeros(len(valid), dtype=np.int64)
    index[valid] = np.arange(int(valid.sum()))
    return values.take(pa.array(index, mask=~valid))


def row_values(batch: pa.RecordBatch, row: int | None, vector_col: str) -> dict | None:
    """The values of batch row ``row`` but its vector (e.g. its id), JSON-ready; None when the row is unknown."""
    if row is None:
        return None
    return {n: batch.column(i)[row].as_py() for i, n in enumerate(batch.schema.names) if n != vector_col}


CorrectionEstimator.model_class = CorrectionModel
_add_setters(CorrectionModel, CorrectionModel._settable_params())


@register_model_class(Method.ABTT)
class AllButTheTopModel(CorrectionModel, _AllButTheTopParams):
    """Fitted All-but-the-Top; ``getD()`` is the number of directions removed, ``getDirections()`` which."""

    @property
    def components(self) -> np.ndarray:
        """(D, d) the removed unit directions, one per row (read-only)."""
        return read_only(self.fitted(AllButTheTop).components)

    @property
    def eigenvalues(self) -> np.ndarray:
        """(d,) the eigenvalues of the centred covariance, descending (read-only)."""
        return read_only(self.fitted(AllButTheTop).eigenvalues)


@register_model_class(Method.WHITENING)
class WhiteningModel(CorrectionModel, _WhiteningParams):
    """Fitted whitening-k; ``getK()`` is the number of kept directions."""

    @property
    def matrix(self) -> np.ndarray:
        """(d, d_out) W: the output is (v − mean) W (read-only)."""
        return read_only(self.fitted(Whitening).matrix)

    @property
    def eigenvalues(self) -> np.ndarray:
        """(d,) the eigenvalues of the (shrunk) centred covariance, descending (read-only)."""
        return read_only(self.fitted(Whitening).eigenvalues)


@register_model_class(Method.ABTT_PCA_ABTT)
class AbttPcaAbttModel(CorrectionModel, _AbttPcaAbttParams):
    """Fitted ABTT → PCA-k → ABTT; ``getK()`` is the output dimension."""

    @property
    def firstComponents(self) -> np.ndarray:
        """(D, d) the directions removed before the PCA (read-only)."""
        return read_only(self.fitted(AbttPcaAbtt).first_components)

    @property
    def basis(self) -> np.ndarray:
        """(d, k) the PCA basis (read-only)."""
        return read_only(self.fitted(AbttPcaAbtt).basis)

    @property
    def secondComponents(self) -> np.ndarray:
        """(D2, k) the directions removed after the PCA (read-only)."""
        return read_only(self.fitted(AbttPcaAbtt).second_components)


@register_model_class(Method.FLOW)
class FlowModel(CorrectionModel, _FlowParams):
    """Fitted BERT-flow."""

    @property
    def trainingLog(self) -> dict:
        """The training facts recorded in the artifact (sample size, steps, nll before and after, …; a copy)."""
        return dict(self.fitted(FlowTransform).training)


AllButTheTopEstimator.model_class = AllButTheTopModel
WhiteningEstimator.model_class = WhiteningModel
AbttPcaAbttEstimator.model_class = AbttPcaAbttModel
FlowEstimator.model_class = FlowModel


class _CorrectionWriter(MLWriter):
    def __init__(self, instance: CorrectionModel):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        model = self.instance
        save_artifact(path, model.transform_, model.n, model.fitted_on)
        DefaultParamsWriter.saveMetadata(model, path, self.sparkSession)


class _CorrectionReader(MLReader):
    def __init__(self, cls: type[CorrectionModel]):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> CorrectionModel:
        model = self.cls.from_artifact(load_artifact(path))
        if storage.exists(storage.join(path, "metadata")):
            metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
            model._resetUid(metadata["uid"])
            DefaultParamsReader.getAndSetParams(model, metadata)
        return model
