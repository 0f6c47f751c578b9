"""GPU benchmark: the chip's bf16 matmul rate, then a training step and a prefill of the kit decoder, with MFU.

    python benchmarks/bench_gpu.py --device cuda --shape issue --out benchmarks/RESULTS_gpu.md   # one H200: 2-3 min
    python benchmarks/bench_gpu.py --device cpu --shape tiny --out /tmp/gpu_smoke.md             # CPU smoke: ~30 s

Sub-benchmarks, in order (each one's failure, e.g. an OOM, is a row of the table, never the end of the script):

1. **matmul**: ``C = A @ B`` on square bf16 matrices (8192³ on the GPU); median of timed samples after warm-up, each
   sample long enough (≥ 20 ms) that launch and synchronisation costs vanish. The best size is the *measured peak*.
2. **train**: one step of the kit decoder on ``train_tokens`` tokens: bf16 autocast forward, cross-entropy,
   backward, grad clip, AdamW step on fp32 master weights (the pre-training loop's ``build_optimizer``).
3. **prefill**: forward without grad of ``prefill_tokens`` tokens, weights in bf16 (router fp32), logits of the last
   position only, as a server prefills.
4. **memory copy** and **decode**: the bandwidth a copy reaches, then one batch-1 decode step at
   ``decode_context`` cached tokens (bf16), the eager static-cache step and the compiled one (a CUDA graph on
   CUDA), against the HBM bound: the bytes a step must read (:func:`decode_bytes`) ÷ bandwidth.
5. **kit vs transformers**: prefill of ``compare_tokens`` tokens by the kit and by transformers'
   ``MiMoV2FlashForCausalLM`` (eager attention: the only one it offers this model, for the sinks) on the same bf16
   weights (shared tensors, no copy); the note gives the speed ratio and how far the two models' logits differ.

Train and prefill run once per attention kernel of ``kernels`` (``MiMoConfig.attention_kernel``): ``eager``, the
previous kernels (SDPA for GA, the blocked SWA), then ``flex`` (FlexAttention, compiled), the same weights; a
later kernel's prefill row notes how far its logits are from the first's. Off CUDA the flex training row is
skipped (FlexAttention has no CPU backward).

FLOPs counted (model FLOPs, as in PaLM's MFU: what the maths needs, not what the kernels happen to compute):

.. math:: F_{\\text{fwd}} = 2 N T \\;+\\; 2 N_{\\text{head}} T_{\\text{logits}}
          \\;+\\; \\sum_{\\ell} 2\\, H (d_{qk} + d_v)\\, P_\\ell(T), \\qquad F_{\\text{train}} = 3 F_{\\text{fwd}}

- N + N_head = N_active: the weights one token multiplies, i.e. ``count_parameters(cfg)["active"]`` (attention
  projections, dense FFN, k of E experts, router, LM head) less the embedding table (a lookup), the norms and the
  SWA sinks (elementwise). The LM head N_head is apart because a prefill computes logits for T_logits = 1 position
  only (train: T_logits = T). Backward = 2 × forward, hence 6·N_active·T for a training step.
- P_ℓ(T): query-key pairs of layer ℓ on a sequence of T tokens. GA layers are causal and we count **the causal
  half**, P = T(T+1)/2 (what a causal flash kernel computes; the full T² would double the GA share). SWA layers
  count the band: P = Σ_i min(i+1, W) = W(W+1)/2 + (T−W)·W for T ≥ W (W = ``sliding_window``, keys incl. the
  query). The kit's blocked SWA kernel scores each W-block of queries against W + W − 1 keys, i.e. about twice
  the counted SWA pairs; that extra work is not model FLOPs and is not counted.
- Not counted: RoPE, norms, softmax, SwiGLU, routing top-k, gathers and scatters, the optimiser (elementwise).

MFU = (F per iteration / median seconds per iteration) ÷ peak, for two peaks: the matmul rate measured in step 1,
and 790 TFLOP/s (the H200's dense bf16 figure). ``--budget`` seconds bound the whole run: a sub-benchmark that
cannot start in time is recorded as skipped, and timed loops stop early (at least one timed sample each).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from mimo_kit.config.base import Config, knob
from mimo_kit.model.config import FULL, MiMoConfig
from mimo_kit.model.decoder import MiMoForCausalLM
from mimo_kit.model.params import count_parameters
from mimo_kit.nb import markdown_table
from mimo_kit.optim import OptimConfig, build_optimizer

H200_BF16_TFLOPS = 790.0  # dense bf16 tensor-core peak of one H200 (no sparsity)

#: The issue's shape: hidden 2048, 12 layers (GA at 0, 5, 11: transformers' every-6th rule), 32 heads of 64,
#: 64 experts top-8 of width 768, window 128, vocab 32768. The dense first layer is k × the expert width (6144), as
#: Flash's 16384 = 8 × 2048; KV heads 4 GA / 8 SWA as Flash. 3.62B parameters, 0.71B active.
ISSUE_MODEL = dict(vocab_size=32768, hidden_size=2048, num_hidden_layers=12, global_layers=(0, 5, 11),
                   dense_layers=(0,), num_attention_heads=32, num_key_value_heads=4, swa_num_key_value_heads=8,
                   head_dim=64, v_head_dim=64, intermediate_size=6144, n_routed_experts=64, num_experts_per_tok=8,
                   moe_intermediate_size=768, sliding_window=128, max_position_embeddings=16384)


@dataclasses.dataclass
class BenchGPUConfig(Config):
    model: MiMoConfig = dataclasses.field(default_factory=MiMoConfig)
    matmul_sizes: tuple[int, ...] = knob((256, 512), "tiny: CPU-sized squares; issue: 4096³ and 8192³")
    train_tokens: int = knob(128, "tiny: a smoke run in seconds on 2 cores; one sequence per step", min=2)
    prefill_tokens: int = knob(512, "tokens of one prefill (one sequence); tiny: 32 windows", min=1)
    compare_tokens: int = knob(128, "prefill length of the kit-vs-transformers rows (eager attention is T²)", min=1)
    warmup: int = knob(1, "untimed calls before timing (the first allocates optimiser state and workspaces)", min=1)
    repeats: int = knob(2, "timed samples per measurement; the median is reported", min=1)
    matmul_sample_s: float = knob(0.02, "each matmul sample loops until it lasts this long (launches amortised)",
                                  min=0.0)
    seed: int = knob(0, "weights and token ids", min=0)
    kernels: tuple[str, ...] = knob(("eager", "flex"), "attention kernels timed side by side: the reference first")
    decode_context: int = knob(256, "tokens in the cache of the batch-1 decode rows; tiny: 16 windows", min=1)
    decode_repeats: int = knob(5, "timed samples of a decode step (each ≥ matmul_sample_s of steps)", min=1)
    copy_mib: int = knob(64, "MiB copied by the bandwidth row; issue: 1 GiB, far past every cache", min=1)

    PRESETS = {
        "tiny": {},
        "issue": {"model": ISSUE_MODEL, "matmul_sizes": (4096, 8192), "train_tokens": 4096, "prefill_tokens": 16384,
                  "compare_tokens": 4096, "warmup": 2, "repeats": 10, "decode_context": 8192, "decode_repeats": 10,
                  "copy_mib": 1024},
    }


# ---- FLOPs ----------------------------------------------------------------------------------------------------
def attention_pairs(T: int, window: int | None = None) -> int:
    """Query-key pairs of one causal sequence of T tokens: Σ_i min(i + 1, W); W = None (GA) gives T(T+1)/2."""
    if window is None or window >= T:
        return T * (T + 1) // 2
    return window * (window + 1) // 2 + (T - window) * window


def matmul_params(cfg: MiMoConfig) -> dict[str, int]:
    """``{"body": N, "head": N_head}``: weights one token multiplies, the LM head apart (the module docstring)."""
    c = count_parameters(cfg)
    n_swa = sum(t != FULL for t in cfg.layer_types)
    sinks = n_swa * cfg.num_attention_heads
    head = c["embeddings"] if cfg.tie_word_embeddings else c["LM head"]  # tied: the table (counted once) is the head
    return {"body": c["active"] - c["embeddings"] - c["norms"] - sinks - c["LM head"], "head": head}


def forward_flops(cfg: MiMoConfig, T: int, batch: int = 1, logits: int | None = None) -> dict[str, float]:
    """Model FLOPs of one forward over ``batch`` sequences of T tokens, LM head on ``logits`` positions (None = T).

    Returns ``{"matmul", "attention", "total"}``: 2·N·T·B + 2·N_head·T_logits·B and Σ_ℓ 2·H·(d_qk+d_v)·P_ℓ·B.
    """
    n = matmul_params(cfg)
    kept = T if logits is None else min(logits, T)
    mm = 2.0 * batch * (n["body"] * T + n["head"] * kept)
    per_pair = 2.0 * cfg.num_attention_heads * (cfg.head_dim + cfg.v_head_dim)  # QKᵀ and PV, one pair, all heads
    attn = sum(per_pair * batch * attention_pairs(T, None if t == FULL else cfg.sliding_window)
               for t in cfg.layer_types)
    return {"matmul": mm, "attention": attn, "total": mm + attn}


def train_flops(cfg: MiMoConfig, T: int, batch: int = 1) -> dict[str, float]:
    """3 × the forward with every position's logits: 6·N·tokens + 3 × attention."""
    return {k: 3.0 * v for k, v in forward_flops(cfg, T, batch).items()}


