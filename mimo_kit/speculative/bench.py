"""Measurements of chapter 2.4: accepted length, acceptance per position and wall-clock speedup vs block size,
the block drafter (DFlash) against the MTP module at the same budget; and what retraining the drafter on the
updated policy's own text buys (Report §2, §6).

Both sides of every comparison run in the same process on the same prompts: plain decoding with the kit's cache
(:func:`mimo_kit.model.generate`) against :func:`speculative_generate`, alternated round by round, reported as
median and min–max over rounds. :func:`step_costs` measures what drafting has to beat: a B-token verification
forward against a 1-token decode step, and one ``propose``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.model.decoder import MiMoForCausalLM
from mimo_kit.model.fast_decode import StaticKVCache, block_logits, decode_step, fast_generate
from mimo_kit.model.generate import generate
from mimo_kit.speculative.decode import Drafter, speculative_generate
from mimo_kit.speculative.mtp import MTPDrafter
from mimo_kit.speculative.train import DrafterTrainConfig, MTPTrainConfig, train_drafter, train_mtp
from mimo_kit.spread import spread


@dataclasses.dataclass
class SpecBenchConfig(Config):
    train: DrafterTrainConfig = dataclasses.field(default_factory=DrafterTrainConfig)
    backbone_steps: int = knob(600, "tiny backbone pre-training steps: enough for text the drafter can predict",
                               min=1)
    backbone_shape: str = knob("tiny", "a key of BACKBONE_SHAPES: the backbone's model overrides")
    block_sizes: tuple[int, ...] = knob((4, 6, 8), "the issue's sweep; Report §2: 8 by default, 6 in RL serving")
    mtp_block_sizes: tuple[int, ...] = knob((), "MTP budgets (anchor + k drafts), compared with the block drafter "
                                                "at the same B (Report §6: DFlash vs the old MTP); none in tiny")
    mtp_layers: int = knob(1, "MTP layers; one reused at every depth, as vLLM serves Flash's", min=1)
    mtp_steps: int | None = knob(None, "MTP training steps; None = train.steps (pays: fewer, as an MTP step costs "
                                       "more: both get ≤ 4 minutes on one core)")
    temperatures: tuple[float, ...] = knob((0.0, 0.7), "greedy, and sampling with lossless rejection")
    prompts: int = knob(4, "prompts per setting, drawn from held-out text", min=1)
    prompt_len: int = knob(48, "tokens per prompt (longer than the tiny SWA window)", min=1)
    new_tokens: int = knob(96, "tokens generated per prompt", min=1)
    quick: bool = knob(False, "smoke-sized run (notebooks set it from MIMO_KIT_QUICK)")
    out_dir: str | None = knob(None, "backbone and drafter checkpoints, reused by reruns; None = runs/ch02b in the "
                                     "working directory, as every run folder")
    seed: int = knob(0, "prompts and sampling", min=0)
    fast_path: bool = knob(False, "also time plain and speculative decoding on the static-cache fast path (the "
                                  "kit's fastest batch-1 decoding), and the speedup there")
    rounds: int = knob(1, "alternated plain/speculative timing rounds per drafter seed; medians and spreads over "
                          "seeds × rounds", min=1)
    seeds: int = knob(3, "drafter seeds (init, data order, anchors: train.seed, train.seed + 1, …) per setting; "
                         "accepted lengths are mean ± sd over them", min=1)
    quick_seeds: int = knob(2, "drafter seeds of a quick run (at most ``seeds``): two still give a spread; the full "
                               "run's are in the committed notebook", min=1)

    PRESETS = {
        # The report's two block sizes (8 by default, 6 in RL serving) and the MTP drafter at block 6, 3 seeds each:
        # ~8 minutes of training on one CPU core (a block drafter ~45 s, an MTP module ~75 s, the backbone ~80 s).
        "tiny": {"block_sizes": (6, 8), "mtp_block_sizes": (6,)},
        "small": {"backbone_steps": 2000, "new_tokens": 192},
        # A shape where drafting can pay: an 8-layer backbone step against a 1-layer drafter (see BACKBONE_SHAPES).
        # Budgets on one CPU core: backbone ~11 min, each drafter ≤ 4 min.
        "pays": {"backbone_shape": "pays", "backbone_steps": 900, "block_sizes": (4, 6, 8), "rounds": 5,
                 "train.steps": 560, "mtp_block_sizes": (6,), "mtp_steps": 400, "train.drafter.num_layers": 1,
                 "train.drafter.head_dim": 64, "train.drafter.intermediate_size": 512,
                 "seeds": 1},  # a timing benchmark of one drafter per setting (benchmarks/bench_spec.py)
        # As `pays` on a deeper, narrower backbone (16 layers of hidden 128): a decode step runs twice the layers
        # of fixed cost, so a 1-layer drafter and a 6-token verification cost less of it (benchmarks/RESULTS_spec.md)
        "deep": {"backbone_shape": "deep", "backbone_steps": 900, "block_sizes": (4, 6, 8), "rounds": 5,
                 "train.steps": 560, "mtp_block_sizes": (6,), "mtp_steps": 400, "train.drafter.num_layers": 1,
                 "train.drafter.head_dim": 64, "train.drafter.intermediate_size": 512,
                 "train.drafter.context_window": 16, "seeds": 1, "fast_path": True},
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
    # hidden 128, 16 layers (12 dense, 4 MoE with 4 experts, top-1), global attention: per layer a quarter of the
    # arithmetic of `pays`, twice the layers; measured on one core: a 6-token forward 1.2× a decode step, a 1-layer
    # block drafter's propose 0.09×, the MTP chain of 5 depths 0.45× (`pays`: 1.41×, 0.14×, 0.78×)
    "deep": {"model.hidden_size": 128, "model.num_hidden_layers": 16, "model.num_attention_heads": 4,
             "model.head_dim": 32, "model.v_head_dim": 32, "model.intermediate_size": 384,
             "model.moe_intermediate_size": 192, "model.n_routed_experts": 4, "model.num_experts_per_tok": 1,
             "model.dense_layers": tuple(range(12)), "model.global_layers": tuple(range(16))},
}


def n_seeds(cfg: SpecBenchConfig) -> int:
    """Drafter seeds per setting: ``seeds``, or ``quick_seeds`` of them in a quick run."""
    return min(cfg.seeds, cfg.quick_seeds) if cfg.quick else cfg.seeds


def run_dir(cfg: SpecBenchConfig) -> str:
    """Quick and full runs keep separate checkpoints, so neither resumes the other's."""
    base = cfg.out_dir or "runs/ch02b"
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


