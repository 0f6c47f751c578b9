"""The toy policy and its SFT warm start on the scripted expert's trajectories (Report §5: RL starts from SFT).

The policy is the kit decoder (:class:`~mimo_kit.model.MiMoForCausalLM`) sized for two CPU cores: char-level
vocabulary of the toy world, a dense first layer and MoE layers after it (Report §2), so router drift and expert
load can be watched during RL. SFT is next-token cross-entropy on the expert's action tokens only (prompts and
tool outputs are context, not targets), AdamW, gradient clip 1.0.
"""

from __future__ import annotations

import dataclasses
import random

import torch
import torch.nn.functional as F

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.dist import Dist, autocast, checkpointed_layers
from mimo_kit.model import MiMoConfig, MiMoForCausalLM
from mimo_kit.train.toy.world import TOKENIZER, expert_dataset, make_tasks


@dataclasses.dataclass
class PolicyConfig(Config):
    """The toy policy's shape (the kit decoder at toy scale)."""

    hidden_size: int = knob(64, "wide enough to copy a line from a tool output, small enough for 2 cores", min=8)
    num_hidden_layers: int = knob(3, "a dense GA layer, then SWA and GA MoE layers (Report §2 pattern)", min=2)
    n_routed_experts: int = knob(8, "8 experts: load CV and cold share are readable", min=2)
    num_experts_per_tok: int = knob(2, "top-2 routing", min=1)
    sliding_window: int = knob(16, "an SWA layer sees the last 16 chars: about one turn", min=2)
    max_positions: int = knob(1024, "a repo-world episode is ~200–400 BPE tokens; a toy one under 100 chars", min=64)

    PRESETS = {"tiny": {}, "small": {"hidden_size": 128, "num_hidden_layers": 4}}

    def model_config(self, vocab_size: int | None = None) -> MiMoConfig:
        n = self.num_hidden_layers
        return MiMoConfig.preset("tiny", vocab_size=vocab_size or TOKENIZER.vocab_size, hidden_size=self.hidden_size,
                                 num_hidden_layers=n, global_layers=(0, n - 1), dense_layers=(0,),
                                 num_attention_heads=4, head_dim=16, v_head_dim=16,
                                 intermediate_size=2 * self.hidden_size, moe_intermediate_size=self.hidden_size // 2,
                                 n_routed_experts=self.n_routed_experts, num_experts_per_tok=self.num_experts_per_tok,
                                 sliding_window=self.sliding_window, max_position_embeddings=self.max_positions)


@dataclasses.dataclass
class SFTConfig(Config):
    """SFT warm start on the scripted expert (``mix`` = clean / needless / wrong shares)."""

    tasks: int = knob(3000, "distinct training tasks for SFT; the RL pool and held-out set are disjoint seeds", min=1)
    steps: int = knob(400, "enough for the copy skill to appear on 2 cores in about a minute", min=0)
    batch_size: int = knob(32, "sequences per SFT step", min=1)
    lr: float = knob(3e-3, "AdamW at a toy scale learns fast without diverging", min=0.0)
    optimizer: str = knob("adamw", "'adamw', or 'muown' on the hidden matrices (AdamW on the rest, no weight decay) "
                          "so that RL can carry its state over (Report §5)")
    mix: tuple[float, float, float] = knob((0.5, 0.25, 0.25), "half clean, a quarter needless, a quarter wrong: "
                                           "SFT starts well below 100% so RL has room")
    retry_prob: float = knob(0.3, "share of needless trajectories that repair a wrong first edit", min=0.0, max=1.0)

    PRESETS = {"tiny": {}, "small": {"steps": 1200}}

    def check(self) -> None:
        if self.optimizer not in ("adamw", "muown"):
            raise ConfigError(f"SFTConfig.optimizer={self.optimizer!r}; expected 'adamw' or 'muown'")