def decode_bytes(cfg: MiMoConfig, context: int, weight_bytes: int = 2) -> dict[str, float]:
    """Bytes one batch-1 decode step at ``context`` cached tokens must read from memory (its HBM bound):

    .. math:: \\text{weights} = b\\,(N_{\\text{active}} - N_{\\text{emb}} + H) + 2\\,N_{\\text{router}}, \\qquad
              \\text{KV} = b \\sum_\\ell n_{kv,\\ell}\\,(d_{qk} + d_v)\\,\\min(C, W_\\ell)

    with b = 2 bytes (bf16; the router is fp32: 2 more per weight), one embedding row of the table, C = ``context``
    (+ the new token), W_ℓ = the window on SWA layers, C on GA layers. Activations are not counted (kilobytes)."""
    c = count_parameters(cfg)
    weights = weight_bytes * (c["active"] - c["embeddings"] + cfg.hidden_size) + 2 * c["router"]
    kv = 0
    for t in cfg.layer_types:
        heads = cfg.num_key_value_heads if t == FULL else cfg.swa_num_key_value_heads
        keys = context + 1 if t == FULL else min(context + 1, cfg.sliding_window)
        kv += weight_bytes * heads * (cfg.head_dim + cfg.v_head_dim) * keys
    return {"weights": float(weights), "kv": float(kv), "total": float(weights + kv)}