def measure(backbone: MiMoForCausalLM, drafter: Drafter, prompts: torch.Tensor, new_tokens: int,
            temperature: float, seed: int, rounds: int = 1, progress=None, fast: bool = False) -> dict:
    """Plain vs speculative decoding on each prompt [n, T]: accepted length, per-position acceptance, tok/s.

    Each of ``rounds`` rounds decodes every prompt plainly (:func:`mimo_kit.model.generate`) and speculatively,
    alternating, so slow phases of a shared machine hit both; tok/s and their ratio are per round, reported as
    median and min–max over rounds. The accepted length is the mean tokens per draft round (one backbone pass) over
    the ``draft_rounds`` of every prompt, with ``accepted_length_se``, the standard error of that mean: a yardstick
    for comparing two measurements on the same prompts, not a test (a prompt's rounds are not independent).
    ``fast`` also times both on the static-cache fast path in each round (plain :func:`~mimo_kit.model.
    fast_generate`, speculative verification with :func:`~mimo_kit.model.fast_decode.block_logits`): ``fast_tok_s``,
    ``fast_spec_tok_s`` and ``speedup_fast``, with their ranges (same seeds: the same accepted lengths up to
    float rounding)
    """
    K = drafter.num_drafts
    plain, spec, ratio, lengths, fast_plain, fast_spec, fast_ratio = [], [], [], [], [], [], []
    proposed, accepted = [0] * K, [0] * K
    for r in range(rounds):
        plain_s, spec_s, fast_s, fast_spec_s, n_tokens, fast_tokens = 0.0, 0.0, 0.0, 0.0, 0, 0
        for i, prompt in enumerate(prompts):
            g = torch.Generator().manual_seed(seed + i)
            start = time.perf_counter()
            generate(backbone, prompt[None], new_tokens, temperature=temperature, generator=g)
            plain_s += time.perf_counter() - start
            if fast:
                start = time.perf_counter()
                fast_generate(backbone, prompt[None], new_tokens, temperature=temperature,
                              generator=torch.Generator().manual_seed(seed + i))
                fast_s += time.perf_counter() - start
                quick = speculative_generate(backbone, drafter, prompt[None], new_tokens, temperature=temperature,
                                             generator=torch.Generator().manual_seed(seed + i), fast=True)
                fast_spec_s += quick.seconds
                fast_tokens += len(quick.tokens)
            res = speculative_generate(backbone, drafter, prompt[None], new_tokens, temperature=temperature,
                                       generator=torch.Generator().manual_seed(seed + i))
            spec_s += res.seconds
            n_tokens += len(res.tokens)
            if r == 0:  # the same seeds every round: acceptance is counted once
                lengths += [a + 1 for a in res.accepted]
                proposed = [p + q for p, q in zip(proposed, res.proposed_by_position)]
                accepted = [p + q for p, q in zip(accepted, res.accepted_by_position)]
        plain.append(len(prompts) * new_tokens / plain_s)
        spec.append(n_tokens / spec_s)
        ratio.append(spec[-1] / plain[-1])
        if fast:
            fast_plain.append(len(prompts) * new_tokens / fast_s)
            fast_spec.append(fast_tokens / fast_spec_s)
            fast_ratio.append(fast_spec[-1] / fast_plain[-1])
        if progress is not None:
            progress(f"round {r + 1}/{rounds}: plain {plain[-1]:.0f} tok/s, speculative {spec[-1]:.0f} tok/s")
    return {"drafter": "mtp" if isinstance(drafter, MTPDrafter) else "block", "block": K + 1,
            "temperature": temperature, "accepted_length": statistics.mean(lengths),
            "accepted_length_se": statistics.stdev(lengths) / math.sqrt(len(lengths)) if len(lengths) > 1 else 0.0,
            "draft_rounds": len(lengths),
            "plain_tok_s": statistics.median(plain), "spec_tok_s": statistics.median(spec),
            "speedup": statistics.median(ratio), "plain_tok_s_range": (min(plain), max(plain)),
            "spec_tok_s_range": (min(spec), max(spec)), "speedup_range": (min(ratio), max(ratio)), "rounds": rounds,
            "acceptance_by_position": [a / p if p else 0.0 for a, p in zip(accepted, proposed)],
            **({"fast_tok_s": statistics.median(fast_plain), "fast_tok_s_range": (min(fast_plain), max(fast_plain)),
                "fast_spec_tok_s": statistics.median(fast_spec),
                "fast_spec_tok_s_range": (min(fast_spec), max(fast_spec)),
                "speedup_fast": statistics.median(fast_ratio),
                "speedup_fast_range": (min(fast_ratio), max(fast_ratio))} if fast else {})}


