"""The RL loop synchronous and colocated against asynchronous steps on 1, 2 and 4 engines (Report §6), in one run.

Every side is :func:`~mimo_kit.train.run.run_rl` on the repo world (multi-turn harness episodes, sandboxed
tools, hidden-test grading) from the same SFT policy (trained once, cached), for ``--steps`` steps, without
evaluation:

- **synchronous, colocated**: today's default loop: one in-process engine plays the step's batch, then the learner
  trains on it, then the weights are copied in;
- **asynchronous**: ``async_steps=true``: the engines generate step t+1's batch while the learner trains on step t,
  with the episodes in a harness pool (``--pool``: ``local`` threads in the learner, ``ray`` actors of their own;
  default both) and the engines either in process (``engines=E``, one rollout loop per engine in a thread) or
  ``mimo-kit serve`` processes started here
  (``engine_url=`` E servers, weights sent over a torch.distributed group, ``weight_sync=dist``).

Measured per side: episodes (sequences drawn) per second and trained tokens per second over the steps' wall time,
the learner's share of time spent waiting for rollouts, the mean token lag, and the cores the whole machine kept
busy (CPU seconds of every process over the run's wall time); sides alternate over ``--repeats`` rounds, each
starting one side later and each run after the machine has gone quiet (the previous run's Ray head
and processes gone), so drifts of the machine hit every side alike; each row's ratio is to the synchronous loop's
median.

    .venv/bin/python benchmarks/bench_async.py [--steps 4] [--repeats 3] [--servers 2 4] [--pool local ray]

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


def one_run(name: str, overrides: dict, steps: int, root: Path) -> dict:
    """One side's run: its rates over the steps' wall time, and how many of the machine's cores it kept busy."""
    out = root / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
    cfg = RLConfig().override({"steps": steps, "eval_tasks": 0, "checkpoint_every": 0, "progress": False,
                               "save_trajectories": False, "out_dir": str(out), **overrides})
    c0, t0 = busy_cores(), time.perf_counter()
    hist = run_rl(cfg)["history"]
    cores = (busy_cores() - c0) / (time.perf_counter() - t0)  # the whole run (start-up and SFT load included)
    wall = sum(h["step_s"] for h in hist)
    episodes = sum(h["samples_per_s"] * h["step_s"] for h in hist)  # sequences drawn, every step
    return {"episodes_per_s": episodes / wall, "tokens_per_s": sum(h["trained_tokens"] for h in hist) / wall,
            "wait_share": sum(h["wait_s"] for h in hist) / wall, "lag": statistics.mean(h["lag_mean"] for h in hist),
            "train_s": statistics.mean(h["train_s"] for h in hist), "wall": wall, "cores": cores,
            "drawn": statistics.mean(h["groups_drawn"] for h in hist)}