#: nominal HBM bandwidth (bytes/s) by GPU name: H200 4.8 TB/s, H100 SXM 3.35 TB/s, H100 PCIe 2.0 TB/s (data sheets)
NOMINAL_HBM = (("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12))


def nominal_bandwidth(device: torch.device) -> tuple[str, float] | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next(((key, bw) for key, bw in NOMINAL_HBM if key in name), None)


# ---- timing ---------------------------------------------------------------------------------------------------
class Budget:
    """Seconds left of the run's time budget."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


class Skipped(Exception):
    """Not started: the time budget is spent."""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, budget: Budget, *, warmup: int, repeats: int,
          min_sample_s: float = 0.0) -> list[float]:
    """Seconds per call of ``fn``: ``warmup`` untimed calls, then up to ``repeats`` samples (synchronised around
    each), a sample looping ``fn`` until it lasts ``min_sample_s``. Stops early when the budget runs short."""
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    once = time.perf_counter() - t0
    inner = max(1, math.ceil(min_sample_s / max(once, 1e-9)))
    times: list[float] = []
    while len(times) < repeats and (not times or budget.left() > 2 * inner * once):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / inner)
    return times


@dataclasses.dataclass
class Row:
    """One line of the table; ``flop`` and ``seconds`` are per iteration (seconds: the median sample)."""

    workload: str
    tokens: int | None = None
    flop: float | None = None
    seconds: float | None = None
    samples: int = 0
    peak_bytes: int | None = None
    note: str = ""
    is_matmul: bool = False
    read_bytes: float | None = None  # decode rows: bytes a step must read (weights it touches, its keys and values)
    failed: bool = False  # an error: no numbers, the note says why
    skipped: bool = False  # not run: the time budget was spent


def reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def build_model(cfg: MiMoConfig, device: torch.device, dtype: torch.dtype = torch.float32,
                seed: int = 0) -> MiMoForCausalLM:
    """The kit decoder built on ``device`` (no CPU copy of the weights); bf16 keeps the router fp32, as
    ``mimo_kit.model.hf.load_checkpoint`` does."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = MiMoForCausalLM(cfg)
    if dtype != torch.float32:
        model.to(dtype)
        for m in model.moe_layers():
            m.gate.float()
    return model


def token_ids(cfg: MiMoConfig, n: int, device: torch.device, seed: int) -> torch.Tensor:
    """[1, n] random ids drawn on the CPU (the same on every device)."""
    return torch.randint(0, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed)).to(device)


# ---- the experts under autocast -------------------------------------------------------------------------------
def expert_gemm_precision(device: torch.device) -> str:
    """Which precision the kit's expert GEMMs run at under bf16 autocast with fp32 weights, read off the result:
    equal to the fp32 product (≲ 1e-6 relative) or off by bf16 rounding (~1e-3). ``torch._grouped_mm`` is not on
    autocast's list, so :func:`mimo_kit.model.moe.grouped_matmul` casts its operands itself: bf16 is expected."""
    from mimo_kit.model.moe import grouped_matmul

    g = torch.Generator().manual_seed(0)
    E, n, d = 4, 64, 64  # 4 experts × 64 rows of width 64: aligned, enough rows for the grouped kernel
    xs, w = torch.randn(E * n, d, generator=g).to(device), torch.randn(E, d, d, generator=g).to(device)
    counts = torch.full((E,), n, dtype=torch.long, device=device)
    ref = grouped_matmul(xs, w, counts)
    with autocast(device):
        got = grouped_matmul(xs, w, counts)
    err = float((got.float() - ref).norm() / ref.norm())
    kind = "float32" if err < 1e-4 else "bf16"
    return f"{kind} (relative difference from the fp32 product {err:.1e})"


# ---- sub-benchmarks -------------------------------------------------------------------------------------------
def bench_matmul(cfg: BenchGPUConfig, device: torch.device, budget: Budget) -> list[Row]:
    rows = []
    for n in cfg.matmul_sizes:
        def one(n=n) -> Row:
            torch.manual_seed(cfg.seed)
            a, b, c = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(3))  # [n, n]; c = out
            times = timed(lambda: torch.mm(a, b, out=c), device, budget, warmup=cfg.warmup, repeats=cfg.repeats,
                          min_sample_s=cfg.matmul_sample_s)
            return Row(f"matmul bf16 {n}³", flop=2.0 * n**3, seconds=statistics.median(times), samples=len(times),
                       is_matmul=True)

        rows.append(guarded(f"matmul bf16 {n}³", one, device, budget, need_s=2.0))
    return rows