def call_ms(call: Callable[[], object], reps: int, after: Callable[[], object] | None = None
            ) -> tuple[float, tuple[float, float]]:
    """Median milliseconds of ``call()`` over ``reps`` runs, and its (25th, 75th percentile): how far two medians
    must differ to tell them apart. ``after()`` runs untimed after each (a cache put back where it was)."""
    ts = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        ts.append(time.perf_counter() - start)
        if after is not None:
            after()
    q1, _, q3 = statistics.quantiles(ts, n=4)
    return 1e3 * statistics.median(ts), (1e3 * q1, 1e3 * q3)


@torch.no_grad()
def step_costs(backbone: MiMoForCausalLM, drafters: dict[str, Drafter], prompt: torch.Tensor,
               block_sizes: tuple[int, ...], reps: int = 30, quartiles: dict | None = None,
               fast: bool = False) -> dict[str, float]:
    """Median milliseconds of one backbone forward of 1 token and of B tokens after ``prompt`` [T] (the cost of a
    decode step and of verifying a block), and of one ``propose`` per drafter; ``fast`` adds the same two on the
    static-cache fast path (``decode_step``, ``block_logits``). A ``quartiles`` dict is filled with each call's
    (25th, 75th percentile) in milliseconds (:func:`call_ms`)."""
    quartiles = {} if quartiles is None else quartiles
    costs: dict[str, float] = {}
    T = prompt.shape[0]
    cache = backbone.new_cache(slack=max(block_sizes))
    out = backbone(prompt[None], cache, output_hidden_states=True)
    static = None
    if fast:
        static = StaticKVCache(backbone.config, 1, T + max(block_sizes) + 1, slack=max(block_sizes),
                               dtype=next(backbone.parameters()).dtype, device=prompt.device)
        static.fill_row(backbone, 0, prompt.tolist())

    def back_to_prompt() -> None:  # every call reads the same keys
        static.lengths.fill_(T)
        static.span = T

    for L in sorted({1, *block_sizes}):
        tokens = f"{L} token{'s' if L > 1 else ''}"
        costs[f"backbone {tokens}"], quartiles[f"backbone {tokens}"] = call_ms(
            lambda L=L: backbone(prompt[None, :L], cache, output_hidden_states=True), reps,
            lambda L=L: cache.rollback(L))
        if static is not None:
            costs[f"fast path, {tokens}"], quartiles[f"fast path, {tokens}"] = call_ms(
                (lambda: decode_step(backbone, prompt[-1:], static)) if L == 1 else
                (lambda L=L: block_logits(backbone, prompt[None, :L], static, T + L)), reps, back_to_prompt)
    for name, drafter in drafters.items():
        state = drafter.begin(backbone, out, prompt[None])
        costs[f"{name} propose"], quartiles[f"{name} propose"] = call_ms(
            lambda d=drafter, s=state: d.propose(backbone, s, int(prompt[-1]), T), reps)
    return costs


