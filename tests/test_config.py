import dataclasses
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.config import PRESET_NAMES, ConfigError, env_preset, quick_mode
from mimo_kit.config.base import Config, knob, parse_assignments
from mimo_kit.model import MiMoConfig


@dataclasses.dataclass
class RunConfig(Config):
    """A job config of the kit's usual shape (a nested model and run settings), for the config machinery's tests."""

    model: MiMoConfig = dataclasses.field(default_factory=MiMoConfig)
    seed: int = knob(0, "a fixed seed", min=0)
    device: Literal["auto", "cpu", "cuda", "meta"] = knob("auto", "auto = cuda when available, else cpu")
    dtype: Literal["float32", "bfloat16", "float16"] = knob("float32", "float32 on CPU")
    quick: bool = knob(False, "a smoke-sized run")

    PRESETS = {"tiny": {}, "small": {}, "flash": {"device": "meta", "dtype": "bfloat16"},
               "pro": {"device": "meta", "dtype": "bfloat16"}}


preset = RunConfig.preset


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_builds_and_round_trips_through_yaml(name, tmp_path):
    cfg = preset(name)
    assert isinstance(cfg.model, MiMoConfig) and cfg.model == MiMoConfig.preset(name)  # the nested preset
    path = tmp_path / "c.yaml"
    cfg.to_yaml(path)
    assert RunConfig.from_yaml(path) == cfg
    assert MiMoConfig.from_yaml(MiMoConfig.preset(name).to_yaml()) == MiMoConfig.preset(name)


def test_presets_grow_in_scale():
    hidden = [MiMoConfig.preset(n).hidden_size for n in PRESET_NAMES]
    assert hidden == sorted(hidden) and len(set(hidden)) == len(hidden)
    assert preset("flash").device == "meta" and preset("tiny").device != "meta"


def test_unknown_preset_lists_available():
    with pytest.raises(ConfigError, match=r"no preset 'huge'.*tiny, small, flash, pro"):
        preset("huge")


def test_unknown_key_names_it_and_lists_valid_keys():
    with pytest.raises(ConfigError) as e:
        preset("tiny").override(["model.hiden_size=8"])
    msg = str(e.value)
    assert "'model.hiden_size'" in msg and "did you mean 'hidden_size'" in msg and "num_hidden_layers" in msg


