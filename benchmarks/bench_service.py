"""Repo-world rollouts on one engine against the rollout service's engines (Report §6), side by side in one process.

The trainer's synchronous loop plays every episode of a step with one engine: each turn it generates for every live
episode, then runs their tools (sandboxed commands) and grades the finished ones, and the engine waits while they
do. :class:`~mimo_kit.infra.service.RolloutService` gives each of E engines its own loop in a thread, so one engine
generates while another's episodes run tools and grading. Both sides play the same repo-world tasks (multi-turn
harness episodes, sandboxed tools, hidden-test grading) with the repo world's SFT policy (trained once, cached),
alternating over ``--repeats`` rounds; measured: episodes and generated tokens per second of wall time (median and
spread), each row's ratio to the one-engine loop. Optionally (``--pool``) the service's episodes live in a local
harness pool.

    .venv/bin/python benchmarks/bench_service.py [--tasks 8] [--group 4] [--engines 2 4] [--repeats 3]

Writes ``benchmarks/RESULTS_service.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from mimo_kit.infra import rollout
from mimo_kit.infra.engine import InProcessEngine
from mimo_kit.infra.service import RolloutService
from mimo_kit.nb import markdown_table
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import warm_start
from mimo_kit.train.toy import pooled


def side(name: str, engine, world, tasks, group: int, settings, pool=None) -> dict:
    """One round: every task's group played to its end (graded); episodes/s and generated tokens/s."""
    if pool is not None:
        groups = pool.groups([pooled.builders(world, t, group) for t in tasks])
    else:
        groups = [world.episodes(t, group) for t in tasks]
    t0 = time.perf_counter()
    samples = rollout.play(engine, groups, settings, grade_workers=world.grade_workers)
    dt = time.perf_counter() - t0
    seqs = [q for s in samples for q in s.sequences]
    gen = sum(len(seg) for q in seqs for c in q.contexts for seg in c.segments if seg.trainable)
    return {"side": name, "episodes_per_s": len(seqs) / dt, "tokens_per_s": gen / dt, "seconds": dt,
            "pass_rate": sum(bool(q.passed) for q in seqs) / len(seqs),
            "turns": statistics.mean(q.metadata.get("turns", 0) for q in seqs)}


def verdict(rows: list[dict]) -> str:
    """What the table shows, from its own ratios."""
    best = max(rows[1:], key=lambda r: float(r["× one engine"]))
    ratio = float(best["× one engine"])
    head = (f"The best service row ({best['side']}) plays {ratio:.2f}× the one-engine loop's episodes per second: "
            + ("faster. " if ratio > 1.05 else "no faster. "))
    return head + ("The in-process engines share one Python process, so their decode loops take turns on the "
                   "interpreter and each decodes a smaller batch; the overlap of one engine's generation with the "
                   "others' sandboxed tool calls and grading has to pay for both. Engines in their own processes "
                   "(`mimo-kit serve` servers, several `engine_url=` URLs) decode in parallel: "
                   "`benchmarks/RESULTS_async.md` measures them, with asynchronous steps.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--engines", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pool", action="store_true", help="also the service with episodes in a local harness pool")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the trainer's default: 1)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_service.md")))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    cfg = RLConfig(progress=False, out_dir=tempfile.mkdtemp(prefix="bench-service-"))
    world = cfg.make_world()
    policy, _ = warm_start(cfg, Path(cfg.out_dir), world)  # the repo world's SFT policy (cached after the first)
    settings = cfg.rollout_settings(world)
    tasks = world.tasks(args.tasks, seed=123, prefix="bench")
    sides = {"one engine (the synchronous loop)": (lambda: InProcessEngine(policy, seed=0), None)}
    for e in args.engines:
        sides[f"service, {e} engines"] = (
            lambda e=e: RolloutService([InProcessEngine(policy, seed=i) for i in range(e)]), None)
    pool = None
    if args.pool:
        from mimo_kit.infra.pool import HarnessPool

        pool = HarnessPool(2, pooled.host_setup(world), backend="local", tool_threads=max(2, world.grade_workers))
        e = max(args.engines)
        sides[f"service, {e} engines, local pool"] = (
            lambda: RolloutService([InProcessEngine(policy, seed=i) for i in range(e)]), pool)
    side("warm-up", InProcessEngine(policy, seed=0), world, tasks[:1], 1, settings)
    runs: dict[str, list[dict]] = {k: [] for k in sides}
    for r in range(args.repeats):
        for name, (make, p) in sides.items():  # alternating, so drifts of the machine hit every side alike
            runs[name].append(side(name, make(), world, tasks, args.group, settings, p))
            print(f"round {r + 1} {name}: {runs[name][-1]['episodes_per_s']:.2f} episodes/s", flush=True)
    if pool is not None:
        pool.shutdown()
    base = statistics.median(x["episodes_per_s"] for x in runs[next(iter(sides))])
    rows = []
    for name, rs in runs.items():
        eps = [x["episodes_per_s"] for x in rs]
        rows.append({"side": name, "episodes/s (median)": f"{statistics.median(eps):.2f}",
                     "min–max": f"{min(eps):.2f}–{max(eps):.2f}",
                     "gen tokens/s": f"{statistics.median(x['tokens_per_s'] for x in rs):.0f}",
                     "× one engine": f"{statistics.median(eps) / base:.2f}",
                     "pass rate": f"{statistics.mean(x['pass_rate'] for x in rs):.2f}",
                     "turns": f"{statistics.mean(x['turns'] for x in rs):.1f}"})
    text = "\n".join([
        "# Rollout service: repo-world episodes per second, one engine against E engines",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
        f"torch threads {args.threads}; {args.tasks} repo-world tasks × {args.group} episodes per round "
        f"(multi-turn harness episodes, sandboxed tools, hidden-test grading), the repo world's SFT policy, "
        f"{args.repeats} alternating rounds; `python benchmarks/bench_service.py "
        f"--tasks {args.tasks} --group {args.group} --engines {' '.join(map(str, args.engines))} "
        f"--repeats {args.repeats}{' --pool' if args.pool else ''}`.",
        "",
        markdown_table(rows),
        "",
        verdict(rows),
        "",
    ])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