def mtp_train_config(cfg: SpecBenchConfig, block: int) -> MTPTrainConfig:
    """The MTP module's training knobs: the block drafter's (data, steps, lr, γ), at the same block budget."""
    knobs = {k: v for k, v in cfg.train.to_dict().items() if k != "drafter"}
    knobs["steps"] = cfg.mtp_steps or knobs["steps"]
    return MTPTrainConfig.from_dict({**knobs, "mtp": {"block_size": block, "gamma": cfg.train.drafter.gamma,
                                                      "num_layers": cfg.mtp_layers}})


def held_out_prompts(cfg: SpecBenchConfig, streams: dict[str, torch.Tensor],
                     g: torch.Generator | None = None) -> tuple[torch.Tensor, int]:
    """``cfg.prompts`` prompts [n, prompt_len] from held-out text, and the tokens to generate per prompt.

    Drawn with ``g`` (default: a generator seeded with ``cfg.seed``); a caller that goes on drawing passes its own."""
    val = streams["val"].long()
    g = g or torch.Generator().manual_seed(cfg.seed)
    starts = torch.randint(0, len(val) - cfg.prompt_len, (cfg.prompts,), generator=g)
    prompts = torch.stack([val[s : s + cfg.prompt_len] for s in starts.tolist()])
    return prompts, min(cfg.new_tokens, 24) if cfg.quick else cfg.new_tokens


def drafter_dir(cfg: SpecBenchConfig, kind: str, block: int, seed_offset: int = 0) -> str:
    """Checkpoint folder of one drafter: ``drafter-B6`` / ``mtp-B6`` for the first seed, ``…-s1``, ``…-s2`` after."""
    return f"{run_dir(cfg)}/{kind}-B{block}" + (f"-s{seed_offset}" if seed_offset else "")


