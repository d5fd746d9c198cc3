"""Typed YAML config: unknown keys, types, literals, required keys, CLI overrides (incl. null)."""

import dataclasses
from typing import Literal

import pytest

from jobs.config import ConfigError, config_hash, from_mapping, parse_args


@dataclasses.dataclass
class Example:
    input: str
    k: int = 3
    mode: Literal["a", "b"] = "a"
    tol: float = 1.0
    cols: list[str] = dataclasses.field(default_factory=list)
    table: str | None = "out/t"
    dimension: int | None = None

    def check(self):
        return [f"k must be ≥ 1, got {self.k}"] if self.k < 1 else []


def test_valid_mapping_and_int_to_float():
    c = from_mapping(Example, {"input": "x", "k": 4, "tol": 2, "cols": ["a"]})
    assert c == Example(input="x", k=4, tol=2.0, cols=["a"]) and isinstance(c.tol, float)


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"input": "x", "kk": 1}, r"unknown key\(s\) \['kk'\]"),
        ({"input": "x", "k": "3"}, "config.k: expected int, got str"),
        ({"input": "x", "k": True}, "config.k: expected int, got bool"),
        ({"input": "x", "mode": "c"}, r"config.mode: 'c' is not one of \['a', 'b'\]"),
        ({"k": 1}, r"missing required key\(s\) \['input'\]"),
        ({"input": "x", "cols": "a"}, "config.cols: expected a list"),
        ({"input": "x", "k": 0}, "k must be ≥ 1"),
    ],
)
def test_errors_name_the_key(raw, message):
    with pytest.raises(ConfigError, match=message):
        from_mapping(Example, raw)


def test_cli_overrides_file_and_null_clears(tmp_path):
    conf = tmp_path / "c.yaml"
    conf.write_text("input: from-file\nk: 5\ntable: out/metrics\n")
    config, _ = parse_args(
        Example, ["--conf", str(conf), "--k", "7", "--cols", "[a, b]", "--table", "null", "--dimension", "12"], "test"
    )
    assert (config.input, config.k, config.cols, config.table, config.dimension) == (
        "from-file",
        7,
        ["a", "b"],
        None,
        12,
    )
    untouched, _ = parse_args(Example, ["--conf", str(conf)], "test")
    assert untouched.table == "out/metrics" and untouched.k == 5
    text_kept, _ = parse_args(Example, ["--input", "123"], "test")
    assert text_kept.input == "123"


def test_yaml_is_loaded_safely(tmp_path):
    conf = tmp_path / "evil.yaml"
    conf.write_text("input: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(Exception, match="could not determine a constructor"):
        parse_args(Example, ["--conf", str(conf)], "test")


def test_config_hash_is_stable_and_sensitive():
    a, b = Example(input="x"), Example(input="x", k=4)
    assert config_hash(a) == config_hash(Example(input="x")) and config_hash(a) != config_hash(b)


def test_quarantine_needs_a_path():
    from jobs.config import quarantine_problems
    from jobs.diagnose import DiagnoseConfig

    assert quarantine_problems(DiagnoseConfig(input="x", on_invalid="quarantine")) == [
        "on_invalid: quarantine needs quarantine_path"
    ]
    assert quarantine_problems(DiagnoseConfig(input="x", on_invalid="quarantine", quarantine_path="q")) == []
    assert quarantine_problems(DiagnoseConfig(input="x")) == []


@dataclasses.dataclass
class Thresholds:
    low: float = 0.0
    high: float = 1.0


@dataclasses.dataclass
class Nested:
    input: str
    limits: Thresholds = dataclasses.field(default_factory=Thresholds)
    drift: dict[str, float] = dataclasses.field(default_factory=dict)


def test_cli_mapping_overrides_deep_merge_into_the_file(tmp_path):
    conf = tmp_path / "n.yaml"
    conf.write_text("input: x\nlimits: {low: 0.2, high: 0.8}\ndrift: {a: 0.1, b: 0.2}\n")
    config, _ = parse_args(Nested, ["--conf", str(conf), "--limits", "{high: 0.9}", "--drift", "{b: 0.5}"], "test")
    assert config.limits == Thresholds(low=0.2, high=0.9) and config.drift == {"a": 0.1, "b": 0.5}


def test_dict_values_are_type_checked():
    with pytest.raises(ConfigError, match="config.drift.a: expected float, got str 'big'"):
        from_mapping(Nested, {"input": "x", "drift": {"a": "big"}})
    assert from_mapping(Nested, {"input": "x", "drift": {"a": 1}}).drift == {"a": 1.0}


def test_every_job_shares_the_input_block():
    from jobs.apply import ApplyConfig
    from jobs.config import InputSettings
    from jobs.diagnose import DiagnoseConfig
    from jobs.fit import FitConfig
    from jobs.nightly_config import NightlyConfig

    shared = {f.name for f in dataclasses.fields(InputSettings)}
    # issue 45 adds max_norm_ratio (the norm-outlier rule) to the shared input block
    assert shared == {"input", "vector_col", "id_col", "dimension", "on_invalid", "quarantine_path", "max_norm_ratio"}
    for job in (ApplyConfig, DiagnoseConfig, FitConfig, NightlyConfig):
        assert issubclass(job, InputSettings) and shared <= {f.name for f in dataclasses.fields(job)}
    with pytest.raises(ConfigError, match="dimension must be >= 1, got 0"):
        from_mapping(FitConfig, {"input": "x", "artifact": "a", "dimension": 0})
    with pytest.raises(ConfigError, match="output must differ from input"):
        from_mapping(
            ApplyConfig, {"input": "t", "artifact": "a", "output": "file://" + __import__("os").path.abspath("t")}
        )


def test_fit_config_rejects_a_negative_task_memory():
    from jobs.fit import FitConfig

    assert "task_memory must be >= 0 bytes, got -1" in FitConfig(input="x", artifact="y", task_memory=-1).check()
    assert not any("task_memory" in problem for problem in FitConfig(input="x", artifact="y").check())
