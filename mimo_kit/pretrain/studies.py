"""Chapter 3's three experiments: optimisers at equal steps and time, the AdamW→Muown switch, PTQ vs QAT (Report §3).

Each runs the chapter's :class:`~mimo_kit.pretrain.loop.Trainer` on the same tokens, once per seed (``seeds``
knob: seed ``pretrain.seed + i`` draws the initial weights and the data order of run i), and reports every arm
as mean ± sample sd over the seeds, with how many seeds agree with the report's direction:

- :func:`compare_optimizers`: AdamW, Muon and Muown on the hidden matrices (everything else AdamW), trained in
  lockstep on the same batches from the same initial weights within a seed; loss at equal steps and at equal
  wall-clock, the clock starting after the first ``warmup_steps_excluded`` steps (one-time allocation and
  first-call costs, which on a CPU can be most of a short run's time).
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
from mimo_kit.spread import mean_sd as spread_mean_sd
from mimo_kit.spread import spread

#: The tiny preset of every study: 200 steps of 8 × 64 tokens (102K tokens per run) take the AdamW model from
#: ln 512 = 6.24 to ~3.9 nats/token, far below uniform, in ~15 s of one idle CPU thread; 3 seeds of the optimiser
#: comparison (Muon's bf16 Newton–Schulz dominates) take ~10 minutes on one idle thread, ~30 on a busy 2-core box.
TINY_STUDY = {"pretrain": {"steps": 200, "batch": 8, "seq_len": 64, "eval_every": 25}}
#: log fields the studies keep per seed (the published JSON stays small)
KEPT = ("step", "seconds", "opt_seconds", "loss", "val_step", "val_loss")


def seed_configs(cfg: PretrainConfig, seeds: int) -> list[PretrainConfig]:
    """One config per seed: ``cfg.seed + i`` for i < ``seeds`` (initial weights and data order both change)."""
    if seeds < 1:
        raise ConfigError(f"seeds={seeds}; expected >= 1")
    return [dataclasses.replace(cfg, seed=cfg.seed + i) for i in range(seeds)]


def pm(values, digits: int = 3) -> str:
    """``"mean ± sd"`` of per-seed values with ``digits`` decimals, as the tables print them."""
    return spread_mean_sd(spread(values), decimals=digits)


def agreement(flags) -> str:
    """``"k of n"``: on how many seeds a direction holds."""
    flags = [bool(f) for f in flags]
    return f"{sum(flags)} of {len(flags)}"


def wall_clock(log: dict, excluded: int) -> tuple[np.ndarray, np.ndarray]:
    """(seconds since the end of step ``excluded``, loss) from that step on: the warm-up steps' time is dropped.

    Log index i holds step i + 1; the first point returned is step ``excluded`` itself at time 0 (with
    ``excluded`` = 0, the whole log on its own clock). ``excluded`` must leave at least one step after it.
    """
    seconds, loss = np.asarray(log["seconds"], float), np.asarray(log["loss"], float)
    if not 0 <= excluded < len(seconds):
        raise ValueError(f"wall_clock: warmup_steps_excluded={excluded}; the log has {len(seconds)} steps")
    if excluded == 0:
        return seconds, loss
    return seconds[excluded - 1 :] - seconds[excluded - 1], loss[excluded - 1 :]


def _trainers(cfg: PretrainConfig, kinds: tuple[str, ...], tokenizer=None, streams=None) -> dict[str, Trainer]:
    first = Trainer(dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, matrix_optimizer=kinds[0])),
                    tokenizer=tokenizer, streams=streams)
    out = {kinds[0]: first}
    for kind in kinds[1:]:
        c = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, matrix_optimizer=kind))
        out[kind] = Trainer(c, tokenizer=first.tokenizer, streams=first.streams)
    return out


def _kept(log: dict) -> dict:
    return {k: list(log[k]) for k in KEPT}


def ema(values, weight: float = 0.9) -> np.ndarray:
    """Debiased EMA of a loss curve (the smoothing the figures use)."""
    x, out, s = np.asarray(values, float), [], 0.0
    for t, v in enumerate(x):
        s = weight * s + (1 - weight) * v
        out.append(s / (1 - weight ** (t + 1)))
    return np.asarray(out)


# ---- 1. AdamW vs Muon vs Muown ----------------------------------------------------------------------------------
SEEDS_WHY = ("5 seeds: the fewest at which the paired rule's sign test can reach p <= 0.05 (5 of 5: 1/32); each seed "
             "draws new weights and data order")


@dataclasses.dataclass
class CompareConfig(Config):
    pretrain: PretrainConfig = dataclasses.field(default_factory=lambda: PretrainConfig(steps=200))
    optimizers: tuple[str, ...] = knob(("adamw", "muon", "muown"), "the report's optimiser and its two alternatives")
    seeds: int = knob(5, SEEDS_WHY, min=1)
    min_effect: float = knob(0.01, "nats/token: the smallest validation-loss gap the 'Muown ≤ AdamW' claim counts, "
                                   "a quarter of a percent of the tiny run's loss, below which a gap is a rounding "
                                   "matter between kernel sets", min=0.0)
    warmup_steps_excluded: int = knob(
        3, "wall-clock starts after step 3: the first steps pay one-time allocation and first-call costs (AdamW's "
           "first 3 steps once took 11 of its 18 s), which are not the optimiser's speed", min=0)
    smoothing: float = knob(0.9, "EMA weight of the training-loss curve read at the equal-time budget", min=0.0,
                            max=0.999)

    PRESETS = {"tiny": TINY_STUDY, "small": {"pretrain": {"steps": 400}}}

    def check(self) -> None:
        bad = [o for o in self.optimizers if o not in ("adamw", "muon", "muown")]
        if bad or not self.optimizers:
            raise ConfigError(f"CompareConfig.optimizers: got {self.optimizers!r}; expected names from "
                              "'adamw', 'muon', 'muown'")
        if self.warmup_steps_excluded >= self.pretrain.steps:
            raise ConfigError(f"CompareConfig.warmup_steps_excluded: {self.warmup_steps_excluded} must be < "
                              f"pretrain.steps={self.pretrain.steps}")


def compare_optimizers(cfg: CompareConfig, progress: bool = True) -> dict:
    """Per seed, one model per optimiser in lockstep (same init, same batches); per-seed numbers, mean ± sd rows,
    the seeds on which Muown (and Muon) reach a validation loss ≤ AdamW's, and the logs the figures draw."""
    from mimo_kit.live import progress_bar

    total = cfg.pretrain.total_steps
    skip = min(cfg.warmup_steps_excluded, total - 1)
    logs: dict[str, list[dict]] = {k: [] for k in cfg.optimizers}
    per_seed, tok, streams = [], None, None
    for pc in seed_configs(cfg.pretrain, cfg.seeds):
        trainers = _trainers(pc, cfg.optimizers, tok, streams)
        first = next(iter(trainers.values()))
        tok, streams = first.tokenizer, first.streams
        for step in progress_bar(range(1, total + 1), desc=f"AdamW vs Muon vs Muown, seed {pc.seed}",
                                 disable=not progress, leave=False):
            for t in trainers.values():  # alternate: a busy machine slows every optimiser alike
                t.train_step()
                if step % pc.eval_every == 0 or step == total:
                    t.evaluate()
        clocks = {k: wall_clock(t.log, skip) for k, t in trainers.items()}
        budget = min(x[-1] for x, _ in clocks.values())  # equal wall-clock: the fastest run's time after warm-up
        for k, t in trainers.items():
            log = t.log
            smooth = ema(log["loss"], cfg.smoothing)
            x, _ = clocks[k]
            at_budget = float(np.interp(budget, x, smooth[len(smooth) - len(x):]))
            per_seed.append({"seed": pc.seed, "optimizer": k, "val_loss": log["val_loss"][-1],
                             "train_ema": float(smooth[-1]), "train_ema_at_budget": at_budget, "budget_s": budget,
                             "ms_per_step": 1000 * x[-1] / (total - skip),
                             "opt_ms_per_step": 1000 * (log["opt_seconds"][-1] - (
                                 log["opt_seconds"][skip - 1] if skip else 0.0)) / (total - skip)})
            logs[k].append(_kept(log))
    of = lambda k, key: [r[key] for r in per_seed if r["optimizer"] == k]  # noqa: E731
    summary = {k: {key: of(k, key) for key in ("val_loss", "train_ema", "train_ema_at_budget", "ms_per_step",
                                              "opt_ms_per_step")} for k in cfg.optimizers}
    budgets = [r["budget_s"] for r in per_seed if r["optimizer"] == cfg.optimizers[0]]
    rows = [{"optimizer": k, "val loss @ equal steps": pm(s["val_loss"]),
             "train loss (EMA) @ equal steps": pm(s["train_ema"]),
             "train loss (EMA) @ equal time": pm(s["train_ema_at_budget"]),
             f"ms / step (after step {skip})": pm(s["ms_per_step"], 0),
             "optimizer ms / step": pm(s["opt_ms_per_step"], 1)} for k, s in summary.items()]
    agree = {}
    if "adamw" in summary:
        for k in summary:
            if k != "adamw":
                agree[f"{k} ≤ adamw (val loss @ equal steps)"] = agreement(
                    a <= b for a, b in zip(summary[k]["val_loss"], summary["adamw"]["val_loss"]))
    return {"logs": logs, "per_seed": per_seed, "summary": summary, "rows": rows, "agree": agree,
            "seeds": cfg.seeds, "budget_seconds": budgets, "steps": total, "warmup_steps_excluded": skip,
            "tokens": total * cfg.pretrain.batch * cfg.pretrain.seq_len}


