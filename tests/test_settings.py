"""Issue 44: each correction's settings declared once (anisotropy_core.methods) and derived everywhere — the fit and
nightly config keys, the CLI flags, the Spark Params — and the Spark ML surface (typed Params whose converters
validate, a setter for every Param, handleInvalid, read-only fitted state)."""

import dataclasses
import json
import pickle
import typing

import numpy as np
import pytest

from anisotropy_core.methods import CORRECTIONS, SETTINGS, Method, SettingError, param_name
from anisotropy_spark.estimators import (
    AbttPcaAbttEstimator,
    AllButTheTopEstimator,
    CenterEstimator,
    CorrectionModel,
    FlowEstimator,
    WhiteningEstimator,
    estimator_for,
    model_class_for,
    registered_methods,
)
from anisotropy_spark.kmeans import ClusterRecenterEstimator
from anisotropy_spark.params import (
    _AbttPcaAbttParams,
    _AllButTheTopParams,
    _ClusterRecenterParams,
    _FlowParams,
    _TransformParams,
    _WhiteningParams,
)
from jobs.config import ConfigError, from_mapping
from jobs.fit import FitConfig
from jobs.nightly_config import NIGHTLY_KEYS, NightlyConfig


def base_type(hint):
    """``int | None`` → int; ``Literal[...]`` and ``list[int]`` as they are."""
    options = [a for a in typing.get_args(hint) if a is not type(None)]
    return options[0] if typing.get_origin(hint) in (typing.Union, type(int | None)) and len(options) == 1 else hint


def test_method_is_its_name():
    assert Method.ABTT == "abtt" and {"abtt": 1}[Method.ABTT] == 1 and Method("flow") is Method.FLOW
    assert f"{Method.ABTT}-x" == "abtt-x" and json.dumps([Method.NONE]) == '["none"]'
    assert type(pickle.loads(pickle.dumps(Method.CENTER))) is str  # so it may enter Spark rows
    assert set(registered_methods()) == {m.value for m in CORRECTIONS}


def test_settings_validate_on_construction():
    with pytest.raises(SettingError, match="abtt.D must be >= 0, got -1"):
        SETTINGS[Method.ABTT](D=-1)
    with pytest.raises(SettingError, match=r"whitening.shrinkage must be in \[0, 1\], got 1.5"):
        SETTINGS[Method.WHITENING](shrinkage=1.5)
    assert SETTINGS[Method.FLOW]().learning_rate == 1e-2


@pytest.mark.parametrize("method", CORRECTIONS)
def test_each_setting_is_a_fit_key_a_cli_flag_and_a_param(method, capsys):
    """The fit config holds every setting of every method under its key, with a compatible type hint and the
    declaration's default (None where methods differ); --help lists its flag and doc; the Estimator has the Param
    (camelCase) with the same default and doc."""
    fields = {f.name: f for f in dataclasses.fields(FitConfig)}
    hints = typing.get_type_hints(FitConfig)
    estimator = estimator_for(method, {})
    from jobs.fit import main

    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for declared in SETTINGS[method].settings():
        field = fields[declared.key]
        assert declared in field.metadata["settings"] and base_type(hints[declared.key]) == base_type(declared.hint)
        assert field.default in (declared.default, None)
        assert f"--{declared.key.replace('_', '-')} VALUE" in help_text and declared.doc in help_text
        param = estimator.getParam(param_name(declared.key))
        assert estimator.getOrDefault(param) == declared.default and declared.doc in param.doc


def test_fit_config_has_exactly_the_declared_method_keys():
    declared = {s.key for settings in SETTINGS.values() for s in settings.settings()}
    with_settings = {f.name for f in dataclasses.fields(FitConfig) if "settings" in f.metadata}
    assert with_settings == declared


def test_nightly_keys_map_to_declared_settings():
    fields = {f.name: f for f in dataclasses.fields(NightlyConfig)}
    hints = typing.get_type_hints(NightlyConfig)
    assert set(NIGHTLY_KEYS) == set(CORRECTIONS)
    for method, keys in NIGHTLY_KEYS.items():
        for setting, key in keys.items():
            declared = SETTINGS[method].setting(setting)
            assert declared in fields[key].metadata["settings"], (method, setting, key)
            assert fields[key].default == declared.default
            assert base_type(hints[key]) == base_type(declared.hint)


def test_config_errors_name_the_key():
    assert "k must be >= 1, got 0" in FitConfig(input="x", artifact="y", k=0).check()
    assert "learning_rate must be > 0, got 0.0" in FitConfig(input="x", artifact="y", learning_rate=0.0).check()
    with pytest.raises(ConfigError, match="flow_learning_rate must be > 0, got 0"):
        from_mapping(NightlyConfig, {"input": "i", "output": "o", "flow_learning_rate": 0})
    with pytest.raises(ConfigError, match=r"config.method: 'magic' is not one of \['auto', 'none', .*'flow'\]"):
        from_mapping(NightlyConfig, {"input": "i", "output": "o", "method": "magic"})
    assert from_mapping(FitConfig, {"input": "i", "artifact": "a", "method": "flow"}).method is Method.FLOW


ESTIMATORS = [
    CenterEstimator,
    AllButTheTopEstimator,
    WhiteningEstimator,
    AbttPcaAbttEstimator,
    FlowEstimator,
    ClusterRecenterEstimator,
]


def setter(name):
    return "set" + name[0].upper() + name[1:]


