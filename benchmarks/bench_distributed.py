"""FSDP2 on 2 processes against 1 process: the same loss curve (pre-training 20 steps, RL learner 5 steps).

    python benchmarks/bench_distributed.py            # → benchmarks/RESULTS_distributed.md

Both sides run in this script on this machine: the 2-process side through ``mimo_kit.launch.launch`` (torchrun,
gloo, FSDP2), the 1-process side in-process. The table gives the largest relative difference of each logged
quantity over the run (target: ≤ 1e-5 for the losses) and both sides' wall-clock (on 2 cores the 2-process run
shares the cores, so its time says nothing about a GPU node).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch

from mimo_kit.launch import launch
from mimo_kit.pretrain import PretrainConfig, run_pretrain
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import run_rl


def rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def absdiff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def bench(tmp: Path) -> list[dict]:
    rows = []
    for opt in ("adamw", "muown"):
        cfg = PretrainConfig.preset("tiny", steps=20, batch=8, seq_len=128, eval_every=10, checkpoint_every=0,
                                    optim={"matrix_optimizer": opt}, out_dir=str(tmp / f"pre-{opt}-2"))
        t0 = time.perf_counter()
        two = launch("pretrain", cfg, nproc_per_node=2, folder=tmp / f"job-pre-{opt}", quiet=True)["result"]["log"]
        t1 = time.perf_counter()
        one = run_pretrain(cfg.override({"out_dir": str(tmp / f"pre-{opt}-1")}), progress=False).log
        t2 = time.perf_counter()
        rows.append({"run": f"pre-training, tiny, {opt}", "steps": len(one["loss"]),
                     "loss rel. diff": f"{rel(two['loss'], one['loss']):.1e}",
                     "loss abs. diff": f"{absdiff(two['loss'], one['loss']):.1e}",
                     "val loss rel. diff": f"{rel(two['val_loss'], one['val_loss']):.1e}",
                     "grad-norm rel. diff": f"{rel(two['grad_norm'], one['grad_norm']):.1e}",
                     "final loss (2 / 1)": f"{two['loss'][-1]:.5f} / {one['loss'][-1]:.5f}",
                     "seconds (2 / 1)": f"{t1 - t0:.0f} / {t2 - t1:.0f}"})
    # one SFT policy for both sides (a sharded SFT of 400 steps drifts by float rounding, which is enough to flip
    # a sampled token later): the 1-process run trains it, the 2-process run loads the same sft.pt
    cfg = RLConfig.preset("toy", steps=5, eval_tasks=16, checkpoint_every=0, progress=False,
                          out_dir=str(tmp / "rl-1"))
    t0 = time.perf_counter()
    one = run_rl(cfg)["history"]
    t1 = time.perf_counter()
    (tmp / "rl-2").mkdir()
    shutil.copy(tmp / "rl-1" / "sft.pt", tmp / "rl-2" / "sft.pt")
    two = launch("rl", cfg.override({"out_dir": str(tmp / "rl-2")}), nproc_per_node=2, folder=tmp / "job-rl",
                 quiet=True)["result"]["history"]
    t2 = time.perf_counter()
    one_s, two_s = t1 - t0, t2 - t1
    same_tokens = [h["trained_tokens"] for h in two] == [h["trained_tokens"] for h in one]
    rows.append({"run": "RL learner, toy world (one SFT policy)", "steps": len(one),
                 "loss rel. diff": f"{rel([h['loss'] for h in two], [h['loss'] for h in one]):.1e}",
                 "loss abs. diff": f"{absdiff([h['loss'] for h in two], [h['loss'] for h in one]):.1e}",
                 "val loss rel. diff": f"entropy {rel([h['entropy'] for h in two], [h['entropy'] for h in one]):.1e}",
                 "grad-norm rel. diff": f"{rel([h['grad_norm'] for h in two], [h['grad_norm'] for h in one]):.1e}",
                 "final loss (2 / 1)": f"{two[-1]['loss']:.5f} / {one[-1]['loss']:.5f}"
                                       + ("" if same_tokens else " (rollouts diverged)"),
                 "seconds (2 / 1)": f"{two_s:.0f} / {one_s:.0f}"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_distributed.md")))
    args = ap.parse_args()
    from mimo_kit.nb import markdown_table

    with tempfile.TemporaryDirectory() as tmp:
        rows = bench(Path(tmp))
    text = "\n".join([
        "# FSDP2 on 2 processes vs 1 process (CPU, gloo)",
        "",
        f"`python benchmarks/bench_distributed.py` on {platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}. Largest relative difference over the run; "
        "target ≤ 1e-5 for the losses. The PPO loss crosses zero (its mean advantage is ~0), where a relative "
        "difference is ill-conditioned; its absolute difference is the column to read. Rollouts are played by "
        "rank 0 on gathered weights, so the RL runs sample "
        "the same tokens as long as the weights agree to float rounding.",
        "",
        markdown_table(rows),
        "",
    ])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
