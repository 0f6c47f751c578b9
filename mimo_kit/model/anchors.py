"""Decoder anchors: one decode step four ways, each against the memory-bandwidth bound (Report §2, §6).

A decode step is memory-bound: it reads the weights a token routes through and the KV cache it attends over, and
does little arithmetic per byte. Its speed is therefore best read two ways: against the other implementations on
the same weights, and against the bound ``tok/s ≤ batch × bandwidth / bytes a step must read``.

Four paths, timed per step on the same weights and the same context (one process, alternated, best of n):

* **kit eager**: :mod:`mimo_kit.model.fast_decode` (``StaticKVCache`` + ``decode_step``), what ``InProcessEngine``
  decodes with;
* **kit compiled**: the same step through ``torch.compile`` (one fixed-shape graph per cache);
* **transformers eager**: ``MiMoV2FlashForCausalLM.generate`` with its ``DynamicCache``;
* **transformers static + compile**: ``generate`` with ``cache_implementation="static"`` and a ``CompileConfig``
  (transformers' own fast path; it compiles off-GPU only when asked, ``_compile_all_devices``).

A transformers step is the time between two tokens its ``generate`` hands the streamer (:class:`StepClock`), the
first decode step left out; a kit step is one ``decode_step``. Both take the median step of a run.

Bytes a step must read (:func:`step_bytes`): every weight outside the routed experts (attention, norms, the dense
FFN layers, the LM head; one embedding row per sequence), the routed experts the batch is expected to touch
(``E · (1 − (1 − k/E)^B)`` of E experts per MoE layer, k chosen per token), and the KV each sequence attends over
(GA layers: the context; SWA layers: the window). The bandwidth is this machine's, measured by a large copy
(:func:`memory_bandwidth`: bytes read + written per second).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time

import torch

from mimo_kit.model.config import FULL, MiMoConfig
from mimo_kit.model.decoder import MiMoForCausalLM

PATHS = ("kit eager", "kit compiled", "transformers eager", "transformers static + compile")


def memory_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes per second a large ``copy_`` moves (read + write), best of ``repeats``."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def step_bytes(model: MiMoForCausalLM, batch: int, context: int) -> int:
    """Bytes one decode step of ``batch`` sequences at ``context`` tokens must read (the module docstring)."""
    cfg: MiMoConfig = model.config
    expert, other = 0, 0
    for name, p in model.named_parameters():
        size = p.numel() * p.element_size()
        if ".experts." in name:
            expert += size
        elif "embed_tokens" in name:
            other += batch * p.shape[-1] * p.element_size()  # one row per sequence
        else:
            other += size
    if model.config.tie_word_embeddings:  # the LM head is the embedding, read whole for the logits
        other += model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    touched = E * (1 - (1 - k / E) ** batch) / E if E else 0.0  # expected share of each layer's experts
    kv = 0
    itemsize = next(model.parameters()).element_size()
    for t in cfg.layer_types:
        if t == FULL:
            kv += context * cfg.num_key_value_heads * (cfg.head_dim + cfg.v_head_dim)
        else:
            kv += min(context, cfg.sliding_window) * cfg.swa_num_key_value_heads * (cfg.head_dim + cfg.v_head_dim)
    return int(other + touched * expert + batch * kv * itemsize)


class StepClock:
    """A transformers streamer that notes the time of every token ``generate`` hands it."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def median_step(self) -> float:
        """The median time between tokens, the prompt and the first decode step left out."""
        steps = [b - a for a, b in zip(self.times[2:], self.times[3:])]  # put 0: the prompt; 1: after prefill
        if not steps:
            raise ValueError("StepClock: fewer than three tokens were generated (no decode step after the first)")
        return statistics.median(steps)


@dataclasses.dataclass
class AnchorRow:
    path: str
    batch: int
    context: int
    step_s: float
    bound_tok_s: float

    @property
    def tok_s(self) -> float:
        return self.batch / self.step_s

    @property
    def share_of_bound(self) -> float:
        return self.tok_s / self.bound_tok_s