def verdict(rows: list[dict], base_name: str, ncores: int) -> str:
    """What the table shows, from its own ratios and the rounds' spread: a side is faster or slower only when its
    range of rounds clears the synchronous loop's range."""
    def span(row: dict) -> tuple[float, float]:
        lo, hi = row["min–max"].split("–")
        return float(lo), float(hi)

    base_lo, base_hi = span(rows[0])
    best = max(rows[1:], key=lambda r: float(r["× sync episodes/s"]))
    ratio = float(best["× sync episodes/s"])
    lo, hi = span(best)
    if lo > base_hi:
        word = "faster, every round above every synchronous round"
    elif hi < base_lo:
        word = "slower, every round below every synchronous round"
    else:
        word = "inside the rounds' spread, so no speedup is shown at this scale"
    return (f"The best asynchronous side ({best['side']}) plays {ratio:.2f}× the episodes per second of the "
            f"{base_name}: {word}. Its trained tokens per second are {best['× sync tokens/s']}× the synchronous "
            "loop's: a step trains a fixed number of groups, and how many groups dynamic sampling draws to find them "
            "(groups drawn/step) and how long their episodes are vary from run to run. Asynchronous steps hide the "
            "learner's update behind the next batch's rollouts (the wait column is the learner's idle share); more "
            f"engines help only while the machine has idle cores: the synchronous loop kept {rows[0]['cores busy']} "
            f"of the {ncores} cores busy, the best asynchronous side {best['cores busy']}. With the episodes in the "
            "learner's process (pool 'local') their tools and grading share its interpreter with the training "
            "thread; on Ray actors (pool 'ray') they run in processes of their own, beside the engine servers.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", type=int, nargs="*", default=[2], help="in-process engine counts (async)")
    ap.add_argument("--servers", type=int, nargs="*", default=[2, 4], help="mimo-kit serve counts (async)")
    ap.add_argument("--pool", nargs="+", default=["local", "ray"], choices=["", "local", "ray"],
                    help="harness pools of the asynchronous sides: in-process engines take the first, servers each")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_async.md")))
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-async-"))
    base_name = "synchronous loop, 1 engine, colocated"
    sides: dict[str, dict] = {base_name: {}}
    pool = {"pool": args.pool[0]} if args.pool[0] else {}
    for e in args.engines:
        sides[f"async, {e} in-process engine{'s' if e > 1 else ''}, pool {args.pool[0] or 'none'}"] = {
            "async_steps": True, "engines": e, **pool}
    with contextlib.ExitStack() as stack:
        urls = [s.url for s in stack.enter_context(local_servers(max(args.servers), ["--rl-preset", "tiny"]))
                ] if args.servers else []
        for n in args.servers:
            for p in args.pool:
                sides[f"async, {n} mimo-kit serve engines, pool {p or 'none'}"] = {
                    "async_steps": True, "engine_url": ",".join(urls[:n]), "weight_sync": "dist",
                    **({"pool": p} if p else {})}
        one_run("warm-up", {}, 1, root)  # the SFT policy trained or loaded into the cache; sandboxes warm
        runs: dict[str, list[dict]] = {k: [] for k in sides}
        names = list(sides)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:  # each round starts one side later
                settle()
                runs[name].append(one_run(name, sides[name], args.steps, root))
                print(f"round {r + 1} {name}: {runs[name][-1]['episodes_per_s']:.2f} episodes/s", flush=True)
    base = statistics.median(x["episodes_per_s"] for x in runs[base_name])
    base_tok = statistics.median(x["tokens_per_s"] for x in runs[base_name])
    rows = []
    for name, rs in runs.items():
        eps = [x["episodes_per_s"] for x in rs]
        tok = statistics.median(x["tokens_per_s"] for x in rs)
        rows.append({"side": name, "episodes/s (median)": f"{statistics.median(eps):.2f}",
                     "min–max": f"{min(eps):.2f}–{max(eps):.2f}",
                     "× sync episodes/s": f"{statistics.median(eps) / base:.2f}",
                     "trained tokens/s": f"{tok:.0f}", "× sync tokens/s": f"{tok / base_tok:.2f}",
                     "learner waiting": f"{statistics.mean(x['wait_share'] for x in rs):.0%}",
                     "train s/step": f"{statistics.mean(x['train_s'] for x in rs):.1f}",
                     "token lag": f"{statistics.mean(x['lag'] for x in rs):.2f}",
                     "groups drawn/step": f"{statistics.mean(x['drawn'] for x in rs):.1f}",
                     "cores busy": f"{statistics.mean(x['cores'] for x in rs):.2f}"})
    cmd = (f"python benchmarks/bench_async.py --steps {args.steps} --repeats {args.repeats} --engines "
           f"{' '.join(map(str, args.engines))} --servers {' '.join(map(str, args.servers))} --pool "
           f"{' '.join(repr(p) if not p else p for p in args.pool)}")
    text = "\n".join([
        "# Asynchronous RL steps: the synchronous colocated loop against 1, 2 and 4 engines",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {len(os.sched_getaffinity(0))} cores; "
        f"`run_rl` on the repo world (tiny preset: {RLConfig().prompts} prompts × {RLConfig().group_size} "
        f"episodes a step with dynamic sampling, sandboxed tools, hidden-test grading), {args.steps} steps a run, "
        f"no evaluation, {args.repeats} rounds (each starting one side later, every run on a quiet machine); "
        f"`{cmd}`. Episodes/s counts every sequence drawn (over-sampled groups included) over the steps' wall "
        "time; trained tokens/s the tokens the learner trained on; token lag the mean versions between "
        "generation and training; cores busy the CPU seconds of every process on the machine (engine servers, "
        "sandboxes and graders included) per second of the run.",
        "",
        markdown_table(rows),
        "",
        verdict(rows, base_name, len(os.sched_getaffinity(0))),
        "",
    ])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