def with_kernel(cfg: BenchGPUConfig, kernel: str) -> MiMoConfig:
    return dataclasses.replace(cfg.model, attention_kernel=kernel)


def bench_train(cfg: BenchGPUConfig, device: torch.device, budget: Budget, kernel: str = "eager") -> Row:
    T = cfg.train_tokens
    if kernel == "flex" and device.type != "cuda":
        raise Skipped("FlexAttention has no backward off CUDA")
    model = build_model(with_kernel(cfg, kernel), device, seed=cfg.seed).train()  # fp32 master weights
    opt = build_optimizer(model, OptimConfig())  # AdamW on every group, the pre-training loop's set
    ids = token_ids(cfg.model, T + 1, device, cfg.seed)
    x, y = ids[:, :-1], ids[:, 1:]  # [1, T] each: next-token targets
    losses: list[torch.Tensor] = []

    def step() -> None:
        with autocast(device):
            loss = F.cross_entropy(model(x).logits.flatten(0, 1).float(), y.flatten())  # mean over T targets
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())

    times = timed(step, device, budget, warmup=cfg.warmup, repeats=cfg.repeats)
    first, last = float(losses[0]), float(losses[-1])
    if not all(math.isfinite(float(v)) for v in losses):
        raise FloatingPointError(f"non-finite training loss: {[float(v) for v in losses]}")
    return Row("", tokens=T, flop=train_flops(cfg.model, T)["total"], seconds=statistics.median(times),
               samples=len(times), peak_bytes=peak_memory(device), note=f"loss {first:.3f} → {last:.3f}")


