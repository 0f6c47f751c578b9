"""The kit-wide config: the backbone shape plus how and where to run it."""

from __future__ import annotations

import dataclasses
from typing import Literal

from mimo_kit.config.base import Config, knob
from mimo_kit.model.config import MiMoConfig


@dataclasses.dataclass
class KitConfig(Config):
    """What ``preset(name)`` returns: the model of that preset and the run settings every experiment shares."""

    model: MiMoConfig = dataclasses.field(default_factory=MiMoConfig)
    seed: int = knob(0, "fixed seed: CPU runs of the kit are bit-reproducible", min=0)
    device: Literal["auto", "cpu", "cuda", "meta"] = knob("auto", "auto = cuda when available, else cpu")
    dtype: Literal["float32", "bfloat16", "float16"] = knob("float32", "float32 on CPU; bfloat16 on GPUs")
    quick: bool = knob(False, "shrink every loop so a chapter runs in about a minute (MIMO_KIT_QUICK=1)")

    PRESETS = {
        "tiny": {},
        "small": {},
        # The report's shapes are built on the meta device: parameter counts without memory.
        "flash": {"device": "meta", "dtype": "bfloat16"},
        "pro": {"device": "meta", "dtype": "bfloat16"},
    }
