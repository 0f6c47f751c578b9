"""Every constant of the RL math is a named config field with a default and a reason (docs/design.md "Principles")."""

import dataclasses
import inspect

import pytest

import mimo_kit.rl as rl
from mimo_kit.config import ConfigError
from mimo_kit.rl import config as rlc


def _configs():
    return [c for _, c in inspect.getmembers(rlc, inspect.isclass)
            if issubclass(c, rlc.Config) and c is not rlc.Config]


def test_every_field_has_a_reason():
    rows = rlc.RLMathConfig.preset("tiny").describe()
    assert len(rows) >= 25
    missing = [r["key"] for r in rows if len(r["why"].strip()) < 10]
    assert missing == []


@pytest.mark.parametrize("cls", _configs(), ids=lambda c: c.__name__)
def test_each_section_has_a_tiny_preset_and_round_trips_yaml(cls):
    cfg = cls.preset("tiny")
    assert cls.from_yaml(cfg.to_yaml()) == cfg


def test_unpublished_constants_are_named_fields():
    names = {r["key"] for r in rlc.RLMathConfig().describe()}
    for key in ["gar.tier_decay", "gar.min_factor", "gar.max_scale", "gar.recenter", "length.scale",
                "length.tolerance", "length.cap", "length.gate", "segment.kappa", "segment.alpha_max",
                "segment.beta_min", "clip.entropy_target", "clip.entropy_gain", "clip.eps_high_min",
                "clip.eps_high_max", "clip.tis_cap", "grpo.eps", "sampling.confidence", "rules.max_repeats"]:
        assert key in names, key


def _defaults_of(fn):
    return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


def test_function_defaults_come_from_the_config():
    """One source of truth: each function's default equals its config field's default."""
    d = rlc.RLMathConfig()
    assert _defaults_of(rl.grpo_advantages) == {"scale_std": d.grpo.scale_std, "eps": d.grpo.eps,
                                                "std_correction": d.grpo.std_correction}
    assert _defaults_of(rl.length_penalty) == {"scale": d.length.scale, "tolerance": d.length.tolerance,
                                               "cap": d.length.cap, "gate": d.length.gate,
                                               "reference": d.length.reference}
    assert _defaults_of(rl.segment_advantages) == dataclasses.asdict(d.segment)
    assert _defaults_of(rl.entropy_adaptive_eps_high) == {"target": d.clip.entropy_target,
                                                          "gain": d.clip.entropy_gain, "lo": d.clip.eps_high_min,
                                                          "hi": d.clip.eps_high_max}
    q = _defaults_of(rl.quality_factors)
    assert (q["tier_decay"], q["min_factor"]) == (d.gar.tier_decay, d.gar.min_factor)
    assert _defaults_of(rl.truncated_is_weights)["cap"] == d.clip.tis_cap


def test_bad_values_are_rejected_naming_the_field():
    with pytest.raises(ConfigError, match="ClipConfig: eps_high=0.5 outside"):
        rlc.ClipConfig(eps_high=0.5)
    with pytest.raises(ConfigError, match="GARConfig.max_scale: got 0.5"):
        rlc.GARConfig(max_scale=0.5)
    with pytest.raises(ConfigError, match="did you mean 'kappa'"):
        rlc.RLMathConfig.preset("tiny").override(["segment.kapa=3"])