# ---- 2. the switch --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class SwitchConfig(Config):
    pretrain: PretrainConfig = dataclasses.field(default_factory=lambda: PretrainConfig(steps=200))
    switch_at: int = knob(100, "switch half-way: AdamW's moments are settled, the loss still falling", min=1)
    branches: tuple[str, ...] = knob(("adamw", "muown", "muon"), "continue AdamW (reference), switch to Muown/Muon")
    window: int = knob(10, "steps after the switch in which a spike would show", min=1)
    seeds: int = knob(5, SEEDS_WHY, min=1)
    spike_threshold: float = knob(
        0.1, "a spike is an excess over the AdamW branch (same batches) above 0.1 nats/token: several times the "
             "branches' difference in steady training, a small fraction of the loss still to lose", min=0.0)

    PRESETS = {"tiny": TINY_STUDY, "small": {"pretrain": {"steps": 400}, "switch_at": 200}}

    def check(self) -> None:
        if self.switch_at >= self.pretrain.steps:
            raise ConfigError(f"SwitchConfig.switch_at: {self.switch_at} must be < pretrain.steps="
                              f"{self.pretrain.steps}")
        if "adamw" not in self.branches:
            raise ConfigError(f"SwitchConfig.branches: {self.branches!r} must include 'adamw', the reference")


