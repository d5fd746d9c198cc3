"""Job configuration: YAML (safe loading only, no code execution) into typed, validated dataclasses.

Each job declares its settings as a keyword-only dataclass whose fields carry type hints and defaults;
every job reading an embedding table extends :class:`InputSettings` (the one input block). :func:`load`
reads a YAML mapping, deep-merges CLI overrides into it (``--decision "{steep_alpha: 2}"`` changes that one
threshold and keeps the file's others), rejects unknown keys and wrong types — dict values and list items
included — with a message naming the key, and calls the dataclass's ``check()`` for cross-field rules
(impossible values such as k > n or D ≥ d are checked where the data is known).

A correction's settings are declared once in :mod:`anisotropy_core.methods`; a job config holds them as fields
made by :func:`setting_field` (default, ``--help`` and constraint from the declaration; the config keeps its
own key and type hint, so readers and type checkers see every key), and :func:`setting_problems` checks their
constraints in ``check()``.

pydantic v2 was considered: this module's whole coercion is ~60 lines and its messages already name the key
path and problem in the form the tests and run records use; pydantic would add a dependency and a message
translation layer without removing code.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import hashlib
import json
import types
import typing
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import yaml

from anisotropy_core import storage
from anisotropy_core.methods import Setting
from anisotropy_core.norms import DEFAULT_MAX_NORM_RATIO

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")  # a config dataclass


class ConfigError(ValueError):
    """The configuration is invalid; the message names the offending key."""


NOT_GIVEN = object()  # an override that was not given on the command line


VectorReader = Literal["auto", "spark", "pyarrow"]  # who reads the data files: anisotropy_spark.table_files


@dataclasses.dataclass(kw_only=True)
class InputSettings:
    """The input block every job shares: the table (``input``, a Delta or Parquet path or URI), its
    ``vector_col`` (array<float|double> or VectorUDT) and ``id_col``, the expected ``dimension`` (None = the
    most common length), what to do with invalid rows (``on_invalid``; ``quarantine`` appends them with
    a reason to the Delta table ``quarantine_path``) and the norm-outlier rule: a row longer than
    ``max_norm_ratio`` × the median length of the valid rows is invalid, reason ``norm_outlier``
    (:mod:`anisotropy_core.norms`; None or 0 turns the rule off)."""

    input: str
    vector_col: str = "vector"
    id_col: str = "id"
    dimension: int | None = None
    on_invalid: Literal["error", "quarantine"] = "error"
    quarantine_path: str | None = None
    max_norm_ratio: float | None = DEFAULT_MAX_NORM_RATIO

    def input_problems(self) -> list[str]:
        """The checks of this block (each job's ``check()`` adds its own)."""
        problems = quarantine_problems(self)
        if self.dimension is not None and self.dimension < 1:
            problems.append(f"dimension must be >= 1, got {self.dimension}")
        if self.max_norm_ratio is not None and not (self.max_norm_ratio == 0 or self.max_norm_ratio > 1):
            problems.append(f"max_norm_ratio must be > 1 (or 0 / null: off), got {self.max_norm_ratio}")
        return problems

    def named_columns(self) -> dict[str, list[str]]:
        """Every input column this config names, by role: vector, id and, in the jobs that have them, the
        ``metadata_cols`` and ``label_col`` of the artefact test. Each must be in the input's schema, checked
        before the first pass over it (:func:`anisotropy_spark.contract.require_schema`)."""
        label = getattr(self, "label_col", None)
        return {
            "vector": [self.vector_col],
            "id": [self.id_col],
            "metadata": list(getattr(self, "metadata_cols", [])),
            "label": [label] if label else [],
        }

    def output_problems(self, output: str | None) -> list[str]:
        """``output`` (a table the job writes) must not be the input, whose pinned version must stay readable."""
        return ["output must differ from input"] if output and storage.same_location(self.input, output) else []


@dataclasses.dataclass(kw_only=True)
class OutputFiles:
    """How a job writing a corrected copy of a table sizes its data files: ``target_file_mb`` (MiB, > 0), the
    size each output file aims at. The write is coalesced to ``ceil(input bytes / target)`` files at most, the
    input bytes being the pinned version's data files (:mod:`anisotropy_spark.output_files`), without a shuffle."""

    target_file_mb: float = 256.0

    def output_file_problems(self) -> list[str]:
        return [] if self.target_file_mb > 0 else [f"target_file_mb must be > 0, got {self.target_file_mb}"]


def setting_field(*declared: Setting, default: Any = NOT_GIVEN) -> Any:
    """A config field holding the ``declared`` setting (one, or the same key of several methods): its default
    (``default`` where they differ: None = each method's own), its ``--help`` line and its constraints, checked by
    :func:`setting_problems`."""
    own = default is not NOT_GIVEN
    if not own:
        (default,) = {s.default for s in declared}
    named = len(declared) > 1  # a key of several methods: each line says whose
    help_text = "; ".join(f"{s.method}: " * named + s.describe(with_default=False) for s in declared)
    shown = f"{default}" + (": each method's own" if own and default is None else "")
    return dataclasses.field(default=default, metadata={"settings": declared, "help": f"{help_text} (default {shown})"})


def setting_problems(config: Any) -> list[str]:
    """The constraint problems of every :func:`setting_field` of ``config`` (a dataclass), each naming its key,
    e.g. ``cluster_task_memory must be >= 0 bytes, got -1``."""
    problems: list[str] = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if value is not None:  # None: the method's default (a null a setting refuses fails its type check)
            found = [s.problem(value, field.name) for s in field.metadata.get("settings", ())]
            problems += dict.fromkeys(p for p in found if p)
    return problems


def quarantine_problems(config: InputSettings) -> list[str]:
    """``on_invalid: quarantine`` needs a ``quarantine_path``."""
    if config.on_invalid == "quarantine" and not config.quarantine_path:
        return ["on_invalid: quarantine needs quarantine_path"]
    return []


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied; a mapping merged into a mapping keeps the keys it does not name."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load(schema: type[T], path: str | None, overrides: dict[str, Any] | None = None) -> T:
    """Build a ``schema`` dataclass from the YAML file at ``path`` (optional) plus ``overrides``.

    An override equal to :data:`NOT_GIVEN` leaves the file's value; ``None`` sets the key to null; a mapping
    is deep-merged into the file's mapping (:func:`deep_merge`).
    """
    raw: dict[str, Any] = {}
    if path:
        if not storage.is_file(path):
            raise ConfigError(f"config file {path} not found")
        try:
            loaded = yaml.safe_load(storage.read_text(path))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping of settings, got {type(loaded).__name__}")
        raw.update(loaded or {})
    raw = deep_merge(raw, {k: v for k, v in (overrides or {}).items() if v is not NOT_GIVEN})
    return from_mapping(schema, raw, where=path or "config")


def from_mapping(schema: type[T], raw: dict[str, Any], where: str = "config") -> T:
    """Validate ``raw`` against the fields of ``schema`` (recursing into nested dataclasses)."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(fields)}")
    hints = typing.get_type_hints(schema)
    values = {}
    for name, value in raw.items():
        values[name] = _coerce(hints[name], value, f"{where}.{name}")
    missing = [
        n
        for n, f in fields.items()
        if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {missing}")
    config = schema(**values)
    check = getattr(config, "check", None)
    if check is not None:
        problems = check()
        if problems:
            raise ConfigError(f"{where}: " + "; ".join(problems))
    return config


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _coerce(option, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        option_choices = [_choices(o) for o in options if o is not type(None)]
        named = [a for a in option_choices if a is not None]
        if len(named) == len(option_choices):  # e.g. Literal["auto"] | Method: one list of names
            raise ConfigError(f"{where}: {value!r} is not one of {[c for a in named for c in a]}")
        raise ConfigError(errors[0])
    allowed = _choices(hint)
    if allowed is not None:
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {allowed}")
        return hint(value) if isinstance(hint, type) else value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        key_hint, value_hint = typing.get_args(hint) or (Any, Any)
        return {_coerce(key_hint, k, where): _coerce(value_hint, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return from_mapping(hint, value, where)
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float) and isinstance(value, bool) or not isinstance(value, hint):
        raise ConfigError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def _choices(hint: Any) -> list | None:
    """The values a ``Literal`` or an Enum class (e.g. :class:`~anisotropy_core.methods.Method`) allows; None for
    any other hint."""
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return [member.value for member in hint]
    return None


def config_hash(config: DataclassInstance) -> str:
    """Stable sha256 of a config dataclass (sorted JSON), recorded with every run."""
    return fields_hash(dataclasses.asdict(config))


def fields_hash(fields: dict[str, Any]) -> str:
    """:func:`config_hash` of a config's fields as ``dataclasses.asdict`` gives them (e.g. some of them nulled)."""
    payload = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def parse_args(
    schema: type[T], argv: list[str] | None, description: str, job_flags: argparse.ArgumentParser | None = None
) -> tuple[T, argparse.Namespace]:
    """CLI for a job: ``--conf FILE`` plus one ``--field-name VALUE`` override per config field, plus the job's
    own flags (``job_flags``: a parser made with ``add_help=False``, listed by ``--help`` too).

    Override values are parsed as YAML scalars/lists (``3`` → int, ``null`` → None, ``[a, b]`` → list),
    then validated exactly like the file. Returns the config and the raw namespace (for job-only flags).
    """
    parser = argparse.ArgumentParser(description=description, parents=[job_flags] if job_flags else [])
    parser.add_argument("--conf", help="YAML config file (see conf/)")
    for field in dataclasses.fields(schema):
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            default=None,
            metavar="VALUE",
            help=field.metadata.get("help", f"override {field.name}"),
        )
    args = parser.parse_args(argv)
    hints = typing.get_type_hints(schema)
    overrides = {name: _parse_cli_value(hints[name], getattr(args, name)) for name in hints}
    return load(schema, args.conf, overrides), args


