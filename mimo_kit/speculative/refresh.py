"""The drafter refresh (Report §6): during RL the policy moves away from the text its drafter was trained on, so
the drafter keeps training on the run's own trajectories against the current policy.

:class:`DrafterRefresher` owns a drafter (the block drafter or the MTP module) and its AdamW state across refreshes.
Each :meth:`~DrafterRefresher.refresh` takes the token rows of the latest trajectories (prompt, actions and
observations: what the engine will be asked to continue), cuts random windows of ``seq_len`` tokens from them and
runs ``steps`` optimiser steps of the drafter's distillation loss (:func:`~mimo_kit.speculative.train.
drafter_loss` / :func:`~mimo_kit.speculative.train.mtp_loss`) against the backbone it is given, the engine's
current weights. Its state (drafter, optimiser, the window generator) is checkpointed with the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.model.config import MiMoConfig
from mimo_kit.model.decoder import MiMoForCausalLM

KINDS = ("block", "mtp")


@dataclasses.dataclass
class DrafterRefreshConfig(Config):
    """The drafter a run decodes with and how it is refreshed (Report §6: a block-6 DFlash drafter, retrained on
    RL trajectories; the report publishes no refresh schedule)."""

    kind: str = knob("block", "'block' (DFlash-style, all drafts in one pass) or 'mtp' (one draft per depth)")
    block_size: int = knob(4, "tokens per verification block (report: 6); 4 at toy scale, where a short policy "
                              "action rarely pays for long blocks", min=2)
    every: int = knob(1, "RL steps between refreshes", min=1)
    steps: int = knob(8, "optimiser steps per refresh: a few, so the drafter follows the policy without "
                         "dominating a step's time", min=1)
    batch: int = knob(4, "windows per optimiser step", min=1)
    seq_len: int = knob(64, "tokens per window cut from a trajectory", min=8)
    anchors_per_seq: int = knob(16, "block anchors per window", min=1)
    context_window: int = knob(16, "policy positions a block drafter attends to before its anchor: trained on "
                                   "seq_len windows, it never sees more than seq_len − block_size of them, and a "
                                   "longer window at decode cut its acceptance (benchmarks/RESULTS_drafters.md)",
                               min=1)
    lr: float = knob(3e-3, "AdamW, as the drafter's own training (mimo_kit.speculative.train)", min=0.0)
    seed: int = knob(0, "drafter init and window draws", min=0)

    def check(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"DrafterRefreshConfig.kind={self.kind!r}; expected one of {KINDS}")
        if self.context_window > self.seq_len - self.block_size:
            raise ConfigError(f"DrafterRefreshConfig.context_window={self.context_window} > seq_len − block_size = "
                              f"{self.seq_len - self.block_size}: the drafter would attend at decode to more "
                              "policy positions than any training window shows it; lower it or raise seq_len")


class DrafterRefresher:
    """A drafter kept in step with a moving policy (the module docstring)."""

    def __init__(self, cfg: DrafterRefreshConfig, backbone_cfg: MiMoConfig):
        from mimo_kit.speculative.drafter import BlockDrafter, DrafterConfig
        from mimo_kit.speculative.mtp import MTPConfig, MTPDrafter

        cfg.check()
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        if cfg.kind == "block":
            self.drafter = BlockDrafter(DrafterConfig.preset("tiny", block_size=cfg.block_size,
                                                             context_window=cfg.context_window), backbone_cfg)
        else:
            self.drafter = MTPDrafter(MTPConfig.preset("tiny", block_size=cfg.block_size), backbone_cfg)
        self.drafter.eval()
        self.opt = torch.optim.AdamW(self.drafter.parameters(), lr=cfg.lr)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.refreshes = 0

    def windows(self, rows: Sequence[Sequence[int]]) -> torch.Tensor | None:
        """``batch`` random windows of ``seq_len`` tokens from the rows long enough → [batch, seq_len], or None."""
        long = [r for r in rows if len(r) >= self.cfg.seq_len]
        if not long:
            return None
        pick = torch.randint(0, len(long), (self.cfg.batch,), generator=self.generator).tolist()
        out = []
        for i in pick:
            start = int(torch.randint(0, len(long[i]) - self.cfg.seq_len + 1, (1,), generator=self.generator))
            out.append(list(long[i][start:start + self.cfg.seq_len]))
        return torch.tensor(out, dtype=torch.long)

    def refresh(self, backbone: MiMoForCausalLM, rows: Sequence[Sequence[int]]) -> float | None:
        """``steps`` optimiser steps on windows of ``rows`` against ``backbone``; the mean loss, or None when no
        row is ``seq_len`` tokens long."""
        from mimo_kit.speculative.train import drafter_loss, mtp_loss

        loss_fn = drafter_loss if self.cfg.kind == "block" else mtp_loss
        device = next(backbone.parameters()).device
        self.drafter.to(device).train()
        losses = []
        try:
            for _ in range(self.cfg.steps):
                x = self.windows(rows)
                if x is None:
                    return None
                loss, _ = loss_fn(self.drafter, backbone, x.to(device), self.generator, self.cfg.anchors_per_seq)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
                losses.append(float(loss.detach()))
        finally:
            self.drafter.eval()
        self.refreshes += 1
        return sum(losses) / len(losses)

    def state_dict(self) -> dict:
        return {"drafter": self.drafter.state_dict(), "opt": self.opt.state_dict(),
                "generator": self.generator.get_state(), "refreshes": self.refreshes}

    def load_state_dict(self, state: dict) -> None:
        self.drafter.load_state_dict(state["drafter"])
        self.opt.load_state_dict(state["opt"])
        self.generator.set_state(state["generator"])
        self.refreshes = state["refreshes"]
