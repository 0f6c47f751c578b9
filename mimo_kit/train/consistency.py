"""Train–inference consistency: how far the trainer's log-probs are from the rollout engine's (Report §6.1).

The report's rollouts run MXFP4 experts in SGLang while training runs its own kernels on full-precision weights,
so the same token gets two log-probs: log π_rollout (recorded at sampling) and log π_train (the trainer's forward
on the stored tokens). Three fixes close the gap, each a switch of the kit's RL trainer:

- **QDQ** (``RLConfig.qdq_experts``): the training forward reads the experts through MXFP4 quantise-dequantise,
  the weights the engine serves;
- **R3** (``RLConfig.r3``): the experts each token was routed to at rollout are replayed in the training forward, so
  a near-tie in the router cannot send a token to another expert;
- **top-p candidate replay** (``RLConfig.topp_replay``): the engine samples from the top-p set and records the
  log-prob renormalised over it; the trainer renormalises over the recorded set too.

:func:`measure_consistency` rolls out once (MXFP4 engine, top-p sampling, routing and candidate sets recorded) and
scores the *same* trajectories under every combination of the three switches, with Δ = log π_train − log π_rollout
on every generated token:

.. math:: \\overline{|\\Delta|}, \\qquad q_{0.99}(|\\Delta|), \\qquad
          \\widehat{KL}_{k3} = \\overline{e^{-\\Delta} + \\Delta - 1}

(k3 estimates KL(π_rollout ‖ π_train): the tokens were sampled by the engine).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Any

import torch

from mimo_kit.config.base import Config, knob

SWITCHES = ("qdq", "r3", "topp_replay")


@dataclasses.dataclass
class ConsistencyConfig(Config):
    """One rollout batch of the toy world, scored under the 2³ combinations of QDQ, R3 and top-p replay."""

    groups: int = knob(24, "toy tasks rolled out once; ~1.5K generated tokens on 2 cores in seconds", min=1)
    group_size: int = knob(4, "rollouts per task", min=1)
    top_p: float = knob(0.9, "nucleus sampling at rollout (the report samples with top-p; 0.9 keeps sets small)",
                        min=1e-6, max=1.0)
    temperature: float = knob(1.0, "sample at T = 1 so the recorded log-probs are the policy's", min=0.0)
    sft_steps: int = knob(150, "SFT of the toy policy first: a trained policy has peaked next-token distributions, "
                          "as a real one does", min=0)
    hidden_size: int = knob(64, "the toy policy's width (the RL chapter's toy world)", min=8)
    mxfp4_rollouts: bool = knob(True, "the engine serves MXFP4 experts, as the report's rollouts do (Report §6)")
    seed: int = knob(0, "policy init, SFT data, tasks and sampling", min=0)

    PRESETS = {"tiny": {}, "small": {"groups": 64, "sft_steps": 400}}


def _scores(model, batch, temperature: float, qdq: bool, r3: bool, topp: bool) -> torch.Tensor:
    """log π_train [rows, T−1] of the stored tokens under one combination of the three switches."""
    from mimo_kit.optim.mxfp4 import qat_experts
    from mimo_kit.train.update import policy_logprobs, replay_indices

    with torch.no_grad(), (qat_experts(model) if qdq else contextlib.nullcontext()):
        routing = replay_indices(model, batch) if r3 else None
        cands = batch.topp_candidates if topp else None
        logp, _ = policy_logprobs(model, batch.input_ids, temperature, routing, cands)
    return logp


def routing_flips(model, batch, qdq: bool) -> float:
    """Share of (token, MoE layer) pairs whose top-k expert set in the training forward differs from the one
    recorded at rollout: what R3 exists to remove (0 when every token kept its experts)."""
    from mimo_kit.optim.mxfp4 import qat_experts

    with torch.no_grad(), (qat_experts(model) if qdq else contextlib.nullcontext()), model.capture_routing() as rec:
        model(batch.input_ids[:, :-1])
    B, T = batch.input_ids.shape
    now = rec.indices.reshape(rec.indices.shape[0], B, T - 1, -1).permute(1, 2, 0, 3)  # [B, T−1, layers, k]
    then = batch.routed_experts[:, :-1]  # [B, T−1, layers, k], −1 where not recorded
    have = (then >= 0).all(-1)  # [B, T−1, layers]
    differ = (now.sort(-1).values != then.sort(-1).values).any(-1)
    return float(differ[have].float().mean()) if have.any() else 0.0


def consistency_rows(model, samples, *, pad_id: int = 0, temperature: float = 1.0) -> list[dict[str, Any]]:
    """One row per combination of (QDQ, R3, top-p replay): mean |Δ logp|, its 0.99 quantile and max, k3 KL.

    ``samples``: trajectories recorded with routed experts and top-p candidate sets (what R3 and replay need).
    """
    from mimo_kit.rl.losses import mismatch_metrics
    from mimo_kit.rl.trajectory import flatten

    batch = flatten(samples, pad_id=pad_id)
    if batch.routed_experts is None or batch.topp_candidates is None:
        raise ValueError("consistency_rows: the samples carry no routed experts or top-p candidates; roll out with "
                         "return_routed_experts=True and return_candidates=True")
    mask = batch.loss_mask[:, 1:]
    rollout_lp = batch.logprobs[:, 1:].double()
    model.eval()
    rows = []
    for qdq, r3, topp in itertools.product((False, True), repeat=3):
        logp = _scores(model, batch, temperature, qdq, r3, topp).double()
        d = (logp - rollout_lp)[mask].abs()
        mm = mismatch_metrics(logp, rollout_lp, mask)
        flips = 0.0 if r3 else routing_flips(model, batch, qdq)
        rows.append({"qdq": qdq, "r3": r3, "topp_replay": topp, "tokens": int(mask.sum()), "routing_flips": flips,
                     "mean_abs_dlogp": float(d.mean()), "q99_abs_dlogp": float(d.quantile(0.99)),
                     "max_abs_dlogp": float(d.max()), "k3_kl": mm["k3_kl"]})
    return rows


def measure_consistency(cfg: ConsistencyConfig) -> dict[str, Any]:
    """SFT a toy policy, roll out once through an (MXFP4) engine, score the rollouts under all 8 combinations."""
    from mimo_kit.infra import rollout
    from mimo_kit.infra.engine import InProcessEngine
    from mimo_kit.optim.mxfp4 import quantize_experts_
    from mimo_kit.train.sft import PolicyConfig, SFTConfig, build_policy, sft_warm_start
    from mimo_kit.train.toy.world import ToyWorld

    world = ToyWorld()
    model = build_policy(PolicyConfig(hidden_size=cfg.hidden_size), cfg.seed, vocab_size=world.vocab_size)
    if cfg.sft_steps:
        sft_warm_start(model, SFTConfig(steps=cfg.sft_steps), cfg.seed,
                       data=world.sft_data(2000, cfg.seed))
    engine = InProcessEngine(model, seed=cfg.seed)
    if cfg.mxfp4_rollouts:
        quantize_experts_(engine.model)
    settings = world.rollout_settings(cfg.temperature, cfg.top_p, True, True)
    tasks = world.tasks(cfg.groups, seed=30_000 + cfg.seed, prefix="consistency")
    samples = rollout.play(engine, [world.episodes(t, cfg.group_size) for t in tasks], settings)
    rows = consistency_rows(model, samples, pad_id=world.pad_id, temperature=cfg.temperature)
    cands = [len(c) for s in samples for q in s.sequences for ctx in q.contexts for seg in ctx.segments
             if seg.topp_candidates for c in seg.topp_candidates]
    return {"rows": rows, "mean_candidates": sum(cands) / max(len(cands), 1), "config": cfg.to_dict()}


def label(row: dict[str, Any]) -> str:
    """``"QDQ + R3"``-style name of a row's switches (``"none"`` when all are off)."""
    on = [name for key, name in zip(SWITCHES, ("QDQ", "R3", "top-p replay")) if row[key]]
    return " + ".join(on) or "none"


def plot_consistency(rows: list[dict[str, Any]], ax=None):
    """Bars of mean |Δ logp| (and the 0.99 quantile as a marker) per combination, log scale."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.2))
    names = [label(r) for r in rows]
    x = range(len(rows))
    ax.bar(x, [max(r["mean_abs_dlogp"], 1e-12) for r in rows], color="tab:blue", label="mean |Δ logp|")
    ax.scatter(x, [max(r["q99_abs_dlogp"], 1e-12) for r in rows], color="tab:red", marker="_", s=300,
               label="0.99 quantile", zorder=3)
    ax.set_yscale("log")
    ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("|log π_train − log π_rollout|")
    ax.set_title("train–inference mismatch on the same rollouts (MXFP4 engine, top-p sampling)")
    ax.legend(fontsize=8)
    return ax