def optimizer_switch(cfg: SwitchConfig, progress: bool = True) -> dict:
    """Per seed, AdamW until ``switch_at``, then one branch per entry of ``branches``, on the same batches; the
    spike of each branch per seed, mean ± sd rows, and the seeds on which a switch stays below the threshold."""
    from mimo_kit.live import progress_bar

    pre0 = dataclasses.replace(cfg.pretrain, optim=dataclasses.replace(cfg.pretrain.optim,
                                                                       matrix_optimizer="adamw"))
    total = pre0.total_steps
    switch_at = min(cfg.switch_at, max(1, total // 2))  # quick mode shrinks the run, and the switch with it
    # log index i holds the loss of step i + 1, computed before that step's update: the first loss that a
    # post-switch update can move is step switch_at + 2's (index switch_at + 1)
    w = max(1, min(cfg.window, total - switch_at - 1))
    logs: dict[str, list[dict]] = {k: [] for k in cfg.branches}
    per_seed, tok, streams = [], None, None
    for pre in seed_configs(pre0, cfg.seeds):
        base = Trainer(pre, tokenizer=tok, streams=streams)
        tok, streams = base.tokenizer, base.streams
        for _ in progress_bar(range(switch_at), desc=f"AdamW before the switch, seed {pre.seed}",
                              disable=not progress, leave=False):
            base.train_step()
        base.evaluate()
        branches = {}
        for kind in cfg.branches:
            b = base.fork()
            if kind != "adamw":
                b.opt.switch(kind)
            branches[kind] = b
        for step in progress_bar(range(switch_at + 1, total + 1), desc="after the switch", disable=not progress,
                                 leave=False):
            for b in branches.values():
                b.train_step()
                if step % pre.eval_every == 0 or step == total:
                    b.evaluate()
        ref = np.asarray(branches["adamw"].log["loss"])
        before = float(np.mean(ref[max(0, switch_at - w) : switch_at]))
        for k, b in branches.items():
            loss = np.asarray(b.log["loss"])
            after = loss[switch_at + 1 : switch_at + 1 + w]
            excess = after - ref[switch_at + 1 : switch_at + 1 + w]
            per_seed.append({"seed": pre.seed, "branch": k, "before": before, "max_after": float(after.max()),
                             "spike": float(after.max() - before), "excess": float(excess.max()),
                             "val_loss": b.log["val_loss"][-1]})
            logs[k].append(_kept(b.log))
    of = lambda k, key: [r[key] for r in per_seed if r["branch"] == k]  # noqa: E731
    summary = {k: {key: of(k, key) for key in ("before", "max_after", "spike", "excess", "val_loss")}
               for k in cfg.branches}
    rows = [{"branch": "AdamW (no switch)" if k == "adamw" else f"switch to {k}",
             f"mean loss {w} steps before": pm(s["before"]), f"max loss {w} steps after": pm(s["max_after"]),
             "spike = max after − mean before": pm(s["spike"]), "max excess over AdamW branch": pm(s["excess"]),
             "final val loss": pm(s["val_loss"])} for k, s in summary.items()]
    agree = {f"switch to {k}: excess < {cfg.spike_threshold}": agreement(e < cfg.spike_threshold
                                                                          for e in summary[k]["excess"])
             for k in cfg.branches if k != "adamw"}
    return {"logs": logs, "per_seed": per_seed, "summary": summary, "rows": rows, "agree": agree,
            "seeds": cfg.seeds, "switch_at": switch_at, "window": w, "spike_threshold": cfg.spike_threshold,
            "steps": total}


# ---- 3. PTQ vs QAT ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class QATConfig(Config):
    pretrain: PretrainConfig = dataclasses.field(default_factory=lambda: PretrainConfig(steps=200))
    qat_steps: int = knob(60, "the last ~third of the run: the report's QAT is a mid-training stage, not all of it",
                          min=1)
    quick_qat_steps: int = knob(6, "quick mode", min=1)
    seeds: int = knob(5, SEEDS_WHY, min=1)
    min_effect: float = knob(1e-4, "nats/token: the smallest gap difference the 'QAT gap < PTQ gap' claim counts, a "
                                   "tenth of the tiny model's PTQ gap (~1e-3)", min=0.0)

    PRESETS = {"tiny": TINY_STUDY, "small": {"pretrain": {"steps": 400}, "qat_steps": 120}}

    def check(self) -> None:
        if self.qat_steps >= self.pretrain.steps:
            raise ConfigError(f"QATConfig.qat_steps: {self.qat_steps} must be < pretrain.steps={self.pretrain.steps}")


def ptq_vs_qat(cfg: QATConfig, progress: bool = True) -> dict:
    """Per seed, full precision until the last ``qat_steps``; then FP and QAT branches; evaluate both with MXFP4
    experts. Per-seed gaps, mean ± sd rows, and the seeds on which QAT's gap is below PTQ's."""
    from mimo_kit.live import progress_bar

    total = cfg.pretrain.total_steps
    qat_steps = min(cfg.quick_qat_steps if cfg.pretrain.quick else cfg.qat_steps, total - 1)
    runs = (("ptq", "no QAT (PTQ after training)"), ("qat", "QAT (last steps through MXFP4 QDQ)"))
    logs: dict[str, list[dict]] = {k: [] for k, _ in runs}
    per_seed, tok, streams, sizes = [], None, None, {}
    for pc in seed_configs(cfg.pretrain, cfg.seeds):
        base = Trainer(pc, tokenizer=tok, streams=streams)
        tok, streams = base.tokenizer, base.streams
        for _ in progress_bar(range(total - qat_steps), desc=f"full-precision training, seed {pc.seed}",
                              disable=not progress, leave=False):
            base.train_step()
        fp, qat = base, base.fork()
        qat.qat = True
        for _ in progress_bar(range(qat_steps), desc="FP vs QAT branches", disable=not progress, leave=False):
            fp.train_step()
            qat.train_step()
        for (key, _), t in zip(runs, (fp, qat)):
            t.qat = False
            full = t.evaluate(record=False)
            quant = copy.deepcopy(t.model)
            sizes = quantize_experts_(quant)
            t_q = copy.copy(t)
            t_q.model = quant
            mx = t_q.evaluate(record=False)
            per_seed.append({"seed": pc.seed, "run": key, "full": full, "mxfp4": mx, "gap": mx - full})
            logs[key].append(_kept(t.log))
    of = lambda k, key: [r[key] for r in per_seed if r["run"] == k]  # noqa: E731
    summary = {k: {key: of(k, key) for key in ("full", "mxfp4", "gap")} for k, _ in runs}
    rows = [{"run": name, "val loss, full-precision experts": pm(summary[k]["full"]),
             "val loss, MXFP4 experts": pm(summary[k]["mxfp4"]), "MXFP4 gap": pm(summary[k]["gap"], 4),
             "expert bytes bf16 → MXFP4": f"{sizes['bf16_bytes']:,} → {sizes['mxfp4_bytes']:,}"} for k, name in runs]
    agree = {"QAT gap < PTQ gap": agreement(q < p for q, p in zip(summary["qat"]["gap"], summary["ptq"]["gap"]))}
    return {"rows": rows, "per_seed": per_seed, "summary": summary, "agree": agree, "logs": logs,
            "seeds": cfg.seeds, "qat_steps": qat_steps, "steps": total}