def bench_prefill(cfg: BenchGPUConfig, device: torch.device, budget: Budget, kernel: str = "eager",
                  reference: dict | None = None) -> Row:
    """A bf16 prefill; ``reference`` (a dict) keeps the first kernel's last-position logits, and a later kernel's
    row notes how far its logits are from them (the same weights: bf16 rounding apart, equal)."""
    T = cfg.prefill_tokens
    model = build_model(with_kernel(cfg, kernel), device, torch.bfloat16, cfg.seed).eval()
    ids = token_ids(cfg.model, T, device, cfg.seed)
    with torch.no_grad():
        logits = model(ids, logits_to_keep=1).logits.float()[0, -1]  # [V]
        times = timed(lambda: model(ids, logits_to_keep=1), device, budget, warmup=cfg.warmup, repeats=cfg.repeats)
    note = ""
    if reference is not None:
        if "logits" in reference:
            ref = reference["logits"]
            note = (f"last-position logits differ from the {reference['kernel']} kernel's by "
                    f"{float((logits - ref).norm() / ref.norm()):.1e} (relative)")
        else:
            reference.update(logits=logits, kernel=kernel)
    return Row("", tokens=T, flop=forward_flops(cfg.model, T, logits=1)["total"], seconds=statistics.median(times),
               samples=len(times), peak_bytes=peak_memory(device), note=note)


def bench_copy(cfg: BenchGPUConfig, device: torch.device, budget: Budget) -> Row:
    """The memory bandwidth a kernel reaches: a copy of ``copy_mib`` MiB reads and writes each byte once."""
    n = cfg.copy_mib << 20
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    times = timed(lambda: dst.copy_(src), device, budget, warmup=cfg.warmup, repeats=cfg.repeats,
                  min_sample_s=cfg.matmul_sample_s)
    seconds = statistics.median(times)
    return Row("", seconds=seconds, samples=len(times), read_bytes=2.0 * n,
               note=f"{2 * n / seconds / 1e9:,.0f} GB/s (read + write)")


def bench_decode(cfg: BenchGPUConfig, device: torch.device, budget: Budget, compiled: bool) -> Row:
    """One token of one row after ``decode_context`` cached tokens, bf16 weights: the static-cache step eagerly
    or compiled (on CUDA a CUDA graph). Each timed step is rewound, so every step reads the same keys."""
    from mimo_kit.model.fast_decode import StaticKVCache, decode_step

    C = cfg.decode_context
    model = build_model(cfg.model, device, torch.bfloat16, cfg.seed).eval()
    cache = StaticKVCache(cfg.model, 1, C + 1, dtype=torch.bfloat16, device=device)
    tok = torch.zeros(1, dtype=torch.long, device=device)

    def step() -> None:
        decode_step(model, tok, cache, compiled=compiled)
        cache.lengths.sub_(1)
        cache.span -= 1

    with torch.no_grad():
        cache.prefill(model, token_ids(cfg.model, C, device, cfg.seed).tolist())
        times = timed(step, device, budget, warmup=cfg.warmup + 2 * compiled, repeats=cfg.decode_repeats,
                      min_sample_s=cfg.matmul_sample_s)
    return Row("", tokens=1, seconds=statistics.median(times), samples=len(times), peak_bytes=peak_memory(device),
               read_bytes=decode_bytes(cfg.model, C)["total"])


def bench_compare(cfg: BenchGPUConfig, device: torch.device, budget: Budget) -> list[Row]:
    """The kit and transformers' eager model on one set of bf16 weights; two rows (the second notes the ratio)."""
    from transformers import MiMoV2FlashForCausalLM

    from mimo_kit.model.hf import to_hf

    T = cfg.compare_tokens
    flop = forward_flops(cfg.model, T, logits=1)["total"]
    kit = build_model(cfg.model, device, torch.bfloat16, cfg.seed).eval()
    with torch.device(device):
        hf = MiMoV2FlashForCausalLM(to_hf(cfg.model))
    hf.config._attn_implementation = "eager"
    hf.load_state_dict(kit.state_dict(), assign=True)  # hf's own weights are dropped: both run the kit's tensors
    hf.eval()
    gc.collect()
    ids = token_ids(cfg.model, T, device, cfg.seed)
    with torch.no_grad():  # the same weights and maths: bf16 rounding apart, the same last-position logits
        a, b = kit(ids, logits_to_keep=1).logits.float(), hf(ids, logits_to_keep=1).logits.float()
    agree = f"last-position logits differ by {float((a - b).norm() / b.norm()):.1e} (relative)"
    rows = []
    for name, model in (("kit", kit), ("transformers eager", hf)):
        if rows and budget.left() < 5:
            rows.append(Row(f"prefill {T} tok, {name}", note="skipped: time budget", skipped=True))
            continue
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with torch.no_grad():
            times = timed(lambda m=model: m(ids, logits_to_keep=1), device, budget, warmup=1, repeats=cfg.repeats)
        rows.append(Row(f"prefill {T} tok, {name}", tokens=T, flop=flop, seconds=statistics.median(times),
                        samples=len(times), peak_bytes=peak_memory(device), note="weights shared by both models"))
    if len(rows) == 2 and rows[0].seconds and rows[1].seconds:
        speed = rows[1].seconds / rows[0].seconds  # reference time ÷ kit time: > 1 means the kit is faster
        rows[1].note = f"kit speed {speed:.2f}× the reference ({'faster' if speed > 1 else 'slower'}); {agree}"
    return rows


