"""Rollout throughput: the rollout driver (``mimo_kit.infra.rollout``) against the toy world's own turn loop.

Before the driver, the toy world stepped its episodes with a loop of its own (one batched ``engine.generate`` per
turn, actions applied in place); that loop is kept below, verbatim in what it computes, as the baseline. Both sides
play the same tasks with the same SFT-free policy weights and the same engine seed, alternate over ``--repeats``
rounds in one process, and count generated tokens per second of wall time (median and spread). The driver adds the
Episode protocol, contexts, recorded errors and grading hooks; the target is that it costs no more than 10%.

    .venv/bin/python benchmarks/bench_rollout.py [--tasks 32] [--group 8] [--repeats 5]

Writes ``benchmarks/RESULTS_rollout.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from mimo_kit.infra import GenerationRequest, InProcessEngine
from mimo_kit.infra import rollout as driver
from mimo_kit.nb import markdown_table
from mimo_kit.rl.trajectory import Context, Sample, Segment, Sequence
from mimo_kit.train.sft import PolicyConfig, build_policy
from mimo_kit.train.toy.world import TOKENIZER, ToyEpisode, episodes, make_tasks, rollout_settings


# ---- the baseline: the toy world's turn loop before the driver ----------------------------------------------------
def legacy_play(engine, tasks, group_size: int, max_turns: int = 8, max_action_tokens: int = 5) -> list[Sample]:
    slots = [(t, i, ToyEpisode(t), [Segment("user", TOKENIZER.encode(t.prompt), text=t.prompt)])
             for t in tasks for i in range(group_size)]
    finish = {}
    while True:
        live = [s for s in slots if id(s) not in finish]
        if not live:
            break
        reqs = [GenerationRequest(f"{t.task_id}/{i}", [x for seg in segs for x in seg.token_ids], max_action_tokens,
                                  stop_token_ids=(TOKENIZER.stop_id,)) for t, i, _, segs in live]
        for s, out in zip(live, engine.generate(reqs)):
            _, _, ep, segs = s
            segs.append(Segment("assistant", list(out.token_ids), logprobs=list(out.logprobs),
                                policy_versions=[out.policy_version] * len(out.token_ids),
                                text=TOKENIZER.decode(out.token_ids)))
            text = TOKENIZER.decode(out.token_ids)
            obs = ep.step(text[:-1] if out.finish_reason == "stop" else text)
            if obs == "err\n":
                segs[-1].error_spans = [(0, len(out.token_ids), "malformed_action")]
            if ep.submitted:
                finish[id(s)] = "stop"
            elif len(ep.actions) >= max_turns:
                finish[id(s)] = "length"
            elif obs:
                segs.append(Segment("tool", TOKENIZER.encode(obs), text=obs))
    by_task: dict[str, list[Sequence]] = {t.task_id: [] for t in tasks}
    for s in slots:
        t, i, ep, segs = s
        by_task[t.task_id].append(Sequence([Context(segs)], f"{t.task_id}/{i}", reward=float(ep.passed),
                                           passed=ep.passed, finish_reason=finish[id(s)]))
    return [Sample(tid, seqs) for tid, seqs in by_task.items()]


def generated(samples: list[Sample]) -> int:
    return sum(len(seg) for s in samples for q in s.sequences for c in q.contexts for seg in c.segments
               if seg.trainable)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_rollout.md")))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    policy = build_policy(PolicyConfig(), seed=0)
    tasks = make_tasks(args.tasks, seed=7)
    settings = rollout_settings()
    speeds: dict[str, list[float]] = {"toy loop (before)": [], "rollout driver": []}
    same = True
    for rep in range(args.repeats + 1):  # round 0 warms up both sides
        runs = {}
        for name in (speeds if rep % 2 else reversed(list(speeds))):  # alternate which side goes first
            engine = InProcessEngine(policy, seed=rep)
            t0 = time.perf_counter()
            if name == "rollout driver":
                out = driver.play(engine, [episodes(t, args.group) for t in tasks], settings)
            else:
                out = legacy_play(engine, tasks, args.group)
            dt = time.perf_counter() - t0
            runs[name] = out
            if rep:
                speeds[name].append(generated(out) / dt)
        ids = {k: [[seg.token_ids for c in q.contexts for seg in c.segments] for s in v for q in s.sequences]
               for k, v in runs.items()}
        same &= ids["toy loop (before)"] == ids["rollout driver"]
    med = {k: statistics.median(v) for k, v in speeds.items()}
    rows = [{"side": k, "median tok/s": round(med[k], 1), "min": round(min(v), 1), "max": round(max(v), 1)}
            for k, v in speeds.items()]
    ratio = med["rollout driver"] / med["toy loop (before)"]
    text = "\n".join([
        "# Rollout throughput: the driver vs the toy world's own loop", "",
        f"`python benchmarks/bench_rollout.py --tasks {args.tasks} --group {args.group} --repeats {args.repeats}`; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} torch thread(s), "
        f"torch {torch.__version__}. Tiny toy policy (untrained weights, so episodes run their full 8 turns), "
        f"{args.tasks} tasks × {args.group} rollouts, both sides alternated in one process after a warm-up round.",
        "", markdown_table(rows), "",
        f"**driver / before = {ratio:.2f}×** (target ≥ 0.90). Same sampled tokens on both sides: "
        f"{'yes' if same else 'NO'} (same engine seed, same requests in the same order).", ""])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
