"""The optimiser's knobs: which optimiser the hidden matrices get, learning rates, schedule (Report §3).

The report publishes none of these constants (only "AdamW in pre-training, Muown for the hidden matrices in
RL/mid-training"); every default below is the kit's, tuned on the tiny preset, with its reason.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from mimo_kit.config.base import Config, ConfigError, knob


@dataclasses.dataclass
class OptimConfig(Config):
    matrix_optimizer: Literal["adamw", "muon", "muown"] = knob(
        "adamw", "Report §3: pre-training uses AdamW; the switch experiment moves hidden matrices to Muown")
    lr: float = knob(3e-3, "AdamW peak lr: fastest stable value for the tiny model in a short sweep", min=0.0)
    matrix_lr: float = knob(
        3e-3, "Muon/Muown direction lr: with the 0.2·√max(m,n) scaling the AdamW lr carries over (Moonshot)", min=0.0)
    norm_lr: float = knob(3e-3, "Muown: Adam lr of the row magnitudes g, the AdamW lr", min=0.0)
    betas: tuple[float, float] = knob((0.9, 0.95), "common LLM pre-training betas (β2 = 0.95 for stability)")
    eps: float = knob(1e-8, "Adam's ε", min=0.0)
    weight_decay: float = knob(0.1, "decoupled decay of matrices (AdamW/Muon: W; Muown: g); vectors get none",
                               min=0.0)
    momentum: float = knob(0.95, "Muon/Muown momentum (Keller Jordan's default)", min=0.0, max=0.999)
    nesterov: bool = knob(True, "Nesterov momentum, as torch.optim.Muon's default")
    ns_steps: int = knob(5, "Newton–Schulz steps: 5 with the quintic coefficients reach singular values ~[0.7, 1.2]",
                         min=1, max=50)
    ns_coefficients: tuple[float, float, float] = knob(
        (3.4445, -4.775, 2.0315), "Keller Jordan's quintic (a, b, c), also torch.optim.Muon's")
    schedule: Literal["cosine", "constant"] = knob("cosine", "cosine decay after warm-up; constant for ablations")
    warmup_steps: int = knob(20, "linear warm-up steps: Adam's second moment settles within ~20 steps", min=0)
    min_lr_ratio: float = knob(0.1, "cosine floor as a fraction of the peak lr", min=0.0, max=1.0)
    grad_clip: float = knob(1.0, "global gradient-norm clip (0 = off); 1.0 as in the report's RL recipe", min=0.0)

    PRESETS = {
        "tiny": {},
        "small": {"lr": 1e-3, "matrix_lr": 1e-3, "norm_lr": 1e-3, "warmup_steps": 50},
    }

    def check(self) -> None:
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"OptimConfig.betas: got {self.betas!r}, expected two values in [0, 1)")
        if len(self.ns_coefficients) != 3:
            raise ConfigError(f"OptimConfig.ns_coefficients: got {self.ns_coefficients!r}, expected (a, b, c)")
