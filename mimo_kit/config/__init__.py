"""Configs, presets and overrides (see :mod:`mimo_kit.config.base`).

>>> from mimo_kit.config import preset
>>> preset("tiny").model.hidden_size
64
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from mimo_kit.config.base import PRESET_NAMES, Config, ConfigError, knob, parse_assignments

if TYPE_CHECKING:
    from mimo_kit.config.kit import KitConfig

__all__ = ["PRESET_NAMES", "Config", "ConfigError", "knob", "parse_assignments", "preset", "env_preset",
           "quick_mode"]


def preset(name: str = "tiny", **overrides: Any) -> KitConfig:
    """The kit config (model shape + run settings) of preset ``tiny`` | ``small`` | ``flash`` | ``pro``."""
    from mimo_kit.config.kit import KitConfig

    return KitConfig.preset(name, **overrides)


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
