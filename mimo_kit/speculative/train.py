"""Training the block drafter (and the MTP module, :func:`train_mtp`) against a frozen backbone, with checkpoints
and exact resume (Report §2, §6).

Per step: a batch of sequences (corpus text, and text the backbone itself generated: the drafter must predict
*the backbone*, not the corpus), the backbone's hidden states once (no gradient), M random anchors per sequence.
Block position k (1 ≤ k < B) of anchor a predicts token a + k:

.. math:: \\mathcal{L} = \\frac{\\sum_k w_k \\, \\mathrm{CE}(p_{a+k}, q_k)}{\\sum_k w_k}, \\qquad
          w_k = e^{-(k-1)/\\gamma}

where p_{a+k} is the backbone's distribution for token a + k given the text before it (distillation: a draft is
accepted when it agrees with the backbone, not with the corpus) and q_k the drafter's.

A checkpoint (drafter, optimiser, data-generator state, log) is written atomically every ``checkpoint_every``
steps; a run pointed at a folder with a checkpoint continues from it and reproduces the uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from mimo_kit.checkpoint import atomic_save
from mimo_kit.config.base import Config, knob
from mimo_kit.dist import autocast, check_device_knobs, resolve_device, resolve_precision
from mimo_kit.live import LiveLog, progress_bar
from mimo_kit.model.decoder import MiMoForCausalLM
from mimo_kit.model.generate import generate
from mimo_kit.speculative.drafter import BlockDrafter, DrafterConfig, context_mask
from mimo_kit.speculative.mtp import MTPConfig, MTPDrafter


@dataclasses.dataclass
class DraftTrainKnobs(Config):
    """The training knobs the block drafter and the MTP module share."""

    steps: int = knob(300, "tiny: acceptance plateaus within a few hundred steps", min=1)
    batch: int = knob(8, "sequences per step", min=1)
    seq_len: int = knob(96, "tokens per training sequence", min=4)
    anchors_per_seq: int = knob(32, "random anchors per sequence: many blocks share one backbone pass", min=1)
    lr: float = knob(3e-3, "AdamW for a small drafter; constant, so a resumed run matches", min=0.0)
    self_generated: int = knob(32, "sequences the backbone writes itself mixed into batches",
                               min=0)
    self_generated_share: float = knob(0.5, "share of each batch drawn from the backbone's own text", min=0.0,
                                       max=1.0)
    prompt_len: int = knob(16, "corpus prompt length before the backbone's own continuation", min=1)
    generation_temperature: float = knob(0.7, "temperature of the backbone's own text: near what serving samples",
                                         min=0.0)
    distill: bool = knob(True, "match the backbone's next-token distribution, not the text: a draft is accepted "
                               "when it agrees with the backbone")
    checkpoint_every: int = knob(50, "steps between checkpoints", min=1)
    seed: int = knob(0, "data order, anchors and init", min=0)
    device: str = knob("auto", "where the backbone and drafter train: auto = cuda when available, else cpu")
    precision: str = knob("auto", "compute dtype: auto = bf16 on cuda, fp32 on cpu (weights and AdamW state fp32)")

    def check(self) -> None:
        check_device_knobs("DrafterTrainConfig", self.device, self.precision)

    PRESETS = {"tiny": {}, "small": {"steps": 1000, "seq_len": 256, "self_generated": 64}}


@dataclasses.dataclass
class DrafterTrainConfig(DraftTrainKnobs):
    drafter: DrafterConfig = dataclasses.field(default_factory=DrafterConfig)


@dataclasses.dataclass
class MTPTrainConfig(DraftTrainKnobs):
    mtp: MTPConfig = dataclasses.field(default_factory=MTPConfig)


def drafter_loss(drafter: BlockDrafter, backbone: MiMoForCausalLM, x: torch.Tensor, generator: torch.Generator,
                 anchors_per_seq: int = 8, distill: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted block loss on sequences x [N, T] → (loss, per-position agreement [B − 1]).

    ``distill``: cross-entropy against the backbone's own next-token distribution (what verification compares
    with); else against the text's next tokens.
    """
    cfg = drafter.config
    N, T = x.shape
    B = cfg.block_size
    if T < B + 1:
        raise ValueError(f"sequences of {T} tokens are too short for block size {B}")
    with torch.no_grad():
        out = backbone(x, output_hidden_states=True)
        feats = drafter.features(out.hidden_states)  # [N, T, n·H]
    M = min(T - B, anchors_per_seq)
    anchors = torch.randint(1, T - B + 1, (N, M), generator=generator).to(x.device)  # a ≥ 1: one context position
    rows = torch.arange(N, device=x.device).repeat_interleave(M)
    a = anchors.reshape(-1)
    positions = torch.arange(T, device=x.device)
    ctx_kv = [(k[rows], v[rows]) for k, v in drafter.context(feats, positions)]  # per sequence, then per block
    logits = drafter(backbone, ctx_kv, context_mask(positions, a, cfg.context_window), x[rows, a], a)  # [N·M, B−1, V]
    k = torch.arange(1, B, device=x.device)
    w = torch.exp(-(k - 1).float() / cfg.gamma)
    logq = logits.float().log_softmax(-1)
    if distill:  # the backbone's distribution for token a + k, given the text up to a + k − 1
        p = out.logits[rows[:, None], a[:, None] + k[None, :] - 1].float().softmax(-1)  # [N·M, B − 1, V]
        ce = -(p * logq).sum(-1)
        target = p.argmax(-1)
    else:  # the text itself
        target = x[rows[:, None], a[:, None] + k[None, :]]  # [N·M, B − 1]
        ce = -logq.gather(-1, target[..., None])[..., 0]
    loss = (ce.mean(0) * w).sum() / w.sum()
    acc = (logits.argmax(-1) == target).float().mean(0)
    return loss, acc


