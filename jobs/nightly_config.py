"""Settings of the nightly job (conf/nightly.yaml): static checks, checks against the data, the content hash.

Per-method settings are the settings of :mod:`anisotropy_core.methods` under the nightly's own keys,
:data:`NIGHTLY_KEYS` (``abtt_D``, ``whitening_k``, ``cluster_k``, ``flow_steps``, …; ``cluster_*`` also drive
the ``mixture_check`` k-means, ``seed`` is shared); each such field takes its default, ``--help`` and
constraint from the declaration (:func:`nightly_field`), and :func:`jobs.fit_or_reuse.fit_params` maps them
back through the same table.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from anisotropy_core.decision import DecisionThresholds
from anisotropy_core.diagnostics import Diagnosis
from anisotropy_core.methods import Method, OutputDtype, settings_of
from jobs.config import (
    ConfigError,
    EvaluationConfig,
    InputSettings,
    OutputFiles,
    VectorReader,
    fields_hash,
    setting_field,
    setting_problems,
)
from jobs.columns import CLUSTER_COLUMN, VERSION_COLUMN
from jobs.index_settings import IndexSettings

# the scalar numbers of anisotropy_core.diagnose (what drift thresholds and output bounds may name)
CORE_METRICS = Diagnosis.scalar_names()

# method → {its setting: the nightly key holding it}; a setting absent here takes the method's default, but
# abtt's ``max_D`` (the ``decision`` block's) and ``directions`` (the artefact evidence): see fit_params
NIGHTLY_KEYS: dict[str, dict[str, str]] = {  # keyed by Method, looked up by its name too
    Method.CENTER: {},
    Method.ABTT: {"D": "abtt_D"},
    Method.ABTT_PCA_ABTT: {"D": "abtt_D", "k": "pca_k", "D2": "abtt_D2"},
    Method.WHITENING: {"k": "whitening_k", "shrinkage": "whitening_shrinkage", "normalize": "whitening_normalize"},
    Method.CLUSTER_RECENTER: {
        "k": "cluster_k",
        "D": "cluster_D",
        "distance_measure": "cluster_distance_measure",
        "task_memory": "cluster_task_memory",
        "seed": "seed",
    },
    Method.FLOW: {
        key: "flow_" + key for key in ("sample_size", "steps", "couplings", "hidden", "batch_size", "learning_rate")
    }
    | {"seed": "seed"},
}

NightlyMethod = Literal["auto"] | Method  # auto: the diagnosis (and the evaluation, when on) decides


def nightly_field(key: str) -> Any:
    """The config field of nightly key ``key``: the setting(s) :data:`NIGHTLY_KEYS` maps to it."""
    return setting_field(
        *[
            settings_of(method).setting(setting)
            for method, keys in NIGHTLY_KEYS.items()
            for setting, nightly in keys.items()
            if nightly == key
        ]
    )


@dataclasses.dataclass(kw_only=True)
class NightlyConfig(InputSettings, OutputFiles):
    """Settings of the nightly job (conf/nightly.yaml); see that file for what each key means."""

    output: str
    on_invalid: Literal["error", "quarantine"] = "quarantine"
    vector_reader: VectorReader = "auto"
    output_vector_col: str | None = None
    output_dtype: OutputDtype = "same"
    metadata_cols: list[str] = dataclasses.field(default_factory=list)
    label_col: str | None = None
    sample_size: int = 2000
    method: NightlyMethod = "auto"
    abtt_D: int | None = nightly_field("abtt_D")
    abtt_D2: int | None = nightly_field("abtt_D2")
    pca_k: int | None = nightly_field("pca_k")
    whitening_k: int | None = nightly_field("whitening_k")
    whitening_shrinkage: float = nightly_field("whitening_shrinkage")
    whitening_normalize: bool = nightly_field("whitening_normalize")
    cluster_k: int = nightly_field("cluster_k")
    cluster_D: int = nightly_field("cluster_D")
    cluster_distance_measure: Literal["euclidean", "cosine"] = nightly_field("cluster_distance_measure")
    cluster_task_memory: int = nightly_field("cluster_task_memory")
    flow_sample_size: int = nightly_field("flow_sample_size")
    flow_steps: int = nightly_field("flow_steps")
    flow_couplings: int = nightly_field("flow_couplings")
    flow_hidden: int = nightly_field("flow_hidden")
    flow_batch_size: int = nightly_field("flow_batch_size")
    flow_learning_rate: float = nightly_field("flow_learning_rate")
    mixture_check: bool = True
    seed: int = nightly_field("seed")
    artefact_directions: int = 10
    decision: DecisionThresholds = dataclasses.field(default_factory=DecisionThresholds)
    evaluation: EvaluationConfig | None = None
    min_neighbour_overlap: float = 0.25
    neighbour_sample: int = 200
    neighbour_k: int = 10
    index: IndexSettings | None = None
    refit: Literal["always", "on_drift"] = "on_drift"
    drift: dict[str, float] = dataclasses.field(
        default_factory=lambda: {"offset_ratio": 0.05, "anisotropy_A": 0.05, "top1_var": 0.05, "erank_frac": 0.05}
    )
    incremental: bool = True
    output_bounds: dict[str, list[float | None]] = dataclasses.field(default_factory=dict)
    artifacts_dir: str = "out/nightly/transforms"
    runs_dir: str = "out/nightly/runs"
    runs_table: str | None = "out/nightly/runs_table"
    stale_run_hours: float = 24.0
    app_id: str = "anisotropy-nightly"
    master: str | None = None

    @property
    def out_col(self) -> str:
        return self.output_vector_col or self.vector_col

    def check(self) -> list[str]:
        """Static problems (no data needed); :func:`check_against_data` adds k ≤ n, D < d, k ≤ d."""
        problems = self.output_problems(self.output) + self.input_problems() + self.output_file_problems()
        if not self.stale_run_hours > 0:
            problems.append(f"stale_run_hours must be > 0, got {self.stale_run_hours}")
        problems += setting_problems(self)
        if self.abtt_D is not None and self.dimension and self.abtt_D >= self.dimension:
            problems.append(f"abtt_D={self.abtt_D} must satisfy 0 <= abtt_D < dimension={self.dimension}")
        if self.whitening_k is not None and self.dimension and self.whitening_k > self.dimension:
            problems.append(
                f"whitening_k={self.whitening_k} must satisfy 1 <= whitening_k <= dimension={self.dimension}"
            )
        if not 0.0 <= self.min_neighbour_overlap <= 1.0 or self.neighbour_sample < 1 or self.neighbour_k < 1:
            problems.append(
                f"min_neighbour_overlap must be in [0, 1], neighbour_sample and neighbour_k >= 1, got "
                f"{self.min_neighbour_overlap}, {self.neighbour_sample}, {self.neighbour_k}"
            )
        if self.artefact_directions < 1:
            problems.append(f"artefact_directions must be >= 1, got {self.artefact_directions}")
        if self.sample_size < 3:
            problems.append(f"sample_size must be >= 3 (the artefact test's sample), got {self.sample_size}")
        problems += [f"decision.{p}" for p in self.decision.check()]
        if self.out_col in (VERSION_COLUMN, CLUSTER_COLUMN, self.id_col):
            problems.append(f"output_vector_col may not be {self.out_col!r}")
        for key, value in self.drift.items():
            if key not in CORE_METRICS or value < 0:
                problems.append(f"drift.{key}: expected a metric of {CORE_METRICS} with a number >= 0, got {value!r}")
        for key, bounds in self.output_bounds.items():
            if key not in CORE_METRICS:
                problems.append(f"output_bounds.{key}: unknown metric; known: {CORE_METRICS}")
            elif len(bounds) != 2 or _low_above_high(*bounds):
                problems.append(
                    f"output_bounds.{key}: expected [low, high] (numbers or null, low <= high), got {bounds!r}"
                )
        return problems


def _low_above_high(low: float | None, high: float | None) -> bool:
    """Output bounds [low, high] that no value meets (a null bound is open)."""
    return low is not None and high is not None and low > high


def check_against_data(config: NightlyConfig, n: int, d: int, method: str) -> None:
    """Raise :class:`ConfigError` naming the key when a setting is impossible for n valid rows of dimension d."""
    problems = []
    if config.abtt_D is not None and not config.abtt_D < min(d, n):
        problems.append(f"abtt_D={config.abtt_D} must be < d={d} and < n={n}")
    if config.whitening_k is not None and config.whitening_k > d:
        problems.append(f"whitening_k={config.whitening_k} exceeds the dimension d={d}")
    if method == Method.CLUSTER_RECENTER and config.cluster_k > n:
        problems.append(f"cluster_k={config.cluster_k} exceeds the number of valid rows n={n}")
    if problems:
        raise ConfigError(f"{config.input}: " + "; ".join(problems))


# settings that say where things go or how a run is gated, not what the published vectors are
NON_CONTENT_KEYS = (
    "master",
    "runs_dir",
    "runs_table",
    "artifacts_dir",
    "quarantine_path",
    "app_id",
    "output_bounds",
    "min_neighbour_overlap",
    "neighbour_sample",
    "neighbour_k",
    "stale_run_hours",
    "target_file_mb",
    "index",
)


def nightly_config_hash(config: NightlyConfig) -> str:
    """Hash of the settings that determine the published content (``NON_CONTENT_KEYS`` left out), so moving
    the run records or tightening the gate does not turn a no-op night into a rebuild."""
    return fields_hash({**dataclasses.asdict(config), **dict.fromkeys(NON_CONTENT_KEYS)})