def guarded(name: str, fn: Callable[[], Row | list[Row]], device: torch.device, budget: Budget,
            need_s: float) -> Row | list[Row]:
    """``fn()`` with its rows named, or a failed row saying why (an exception, an OOM, or no time left)."""
    reset_memory(device)
    message, skipped = None, False
    try:
        if budget.left() < need_s:
            raise Skipped(f"time budget: {budget.left():.0f} s left, needs ~{need_s:.0f} s")
        out = fn()
    except Skipped as e:
        message, skipped = f"skipped: {e}", True
    except Exception as e:  # noqa: BLE001 - an OOM or a kernel error is a result to report, not a crash
        first = (str(e).strip().splitlines() or [""])[0]
        message = f"error: {type(e).__name__}: {first[:160]}"
    if message is not None:  # outside the except block: the traceback's frames (and their tensors) are freed
        out = Row(name, note=message.replace("|", "/"), failed=not skipped, skipped=skipped)
        print(f"  {name}: {message}", file=sys.stderr, flush=True)
    reset_memory(device)
    if isinstance(out, Row) and not out.workload:
        out.workload = name
    return out


# ---- the run --------------------------------------------------------------------------------------------------
def run(cfg: BenchGPUConfig, device: torch.device, budget_s: float, compare: bool = True,
        progress: Callable[[str], None] = print) -> dict:
    budget = Budget(budget_s)
    T, P, C = cfg.train_tokens, cfg.prefill_tokens, cfg.compare_tokens
    rows: list[Row] = []

    progress("matmul")
    rows += bench_matmul(cfg, device, budget)
    for kernel in cfg.kernels:  # the reference kernel first: the previous kernels' rows, then the fused ones
        progress(f"train step, {kernel} attention")
        rows.append(guarded(f"train {T} tok (fwd+bwd+AdamW), {kernel} attention",
                            lambda k=kernel: bench_train(cfg, device, budget, k), device, budget, need_s=20.0))
    reference: dict = {}
    for kernel in cfg.kernels:
        progress(f"prefill, {kernel} attention")
        rows.append(guarded(f"prefill {P} tok, {kernel} attention",
                            lambda k=kernel: bench_prefill(cfg, device, budget, k, reference), device, budget,
                            need_s=10.0))
    progress("memory copy")
    rows.append(guarded(f"memory copy {cfg.copy_mib} MiB", lambda: bench_copy(cfg, device, budget), device, budget,
                        need_s=2.0))
    D = cfg.decode_context
    for compiled in (False, True):
        name = "compiled step" + (" (CUDA graph)" if device.type == "cuda" else "") if compiled else "eager step"
        progress(f"decode, {name}")
        rows.append(guarded(f"decode 1 row at {D:,} tokens, {name}",
                            lambda c=compiled: bench_decode(cfg, device, budget, c), device, budget,
                            need_s=30.0 if compiled else 5.0))
    if compare:
        progress("kit vs transformers")
        out = guarded(f"prefill {C} tok, kit vs transformers", lambda: bench_compare(cfg, device, budget), device,
                      budget, need_s=15.0)
        rows += out if isinstance(out, list) else [out]
    matmuls = [r.flop / r.seconds for r in rows if r.is_matmul and r.seconds]
    try:
        precision = expert_gemm_precision(device)
    except Exception as e:  # noqa: BLE001 - a diagnostic; its failure is reported, not raised
        precision = f"unknown (the probe failed: {type(e).__name__}: {e})"
    copies = [r.read_bytes / r.seconds for r in rows if r.workload.startswith("memory copy") and r.seconds]
    return {"rows": rows, "peak": max(matmuls) if matmuls else None, "precision": precision,
            "flops": flop_table(cfg), "params": count_parameters(cfg.model),
            "bandwidth": copies[0] if copies else None, "nominal": nominal_bandwidth(device),
            "decode_bytes": decode_bytes(cfg.model, cfg.decode_context)}


