"""Chapter 1's experiment, registered for ``mimo-kit run`` (Report §1).

    mimo-kit run scale-knobs --preset tiny names=[tiny,pro]   # the model shape of each preset, side by side
"""

from __future__ import annotations

import dataclasses

from mimo_kit.config.base import Config, knob
from mimo_kit.experiments import experiment


@dataclasses.dataclass
class ScaleKnobsConfig(Config):
    """Which presets to lay side by side."""

    names: tuple[str, ...] = knob(("tiny", "small", "flash", "pro"), "all four scale knobs")

    PRESETS = {"tiny": {}}


@experiment("scale-knobs", ScaleKnobsConfig, chapter="ch01")
def run_scale_knobs(cfg: ScaleKnobsConfig) -> dict:
    """The model shape of every preset, side by side: one code path from a laptop toy to Pro."""
    from mimo_kit.model import MiMoConfig

    return {name: MiMoConfig.preset(name).summary() for name in cfg.names}
