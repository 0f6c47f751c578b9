"""Chapter 3's three experiments: optimisers at equal steps and time, the AdamW→Muown switch, PTQ vs QAT (Report §3).

Each runs the chapter's :class:`~mimo_kit.pretrain.loop.Trainer` on the same tokens:

- :func:`compare_optimizers`: AdamW, Muon and Muown on the hidden matrices (everything else AdamW), trained in
  lockstep on the same batches from the same initial weights; loss at equal steps and at equal wall-clock.
- :func:`optimizer_switch`: the report's switch. Train with AdamW, fork at ``switch_at``, and continue one branch
  on AdamW and the others with the hidden matrices on Muown (and Muon); the spike is the largest excess of a
  branch's loss over the AdamW branch on the same batches in the ``window`` steps after the switch.
- :func:`ptq_vs_qat`: train, fork, continue one branch in full precision and one with MXFP4 QAT of the experts;
  then quantise both branches' experts to MXFP4 and compare validation losses.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.optim.mxfp4 import quantize_experts_
from mimo_kit.pretrain.config import PretrainConfig
from mimo_kit.pretrain.loop import Trainer

#: The tiny preset of every study: short enough for a shared 2-core machine (minutes, not hours)
TINY_STUDY = {"pretrain": {"steps": 60, "batch": 4, "seq_len": 64, "eval_every": 20}}


def _trainers(cfg: PretrainConfig, kinds: tuple[str, ...]) -> dict[str, Trainer]:
    first = Trainer(dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, matrix_optimizer=kinds[0])))
    out = {kinds[0]: first}
    for kind in kinds[1:]:
        c = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, matrix_optimizer=kind))
        out[kind] = Trainer(c, tokenizer=first.tokenizer, streams=first.streams)
    return out


def ema(values, weight: float = 0.9) -> np.ndarray:
    """Debiased EMA of a loss curve (the smoothing the figures use)."""
    x, out, s = np.asarray(values, float), [], 0.0
    for t, v in enumerate(x):
        s = weight * s + (1 - weight) * v
        out.append(s / (1 - weight ** (t + 1)))
    return np.asarray(out)


# ---- 1. AdamW vs Muon vs Muown ----------------------------------------------------------------------------------
@dataclasses.dataclass
class CompareConfig(Config):
    pretrain: PretrainConfig = dataclasses.field(default_factory=lambda: PretrainConfig(steps=200))
    optimizers: tuple[str, ...] = knob(("adamw", "muon", "muown"), "the report's optimiser and its two alternatives")

    PRESETS = {"tiny": TINY_STUDY, "small": {"pretrain": {"steps": 400}}}

    def check(self) -> None:
        bad = [o for o in self.optimizers if o not in ("adamw", "muon", "muown")]
        if bad or not self.optimizers:
            raise ConfigError(f"CompareConfig.optimizers: got {self.optimizers!r}; expected names from "
                              "'adamw', 'muon', 'muown'")


def compare_optimizers(cfg: CompareConfig, progress: bool = True) -> dict:
    """Train one model per optimiser in lockstep (same init, same batches); logs, a table, the time budget."""
    from tqdm.auto import tqdm

    trainers = _trainers(cfg.pretrain, cfg.optimizers)
    total = cfg.pretrain.total_steps
    for step in tqdm(range(1, total + 1), desc="AdamW vs Muon vs Muown", disable=not progress, leave=False):
        for t in trainers.values():  # alternate: a busy machine slows every optimiser alike
            t.train_step()
            if step % cfg.pretrain.eval_every == 0 or step == total:
                t.evaluate()
    logs = {k: t.log for k, t in trainers.items()}
    budget = min(log["seconds"][-1] for log in logs.values())  # equal wall-clock: the fastest run's total time
    rows = []
    for k, log in logs.items():
        smooth = ema(log["loss"])
        at_budget = float(np.interp(budget, log["seconds"], smooth))
        rows.append({"optimizer": k, "val loss @ equal steps": log["val_loss"][-1],
                     "train loss (EMA) @ equal steps": float(smooth[-1]),
                     f"train loss (EMA) @ {budget:.0f} s": at_budget,
                     "ms / step": 1000 * log["seconds"][-1] / total,
                     "optimizer ms / step": 1000 * log["opt_seconds"][-1] / total})
    return {"logs": logs, "rows": rows, "budget_seconds": budget, "steps": total,
            "tokens": total * cfg.pretrain.batch * cfg.pretrain.seq_len}


# ---- 2. the switch --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class SwitchConfig(Config):
    pretrain: PretrainConfig = dataclasses.field(default_factory=lambda: PretrainConfig(steps=200))
    switch_at: int = knob(30, "switch half-way: AdamW's moments are settled, the loss still falling", min=1)
    branches: tuple[str, ...] = knob(("adamw", "muown", "muon"), "continue AdamW (reference), switch to Muown/Muon")
    window: int = knob(10, "steps after the switch in which a spike would show", min=1)

    PRESETS = {"tiny": TINY_STUDY, "small": {"pretrain": {"steps": 400},
                                                                                "switch_at": 200}}

    def check(self) -> None:
        if self.switch_at >= self.pretrain.steps:
            raise ConfigError(f"SwitchConfig.switch_at: {self.switch_at} must be < pretrain.steps="
                              f"{self.pretrain.steps}")
        if "adamw" not in self.branches:
            raise ConfigError(f"SwitchConfig.branches: {self.branches!r} must include 'adamw', the reference")


def optimizer_switch(cfg: SwitchConfig, progress: bool = True) -> dict:
    """AdamW until ``switch_at``, then one branch per entry of ``branches``, on the same batches."""
    from tqdm.auto import tqdm

    pre = dataclasses.replace(cfg.pretrain, optim=dataclasses.replace(cfg.pretrain.optim, matrix_optimizer="adamw"))
    base = Trainer(pre)
    total = pre.total_steps
    switch_at = min(cfg.switch_at, max(1, total // 2))  # quick mode shrinks the run, and the switch with it
    for _ in tqdm(range(switch_at), desc="AdamW before the switch", disable=not progress, leave=False):
        base.train_step()
    base.evaluate()
    branches = {}
    for kind in cfg.branches:
        b = base.fork()
        if kind != "adamw":
            b.opt.switch(kind)
        branches[kind] = b
    for step in tqdm(range(switch_at + 1, total + 1), desc="after the switch", disable=not progress, leave=False):
        for b in branches.values():
            b.train_step()
            if step % pre.eval_every == 0 or step == total:
                b.evaluate()
    logs = {k: b.log for k, b in branches.items()}
    ref = np.asarray(logs["adamw"]["loss"])
    # log index i holds the loss of step i + 1, computed before that step's update: the first loss that a
    # post-switch update can move is step switch_at + 2's (index switch_at + 1)
    w = max(1, min(cfg.window, total - switch_at - 1))
    before = float(np.mean(ref[max(0, switch_at - w) : switch_at]))
    rows = []
    for k, log in logs.items():
        loss = np.asarray(log["loss"])
        after = loss[switch_at + 1 : switch_at + 1 + w]
        excess = after - ref[switch_at + 1 : switch_at + 1 + w]
        rows.append({"branch": "AdamW (no switch)" if k == "adamw" else f"switch to {k}",
                     f"mean loss {w} steps before": before, f"max loss {w} steps after": float(after.max()),
                     "spike = max after − mean before": float(after.max() - before),
                     "max excess over AdamW branch": float(excess.max()), "final val loss": log["val_loss"][-1]})
    return {"logs": logs, "rows": rows, "switch_at": switch_at, "window": w}


# ---- 3. PTQ vs QAT ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class QATConfig(Config):
    pretrain: PretrainConfig = dataclasses.field(default_factory=lambda: PretrainConfig(steps=200))
    qat_steps: int = knob(20, "the last third of the run: the report's QAT is a mid-training stage, not all of it",
                          min=1)
    quick_qat_steps: int = knob(6, "quick mode", min=1)

    PRESETS = {"tiny": TINY_STUDY, "small": {"pretrain": {"steps": 400},
                                                                                "qat_steps": 120}}

    def check(self) -> None:
        if self.qat_steps >= self.pretrain.steps:
            raise ConfigError(f"QATConfig.qat_steps: {self.qat_steps} must be < pretrain.steps={self.pretrain.steps}")


def ptq_vs_qat(cfg: QATConfig, progress: bool = True) -> dict:
    """Full precision until the last ``qat_steps``; then FP and QAT branches; evaluate both with MXFP4 experts."""
    from tqdm.auto import tqdm

    total = cfg.pretrain.total_steps
    qat_steps = min(cfg.quick_qat_steps if cfg.pretrain.quick else cfg.qat_steps, total - 1)
    base = Trainer(cfg.pretrain)
    for _ in tqdm(range(total - qat_steps), desc="full-precision training", disable=not progress, leave=False):
        base.train_step()
    fp, qat = base, base.fork()
    qat.qat = True
    for _ in tqdm(range(qat_steps), desc="FP vs QAT branches", disable=not progress, leave=False):
        fp.train_step()
        qat.train_step()
    rows = []
    for name, t in (("no QAT (PTQ after training)", fp), ("QAT (last steps through MXFP4 QDQ)", qat)):
        t.qat = False
        full = t.evaluate(record=False)
        quant = copy.deepcopy(t.model)
        sizes = quantize_experts_(quant)
        t_q = copy.copy(t)
        t_q.model = quant
        mx = t_q.evaluate(record=False)
        rows.append({"run": name, "val loss, full-precision experts": full, "val loss, MXFP4 experts": mx,
                     "MXFP4 gap": mx - full, "expert bytes bf16 → MXFP4": f"{sizes['bf16_bytes']:,} → "
                                                                          f"{sizes['mxfp4_bytes']:,}"})
    return {"rows": rows, "logs": {"fp": fp.log, "qat": qat.log}, "qat_steps": qat_steps, "steps": total}