def _parse_cli_value(hint: Any, text: str | None) -> Any:
    """A CLI string as the field expects it: verbatim for text fields (``null`` clears an optional one),
    else a YAML scalar or list; :data:`NOT_GIVEN` when the flag was absent."""
    if text is None:
        return NOT_GIVEN
    is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    optional_text = is_union and set(typing.get_args(hint)) == {str, type(None)}
    if optional_text and text in ("null", "~"):
        return None
    return text if hint is str or optional_text else yaml.safe_load(text)


@dataclasses.dataclass
class EvaluationConfig:
    """The optional ``evaluation:`` block of the diagnose and nightly configs (held-out retrieval quality per
    candidate, with confidence intervals; :mod:`jobs.evaluation`). It is on when ``queries`` or ``pairs`` is given.

    * ``queries``: Delta/Parquet table of (``query_id_col``, ``query_vector_col``, ``relevant_col`` — one id or
      a list of ids); scored by recall@k and nDCG@k against the whole corpus table (integer ids).
      ``exclude_self``: the queries are rows of the corpus — a query never retrieves its own row, and its row is
      kept out of the fit: the queries fall into ``folds`` folds by a hash of their id and each fold is scored
      by candidates fitted on the corpus minus that fold's rows. Without it the queries are real queries (not
      corpus rows) and the query-drift check runs.
    * ``pairs``: Delta/Parquet table of (``pair_cols`` = id_a, id_b, score); scored by Spearman ρ of the cosine
      with the score; the rows the pairs use are kept out of the fit.
    * ``metric``: the metric that picks the best candidate (default ``ndcg@k`` with queries, else ``spearman``).
    * Queries (pairs) are split by a hash of their id (``seed``) into a selection half (picks the best candidate)
      and a report half (reports it: means and a paired bootstrap interval, ``resamples`` draws, ``confidence``).
    * ``min_gain``: ``method: auto`` publishes a candidate only when the lower bound of its Δ against raw exceeds
      this (and its Δ against the published transform exceeds 0).
    * ``max_quality_drop``: an explicitly configured method is refused when the upper bound of its Δ against raw
      (any metric) is below −max_quality_drop.
    """

    queries: str | None = None
    query_id_col: str = "query_id"
    query_vector_col: str = "vector"
    relevant_col: str = "relevant"
    exclude_self: bool = False
    pairs: str | None = None
    pair_cols: list[str] = dataclasses.field(default_factory=lambda: ["id_a", "id_b", "score"])
    k: int = 10
    metric: str | None = None
    folds: int = 5
    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0
    min_gain: float = 0.0
    max_quality_drop: float = 0.0

    @property
    def active(self) -> bool:
        """The block turns on when queries or pairs are given (a block with neither is documentation only)."""
        return bool(self.queries or self.pairs)

    def selection_metric(self) -> str:
        return self.metric or (f"ndcg@{self.k}" if self.queries else "spearman")

    def check(self) -> list[str]:
        problems = []
        if self.k < 1:
            problems.append(f"evaluation.k must be >= 1, got {self.k}")
        if len(self.pair_cols) != 3:
            problems.append(f"evaluation.pair_cols must name 3 columns (id_a, id_b, score), got {self.pair_cols}")
        known = ([f"recall@{self.k}", f"ndcg@{self.k}"] if self.queries else []) + (["spearman"] if self.pairs else [])
        if self.metric is not None and self.metric not in known:
            problems.append(f"evaluation.metric {self.metric!r} is not measured; choose one of {known}")
        if self.folds < 1 or self.resamples < 100:
            problems.append(f"evaluation.folds must be >= 1 and resamples >= 100, got {self.folds}, {self.resamples}")
        if not 0 < self.confidence < 1:
            problems.append(f"evaluation.confidence must be in (0, 1), got {self.confidence}")
        if not self.max_quality_drop >= 0:
            problems.append(f"evaluation.max_quality_drop must be >= 0, got {self.max_quality_drop}")
        return problems