def _kit_step(kit: MiMoForCausalLM, ctx: torch.Tensor, steps: torch.Tensor, compiled: bool) -> float:
    from mimo_kit.model.fast_decode import StaticKVCache, decode_step

    batch, n = steps.shape
    cache = StaticKVCache(kit.config, batch, ctx.shape[1] + n + 1)
    cache.prefill(kit, ctx.tolist() * batch)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        decode_step(kit, steps[:, i], cache, compiled=compiled)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:] if len(times) > 1 else times)


def _hf_step(hf, ctx: torch.Tensor, batch: int, n: int, static: bool) -> float:
    from transformers import CompileConfig, GenerationConfig

    gc = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None,
                          cache_implementation="static" if static else None)
    if static:
        gc.compile_config = CompileConfig()
        gc.compile_config._compile_all_devices = True  # transformers compiles off-GPU only when told to
    clock = StepClock()
    hf.generate(ctx.expand(batch, -1), generation_config=gc, streamer=clock)
    return clock.median_step()


def anchor_rows(kit: MiMoForCausalLM, hf, shapes: tuple[tuple[int, int], ...], *, tokens: int = 16,
                repeats: int = 2, bandwidth: float | None = None, seed: int = 0, paths: tuple[str, ...] = PATHS,
                progress=None) -> tuple[list[AnchorRow], float]:
    """The ``paths`` at each (batch, context) of ``shapes``; ``hf`` is transformers' model on the same weights
    (None: the kit's rows alone). Returns the rows and the bandwidth (bytes/s) the bound used."""
    unknown = [p for p in paths if p not in PATHS]
    if unknown or "kit eager" not in paths:
        raise ValueError(f"anchor_rows: paths={paths}; expected 'kit eager' and any of {PATHS}")
    say = progress or (lambda s: None)
    bandwidth = bandwidth or memory_bandwidth()
    gen = torch.Generator().manual_seed(seed)
    rows = []
    with torch.no_grad():
        for batch, C in shapes:
            ctx = torch.randint(0, kit.config.vocab_size, (1, C), generator=gen)
            steps = torch.randint(0, kit.config.vocab_size, (batch, tokens), generator=gen)
            bound = batch * bandwidth / step_bytes(kit, batch, C)
            every = {"kit eager": functools.partial(_kit_step, kit, ctx, steps, False),
                     "kit compiled": functools.partial(_kit_step, kit, ctx, steps, True),
                     "transformers eager": functools.partial(_hf_step, hf, ctx, batch, tokens, False),
                     "transformers static + compile": functools.partial(_hf_step, hf, ctx, batch, tokens, True)}
            runs = {p: every[p] for p in paths if hf is not None or p.startswith("kit")}
            best = {p: float("inf") for p in runs}
            for r in range(repeats + 1):  # round 0 warms up (and compiles); the paths alternate in every round
                for path, fn in runs.items():
                    say(f"batch {batch} @ {C}: {path}, round {r}")
                    t = fn()
                    if r:
                        best[path] = min(best[path], t)
            rows += [AnchorRow(p, batch, C, best[p], bound) for p in runs]
    return rows, bandwidth


def anchors_markdown(rows: list[AnchorRow], bandwidth: float) -> str:
    head = ("| batch @ context | path | tok/s | × kit eager | share of the bandwidth bound |\n"
            "|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        base = next(x for x in rows if (x.batch, x.context, x.path) == (r.batch, r.context, "kit eager"))
        lines.append(f"| {r.batch} @ {r.context} | {r.path} | {r.tok_s:,.1f} | {r.tok_s / base.tok_s:.2f}× | "
                     f"{r.share_of_bound:.1%} (bound {r.bound_tok_s:,.0f} tok/s) |")
    note = f"\n\nBandwidth of this machine (copy, read + write): {bandwidth / 1e9:.1f} GB/s.\n"
    return head + "\n".join(lines) + note
