"""pyspark.ml Estimators for the corrections of :mod:`anisotropy_core.transforms`, and one generic Model.

* :class:`CenterEstimator`, :class:`AllButTheTopEstimator`, :class:`WhiteningEstimator` — ``fit(df)`` is
  one pass (:func:`~anisotropy_spark.moments.corpus_moments`, Arrow batches + treeReduce) plus a driver
  ``eigh``; it returns a :class:`CorrectionModel`.
* :class:`CorrectionModel` — wraps any fitted :class:`~anisotropy_core.transforms.FittedTransform`;
  ``transform(df)`` maps Arrow batches through numpy with ``mapInArrow`` (no per-row Python) and writes
  ``outputCol`` as ``array<double>`` (d_out long), keeping every other column. ``save(path)`` writes the
  versioned artifact (``manifest.json`` + ``arrays.npz``, see :mod:`anisotropy_core.artifact`) plus the
  pyspark.ml ``metadata/`` folder, so the model also loads as a ``PipelineModel`` stage; ``load(path)``
  accepts either (a bare artifact written by plain numpy loads with default column params).

A new correction plugs in by subclassing :class:`CorrectionEstimator` and implementing
``_fit_transform(vectors_df, vector_col, d) -> (FittedTransform, n)``. When its model writes more than
``outputCol`` (cluster recentering also writes the cluster id), it sets ``model_class`` to a
:class:`CorrectionModel` subclass that overrides :meth:`CorrectionModel.extra_output_fields` and
:meth:`CorrectionModel.batch_outputs`, and registers that class for its transform method with
:func:`register_model_class`, so :meth:`CorrectionModel.from_artifact` and :meth:`CorrectionModel.load`
return it for such artifacts.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasOutputCol
from pyspark.ml.util import (DefaultParamsReadable, DefaultParamsReader, DefaultParamsWritable,
                             DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

from anisotropy_core.artifact import Artifact, ArtifactError, build_manifest, load_artifact, save_artifact
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import DEFAULT_EPS, FittedTransform, fit_abtt, fit_center, fit_whitening

from .arrow import batch_matrix, matrix_column
from .io import TableRef, as_double_array, infer_dimension
from .moments import corpus_moments


class _CorrectionParams(HasInputCol, HasOutputCol):
    """inputCol (default ``vector``: array<float|double> or VectorUDT), outputCol (default ``corrected``)."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(inputCol="vector", outputCol="corrected")


class CorrectionEstimator(Estimator, _CorrectionParams, DefaultParamsReadable, DefaultParamsWritable):
    """Base Estimator: reads ``inputCol``, infers d, delegates the math to ``_fit_transform``.

    ``model_class``: the :class:`CorrectionModel` (sub)class ``fit`` returns; every param the model shares
    with the estimator by name (inputCol, outputCol, a subclass's extra output columns) is copied over.
    """

    model_class: type["CorrectionModel"]   # set below, once CorrectionModel exists

    def _fit(self, dataset: DataFrame) -> "CorrectionModel":
        col = self.getInputCol()
        vectors = self._input_vectors(dataset, col)
        d = infer_dimension(vectors, col)
        transform, n = self._fit_transform(vectors, col, d)
        model = self.model_class(transform, n=n)
        return self._copyValues(model)

    def _input_vectors(self, dataset: DataFrame, col: str) -> DataFrame:
        """The one column ``col`` of ``dataset`` as ``_fit_transform`` reads it (here: ``array<double>``)."""
        return as_double_array(dataset.select(col), col)

    def _fit_transform(self, vectors: DataFrame, col: str, d: int) -> tuple[FittedTransform, int]:
        """Fit on ``vectors`` (column ``col`` array<double> of length d) → (transform, vectors used)."""
        state = corpus_moments(vectors, col, d)
        return self._fit_moments(state), state.n

    def _fit_moments(self, state: Moments) -> FittedTransform:
        raise NotImplementedError


class CenterEstimator(CorrectionEstimator):
    """Subtract the corpus mean."""

    @keyword_only
    def __init__(self, *, inputCol: str | None = None, outputCol: str | None = None):
        super().__init__()
        self._set(**self._input_kwargs)

    def _fit_moments(self, state):
        return fit_center(state)


