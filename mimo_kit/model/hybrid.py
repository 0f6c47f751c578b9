"""Hybrid SWA/GA vs all-GA: the same model trained twice on the same bytes (Report §2).

The report's backbone keeps 9 of 48 layers global; the rest see a window of 128 tokens. This experiment asks
what that costs in loss and what it saves in time at toy scale: both twins share every weight shape (a SWA layer
of the kit can have the GA layer's KV heads), only the attention pattern differs.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn.functional as F

from mimo_kit.config.base import Config, knob
from mimo_kit.corpus import batches, byte_corpus, split
from mimo_kit.live import progress_bar
from mimo_kit.model.config import MiMoConfig
from mimo_kit.model.decoder import MiMoForCausalLM


@dataclasses.dataclass
class HybridVsGlobalConfig(Config):
    model: MiMoConfig = dataclasses.field(default_factory=MiMoConfig)
    steps: int = knob(150, "tiny: the loss curves separate within a few hundred steps", min=1)
    quick_steps: int = knob(12, "quick mode: a smoke run", min=1)
    quick: bool = knob(False, "use quick_steps (notebooks set it from MIMO_KIT_QUICK)")
    batch: int = knob(8, "sequences per step", min=1)
    seq_len: int = knob(128, "8 windows of the tiny model: long enough for the window to matter", min=2)
    lr: float = knob(3e-3, "AdamW for a 100K-parameter toy", min=0.0)
    eval_every: int = knob(25, "steps between validation losses", min=1)
    corpus_bytes: int = knob(1_000_000, "stdlib source bytes used", min=10_000)
    seed: int = knob(0, "same data order and init for both twins", min=0)

    # SWA layers get the GA layers' KV heads, so the twins have identical parameter shapes
    PRESETS = {"tiny": {"model": {"swa_num_key_value_heads": 1}}}


def run_hybrid_vs_global(cfg: HybridVsGlobalConfig, return_models: bool = False) -> dict:
    """Train the hybrid (``cfg.model``) and its all-GA twin on the same batches; logs keyed ``hybrid`` / ``all-GA``.

    The twins take their steps alternately, so a busy machine slows both alike and the wall-clock comparison
    stays fair.
    """
    train, val = split(byte_corpus(cfg.corpus_bytes))
    all_ga = dataclasses.replace(cfg.model, global_layers=tuple(range(cfg.model.num_hidden_layers)))
    twins = {}
    for name, model_cfg in (("hybrid", cfg.model), ("all-GA", all_ga)):
        torch.manual_seed(cfg.seed)
        model = MiMoForCausalLM(model_cfg)
        twins[name] = {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=cfg.lr), "elapsed": 0.0,
                       "log": {"step": [], "tokens": [], "seconds": [], "loss": [], "val_step": [], "val_loss": []}}
    data = batches(train, cfg.batch, cfg.seq_len, torch.Generator().manual_seed(cfg.seed))
    vdata = batches(val, cfg.batch, cfg.seq_len, torch.Generator().manual_seed(cfg.seed + 1))
    vset = [next(vdata) for _ in range(4)]
    steps = cfg.quick_steps if cfg.quick else cfg.steps
    for step in progress_bar(range(1, steps + 1), desc="hybrid vs all-GA", leave=False):
        x, y = next(data)
        for twin in twins.values():
            model, opt, log = twin["model"], twin["opt"], twin["log"]
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            twin["elapsed"] += time.perf_counter() - t0
            log["step"].append(step)
            log["tokens"].append(step * cfg.batch * cfg.seq_len)
            log["seconds"].append(twin["elapsed"])
            log["loss"].append(loss.item())
            if step % cfg.eval_every == 0 or step == steps:
                with torch.no_grad():
                    v = sum(F.cross_entropy(model(a).logits.flatten(0, 1), b.flatten()).item() for a, b in vset)
                log["val_step"].append(step)
                log["val_loss"].append(v / len(vset))
    out = {name: twin["log"] for name, twin in twins.items()}
    out["layer_types"] = {"hybrid": cfg.model.layer_types, "all-GA": all_ga.layer_types}
    if return_models:
        out["models"] = {name: twin["model"].eval() for name, twin in twins.items()}
    return out
