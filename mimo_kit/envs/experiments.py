"""Chapter 4b experiments: task validation and the grading benchmark (Report §4.2–4.3); the hack suite, which plays
through the harness, is :mod:`mimo_kit.harness.experiments`.

    mimo-kit run validate-tasks              # every shipped code task, 8 reruns
    mimo-kit run bench-grading repeats=10
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.experiments import experiment


def pick(all_items: list, names: tuple[str, ...], what: str) -> list:
    """The items whose ``id`` is named, in the order named (all of them when none is); an unknown id is an error."""
    if not names:
        return all_items
    by_id = {x.id: x for x in all_items}
    bad = [n for n in names if n not in by_id]
    if bad:
        raise ConfigError(f"unknown {what} {bad}; known: {', '.join(by_id)}")
    return [by_id[n] for n in names]


@dataclasses.dataclass
class ValidateTasksConfig(Config):
    """Which code tasks to validate, and how many reruns."""

    tasks: tuple[str, ...] = knob((), "task ids; empty = every shipped task")
    reruns: int = knob(8, "Report §4.2: identical results over 8 reruns", min=1)

    PRESETS = {"tiny": {}}


@experiment("validate-tasks", ValidateTasksConfig, chapter="ch04b")
def run_validate_tasks(cfg: ValidateTasksConfig) -> list[dict]:
    """Validate code tasks: F2P fail / P2P pass before the reference patch, all pass after, stable over reruns."""
    from mimo_kit.envs.code import CodeEnvConfig, shipped_tasks, validate_task

    rows = []
    for task in pick(shipped_tasks(), cfg.tasks, "code tasks"):
        v = validate_task(task, CodeEnvConfig(reruns=cfg.reruns))
        rows.append({"task": task.id, "source": task.source, "F2P": len(task.f2p), "P2P": len(task.p2p),
                     "valid": v.ok, "reasons": "; ".join(v.reasons) or "-", "seconds": round(v.wall_s, 2)})
    return rows


@dataclasses.dataclass
class BenchGradingConfig(Config):
    """How many repetitions the grading benchmark times."""

    repeats: int = knob(20, "20 runs give a stable median on a shared 2-core machine", min=1)
    tasks: tuple[str, ...] = knob((), "code task ids to time; empty = all")

    PRESETS = {"tiny": {}}


def _timed(fn, repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_ms": round(1000 * statistics.median(times), 1), "max_ms": round(1000 * max(times), 1)}


def _budget_stops(ws: str, repeats: int) -> list[dict]:
    """How soon the budgets stop a bomb, against the timeout that would stop it otherwise: 8 processes of 48 MB
    under a 128 MB cgroup memory budget, and a fork bomb under a 12-task budget (needs the cgroup layer)."""
    from mimo_kit.envs.sandbox import SandboxConfig, run_sandboxed

    memory = ("import os, time\nfor _ in range(3): os.fork()\nx = bytearray(48 << 20)\n"
              "for i in range(0, len(x), 4096): x[i] = 1\ntime.sleep(3)\n")
    bombs = [("memory: 8 × 48 MB under 128 MB", [sys.executable, "-c", memory], SandboxConfig(memory_mb=128,
                                                                                            timeout_s=20)),
             ("tasks: fork bomb under 12 tasks", "bomb() { bomb | bomb & }; bomb; sleep 1",
              SandboxConfig(nproc=12, timeout_s=20))]
    rows = []
    for name, cmd, cfg in bombs:
        seconds, stopped = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = run_sandboxed(cmd, ws, cfg=cfg)
            seconds.append(time.perf_counter() - t0)
            stopped.append(not r.timed_out)
        med = statistics.median(seconds)
        rows.append({"bomb": name, "stopped by the budget": f"{sum(stopped)} of {repeats}",
                     "seconds (median)": round(med, 2), "timeout (s)": cfg.timeout_s,
                     "median / timeout": round(med / cfg.timeout_s, 3)})
    return rows


@experiment("bench-grading", BenchGradingConfig, chapter="ch04b")
def run_bench_grading(cfg: BenchGradingConfig) -> dict:
    """Sandbox overhead over a bare subprocess, and the time to grade a toy code task, a cyber PoC, a general task,
    a visual task (its sandboxed renderer), a pass through the grade cache (confirmed, then a hit), and the audit of
    the commands and diff that made the old audit quadratic."""
    from mimo_kit.envs import cyber, general
    from mimo_kit.envs.code import grade_patch, shipped_tasks
    from mimo_kit.envs.sandbox import capabilities, run_sandboxed

    n = cfg.repeats
    ws = tempfile.mkdtemp(prefix="mimo-bench-")
    sandbox = [
        {"command": "true", "bare": _timed(lambda: subprocess.run(["true"], cwd=ws), n),
         "sandboxed": _timed(lambda: run_sandboxed(["true"], ws), n)},
        {"command": "python -c pass", "bare": _timed(lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "pass"],
                                                                            cwd=ws), n),
         "sandboxed": _timed(lambda: run_sandboxed([sys.executable, "-I", "-S", "-c", "pass"], ws), n)},
    ]
    for row in sandbox:
        row["overhead_ms"] = round(row["sandboxed"]["median_ms"] - row["bare"]["median_ms"], 1)
    grading = []
    for task in pick(shipped_tasks(), cfg.tasks, "code tasks"):
        grading.append({"task": task.id, "reference patch": _timed(lambda t=task: grade_patch(t, t.reference_patch), n),
                        "empty patch": _timed(lambda t=task: grade_patch(t, ""), n)})
    target = cyber.shipped_targets()[0]
    cyber.grade_poc(target, target.gold_poc)  # build once (cached)
    gtask = general.shipped_general_tasks()[0]

    def grade_general_once():
        d = tempfile.mkdtemp(prefix="mimo-bench-g-")
        try:
            w = general.make_workspace(gtask, d + "/ws")
            general.replay(gtask.gold_actions, w)
            general.grade_general(gtask, w)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    from mimo_kit.envs import visual
    from mimo_kit.envs.code import CodeEnvConfig, GradeCache
    from mimo_kit.envs.hacks import audited_reward

    vtask = visual.shipped_visual_tasks()[0]
    ctask = pick(shipped_tasks(), cfg.tasks, "code tasks")[0]
    code_cfg = CodeEnvConfig()

    def first_pass():  # a fresh cache each time: the pass is confirmed by the task's reruns, then kept
        GradeCache().grade(ctask, ctask.reference_patch, code_cfg)

    warm = GradeCache()
    warm.grade(ctask, ctask.reference_patch, code_cfg)
    hostile = ["echo " + "find " * 13_000] * 3  # the commands that made the old audit quadratic (28 s)
    hostile_diff = "+++ b/x.py\n+" + "__eq__=lambda " * 21_000 + "\n"
    caps = capabilities()
    budgets = _budget_stops(ws, min(n, 3)) if caps.layers.get("cgroup") else []
    shutil.rmtree(ws, ignore_errors=True)
    return {"sandbox": sandbox, "code_grading": grading, "budgets": budgets,
            "cyber_grading": {"target": target.id, **_timed(lambda: cyber.grade_poc(target, target.gold_poc), n)},
            "general_grading": {"task": gtask.id, **_timed(grade_general_once, n)},
            "visual_grading": {"task": vtask.id, **_timed(lambda: visual.grade_drawing(vtask, vtask.reference), n)},
            "cache": {"task": ctask.id, "reruns": code_cfg.reruns,
                      "first pass": _timed(first_pass, max(1, n // 4)),
                      "hit": _timed(lambda: warm.grade(ctask, ctask.reference_patch, code_cfg), n)},
            "audit": _timed(lambda: audited_reward(1.0, hostile, hostile_diff), n),
            "isolation": {layer: on for layer, on in caps.layers.items()}}