class AllButTheTopEstimator(CorrectionEstimator):
    """Centre, then remove the top-D directions of the centred covariance (seed chapter 3).

    ``D`` (default None = choose by measurement: eigenvalues above the Marchenko–Pastur edge, capped at
    ``maxD``, default round(d/100); d/100 when n ≤ d). The fitted model's ``transform_.d_rule`` says which.
    """

    D = Param(Params._dummy(), "D", "directions to remove; None = Marchenko–Pastur count (capped)",
              typeConverter=TypeConverters.toInt)
    maxD = Param(Params._dummy(), "maxD", "cap on the measured D; None = max(1, round(d/100))",
                 typeConverter=TypeConverters.toInt)

    @keyword_only
    def __init__(self, *, inputCol: str | None = None, outputCol: str | None = None,
                 D: int | None = None, maxD: int | None = None):
        super().__init__()
        self._setDefault(D=None, maxD=None)
        self._set(**self._input_kwargs)

    def _fit_moments(self, state):
        return fit_abtt(state, D=self.getOrDefault(self.D), max_D=self.getOrDefault(self.maxD))


class WhiteningEstimator(CorrectionEstimator):
    """Whitening-k (seed chapter 6): W = U_k Λ_k^{-1/2}, optional shrinkage, clamp, ZCA, L2 output."""

    k = Param(Params._dummy(), "k", "kept directions; None = d", typeConverter=TypeConverters.toInt)
    shrinkage = Param(Params._dummy(), "shrinkage", "α: Σ ← (1−α)Σ + α tr(Σ)/d I",
                      typeConverter=TypeConverters.toFloat)
    eps = Param(Params._dummy(), "eps", "relative eigenvalue clamp (· λ1)", typeConverter=TypeConverters.toFloat)
    zca = Param(Params._dummy(), "zca", "symmetric W = UΛ^-1/2Uᵀ", typeConverter=TypeConverters.toBoolean)
    normalize = Param(Params._dummy(), "normalize", "L2-normalise the output",
                      typeConverter=TypeConverters.toBoolean)

    @keyword_only
    def __init__(self, *, inputCol: str | None = None, outputCol: str | None = None, k: int | None = None,
                 shrinkage: float = 0.0, eps: float = DEFAULT_EPS, zca: bool = False, normalize: bool = False):
        super().__init__()
        self._setDefault(k=None, shrinkage=0.0, eps=DEFAULT_EPS, zca=False, normalize=False)
        self._set(**self._input_kwargs)

    def _fit_moments(self, state):
        get = self.getOrDefault
        return fit_whitening(state, k=get(self.k), shrinkage=get(self.shrinkage), eps=get(self.eps),
                             zca=get(self.zca), normalize=get(self.normalize))


class CorrectionModel(Model, _CorrectionParams, MLReadable, MLWritable):
    """A fitted correction applied batch-wise. ``transform_``: the numpy transform; ``n``: fit size;
    ``fitted_on``: {"path", "format", "version"} of the fit table or None (recorded in the artifact).
    """

    def __init__(self, transform: FittedTransform | None = None, n: int = 0, fitted_on: dict | None = None):
        super().__init__()
        self.transform_ = transform
        self.n = int(n)
        self.fitted_on = fitted_on

    @classmethod
    def from_artifact(cls, artifact: Artifact, inputCol: str = "vector", outputCol: str = "corrected"):
        """The model of ``artifact``, of the class registered for its method (:func:`model_class_for`):
        ``CorrectionModel.from_artifact`` of a ``cluster_recenter`` artifact is a ``ClusterRecenterModel``
        (it also writes the cluster-id column). Called on a subclass, the artifact's class must be that
        subclass or below it, else :class:`ArtifactError`."""
        model_cls = model_class_for(artifact.transform.method)
        if not issubclass(model_cls, cls):
            raise ArtifactError(f"a {artifact.transform.method} artifact loads as {model_cls.__name__}, "
                                f"not as {cls.__name__}")
        model = model_cls(artifact.transform, artifact.manifest["n"], artifact.manifest["fitted_on"])
        return model._set(inputCol=inputCol, outputCol=outputCol)

    def setFittedOn(self, table: TableRef) -> "CorrectionModel":
        self.fitted_on = {"path": table.path, "format": table.format, "version": table.version}
        return self

    def setInputCol(self, value: str) -> "CorrectionModel":
        return self._set(inputCol=value)

    def setOutputCol(self, value: str) -> "CorrectionModel":
        return self._set(outputCol=value)

    @property
    def transform_version(self) -> str:
        """``<method>-<hash12>``, identical to the saved artifact's."""
        return build_manifest(self.transform_, self.n, self.fitted_on)["transform_version"]

    def extra_output_fields(self) -> list[StructField]:
        """Columns written after ``outputCol`` (none here; ``ClusterRecenterModel``: the cluster id)."""
        return []

    def batch_outputs(self) -> "BatchOutputs | None":
        """Function (B, d_in) float64 → ((B, d_out) corrected, one length-B Arrow array per
        :meth:`extra_output_fields` entry), run inside the Python workers; None = ``transform_.apply`` with no
        extra columns. It must capture plain data only (e.g. ``transform_``), never the model itself."""
        return None

    def _transform(self, dataset: DataFrame) -> DataFrame:
        col, out = self.getInputCol(), self.getOutputCol()
        df = as_double_array(dataset, col)
        first = df.where(F.col(col).isNotNull()).select(F.size(col).alias("d")).first()
        if first is not None and first["d"] != self.transform_.d_in:
            raise ArtifactError(f"column {col!r} holds vectors of dimension {first['d']} but the "
                                f"{self.transform_.method} transform was fitted on dimension {self.transform_.d_in}")
        extra = self.extra_output_fields()
        written = {out, *(f.name for f in extra)}
        fields = [f for f in df.schema.fields if f.name not in written]
        schema = StructType(fields + [StructField(out, ArrayType(DoubleType()), True)] + extra)
        return df.mapInArrow(apply_batches(self.transform_, col, out, [f.name for f in extra],
                                           self.batch_outputs()), schema)

    def write(self) -> MLWriter:
        return _CorrectionWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _CorrectionReader(cls)


