"""The correction methods and the settings of each, declared once (no Spark import).

* :class:`Method` — the registry name of every method (``none`` is the raw vectors; every other one is a
  correction with an Estimator in :mod:`anisotropy_spark.estimators` and a transform in the numpy core).
* One frozen dataclass per correction (:class:`AbttSettings`, :class:`WhiteningSettings`, …) whose fields are
  the method's settings, each declared with :func:`setting`: its default, its constraint (``ge``/``gt``/``le``;
  a ``Literal`` annotation lists the allowed strings; ``| None`` allows None, whose meaning the doc states) and
  one line saying what it does. Constructing one validates every field (:class:`SettingError`).

Everything else is derived from these declarations (:meth:`MethodSettings.settings` lists them as
:class:`Setting` records): the method keys of the fit job's config (snake_case field names) and of the nightly
(the same settings under its own prefixed keys, :data:`jobs.nightly_config.NIGHTLY_KEYS`), their ``--help``
and constraint checks, and the Spark Params of each Estimator (camelCase names, :func:`param_name`, with a
``typeConverter`` that enforces the constraint: :mod:`anisotropy_spark.params`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import typing
from typing import Any, ClassVar, Literal


class Method(str, enum.Enum):
    """A correction method by its registry name; equal (and hashing equal) to that plain string, so it may
    index a mapping keyed by the name, and written as the name in JSON, manifests, f-strings and messages. It
    pickles as the plain name, so it may enter Spark rows (the JVM's unpickler knows no Python enum)."""

    NONE = "none"
    CENTER = "center"
    ABTT = "abtt"
    WHITENING = "whitening"
    CLUSTER_RECENTER = "cluster_recenter"
    ABTT_PCA_ABTT = "abtt_pca_abtt"
    FLOW = "flow"

    __hash__ = str.__hash__

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return str, (self.value,)


OutputDtype = Literal["same", "float32", "float64"]  # element type of corrected vectors: same = as the input's


class SettingError(ValueError):
    """A setting's value breaks its constraint; the message names the setting."""


def param_name(key: str) -> str:
    """The Spark Param name of a snake_case setting key: ``max_D`` → ``maxD``, ``distance_measure`` →
    ``distanceMeasure``."""
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def setting(
    default: Any, doc: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None, unit: str = ""
) -> Any:
    """A settings field: ``default``, what the setting does (``doc``), its bounds (on every item of a list) and
    the ``unit`` its bounds are stated in (e.g. ``bytes``)."""
    return dataclasses.field(default=default, metadata={"doc": doc, "ge": ge, "gt": gt, "le": le, "unit": unit})


@dataclasses.dataclass(frozen=True)
class Setting:
    """One declared setting: ``key`` (snake_case), its annotation ``hint``, ``default``, ``doc``, bounds,
    ``unit`` and the ``method`` declaring it (empty for a setting of no method); :attr:`param` is its Spark Param
    name."""

    key: str
    hint: Any
    default: Any
    doc: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    unit: str = ""
    method: str = ""

    @property
    def param(self) -> str:
        return param_name(self.key)

    @property
    def optional(self) -> bool:
        return type(None) in typing.get_args(self.hint)

    @property
    def base(self) -> Any:
        """The annotation without ``| None``: int, float, bool, list[int] or a Literal of strings."""
        options = [a for a in typing.get_args(self.hint) if a is not type(None)]
        return options[0] if self.optional else self.hint

    @property
    def choices(self) -> tuple[str, ...] | None:
        return typing.get_args(self.base) if typing.get_origin(self.base) is Literal else None

    def bounds(self) -> str:
        """The constraint in words, e.g. ``>= 0 bytes``, ``in [0, 1]``, ``one of ['euclidean', 'cosine']``
        (empty when there is none)."""
        unit = f" {self.unit}" if self.unit else ""
        if self.choices is not None:
            return f"one of {list(self.choices)}"
        if self.ge is not None and self.le is not None:
            return f"in [{self.ge:g}, {self.le:g}]{unit}"
        if self.ge is not None or self.gt is not None:
            return f">= {self.ge:g}{unit}" if self.ge is not None else f"> {self.gt:g}{unit}"
        return ""

    def describe(self, with_default: bool = True) -> str:
        """The doc line with the default (``with_default``) and the constraint, e.g. ``mini-batch size (default
        256; >= 1)``: what ``--help`` says (a Param's doc leaves the default to ``explainParams``)."""
        notes = ([f"default {self.default}"] if with_default else []) + ([self.bounds()] if self.bounds() else [])
        return f"{self.doc} ({'; '.join(notes)})" if notes else self.doc

    def problem(self, value: Any, name: str | None = None) -> str | None:
        """Why ``value`` (already of the right type) breaks the constraint, e.g. ``task_memory must be >= 0
        bytes, got -1``, naming the setting ``name`` (default its key); None when it satisfies it."""
        if value is None:
            return None if self.optional else f"{name or self.key} must not be null"
        items = value if isinstance(value, (list, tuple)) else [value]
        if self.choices is not None:
            ok = value in self.choices
        else:
            ok = all(
                not (isinstance(v, float) and math.isnan(v))
                and (self.ge is None or v >= self.ge)
                and (self.gt is None or v > self.gt)
                and (self.le is None or v <= self.le)
                for v in items
            )
        return None if ok else f"{name or self.key} must be {self.bounds()}, got {value!r}"

    def validate(self, value: Any, name: str | None = None) -> Any:
        """``value`` if it satisfies the constraint, else :class:`SettingError` (see :meth:`problem`)."""
        problem = self.problem(value, name)
        if problem:
            raise SettingError(problem)
        return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodSettings:
    """Base of the settings of one correction ``method``; constructing one validates every field."""

    method: ClassVar[Method]

    def __post_init__(self) -> None:
        for declared in self.settings():
            declared.validate(getattr(self, declared.key), f"{self.method}.{declared.key}")

    @classmethod
    @functools.cache
    def settings(cls) -> tuple[Setting, ...]:
        """Every setting of this method, in declaration order."""
        hints = typing.get_type_hints(cls)
        return tuple(
            Setting(f.name, hints[f.name], f.default, **f.metadata, method=cls.method) for f in dataclasses.fields(cls)
        )

    @classmethod
    def setting(cls, key: str) -> Setting:
        return next(s for s in cls.settings() if s.key == key)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CenterSettings(MethodSettings):
    """Centring has no settings."""

    method: ClassVar[Method] = Method.CENTER


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbttSettings(MethodSettings):
    """All-but-the-Top (seed ch. 3): the top ``D`` principal directions of the centred covariance removed, or
    the given ``directions``."""

    method: ClassVar[Method] = Method.ABTT
    D: int | None = setting(
        None, "directions removed; null = max(1, round(d/100)), at most max_D, recorded unverified", ge=0
    )
    max_D: int | None = setting(None, "cap on the default D; null = uncapped", ge=0)
    directions: list[int] | None = setting(
        None, "1-based principal directions removed (overrides D); null = the top D", ge=1
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class WhiteningSettings(MethodSettings):
    """Whitening-k (seed ch. 6): W = U_k Λ_k^-1/2 of the (shrunk) covariance."""

    method: ClassVar[Method] = Method.WHITENING
    k: int | None = setting(None, "kept directions; null = d, or the rank n - 1 when n <= d without shrinkage", ge=1)
    shrinkage: float = setting(0.0, "α: Σ ← (1−α)Σ + α tr(Σ)/d I", ge=0, le=1)
    eps: float = setting(1e-12, "relative eigenvalue clamp: eigenvalues below eps · λ1 are raised to it", gt=0)
    zca: bool = setting(False, "symmetric W = UΛ^-1/2Uᵀ")
    normalize: bool = setting(False, "L2-normalise the output")
    exclude: list[int] | None = setting(None, "1-based principal directions dropped first (ABTT then whitening)", ge=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbttPcaAbttSettings(MethodSettings):
    """ABTT → PCA-k → ABTT refitted on the reduced output (seed ch. 3)."""

    method: ClassVar[Method] = Method.ABTT_PCA_ABTT
    D: int | None = setting(None, "directions removed first; null = max(1, round(d/100)), unverified", ge=0)
    k: int | None = setting(None, "PCA dimension kept; null = ceil(d/3)", ge=1)
    D2: int | None = setting(None, "directions removed after the PCA; null = max(1, round(k/100)), unverified", ge=0)
    max_D: int | None = setting(None, "cap on the default D and D2; null = uncapped", ge=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterRecenterSettings(MethodSettings):
    """Cluster recentering: k-means, then each cluster's mean (and top ``D`` within-cluster directions)
    removed from its rows."""

    method: ClassVar[Method] = Method.CLUSTER_RECENTER
    k: int = setting(8, "number of clusters", ge=1)
    D: int = setting(0, "top within-cluster directions removed per cluster", ge=0)
    distance_measure: Literal["euclidean", "cosine"] = setting("euclidean", "k-means assignment metric")
    seed: int = setting(0, "random seed of the k-means initialisation")
    max_iter: int = setting(50, "Lloyd iterations at most", ge=0)
    tol: float = setting(1e-4, "relative inertia change below which Lloyd iterations stop", ge=0)
    init_steps: int = setting(2, "k-means|| rounds (Spark ML's default initSteps)", ge=1)
    task_memory: int = setting(
        0,
        "bytes of rows a task may hold to refine k-means in memory (barrier stage); 0 re-reads the table",
        ge=0,
        unit="bytes",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlowSettings(MethodSettings):
    """BERT-flow (seed ch. 5): trained on ``sample_size`` rows sampled to the driver, ``steps`` Adam steps of
    ``batch_size`` rows at ``learning_rate``; ``couplings`` additive couplings with an MLP of width ``hidden``."""

    method: ClassVar[Method] = Method.FLOW
    sample_size: int = setting(5000, "rows sampled to the driver for training", ge=2)
    steps: int = setting(300, "Adam steps", ge=1)
    couplings: int = setting(4, "additive coupling layers", ge=1)
    hidden: int = setting(32, "hidden width of each coupling's MLP", ge=1)
    batch_size: int = setting(256, "mini-batch size", ge=1)
    learning_rate: float = setting(1e-2, "Adam step size", gt=0)
    seed: int = setting(0, "random seed of the sample and the training")


SETTINGS: dict[Method, type[MethodSettings]] = {
    s.method: s
    for s in (
        CenterSettings,
        AbttSettings,
        WhiteningSettings,
        AbttPcaAbttSettings,
        ClusterRecenterSettings,
        FlowSettings,
    )
}
CORRECTIONS = tuple(SETTINGS)  # every method but none


def settings_of(method: Method | str) -> type[MethodSettings]:
    """The settings class of correction ``method``; ValueError for an unknown name or ``none``."""
    try:
        return SETTINGS[Method(method)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown correction method {method!r}; known: {[m.value for m in CORRECTIONS]}") from None