def decode_table(result: dict) -> list[dict]:
    """Decode rows against the HBM bound: (bytes a step reads ÷ bandwidth) ÷ the step's time."""
    bw, nominal = result["bandwidth"], result["nominal"]
    out = []
    for r in result["rows"]:
        if not r.workload.startswith("decode") or not r.seconds:
            continue
        bound = {"measured copy bandwidth": bw, **({f"{nominal[0]} nominal": nominal[1]} if nominal else {})}
        out.append({"decode": r.workload, "ms / step": f"{1e3 * r.seconds:.3g}",
                    "tokens/s": f"{1 / r.seconds:,.0f}", "bytes read / step (GB)": f"{r.read_bytes / 1e9:.3g}",
                    "GB/s": f"{r.read_bytes / r.seconds / 1e9:,.4g}",
                    **{f"% of the bound ({k})": fmt(100 * r.read_bytes / r.seconds / v if v else None, ".3g", "%")
                       for k, v in bound.items()}})
    return out


def flop_table(cfg: BenchGPUConfig) -> list[dict]:
    """The FLOP count of each model workload, split into weight matmuls and attention (TFLOP per iteration)."""
    parts = [("train", cfg.train_tokens, train_flops(cfg.model, cfg.train_tokens), "6·(N + N_head)·T + 3·attn"),
             ("prefill", cfg.prefill_tokens, forward_flops(cfg.model, cfg.prefill_tokens, logits=1),
              "2·N·T + 2·N_head + attn"),
             ("compare prefill", cfg.compare_tokens, forward_flops(cfg.model, cfg.compare_tokens, logits=1),
              "2·N·T + 2·N_head + attn")]
    return [{"workload": name, "tokens": T, "formula": formula, "weight matmuls (TFLOP)": f"{f['matmul'] / 1e12:.4g}",
             "attention (TFLOP)": f"{f['attention'] / 1e12:.4g}", "total (TFLOP)": f"{f['total'] / 1e12:.4g}",
             "attention share": f"{100 * f['attention'] / f['total']:.1f}%"} for name, T, f, formula in parts]


def fmt(v: float | None, spec: str = ".3g", unit: str = "") -> str:
    return "—" if v is None else f"{v:{spec}}{unit}"


def table(result: dict) -> str:
    peak = result["peak"]
    lines = []
    for r in result["rows"]:
        rate = r.flop / r.seconds if r.flop and r.seconds else None
        lines.append({
            "workload": r.workload,
            "tokens": fmt(r.tokens, ","),
            "TFLOP / iter": fmt(r.flop / 1e12 if r.flop and not r.failed else None, ".4g"),
            "ms / iter": fmt(1e3 * r.seconds if r.seconds else None),
            "tokens/s": fmt(r.tokens / r.seconds if r.tokens and r.seconds else None, ",.0f"),
            "TFLOP/s": fmt(rate / 1e12 if rate else None),
            "MFU (measured peak)": fmt(100 * rate / peak if rate and peak and not r.is_matmul else None, ".3g", "%"),
            f"MFU ({H200_BF16_TFLOPS:.0f} TFLOP/s)": fmt(100 * rate / (H200_BF16_TFLOPS * 1e12) if rate else None,
                                                          ".3g", "%"),
            "peak mem (GiB)": fmt(r.peak_bytes / 2**30 if r.peak_bytes else None, ".1f"),
            "samples": r.samples or "—",
            "note": r.note,
        })
    return markdown_table(lines)