BatchOutputs = Callable[[np.ndarray], "tuple[np.ndarray, list[pa.Array]]"]


def apply_batches(transform: FittedTransform, vector_col: str, output_col: str, extra_cols: Sequence[str] = (),
                  outputs: BatchOutputs | None = None):
    """``mapInArrow`` function: each batch's (B, d_in) vectors → (B, d_out) ``output_col``, then the
    ``extra_cols`` (each a length-B Arrow array), replacing input columns of the same names.

    ``outputs``: (B, d_in) → ((B, d_out), [one array per extra column]); default ``transform.apply`` and no
    extra columns. Errors name the batch row and, when the batch has other columns, that row's values (e.g.
    its id).
    """
    d = transform.d_in
    extra_cols = list(extra_cols)
    compute = outputs if outputs is not None else (lambda x: (transform.apply(x), []))
    written = [output_col] + extra_cols

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            try:
                result, extra = compute(batch_matrix(batch, vector_col, d))
            except ValueError as exc:
                row = getattr(exc, "row", None)
                raise ValueError(f"{exc} [{row_context(batch, row, vector_col)}]") from exc
            if len(extra) != len(extra_cols):
                raise ValueError(f"batch function returned {len(extra)} extra columns, expected {extra_cols}")
            names = [n for n in batch.schema.names if n not in written]
            columns = [batch.column(batch.schema.get_field_index(n)) for n in names]
            yield pa.RecordBatch.from_arrays(columns + [matrix_column(result)] + list(extra), names + written)

    return run


def row_context(batch: pa.RecordBatch, row: int | None, vector_col: str) -> str:
    """Error context for batch row ``row``: the vector column's name and the row's other values (e.g. its
    id); the column name alone when the row is unknown (``None``)."""
    if row is None:
        return f"column {vector_col!r}"
    other = {n: batch.column(i)[row].as_py() for i, n in enumerate(batch.schema.names) if n != vector_col}
    return f"column {vector_col!r}, row {other}"


CorrectionEstimator.model_class = CorrectionModel

_MODEL_CLASSES: dict[str, type[CorrectionModel]] = {}
# methods whose model class lives in another module of this package: imported on first use, so
# ``CorrectionModel.from_artifact`` works without the caller importing that module
_MODEL_MODULES = {"cluster_recenter": "anisotropy_spark.kmeans"}


def register_model_class(method: str) -> Callable[[type[CorrectionModel]], type[CorrectionModel]]:
    """Class decorator: artifacts of transform ``method`` load as this :class:`CorrectionModel` subclass."""

    def decorate(model_cls: type[CorrectionModel]) -> type[CorrectionModel]:
        if not issubclass(model_cls, CorrectionModel):
            raise TypeError(f"{model_cls.__name__} is not a CorrectionModel")
        _MODEL_CLASSES[method] = model_cls
        return model_cls

    return decorate


def model_class_for(method: str) -> type[CorrectionModel]:
    """The model class registered for transform ``method``; :class:`CorrectionModel` for any other method."""
    if method not in _MODEL_CLASSES and method in _MODEL_MODULES:
        importlib.import_module(_MODEL_MODULES[method])
    return _MODEL_CLASSES.get(method, CorrectionModel)


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
        if os.path.isdir(os.path.join(path, "metadata")):
            metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
            model._resetUid(metadata["uid"])
            DefaultParamsReader.getAndSetParams(model, metadata)
        return model
