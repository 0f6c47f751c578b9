"""What each part of the asynchronous RL loop buys (Report §6), one factor at a time, in one run.

Every side is :func:`~mimo_kit.train.run.run_rl` on the repo world (multi-turn harness episodes, sandboxed
tools, hidden-test grading) from the same SFT policy (trained once, cached), for ``--steps`` steps, without
evaluation, and every side trains the same work: dynamic sampling off, so each step draws and trains exactly
``prompts`` groups. The baseline is the synchronous loop with one in-process engine and the episodes in the
learner's process; each other side adds one or more of three factors:

- ``async``: ``async_steps=true``: the engines generate step t+1's batch while the learner trains on step t;
- ``server``: the engine is a ``mimo-kit serve`` process started here (``engine_url``, weights sent over a
  torch.distributed group, ``weight_sync=dist``); ``2 servers``: two of them behind one rollout service;
- ``ray``: the episodes live in a harness pool of Ray actors (``pool=ray``), processes of their own.

The headline is trained groups per second over the steps' wall time (equal work per step, so it is the inverse of
the step time), beside trained tokens per second, the learner's share of time spent waiting for rollouts, the mean
token lag, and the cores the whole machine kept busy (CPU seconds of every process over the run's wall time). Sides
alternate over ``--repeats`` rounds, each starting one side later and each run after the machine has gone quiet
(the previous run's Ray head and processes gone), so drifts of the machine hit every side alike; a side is faster
or slower than the baseline only when every round of it clears every baseline round.

    .venv/bin/python benchmarks/bench_async.py [--steps 4] [--repeats 3] [--sides sync async server ...]

Writes ``benchmarks/RESULTS_async.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from mimo_kit.infra.local_servers import local_servers
from mimo_kit.nb import markdown_table
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import run_rl

#: a machine with less than this share of its cores busy counts as quiet between runs (the idle servers' polling)
SETTLED = 0.15


def busy_cores() -> float:
    """CPU seconds the whole machine has spent working (every process: servers, sandboxes, graders too)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def settle(busy_share: float = SETTLED, longest_s: float = 60.0) -> float:
    """Wait until the machine is quiet (less than ``busy_share`` of its cores busy over a second: a Ray head or a
    server of the previous run has finished exiting), at most ``longest_s``; the seconds waited."""
    t0 = time.perf_counter()
    while psutil.cpu_percent(interval=1.0) > 100 * busy_share and time.perf_counter() - t0 < longest_s:
        pass
    return time.perf_counter() - t0


#: the sides, as the factors each adds to the baseline (synchronous, one in-process engine, episodes in the learner)
SIDES: dict[str, tuple[str, ...]] = {
    "sync": (),
    "async": ("async",),
    "server": ("server",),
    "ray": ("ray",),
    "async+server": ("async", "server"),
    "server+ray": ("server", "ray"),
    "async+ray": ("async", "ray"),
    "async+server+ray": ("async", "server", "ray"),
    "sync, 2 servers+ray": ("2 servers", "ray"),
    "async+2 servers+ray": ("async", "2 servers", "ray"),
}


def overrides(factors: tuple[str, ...], urls: list[str]) -> dict:
    """The RLConfig overrides of a side's factors."""
    out: dict = {}
    if "async" in factors:
        out["async_steps"] = True
    n = 2 if "2 servers" in factors else 1 if "server" in factors else 0
    if n:
        out.update(engine_url=",".join(urls[:n]), weight_sync="dist")
    if "ray" in factors:
        out["pool"] = "ray"
    return out


def one_run(name: str, over: dict, steps: int, root: Path) -> dict:
    """One side's run: its rates over the steps' wall time, and how many of the machine's cores it kept busy."""
    out = root / name.replace(" ", "_").replace(",", "").replace("+", "-")
    cfg = RLConfig().override({"steps": steps, "eval_tasks": 0, "checkpoint_every": 0, "progress": False,
                               "save_trajectories": False, "dynamic_sampling": False, "out_dir": str(out), **over})
    c0, t0 = busy_cores(), time.perf_counter()
    hist = run_rl(cfg)["history"]
    cores = (busy_cores() - c0) / (time.perf_counter() - t0)  # the whole run (start-up and SFT load included)
    wall = sum(h["step_s"] for h in hist)
    return {"groups_per_s": sum(h["groups_trained"] for h in hist) / wall,
            "tokens_per_s": sum(h["trained_tokens"] for h in hist) / wall,
            "step_s": wall / len(hist), "wait_share": sum(h["wait_s"] for h in hist) / wall,
            "lag": statistics.mean(h["lag_mean"] for h in hist),
            "train_s": statistics.mean(h["train_s"] for h in hist), "cores": cores,
            "drawn": statistics.mean(h["groups_drawn"] for h in hist),
            "trained": statistics.mean(h["groups_trained"] for h in hist)}