def sft_optimizer(model: MiMoForCausalLM, cfg: SFTConfig):
    """SFT's optimiser: AdamW on every parameter, or the kit's Muown set (Muown on the hidden matrices, AdamW on
    embeddings, head, router and norms), no weight decay, constant lr (Report §5's RL settings, so that RL can
    take the state over unchanged)."""
    if cfg.optimizer == "muown":
        from mimo_kit.optim.build import OptimizerSet
        from mimo_kit.optim.config import OptimConfig

        return OptimizerSet(model, OptimConfig(matrix_optimizer="muown", lr=cfg.lr, matrix_lr=cfg.lr, norm_lr=cfg.lr,
                                               weight_decay=0.0, schedule="constant", warmup_steps=0))
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)


def build_policy(cfg: PolicyConfig, seed: int, vocab_size: int | None = None) -> MiMoForCausalLM:
    """The policy for a world with ``vocab_size`` tokens (default: the toy world's char vocabulary)."""
    torch.manual_seed(seed)
    return MiMoForCausalLM(cfg.model_config(vocab_size))


def pad_batch(rows: list[list[int]], masks: list[list[bool]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest row: ids [B, T] (pad 0) and loss mask [B, T]."""
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(m)] = torch.tensor(m)
    return ids, mask


def sft_warm_start(model: MiMoForCausalLM, cfg: SFTConfig, seed: int, progress: bool = False,
                   data: list | None = None, *, d: Dist | None = None, dtype: torch.dtype = torch.float32,
                   activation_checkpointing: bool = False, opt=None, live=None) -> list[float]:
    """Train ``model`` in place on expert trajectories ``data`` ((ids, loss mask, info) per trace; default: the toy
    world's expert); returns the loss per step.

    ``d``: the process group of a sharded run. Every rank draws the same batch and trains on its rows; the loss is
    normalised by the whole batch's target count N (each rank's sum of token losses / N, × W for FSDP's average),
    so W ranks compute the one-process loss. ``dtype``: the compute dtype (bf16 autocast on fp32 weights).
    ``opt``: the optimiser to step (default: :func:`sft_optimizer`), for a caller that keeps its state.
    ``live``: a :class:`mimo_kit.live.LiveLog` that gets each step's loss (TensorBoard, ``RUN/tb/sft``).
    """
    if data is None:
        data = expert_dataset(make_tasks(cfg.tasks, seed=10_000 + seed, prefix="sft"), seed, cfg.mix, cfg.retry_prob)
    d = d or Dist(device=next(model.parameters()).device)
    opt = opt if opt is not None else sft_optimizer(model, cfg)
    rng = random.Random(seed)
    losses = []
    steps = range(cfg.steps)
    if progress:
        from mimo_kit.live import progress_bar

        steps = progress_bar(steps, desc="SFT", leave=False)
    model.train()
    for _ in steps:
        batch = rng.sample(data, min(cfg.batch_size, len(data)))
        ids, mask = pad_batch([b[0] for b in batch], [b[1] for b in batch])
        n_targets = int(mask[:, 1:].sum())  # the whole batch's targets
        if d.world_size > 1:
            rows = torch.tensor_split(torch.arange(ids.shape[0]), d.world_size)[d.rank]
            ids, mask = (ids[rows], mask[rows]) if rows.numel() else (ids[:1], torch.zeros_like(mask[:1]))
        ids, mask = ids.to(d.device), mask.to(d.device)
        with checkpointed_layers(model, activation_checkpointing):
            with autocast(d.device, dtype):
                logits = model(ids[:, :-1]).logits  # [B, T-1, V]
            m = mask[:, 1:]
            if d.world_size == 1:
                loss = F.cross_entropy(logits[m].float(), ids[:, 1:][m])
            else:
                loss = F.cross_entropy(logits[m].float(), ids[:, 1:][m], reduction="sum") * (d.world_size /
                                                                                             max(n_targets, 1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(d.all_reduce_sum(loss.detach()) / d.world_size))
        if live is not None:
            live.scalars(len(losses), {"loss": losses[-1]})
    model.eval()
    return losses
