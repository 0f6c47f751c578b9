"""Measurements of chapter 2.4: accepted length, acceptance per position and wall-clock speedup vs block size;
and what retraining the drafter on the updated policy's own text buys (Report §2, §6).

Both sides of every comparison run in the same process on the same prompts: plain decoding with the kit's cache
(:func:`mimo_kit.model.generate`) against :func:`speculative_generate`.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time

import torch
import torch.nn.functional as F

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.model.decoder import MiMoForCausalLM
from mimo_kit.model.generate import generate
from mimo_kit.speculative.decode import speculative_generate
from mimo_kit.speculative.drafter import BlockDrafter
from mimo_kit.speculative.train import DrafterTrainConfig, train_drafter


@dataclasses.dataclass
class SpecBenchConfig(Config):
    train: DrafterTrainConfig = dataclasses.field(default_factory=DrafterTrainConfig)
    backbone_steps: int = knob(600, "tiny backbone pre-training steps: enough for text the drafter can predict",
                               min=1)
    backbone_shape: str = knob("tiny", "a key of BACKBONE_SHAPES: the backbone's model overrides")
    block_sizes: tuple[int, ...] = knob((4, 6, 8), "the issue's sweep; Report §2: 8 by default, 6 in RL serving")
    temperatures: tuple[float, ...] = knob((0.0, 0.7), "greedy, and sampling with lossless rejection")
    prompts: int = knob(4, "prompts per setting, drawn from held-out text", min=1)
    prompt_len: int = knob(48, "tokens per prompt (longer than the tiny SWA window)", min=1)
    new_tokens: int = knob(96, "tokens generated per prompt", min=1)
    quick: bool = knob(False, "smoke-sized run (notebooks set it from MIMO_KIT_QUICK)")
    out_dir: str | None = knob(None, "backbone and drafter checkpoints, reused by reruns; None = <repo>/runs/ch02b, "
                                     "shared by the notebook and the command line")
    seed: int = knob(0, "prompts and sampling", min=0)
    rounds: int = knob(1, "alternated plain/speculative timing rounds; medians and spreads over them", min=1)

    PRESETS = {
        "tiny": {},
        "small": {"backbone_steps": 2000, "new_tokens": 192},
        # A shape where drafting can pay: an 8-layer backbone step against a 1-layer drafter (see BACKBONE_SHAPES).
        "pays": {"backbone_shape": "pays", "backbone_steps": 900, "block_sizes": (6, 8), "rounds": 5,
                 "train.steps": 400, "train.drafter.num_layers": 1, "train.drafter.head_dim": 64,
                 "train.drafter.intermediate_size": 512},
    }

    def check(self) -> None:
        if self.backbone_shape not in BACKBONE_SHAPES:
            raise ConfigError(f"SpecBenchConfig.backbone_shape: {self.backbone_shape!r}; expected one of "
                              f"{sorted(BACKBONE_SHAPES)}")


# Backbone model overrides on top of the tiny pre-training preset.
BACKBONE_SHAPES: dict[str, dict] = {
    "tiny": {},
    # hidden 256, 8 layers (6 dense, 2 MoE with 4 experts, top-1): a decode step is 8 layers of fixed per-layer
    # overhead on a CPU, a 1-layer drafter ~1/8 of it. Global attention in every layer: the kit's SWA kernel
    # costs ~2× a decode step for a multi-token query, GA ~1.1× (measured, benchmarks/RESULTS_spec.md), and
    # verification must cost about one decode step for drafting to pay.
    "pays": {"model.hidden_size": 256, "model.num_hidden_layers": 8, "model.num_attention_heads": 4,
             "model.head_dim": 64, "model.v_head_dim": 64, "model.intermediate_size": 768,
             "model.moe_intermediate_size": 384, "model.n_routed_experts": 4, "model.num_experts_per_tok": 1,
             "model.dense_layers": (0, 1, 2, 3, 4, 5), "model.global_layers": tuple(range(8))},
}


def run_dir(cfg: SpecBenchConfig) -> str:
    """Quick and full runs keep separate checkpoints, so neither resumes the other's."""
    from pathlib import Path

    base = cfg.out_dir or str(Path(__file__).resolve().parents[2] / "runs" / "ch02b")
    shape = "" if cfg.backbone_shape == "tiny" else f"-{cfg.backbone_shape}"
    return f"{base}/{'quick' if cfg.quick else 'full'}{shape}"