def environment(device: torch.device) -> str:
    import transformers

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        chip = f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor})"
    else:
        chip = f"CPU {platform.machine()} ({torch.get_num_threads()} torch threads)"
    return (f"{chip} · torch {torch.__version__} · CUDA {torch.version.cuda or 'none'} · transformers "
            f"{transformers.__version__} · Python {platform.python_version()} · fp32 matmul precision "
            f"{torch.get_float32_matmul_precision()!r} ('highest': no TF32) · {when}")


def count(n: float) -> str:
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.3f}M"


def report(cfg: BenchGPUConfig, shape: str, result: dict, device: torch.device, command: str) -> str:
    p = result["params"]
    model = ", ".join(f"{k} {v}" for k, v in cfg.model.summary().items())
    n = matmul_params(cfg.model)
    peak = result["peak"]
    peak_text = f"{peak / 1e12:.1f} TFLOP/s" if peak else "not measured (the matmul rows failed)"
    return "\n".join([
        f"# GPU benchmark: bf16 matmul rate, training step and prefill of the kit decoder ({shape} shape)",
        "",
        f"`{command}`",
        "",
        f"Environment: {environment(device)}",
        "",
        f"Model: {model}; dense FFN {cfg.model.intermediate_size} in layers {list(cfg.model.dense_layers)}, "
        f"experts of width {cfg.model.moe_intermediate_size}. Parameters: {count(p['total'])} total, "
        f"{count(p['active'])} active; FLOPs use N = {count(n['body'])} (active, less embeddings, norms, sinks and "
        f"LM head) and N_head = {count(n['head'])}.",
        "",
        f"Measured peak (best matmul row): {peak_text}. MFU = model FLOP/s ÷ that peak, and ÷ "
        f"{H200_BF16_TFLOPS:.0f} TFLOP/s (H200 dense bf16). Times are medians over `samples` timed iterations, "
        f"after {cfg.warmup} untimed warm-up iteration(s) and one untimed calibration iteration; peak memory is "
        "`torch.cuda.max_memory_allocated` since the row's model was built (weights included).",
        "",
        table(result),
        "",
        f"Expert GEMMs under bf16 autocast with fp32 weights ran in {result['precision']}.",
        "",
        f"Batch-1 decode against the HBM bound: a step at {cfg.decode_context:,} cached tokens must read "
        f"{result['decode_bytes']['weights'] / 1e9:.3g} GB of weights (bf16, the k chosen experts of each MoE layer, "
        f"the LM head) and {result['decode_bytes']['kv'] / 1e9:.3g} GB of keys and values (`decode_bytes` in "
        "`benchmarks/bench_gpu.py`); the bound is that many bytes at the copy row's bandwidth, or at the chip's "
        "nominal HBM bandwidth. The eager step is the kit's previous decode kernel (`decode_step`), the compiled "
        "one the same step under `torch.compile` (`mode=\"reduce-overhead\"` on CUDA: one CUDA graph per step).",
        "",
        markdown_table(decode_table(result)) if decode_table(result) else "(no decode row ran)",
        "",
        "FLOPs per iteration (model FLOPs: GA counted as the causal half T(T+1)/2, SWA as its band; formula in "
        "`benchmarks/bench_gpu.py`):",
        "",
        markdown_table(result["flops"]),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when available)")
    ap.add_argument("--shape", choices=("tiny", "issue"), default=None,
                    help="model and lengths: issue (default on cuda) or tiny (default on cpu; a smoke run)")
    ap.add_argument("--out", default=None, help="markdown file to write (default: benchmarks/RESULTS_gpu.md for the "
                    "issue shape, none for tiny)")
    ap.add_argument("--budget", type=float, default=200.0,
                    help="seconds the measurements may take in all (sub-benchmarks that cannot start are skipped)")
    ap.add_argument("--no-compare", action="store_true", help="skip the kit-vs-transformers rows")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    shape = args.shape or ("issue" if device.type == "cuda" else "tiny")
    cfg = BenchGPUConfig.preset(shape)
    out = args.out or (str(Path(__file__).with_name("RESULTS_gpu.md")) if shape == "issue" else None)
    command = "python benchmarks/bench_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"bench_gpu: {shape} shape on {device}; budget {args.budget:.0f} s", flush=True)
    result = run(cfg, device, args.budget, compare=not args.no_compare,
                 progress=lambda s: print(f"- {s}", flush=True))
    text = report(cfg, shape, result, device, command.strip())
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"→ {out}")
    return 1 if any(r.failed for r in result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