def train_drafter(backbone: MiMoForCausalLM, tokens: torch.Tensor, cfg: DrafterTrainConfig,
                  out_dir: str | Path | None = None, drafter: BlockDrafter | None = None) -> dict:
    """Train (or continue training) a drafter on the token stream ``tokens`` [n] with ``backbone`` frozen.

    Returns ``{"drafter", "log": {"step", "loss", "acc"}}``. With ``out_dir``, checkpoints go to
    ``out_dir/drafter.pt`` and an existing checkpoint there is resumed.
    """
    torch.manual_seed(cfg.seed)
    drafter = drafter or BlockDrafter(cfg.drafter, backbone.config)
    return _train(drafter, lambda m, bb, x, g: drafter_loss(m, bb, x, g, cfg.anchors_per_seq, cfg.distill),
                  backbone, tokens, cfg, out_dir, "drafter")


def mtp_loss(mtp: MTPDrafter, backbone: MiMoForCausalLM, x: torch.Tensor, generator: torch.Generator,
             anchors_per_seq: int = 8, distill: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's weighted loss for the MTP chain on sequences x [N, T] → (loss, per-depth agreement [k]).

    Anchors P as at inference: depth 0 reads h_{P−1} and x_P, depth j the state of depth j − 1 and x_{P+j} (the
    text: a draft is kept only when it is the text the backbone would write), each depth sees the committed
    entries t ≤ P − 2 and the depths before it. Depth j predicts x_{P+j+1}, weight exp(−j/γ).
    """
    cfg = mtp.config
    N, T = x.shape
    K = cfg.block_size - 1
    if T < K + 2:
        raise ValueError(f"sequences of {T} tokens are too short for {K} MTP depths")
    with torch.no_grad():
        out = backbone(x)
        h = out.last_hidden_state  # [N, T, H]
    kv = mtp.entries(backbone, h[:, :-1], x[:, 1:], torch.arange(1, T, device=x.device))  # entries t = 0 … T − 2
    M = min(T - K - 1, anchors_per_seq)
    P = torch.randint(1, T - K, (N, M), generator=generator).to(x.device).reshape(-1)  # P + K ≤ T − 1
    rows = torch.arange(N, device=x.device).repeat_interleave(M)
    ctx = [(k[rows], v[rows]) for k, v in kv]
    allowed = torch.arange(T - 1, device=x.device)[None, :] < (P - 1)[:, None]  # [N·M, T − 1]: t ≤ P − 2
    logits = torch.stack(mtp.chain(backbone, h[rows, P - 1][:, None], x[rows, P], P, ctx, allowed, K,
                                   lambda j, _: x[rows, P + j + 1]), dim=1)  # [N·M, K, V]
    j = torch.arange(K, device=x.device)
    w = torch.exp(-j.float() / cfg.gamma)
    logq = logits.float().log_softmax(-1)
    if distill:  # the backbone's distribution for x_{P+j+1} given the text up to P + j
        p = out.logits[rows[:, None], P[:, None] + j[None, :]].float().softmax(-1)
        ce = -(p * logq).sum(-1)
        target = p.argmax(-1)
    else:
        target = x[rows[:, None], P[:, None] + j[None, :] + 1]
        ce = -logq.gather(-1, target[..., None])[..., 0]
    loss = (ce.mean(0) * w).sum() / w.sum()
    return loss, (logits.argmax(-1) == target).float().mean(0)


def train_mtp(backbone: MiMoForCausalLM, tokens: torch.Tensor, cfg: MTPTrainConfig,
              out_dir: str | Path | None = None, mtp: MTPDrafter | None = None) -> dict:
    """Train (or continue training) an MTP module like :func:`train_drafter`: same data, loss weighting and
    checkpoints (``out_dir/drafter.pt``). Returns ``{"drafter", "log"}``."""
    torch.manual_seed(cfg.seed)
    mtp = mtp or MTPDrafter(cfg.mtp, backbone.config)
    return _train(mtp, lambda m, bb, x, g: mtp_loss(m, bb, x, g, cfg.anchors_per_seq, cfg.distill),
                  backbone, tokens, cfg, out_dir, "mtp")


def _train(drafter: torch.nn.Module, loss_fn, backbone: MiMoForCausalLM, tokens: torch.Tensor,
           cfg: DraftTrainKnobs, out_dir: str | Path | None, desc: str) -> dict:
    """The shared loop: ``loss_fn(drafter, backbone, x [N, T], generator)`` → (loss, per-position agreement)."""
    backbone.eval()
    for p in backbone.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(cfg.seed)
    pool = _self_generated_pool(backbone, tokens, cfg)
    device = resolve_device(cfg.device)
    dtype = resolve_precision(cfg.precision, device)
    backbone.to(device)  # the frozen backbone moves to the run's device with the drafter
    drafter.to(device)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr)
    log: dict[str, list] = {"step": [], "loss": [], "acc": []}
    start = 0
    ckpt = Path(out_dir) / "drafter.pt" if out_dir is not None else None
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        free = dict(steps=None, device=None, precision=None)  # may change between a run and its continuation
        theirs, ours = dict(state["config"], **free), dict(cfg.to_dict(), **free)
        if theirs != ours:  # a longer run may continue a shorter one; anything else is another experiment
            diff = cfg.diff(type(cfg).from_dict(state["config"]))
            raise ValueError(f"train_{desc}: {ckpt} was written by a different config ({diff}); use another "
                             "out_dir")
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        log, start = state["log"], state["step"]
    n_self = round(cfg.batch * cfg.self_generated_share) if len(pool) else 0
    replay = [(s, _live(log, i)) for i, s in enumerate(log["step"])] if start else None
    with LiveLog(out_dir, desc, replay=replay) as live:  # RUN/tb/drafter or RUN/tb/mtp; none without a folder
        for step in progress_bar(range(start + 1, cfg.steps + 1), desc=desc, leave=False, initial=start,
                         total=cfg.steps):
            starts = torch.randint(0, len(tokens) - cfg.seq_len, (cfg.batch - n_self,), generator=gen)
            x = torch.stack([tokens[s : s + cfg.seq_len] for s in starts.tolist()] +
                            [pool[i] for i in torch.randint(0, len(pool), (n_self,), generator=gen).tolist()]).long()
            drafter.train()
            with autocast(device, dtype):
                loss, acc = loss_fn(drafter, backbone, x.to(device), gen)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            opt.step()
            log["step"].append(step)
            log["loss"].append(loss.item())
            log["acc"].append(acc.tolist())
            live.scalars(step, _live(log, -1))
            if ckpt is not None and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                atomic_save({"drafter": drafter.state_dict(), "optimizer": opt.state_dict(),
                             "generator": gen.get_state(), "log": log, "step": step,
                             "config": cfg.to_dict()}, ckpt)
    drafter.eval()
    return {"drafter": drafter, "log": log}


def _live(log: dict[str, list], i: int) -> dict[str, float]:
    """Step ``i``'s scalars for TensorBoard: the loss and ``acc/k``, draft position k's agreement with the backbone's
    greedy token."""
    return {"loss": log["loss"][i], **{f"acc/{k + 1}": a for k, a in enumerate(log["acc"][i])}}


def _self_generated_pool(backbone: MiMoForCausalLM, tokens: torch.Tensor, cfg: DraftTrainKnobs) -> torch.Tensor:
    """Sequences [n, seq_len]: corpus prompts continued by the backbone itself (deterministic for a seed)."""
    if cfg.self_generated == 0 or cfg.self_generated_share == 0:
        return torch.empty(0, cfg.seq_len, dtype=torch.long)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    starts = torch.randint(0, len(tokens) - cfg.prompt_len, (cfg.self_generated,), generator=g)
    prompts = torch.stack([tokens[s : s + cfg.prompt_len] for s in starts.tolist()]).long()
    out = generate(backbone, prompts, cfg.seq_len - cfg.prompt_len, temperature=cfg.generation_temperature,
                   generator=g)
    return torch.cat([prompts, out.tokens], dim=1)


def weights(cfg: DrafterConfig) -> list[float]:
    """The loss weight of each block position 1 … B − 1: exp(−(k − 1)/γ)."""
    return [math.exp(-(k - 1) / cfg.gamma) for k in range(1, cfg.block_size)]