def run_spec_bench(cfg: SpecBenchConfig, progress: bool = True) -> dict:
    """Train ``seeds`` block drafters per block size and ``seeds`` MTP modules per MTP budget on the pre-trained
    backbone (``quick_seeds`` of them in a quick run: the result's ``seeds``), then measure each at each temperature
    (Report §2, §6).

    For every drafter seed, temperature and round, every drafter decodes the same prompts in turn (each time
    alternating plain and speculative decoding, :func:`measure`), so the drafters of one round share the
    machine's state: ``rows`` give the accepted length as mean ± sd over seeds and tok/s and speedup as median
    and min–max over seeds × rounds; ``seed_rows`` keep each seed's measurement, and :func:`throughput_ratios`
    pairs two drafters round by round."""
    say = (lambda msg: print(f"[bench-spec] {msg}", flush=True)) if progress else None
    backbone, _, streams = backbone_and_streams(cfg)
    prompts, new_tokens = held_out_prompts(cfg, streams)
    quick = {"steps": 20, "self_generated": 8} if cfg.quick else {}
    drafters: dict[str, list] = {}
    logs: dict[int, list] = {}
    mtp_logs: dict[int, list] = {}
    for s in range(n_seeds(cfg)):
        seed = {"seed": cfg.train.seed + s}
        for B in cfg.block_sizes:
            trained = train_drafter(backbone, streams["train"].long(),
                                    cfg.train.override({"drafter.block_size": B, **quick, **seed}),
                                    out_dir=drafter_dir(cfg, "drafter", B, s))
            drafters.setdefault(f"block B={B}", []).append(trained["drafter"])
            logs.setdefault(B, []).append(trained["log"])
        for B in cfg.mtp_block_sizes:
            trained = train_mtp(backbone, streams["train"].long(),
                                mtp_train_config(cfg, B).override({**quick, **seed}),
                                out_dir=drafter_dir(cfg, "mtp", B, s))
            drafters.setdefault(f"MTP B={B}", []).append(trained["drafter"])
            mtp_logs.setdefault(B, []).append(trained["log"])
    cost_quartiles: dict[str, tuple[float, float]] = {}
    costs = step_costs(backbone, {k: v[0] for k, v in drafters.items()}, prompts[0],
                       tuple(sorted({*cfg.block_sizes, *cfg.mtp_block_sizes})), quartiles=cost_quartiles,
                       fast=cfg.fast_path)
    per: dict[tuple[str, float, int], list[dict]] = {}
    for s in range(n_seeds(cfg)):
        for T in cfg.temperatures:
            for r in range(cfg.rounds):
                for name, seeded in drafters.items():
                    if say:
                        say(f"{name}, seed {s}, temperature {T}, round {r + 1}/{cfg.rounds}")
                    per.setdefault((name, T, s), []).append(
                        measure(backbone, seeded[s], prompts, new_tokens, T, cfg.seed, 1, say, cfg.fast_path))
    seed_rows = [{**ms[0], "name": name, "seed": cfg.train.seed + s,
                  "spec_tok_s_rounds": [m["spec_tok_s"] for m in ms], "speedup_rounds": [m["speedup"] for m in ms],
                  "plain_tok_s_rounds": [m["plain_tok_s"] for m in ms],
                  **({"fast_tok_s_rounds": [m["fast_tok_s"] for m in ms],
                      "fast_spec_tok_s_rounds": [m["fast_spec_tok_s"] for m in ms],
                      "speedup_fast_rounds": [m["speedup_fast"] for m in ms]} if cfg.fast_path else {})}
                 for (name, T, s), ms in per.items()]
    rows = []
    for name in drafters:
        for T in cfg.temperatures:
            mine = [r for r in seed_rows if r["name"] == name and r["temperature"] == T]
            acc = spread([r["accepted_length"] for r in mine], with_values=True)
            timing = {k: spread([v for r in mine for v in r[f"{k}_rounds"]], with_values=True)
                      for k in ("plain_tok_s", "spec_tok_s", "speedup")
                      + (("fast_tok_s", "fast_spec_tok_s", "speedup_fast") if cfg.fast_path else ())}
            K = len(mine[0]["acceptance_by_position"])
            rows.append({"drafter": mine[0]["drafter"], "name": name, "block": mine[0]["block"], "temperature": T,
                         "accepted_length": acc["mean"], "accepted_length_sd": acc["sd"],
                         "accepted_length_range": (acc["min"], acc["max"]), "accepted_lengths": acc["values"],
                         **{k: statistics.median(t["values"]) for k, t in timing.items()},
                         **{f"{k}_range": (t["min"], t["max"]) for k, t in timing.items()},
                         "seeds": len(mine), "rounds": cfg.rounds,
                         "acceptance_by_position": [statistics.mean(r["acceptance_by_position"][k] for r in mine)
                                                    for k in range(K)],
                         "acceptance_by_position_by_seed": [r["acceptance_by_position"] for r in mine]})
    return {"rows": rows, "seed_rows": seed_rows, "drafter_logs": logs, "mtp_logs": mtp_logs, "backbone": backbone,
            "seeds": n_seeds(cfg), "costs": costs, "cost_quartiles": cost_quartiles,
            "drafters": {k: v[0] for k, v in drafters.items()}, "drafters_by_seed": drafters}