@pytest.mark.parametrize("estimator_class", ESTIMATORS)
def test_every_param_has_a_setter(estimator_class):
    """Every Estimator Param has a setter that sets it; every Model has one for each Param but the fitted ones
    (read-only: setParams refuses them)."""
    estimator = estimator_class()
    for param in estimator.params:
        value = estimator.getOrDefault(param)
        assert getattr(estimator, setter(param.name))(value) is estimator, param.name
        assert estimator.isSet(param)
    model_class = estimator_class.model_class
    fitted = {s.param for s in model_class.method_settings.settings()} if model_class.method_settings else set()
    model = model_class()
    for param in model.params:
        assert hasattr(model, setter(param.name)) == (param.name not in fitted), param.name
    for name in fitted:
        with pytest.raises(ValueError, match="read-only on a model"):
            model.setParams(**{name: 1})


@pytest.mark.parametrize(
    "mixin",
    [_TransformParams, _AllButTheTopParams, _WhiteningParams, _AbttPcaAbttParams, _FlowParams, _ClusterRecenterParams],
)
def test_typed_getters_are_the_generated_ones(mixin):
    """Each Params mixin annotates (for mypy) exactly the getters its declared settings generate, each returning the
    setting's type."""
    own = [name for name in vars(mixin).get("__annotations__", {}) if name.startswith("get")]
    hints = typing.get_type_hints(mixin)
    generated = {"get" + s.param[:1].upper() + s.param[1:]: s for s in mixin._declared}
    assert set(own) == set(generated)
    for name in own:
        assert typing.get_args(hints[name]) == ([], generated[name].hint), name


def test_typed_model_setters_are_the_added_ones():
    """CorrectionModel annotates (for mypy) exactly the setters every model gets: one per settable Param."""
    own = {name for name in vars(CorrectionModel).get("__annotations__", {}) if name.startswith("set")}
    assert own == {setter(name) for name in CorrectionModel._settable_params()}
    assert all(callable(getattr(CorrectionModel, name)) for name in own)


@pytest.mark.parametrize(
    "make",
    [
        lambda: AllButTheTopEstimator(D=-1),
        lambda: AllButTheTopEstimator().setMaxD(-2),
        lambda: WhiteningEstimator(k=0),
        lambda: WhiteningEstimator().setShrinkage(2.0),
        lambda: WhiteningEstimator().setEps(0.0),
        lambda: ClusterRecenterEstimator(k=0),
        lambda: ClusterRecenterEstimator().setDistanceMeasure("manhattan"),
        lambda: FlowEstimator().setLearningRate(0.0),
        lambda: AbttPcaAbttEstimator().setD2(-1),
        lambda: FlowEstimator(sampleSize=1),
    ],
)
def test_converters_reject_values_outside_the_constraint(make):
    with pytest.raises(ValueError, match="must be"):
        make()


def test_estimator_for_names_the_key_of_a_bad_value():
    with pytest.raises(ValueError, match="abtt.D: D must be >= 0, got -3"):
        estimator_for("abtt", {"D": -3})


@pytest.fixture(scope="module")
def frame(spark):
    rows = [(i, [float(i % 3), float(i % 5), float(i % 7), 1.0 + i / 10]) for i in range(40)]
    return spark.createDataFrame(rows, "id long, vector array<double>")


def test_output_dtype_is_validated_wherever_it_is_set(spark, frame, tmp_path):
    """Issue 44: an unknown outputDtype used to pass transform params, copy() and load and silently become
    double; the converter now refuses it everywhere."""
    model = CenterEstimator().fit(frame)
    with pytest.raises(ValueError, match="outputDtype must be one of"):
        model.setOutputDtype("float16")
    with pytest.raises(ValueError, match="outputDtype must be one of"):
        model.transform(frame, {model.outputDtype: "float16"})
    with pytest.raises(ValueError, match="outputDtype must be one of"):
        model.copy({model.outputDtype: "float16"})
    assert (
        model.transform(frame, {model.outputDtype: "float32"}).schema["corrected"].dataType.elementType.simpleString()
        == "float"
    )
    path = tmp_path / "center"
    model.save(str(path))
    metadata = next((path / "metadata").glob("part-*"))
    saved = json.loads(metadata.read_text())
    saved["paramMap"]["outputDtype"] = "float16"
    metadata.write_text(json.dumps(saved))
    for checksum in (path / "metadata").glob(".*.crc"):  # Hadoop would refuse the edited file
        checksum.unlink()
    with pytest.raises(ValueError, match="outputDtype must be one of"):
        CorrectionModel.load(str(path))


def test_handle_invalid_keeps_or_raises(spark, frame):
    model = CenterEstimator().fit(frame).setHandleInvalid("keep")
    bad = spark.createDataFrame(
        [(1, [1.0, 2.0, 3.0, 4.0]), (2, [float("nan"), 0.0, 0.0, 0.0]), (None, [1.0] * 4)],
        "id long, vector array<double>",
    )
    rows = model.transform(bad).collect()
    assert {(r["id"], r["invalid_reason"], r["corrected"] is None) for r in rows} == {
        (2, "non_finite", True),
        (None, "null_id", True),
        (1, None, False),
    }
    with pytest.raises(Exception, match="invalid input row: non_finite"):  # one partition: the first bad row
        model.setHandleInvalid("error").transform(bad.coalesce(1)).collect()
    with pytest.raises(ValueError, match="handleInvalid must be one of"):
        model.setHandleInvalid("skip")


def test_fitted_state_is_read_only(frame):
    model = AllButTheTopEstimator(D=1).fit(frame)
    assert model.components.shape == (1, 4) and model.mean.shape == (4,)
    with pytest.raises(ValueError, match="read-only"):
        model.components[0, 0] = 1.0
    with pytest.raises(AttributeError):
        model.components = np.zeros((1, 4))
    assert model_class_for("abtt") is type(model)
