"""One optimiser object per model: AdamW for the rest, the chosen optimiser for the hidden matrices (Report §3).

:class:`OptimizerSet` holds the two parts (``"adamw"`` and ``"matrix"``), steps them together, schedules their
learning rates by one factor, and checkpoints them as one state dict. :meth:`OptimizerSet.switch` replaces the
matrix part mid-run: the report's switch from AdamW to Muown.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from mimo_kit.optim.config import OptimConfig
from mimo_kit.optim.grouping import ADAMW, MATRIX, group_parameters
from mimo_kit.optim.muown import Muon, Muown


def _matrix_optimizer(params: list[nn.Parameter], kind: str, cfg: OptimConfig) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if kind == "muon":
        return Muon(params, lr=cfg.matrix_lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
                    nesterov=cfg.nesterov, ns_coefficients=cfg.ns_coefficients, ns_steps=cfg.ns_steps,
                    adjust_lr_fn="match_rms_adamw")
    if kind == "muown":
        return Muown(params, lr=cfg.matrix_lr, lr_norm=cfg.norm_lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                     betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, ns_steps=cfg.ns_steps,
                     ns_coefficients=cfg.ns_coefficients)
    raise ValueError(f"matrix optimiser {kind!r}; expected 'adamw', 'muon' or 'muown'")


def _remember_base_lr(opt: torch.optim.Optimizer) -> None:
    for group in opt.param_groups:
        for key in ("lr", "lr_norm"):
            if key in group:
                group[f"base_{key}"] = group[key]


class OptimizerSet:
    """``parts = {"adamw": AdamW(embeddings, head, router, norms, sinks), "matrix": AdamW | Muon | Muown}``."""

    def __init__(self, model: nn.Module, cfg: OptimConfig):
        self.cfg = cfg
        groups = group_parameters(model)
        self.matrix_params = [p for _, p in groups[MATRIX]]
        decay = [p for _, p in groups[ADAMW] if p.dim() >= 2]  # embedding, LM head, router
        no_decay = [p for _, p in groups[ADAMW] if p.dim() < 2]  # norms, sinks, biases
        self.parts: dict[str, torch.optim.Optimizer] = {
            ADAMW: torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                      {"params": no_decay, "weight_decay": 0.0}],
                                     lr=cfg.lr, betas=cfg.betas, eps=cfg.eps),
            MATRIX: _matrix_optimizer(self.matrix_params, cfg.matrix_optimizer, cfg),
        }
        self.matrix_kind = cfg.matrix_optimizer
        self.lr_factor = 1.0
        for opt in self.parts.values():
            _remember_base_lr(opt)

    def switch(self, kind: str) -> None:
        """Give the hidden matrices a fresh ``kind`` optimiser (no state carried over); AdamW's part is kept."""
        self.parts[MATRIX] = _matrix_optimizer(self.matrix_params, kind, self.cfg)
        self.matrix_kind = kind
        _remember_base_lr(self.parts[MATRIX])
        self.set_lr_factor(self.lr_factor)

    def set_lr_factor(self, factor: float) -> None:
        """lr = base lr × factor in every group (the schedule's multiplier)."""
        self.lr_factor = factor
        for opt in self.parts.values():
            for group in opt.param_groups:
                for key in ("lr", "lr_norm"):
                    if f"base_{key}" in group:
                        group[key] = group[f"base_{key}"] * factor

    def step(self) -> None:
        for opt in self.parts.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts.values():
            opt.zero_grad(set_to_none=set_to_none)

    def carry_state(self, sd: dict) -> None:
        """Take over another run's per-parameter state (moments, Muown's momentum and row Adam) from its
        :meth:`state_dict`, keeping this set's own hyperparameters (lr, betas): RL starting from SFT's optimiser
        (Report §5). Both sets must cover the same parameters in the same groups."""
        if sd["matrix_kind"] != self.matrix_kind:
            raise ValueError(f"carry_state: the saved hidden matrices ran {sd['matrix_kind']!r}, these run "
                             f"{self.matrix_kind!r}")
        sd = copy.deepcopy(sd)  # torch loads state tensors as they are: never share them with the giver
        for k, opt in self.parts.items():
            mine, theirs = opt.state_dict(), sd["parts"][k]
            sizes = [len(g["params"]) for g in mine["param_groups"]]
            if sizes != [len(g["params"]) for g in theirs["param_groups"]]:
                raise ValueError(f"carry_state: the {k} part's groups hold {sizes} parameters here, "
                                 f"{[len(g['params']) for g in theirs['param_groups']]} in the saved state")
            opt.load_state_dict({"state": theirs["state"],
                                 "param_groups": [{**g, "params": t["params"]}
                                                  for g, t in zip(mine["param_groups"], theirs["param_groups"])]})

    def state_dict(self) -> dict:
        return {"matrix_kind": self.matrix_kind, "lr_factor": self.lr_factor,
                "parts": {k: opt.state_dict() for k, opt in self.parts.items()}}

    def load_state_dict(self, sd: dict) -> None:
        if sd["matrix_kind"] != self.matrix_kind:
            self.switch(sd["matrix_kind"])
        for k, opt in self.parts.items():
            opt.load_state_dict(sd["parts"][k])
        self.set_lr_factor(sd["lr_factor"])


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> OptimizerSet:
    """The model's optimiser: AdamW for the AdamW group, ``cfg.matrix_optimizer`` for the hidden matrices."""
    return OptimizerSet(model, cfg)


def lr_factor(step: int, total: int, cfg: OptimConfig) -> float:
    """Schedule multiplier at ``step`` (1-based) of ``total``: linear warm-up, then cosine to ``min_lr_ratio``.

    .. math:: f(t) = \\frac{t}{T_w} \\ (t \\le T_w), \\qquad
              f(t) = r + (1 - r)\\,\\tfrac12\\bigl(1 + \\cos \\pi \\tfrac{t - T_w}{T - T_w}\\bigr)
    """
    if step <= cfg.warmup_steps:
        return step / max(1, cfg.warmup_steps)
    if cfg.schedule == "constant" or total <= cfg.warmup_steps:
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / (total - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