def throughput_ratios(seed_rows: list[dict], a: str, b: str, temperature: float) -> list[float]:
    """Speculative tok/s of drafter ``a`` over drafter ``b`` (names as ``"block B=6"``), one ratio per drafter
    seed and round: the two decoded the same prompts back to back in that round. Unknown names raise."""
    pick = {(r["name"], r["seed"]): r["spec_tok_s_rounds"] for r in seed_rows if r["temperature"] == temperature}
    names = sorted({n for n, _ in pick})
    for n in (a, b):
        if n not in names:
            raise ValueError(f"throughput_ratios: no drafter {n!r} at temperature {temperature}; measured: {names}")
    seeds = sorted({s for _, s in pick})
    return [x / y for s in seeds for x, y in zip(pick[(a, s)], pick[(b, s)])]


def markdown(rows: list[dict]) -> str:
    """Accepted length as mean ± sd over drafter seeds (one seed: the value); tok/s and speedup as the median over
    seeds × rounds, min–max in brackets."""
    fast = all("fast_tok_s" in r for r in rows)  # plain decoding on the fast path too: two more columns
    head = ("| drafter | block B | temperature | seeds | mean accepted length | plain tok/s | speculative tok/s | "
            "speedup |" + (" fast path: plain tok/s | fast path: speculative tok/s | fast path: speedup |" if fast
                           else "") + "\n|" + "---|" * (11 if fast else 8) + "\n")

    def rng(r, key, fmt):
        lo, hi = r.get(f"{key}_range", (r[key], r[key]))
        return f"{r[key]:{fmt}} ({lo:{fmt}}–{hi:{fmt}})"

    def acc(r):
        return f"{r['accepted_length']:.2f}" + (f" ± {r['accepted_length_sd']:.2f}" if r.get("seeds", 1) > 1 else "")

    return head + "\n".join(f"| {r.get('drafter', 'block')} | {r['block']} | {r['temperature']} | "
                            f"{r.get('seeds', 1)} | {acc(r)} | {rng(r, 'plain_tok_s', '.0f')} | "
                            f"{rng(r, 'spec_tok_s', '.0f')} | {rng(r, 'speedup', '.2f')}× |"
                            + (f" {rng(r, 'fast_tok_s', '.0f')} | {rng(r, 'fast_spec_tok_s', '.0f')} | "
                               f"{rng(r, 'speedup_fast', '.2f')}× |" if fast else "")
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

    PRESETS = {"tiny": {}, "pays": {"bench": SpecBenchConfig.PRESETS["pays"]}}


def run_drafter_refresh(cfg: DrafterRefreshConfig) -> dict:
    """Accepted length: old drafter on the old policy → on the updated policy (stale) → after retraining on the
    updated policy's own text (refreshed). Report §6 retrains the draft model on RL trajectories."""
    bench = cfg.bench.override({"quick": cfg.quick})
    backbone, _, streams = backbone_and_streams(bench)
    train = streams["train"].long()
    g = torch.Generator().manual_seed(bench.seed)  # prompts first, then the policy update's batches
    prompts, new_tokens = held_out_prompts(bench, streams, g)
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