@pytest.mark.parametrize("assignment, fragment", [
    ("seed=abc", "seed: got 'abc', expected an integer"),
    ("seed=-1", "seed: got -1, expected a value >= 0"),
    ("quick=3", "quick: got 3, expected true or false"),
    ("device=tpu", "device: got 'tpu', expected one of 'auto', 'cpu', 'cuda', 'meta'"),
    ("model.sliding_window=0", "sliding_window: got 0, expected a value >= 1"),
    ("model.global_layers=[0,x]", "global_layers[1]: got 'x', expected an integer"),
])
def test_bad_values_name_field_value_and_expectation(assignment, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        preset("tiny").override([assignment])


@pytest.mark.parametrize("assignment, fragment", [
    ("model.num_key_value_heads=3", "does not divide num_attention_heads=4"),
    ("model.num_experts_per_tok=9", "expected <= n_routed_experts=8"),
    ("model.global_layers=[0,7]", "layer 7 is outside 0..3"),
])
def test_cross_field_rules(assignment, fragment):
    with pytest.raises(ConfigError, match=fragment):
        preset("tiny").override([assignment])


def test_yaml_with_wrong_type_names_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("seed: 1\nmodel:\n  hidden_size: wide\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: model.hidden_size: got 'wide', expected an integer"):
        RunConfig.from_yaml(path)


def test_yaml_syntax_error_is_a_config_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        RunConfig.from_yaml(path)


def test_override_parses_yaml_scalars_and_keeps_the_rest():
    base = preset("tiny")
    cfg = base.override(["model.hidden_size=32", "quick=true", "model.global_layers=[0, 2]", "dtype=bfloat16"])
    assert cfg.model.hidden_size == 32 and cfg.quick is True and cfg.model.global_layers == (0, 2)
    assert cfg.dtype == "bfloat16" and cfg.model.vocab_size == base.model.vocab_size
    assert cfg.diff(base) == {"model.hidden_size": 32, "quick": True, "model.global_layers": [0, 2],
                              "dtype": "bfloat16"}


def test_parse_assignments_rejects_missing_equals():
    with pytest.raises(ConfigError, match="not of the form key=value"):
        parse_assignments(["seed"])


@settings(max_examples=60, deadline=None)
@given(hidden=st.integers(1, 4096), seed=st.integers(0, 2**31), window=st.integers(1, 10_000),
       theta=st.floats(1.0, 1e7), quick=st.booleans(), name=st.sampled_from(PRESET_NAMES))
def test_overrides_and_yaml_round_trip_property(hidden, seed, window, theta, quick, name):
    cfg = preset(name).override({"model.hidden_size": hidden, "seed": seed, "model.sliding_window": window,
                                 "model.rope_theta": theta, "quick": quick})
    assert RunConfig.from_yaml(cfg.to_yaml()) == cfg
    assert cfg.model.hidden_size == hidden and cfg.model.sliding_window == window


def test_every_model_field_says_why():
    missing = [r["key"] for r in MiMoConfig.preset("tiny").describe() if not r["why"]]
    assert missing == []


def test_flash_layer_pattern_matches_transformers_rule():
    types = MiMoConfig.preset("flash").layer_types
    assert [i for i, t in enumerate(types) if t == "full_attention"] == [0, 5, 11, 17, 23, 29, 35, 41, 47]
    assert MiMoConfig.preset("flash").rotary_dim == 64


def test_env_variables(monkeypatch):
    monkeypatch.setenv("MIMO_KIT_PRESET", "small")
    monkeypatch.setenv("MIMO_KIT_QUICK", "1")
    assert env_preset() == "small" and quick_mode() is True
    monkeypatch.setenv("MIMO_KIT_PRESET", "giant")
    with pytest.raises(ConfigError, match="MIMO_KIT_PRESET='giant'"):
        env_preset()
    monkeypatch.setenv("MIMO_KIT_QUICK", "maybe")
    with pytest.raises(ConfigError, match="MIMO_KIT_QUICK='maybe'"):
        quick_mode()


def test_nested_config_follows_parent_preset_only_when_supported():
    @dataclasses.dataclass
    class Inner(Config):
        width: int = knob(1, "test", min=1)
        PRESETS = {"tiny": {}, "small": {"width": 5}}

    @dataclasses.dataclass
    class Outer(Config):
        inner: Inner = dataclasses.field(default_factory=Inner)
        steps: int = knob(2, "test")
        PRESETS = {"tiny": {}, "small": {"steps": 9}}

    small = Outer.preset("small")
    assert small.inner.width == 5 and small.steps == 9
    assert Outer.presets() == ("tiny", "small")
    with pytest.raises(ConfigError, match="Outer has no preset 'flash'"):
        Outer.preset("flash")


@pytest.mark.parametrize("text, value", [("1e-5", 1e-5), ("3E-4", 3e-4), (" 2.5 ", 2.5), ("1e3", 1000.0)])
def test_a_float_knob_reads_exponent_strings(text, value):
    """YAML 1.1 reads ``1e-5`` (no dot) as a string; a float knob still takes it, from YAML and from key=value."""
    from mimo_kit.train.config import RLConfig

    assert RLConfig.from_dict({"lr": text}).lr == value
    assert RLConfig().override([f"lr={text.strip()}"]).lr == value


@pytest.mark.parametrize("text", ["fast", "nan", "inf", ""])
def test_a_float_knob_refuses_other_strings(text):
    from mimo_kit.train.config import RLConfig

    with pytest.raises(ConfigError, match=r"lr: got .*expected a number"):
        RLConfig.from_dict({"lr": text})
