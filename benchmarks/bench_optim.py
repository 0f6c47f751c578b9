"""Optimiser step time of Muon and Muown relative to AdamW on the small preset (Report §3).

Times ``OptimizerSet.step()`` alone (AdamW for embeddings/head/router/norms in every variant, and AdamW, Muon or
Muown for the hidden matrices) on the same model with the same random gradients. The variants run interleaved in
one process, so a busy machine slows them alike; the table reports medians and ratios to AdamW.

    .venv/bin/python benchmarks/bench_optim.py [--preset small] [--repeats 5] [--out benchmarks/RESULTS_optim.md]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch

from mimo_kit.model import MiMoConfig, MiMoForCausalLM
from mimo_kit.nb import markdown_table
from mimo_kit.optim import OptimConfig, build_optimizer

KINDS = ("adamw", "muon", "muown")


def bench(preset: str, repeats: int) -> list[dict]:
    torch.manual_seed(0)
    cfg = MiMoConfig.preset(preset)
    setups = {}
    for kind in KINDS:
        model = MiMoForCausalLM(cfg)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        setups[kind] = build_optimizer(model, OptimConfig.preset(preset if preset in ("tiny", "small") else "small",
                                                                 matrix_optimizer=kind))
        setups[kind].step()  # warm-up: allocate state
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(repeats):
        for kind, opt in setups.items():
            t0 = time.perf_counter()
            opt.step()
            times[kind].append(time.perf_counter() - t0)
    base = statistics.median(times["adamw"])
    n_matrix = sum(p.numel() for p in setups["adamw"].matrix_params)
    return [{"optimizer (hidden matrices)": k, "median step ms": 1000 * statistics.median(v),
             "min step ms": 1000 * min(v), "ratio to AdamW": statistics.median(v) / base,
             "matrix params": n_matrix} for k, v in times.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_optim.md")))
    args = ap.parse_args()
    rows = bench(args.preset, args.repeats)
    text = "\n".join([
        f"# Optimiser step time, {args.preset} preset",
        "",
        f"`python benchmarks/bench_optim.py --preset {args.preset} --repeats {args.repeats}` · torch "
        f"{torch.__version__} · {platform.machine()} · {torch.get_num_threads()} threads · "
        f"{time.strftime('%Y-%m-%d')}",
        "",
        "One `OptimizerSet.step()` (AdamW part + hidden-matrix part), same model and gradients, variants "
        "interleaved. Muon is `torch.optim.Muon` (Newton–Schulz in bf16, one expert matrix at a time); Muown runs "
        "a batched fp32 Newton–Schulz over each expert stack.",
        "",
        markdown_table(rows), ""])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