def backbone_and_streams(cfg: SpecBenchConfig) -> tuple[MiMoForCausalLM, object, dict[str, torch.Tensor]]:
    """The tiny pre-trained backbone of chapter 3 (trained once, then loaded from ``out_dir``) and its token streams."""
    from mimo_kit.pretrain import PretrainConfig, run_pretrain
    from mimo_kit.pretrain.data import token_streams

    pre = PretrainConfig.preset("tiny", steps=cfg.backbone_steps, quick=cfg.quick,
                                out_dir=f"{run_dir(cfg)}/backbone", checkpoint_every=0)
    pre = pre.override(dict(BACKBONE_SHAPES[cfg.backbone_shape]))
    result = run_pretrain(pre)
    return result.model, result.tokenizer, token_streams(result.tokenizer)


def measure(backbone: MiMoForCausalLM, drafter: BlockDrafter, prompts: torch.Tensor, new_tokens: int,
            temperature: float, seed: int) -> dict:
    """Plain vs speculative decoding on each prompt [n, T]: accepted length, per-position acceptance, tok/s."""
    plain_s, spec_s, lengths, n_tokens = 0.0, 0.0, [], 0
    B = drafter.config.block_size
    proposed, accepted = [0] * (B - 1), [0] * (B - 1)
    for i, prompt in enumerate(prompts):
        g = torch.Generator().manual_seed(seed + i)
        start = time.perf_counter()
        generate(backbone, prompt[None], new_tokens, temperature=temperature, generator=g)
        plain_s += time.perf_counter() - start
        res = speculative_generate(backbone, drafter, prompt[None], new_tokens, temperature=temperature,
                                   generator=torch.Generator().manual_seed(seed + i))
        spec_s += res.seconds
        lengths += [a + 1 for a in res.accepted]
        n_tokens += len(res.tokens)
        proposed = [p + q for p, q in zip(proposed, res.proposed_by_position)]
        accepted = [p + q for p, q in zip(accepted, res.accepted_by_position)]
    return {"block": B, "temperature": temperature, "accepted_length": statistics.mean(lengths),
            "plain_tok_s": len(prompts) * new_tokens / plain_s, "spec_tok_s": n_tokens / spec_s,
            "speedup": (n_tokens / spec_s) / (len(prompts) * new_tokens / plain_s),
            "acceptance_by_position": [a / p if p else 0.0 for a, p in zip(accepted, proposed)]}


def run_spec_bench(cfg: SpecBenchConfig) -> dict:
    """Train one drafter per block size on the tiny backbone, then measure each at each temperature."""
    backbone, _, streams = backbone_and_streams(cfg)
    val = streams["val"].long()
    g = torch.Generator().manual_seed(cfg.seed)
    starts = torch.randint(0, len(val) - cfg.prompt_len, (cfg.prompts,), generator=g)
    prompts = torch.stack([val[s : s + cfg.prompt_len] for s in starts.tolist()])
    new_tokens = min(cfg.new_tokens, 24) if cfg.quick else cfg.new_tokens
    rows, logs = [], {}
    for B in cfg.block_sizes:
        train_cfg = cfg.train.override({"drafter.block_size": B, **({"steps": 20, "self_generated": 8}
                                                                    if cfg.quick else {})})
        trained = train_drafter(backbone, streams["train"].long(), train_cfg, out_dir=f"{run_dir(cfg)}/drafter-B{B}")
        logs[B] = trained["log"]
        for T in cfg.temperatures:
            rows.append(measure(backbone, trained["drafter"], prompts, new_tokens, T, cfg.seed))
    return {"rows": rows, "drafter_logs": logs, "backbone": backbone}