def verdict(rows: list[dict], runs: dict[str, list[dict]]) -> str:
    """What the table shows, from its own ratios and the rounds' spread: a side is faster or slower than the
    baseline only when every round of it clears every baseline round."""
    base = [x["groups_per_s"] for x in runs["sync"]]
    parts = []
    for row in rows[1:]:
        got = [x["groups_per_s"] for x in runs[row["side"]]]
        if min(got) > max(base):
            word = "faster (every round above every synchronous round)"
        elif max(got) < min(base):
            word = "slower (every round below every synchronous round)"
        else:
            word = "within the rounds' spread"
        parts.append(f"{row['side']}: {row['× sync groups/s']}×, {word}")
    best = max(rows[1:], key=lambda r: float(r["× sync groups/s"]))
    return ("Trained groups per second against the synchronous loop, one factor at a time: " + "; ".join(parts) +
            f". The best side is {best['side']} at {best['× sync groups/s']}× the synchronous loop's trained groups "
            f"per second ({best['× sync tokens/s']}× its trained tokens per second). Training is "
            f"{rows[0]['training share']} of a synchronous step, so overlapping it with the next batch's rollouts "
            "(asynchronous steps alone) can hide at most that share of the step; what the servers and the Ray pool "
            "add is parallel work on cores the synchronous loop leaves idle (cores busy).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES),
                    help="the sides to measure (sync, the baseline, is always measured)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_async.md")))
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-async-"))
    names = ["sync"] + [n for n in args.sides if n != "sync"]
    n_servers = max((2 if "2 servers" in SIDES[n] else 1 if "server" in SIDES[n] else 0) for n in names)
    with contextlib.ExitStack() as stack:
        urls = ([s.url for s in stack.enter_context(local_servers(n_servers, ["--rl-preset", "tiny"]))]
                if n_servers else [])
        one_run("warm-up", {}, 1, root)  # the SFT policy trained or loaded into the cache; sandboxes warm
        runs: dict[str, list[dict]] = {k: [] for k in names}
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:  # each round starts one side later
                settle()
                runs[name].append(one_run(name, overrides(SIDES[name], urls), args.steps, root))
                print(f"round {r + 1} {name}: {runs[name][-1]['groups_per_s']:.3f} trained groups/s", flush=True)
    base = statistics.median(x["groups_per_s"] for x in runs["sync"])
    base_tok = statistics.median(x["tokens_per_s"] for x in runs["sync"])
    rows = []
    for name, rs in runs.items():
        gps = [x["groups_per_s"] for x in rs]
        tok = statistics.median(x["tokens_per_s"] for x in rs)
        rows.append({"side": name, "adds": " + ".join(SIDES[name]) or "(baseline)",
                     "trained groups/s (median)": f"{statistics.median(gps):.3f}",
                     "min–max": f"{min(gps):.3f}–{max(gps):.3f}",
                     "× sync groups/s": f"{statistics.median(gps) / base:.2f}",
                     "trained tokens/s": f"{tok:.0f}", "× sync tokens/s": f"{tok / base_tok:.2f}",
                     "step s": f"{statistics.median(x['step_s'] for x in rs):.1f}",
                     "training share": f"{statistics.mean(x['train_s'] / x['step_s'] for x in rs):.0%}",
                     "learner waiting": f"{statistics.mean(x['wait_share'] for x in rs):.0%}",
                     "token lag": f"{statistics.mean(x['lag'] for x in rs):.2f}",
                     "groups drawn / trained per step": f"{statistics.mean(x['drawn'] for x in rs):.1f} / "
                                                        f"{statistics.mean(x['trained'] for x in rs):.1f}",
                     "cores busy": f"{statistics.mean(x['cores'] for x in rs):.2f}"})
    cmd = (f"python benchmarks/bench_async.py --steps {args.steps} --repeats {args.repeats} --sides "
           + " ".join(repr(n) if " " in n or "," in n else n for n in names))
    text = "\n".join([
        "# Asynchronous RL steps: what each factor buys, one at a time",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {len(os.sched_getaffinity(0))} cores; "
        f"`run_rl` on the repo world (tiny preset: {RLConfig().prompts} prompts × {RLConfig().group_size} "
        f"episodes a step, dynamic sampling off so every side trains the same groups per step, sandboxed tools, "
        f"hidden-test grading), {args.steps} steps a run, no evaluation, {args.repeats} rounds (each starting one "
        f"side later, every run on a quiet machine); `{cmd}`. Trained groups/s and trained tokens/s are over the "
        "steps' wall time; training share is the learner's update time per step; token lag the mean versions "
        "between generation and training; cores busy the CPU seconds of every process on the machine (engine "
        "servers, Ray actors, sandboxes and graders included) per second of the run.",
        "",
        markdown_table(rows),
        "",
        verdict(rows, runs),
        "",
    ])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
