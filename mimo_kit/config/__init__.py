"""Configs, presets and overrides (see :mod:`mimo_kit.config.base`). The bottom layer of the kit: it imports no other
part of it. Each config class carries its presets (``MiMoConfig.preset("flash")``, ``PretrainConfig.preset("tiny")``).

>>> from mimo_kit.config import PRESET_NAMES
>>> PRESET_NAMES
('tiny', 'small', 'flash', 'pro')
"""

from __future__ import annotations

import os

from mimo_kit.config.base import PRESET_NAMES, Config, ConfigError, knob, parse_assignments

__all__ = ["PRESET_NAMES", "Config", "ConfigError", "knob", "parse_assignments", "env_preset", "quick_mode"]


def env_preset(default: str = "tiny") -> str:
    """The preset named by ``MIMO_KIT_PRESET`` (notebooks honour it), checked against the known names."""
    name = os.environ.get("MIMO_KIT_PRESET", default)
    if name not in PRESET_NAMES:
        raise ConfigError(f"MIMO_KIT_PRESET={name!r}; expected one of {', '.join(PRESET_NAMES)}")
    return name


def quick_mode() -> bool:
    """True when ``MIMO_KIT_QUICK`` is set to 1/true/yes: every loop shrinks to a smoke-sized run."""
    raw = os.environ.get("MIMO_KIT_QUICK", "0").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"MIMO_KIT_QUICK={raw!r}; expected 1 or 0")