def markdown(rows: list[dict]) -> str:
    head = ("| block B | temperature | mean accepted length | plain tok/s | speculative tok/s | speedup |\n"
            "|---|---|---|---|---|---|\n")
    return head + "\n".join(f"| {r['block']} | {r['temperature']} | {r['accepted_length']:.2f} | "
                            f"{r['plain_tok_s']:.0f} | {r['spec_tok_s']:.0f} | {r['speedup']:.2f}× |"
                            for r in rows) + "\n"


@dataclasses.dataclass
class DrafterRefreshConfig(Config):
    bench: SpecBenchConfig = dataclasses.field(default_factory=SpecBenchConfig)
    block: int = knob(6, "Report §2: the block size of RL serving", min=2)
    update_steps: int = knob(60, "fine-tuning steps that move the policy, standing in for RL updates", min=1)
    update_lr: float = knob(3e-3, "large enough to move a tiny policy visibly in a few dozen steps", min=0.0)
    update_slice: float = knob(0.05, "the policy is tuned on this leading share of the training text only "
                                     "(a narrow task distribution, as RL data is)", min=0.001, max=1.0)
    refresh_steps: int = knob(100, "drafter steps on the updated policy's own generations", min=1)
    refresh_lr: float = knob(5e-4, "fine-tuning a trained drafter: a quarter of the from-scratch rate, so the first "
                                   "steps of a fresh optimiser do not undo it", min=0.0)
    quick: bool = knob(False, "smoke-sized run")

    PRESETS = {"tiny": {}}


def run_drafter_refresh(cfg: DrafterRefreshConfig) -> dict:
    """Accepted length: old drafter on the old policy → on the updated policy (stale) → after retraining on the
    updated policy's own text (refreshed). Report §6 retrains the draft model on RL trajectories."""
    bench = cfg.bench.override({"quick": cfg.quick})
    backbone, _, streams = backbone_and_streams(bench)
    train = streams["train"].long()
    val = streams["val"].long()
    g = torch.Generator().manual_seed(bench.seed)
    starts = torch.randint(0, len(val) - bench.prompt_len, (bench.prompts,), generator=g)
    prompts = torch.stack([val[s : s + bench.prompt_len] for s in starts.tolist()])
    new_tokens = min(bench.new_tokens, 24) if cfg.quick else bench.new_tokens
    quick = {"steps": 20, "self_generated": 8} if cfg.quick else {}
    dcfg = bench.train.override({"drafter.block_size": cfg.block, **quick})
    old = train_drafter(backbone, train, dcfg, out_dir=f"{run_dir(bench)}/drafter-B{cfg.block}")["drafter"]
    before = measure(backbone, old, prompts, new_tokens, 0.0, bench.seed)

    policy = copy.deepcopy(backbone).train()  # the policy after some "RL" updates on a narrow slice
    for p in policy.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.update_lr)
    narrow = train[: max(bench.train.seq_len + 2, int(len(train) * cfg.update_slice))]
    steps = 5 if cfg.quick else cfg.update_steps
    for _ in range(steps):
        s = torch.randint(0, len(narrow) - bench.train.seq_len - 1, (bench.train.batch,), generator=g)
        x = torch.stack([narrow[i : i + bench.train.seq_len + 1] for i in s.tolist()])
        loss = F.cross_entropy(policy(x[:, :-1]).logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    policy.eval()
    stale = measure(policy, old, prompts, new_tokens, 0.0, bench.seed)
    refresh_cfg = dcfg.override({"steps": 10 if cfg.quick else cfg.refresh_steps, "self_generated_share": 1.0,
                                 "lr": cfg.refresh_lr})
    refreshed_drafter = train_drafter(policy, train, refresh_cfg, drafter=copy.deepcopy(old))["drafter"]
    refreshed = measure(policy, refreshed_drafter, prompts, new_tokens, 0.0, bench.seed)
    return {"before": before, "stale": stale, "refreshed": refreshed}
