"""The test suite's time, per test, per file and per marker, as a committed table (``RESULTS_suite.md``).

    make suite-table      # = make test with --durations-json, then this script

reads the JSON that ``pytest --durations-json=PATH`` writes (``tests/conftest.py``: each test's setup + call +
teardown seconds, its outcome and its markers), and writes

- ``benchmarks/RESULTS_suite.md``: the wall times of the three tiers (``--wall test=…`` etc.), the test time per
  marker and per file, every test over 5 s, and the tests over 5 s that carry no marker (there should be none);
- ``benchmarks/suite_durations.json``: the same seconds, which ``tests/conftest.py`` reads to hand the longest work
  units to the workers first.

``--kernel-run PATH`` (repeatable) adds a table of runs of the suite on other sets of torch's CPU kernels
(``ATEN_CPU_CAPABILITY``): each PATH is another run's durations JSON, beside the ``PATH.session.json`` that the
suite writes with it (the kernels in force, the tests chosen, the wall time).

Test time is summed over workers, so with ``-n 2`` it is about twice the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
SLOW_SECONDS = 5.0
TIERS = ("test", "check", "demo")


def _fmt(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def counts(durations: dict[str, dict]) -> dict[str, int]:
    """Tests per outcome (passed, failed, skipped)."""
    out: dict[str, int] = defaultdict(int)
    for d in durations.values():
        out[d["outcome"]] += 1
    return dict(out)


def kernel_rows(runs: list[tuple[dict[str, dict], dict]]) -> list[str]:
    """The table of kernel sets: one row per run (its durations and its session record), the kernels torch ran."""
    lines = ["## Kernel sets", "",
             "The same suite on other sets of torch's CPU kernels (`ATEN_CPU_CAPABILITY`; the native set is the "
             "processor's best). `(fast) or outcome` is CI's second pass, `make test-kernels`.", "",
             "| kernels in force | `ATEN_CPU_CAPABILITY` | tests chosen | passed | failed | skipped | wall time |",
             "|---|---|---|---:|---:|---:|---:|"]
    for durations, session in runs:
        n = counts(durations)
        chosen = "(fast) or outcome" if "or outcome" in session.get("markexpr", "") else (
            session.get("markexpr") or "all")
        lines.append(f"| {session.get('kernels') or '?'} | {session.get('aten_cpu_capability') or '(unset: native)'} "
                     f"| {chosen} | {n.get('passed', 0)} | {n.get('failed', 0)} | {n.get('skipped', 0)} "
                     f"| {_fmt(session.get('wall_seconds', 0.0))} |")
    return lines + [""]


def table(durations: dict[str, dict], walls: dict[str, float], note: str = "",
          kernel_runs: list[tuple[dict[str, dict], dict]] | None = None) -> str:
    total = sum(d["seconds"] for d in durations.values())
    outcomes = defaultdict(int)
    for d in durations.values():
        outcomes[d["outcome"]] += 1
    lines = ["# The test suite's time", "",
             f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {len(os.sched_getaffinity(0))} cores"
             f", Python {platform.python_version()}" + (f"; {note}" if note else "") + ".", "",
             "| tier | command | wall time | goal |", "|---|---|---:|---:|"]
    goals = {"test": ("`make test`", 15 * 60), "check": ("`make check`", 3 * 60), "demo": ("`make demo`", 5 * 60)}
    for tier in TIERS:
        if tier in walls:
            cmd, goal = goals[tier]
            lines.append(f"| {tier} | {cmd} | {_fmt(walls[tier])} | ≤ {_fmt(goal)} |")
    lines += ["", f"{len(durations)} tests ({', '.join(f'{n} {k}' for k, n in sorted(outcomes.items()))}); "
              f"test time summed over workers {_fmt(total)}.", ""]
    if kernel_runs:
        lines += kernel_rows(kernel_runs)
    lines += ["## Per marker", "", "| marker | tests | seconds | share |", "|---|---:|---:|---:|"]
    by_marker: dict[str, list[float]] = defaultdict(list)
    for d in durations.values():
        by_marker[d["markers"][0] if d["markers"] else "(none: fast tier)"].append(d["seconds"])
    for marker, secs in sorted(by_marker.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {marker} | {len(secs)} | {sum(secs):.0f} | {sum(secs) / max(total, 1e-9):.0%} |")
    lines += ["", "## Per file", "", "| file | tests | seconds |", "|---|---:|---:|"]
    by_file: dict[str, list[float]] = defaultdict(list)
    for nodeid, d in durations.items():
        by_file[nodeid.split("::")[0]].append(d["seconds"])
    for name, secs in sorted(by_file.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| `{name}` | {len(secs)} | {sum(secs):.1f} |")
    slow = sorted(((d["seconds"], n, d["markers"]) for n, d in durations.items() if d["seconds"] > SLOW_SECONDS),
                  reverse=True)
    lines += ["", f"## Tests over {SLOW_SECONDS:.0f} s", "", "| seconds | test | markers |", "|---:|---|---|"]
    lines += [f"| {s:.1f} | `{n}` | {', '.join(m) or '**none**'} |" for s, n, m in slow]
    unmarked = [n for _, n, m in slow if not m]
    lines += ["", f"Tests over {SLOW_SECONDS:.0f} s without a marker: {len(unmarked)}"
              + (" (" + ", ".join(f"`{n}`" for n in unmarked) + ")" if unmarked else "") + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("durations", help="the JSON written by pytest --durations-json")
    ap.add_argument("--wall", action="append", default=[], metavar="TIER=SECONDS",
                    help=f"a tier's wall time ({', '.join(TIERS)}); repeatable")
    ap.add_argument("--note", default="", help="one line on how it was measured")
    ap.add_argument("--kernel-run", action="append", default=[], metavar="PATH",
                    help="another run's durations JSON (with PATH.session.json beside it) for the table of kernel "
                         "sets; repeatable")
    ap.add_argument("--out", default=str(HERE / "RESULTS_suite.md"))
    ap.add_argument("--json-out", default=str(HERE / "suite_durations.json"))
    args = ap.parse_args(argv)
    durations = json.loads(Path(args.durations).read_text())
    walls = {}
    for item in args.wall:
        tier, _, secs = item.partition("=")
        if tier not in TIERS or not secs.replace(".", "", 1).isdigit():
            ap.error(f"--wall {item!r}: expected TIER=SECONDS with TIER one of {', '.join(TIERS)}")
        walls[tier] = float(secs)
    runs = []
    for path in [args.durations, *args.kernel_run] if args.kernel_run else []:
        session = Path(f"{path}.session.json")
        if not session.is_file():
            ap.error(f"--kernel-run {path!r}: no {session.name} beside it (the suite writes one with "
                     "--durations-json)")
        runs.append((json.loads(Path(path).read_text()), json.loads(session.read_text())))
    Path(args.out).write_text(table(durations, walls, args.note, runs))
    Path(args.json_out).write_text(json.dumps({n: {"seconds": round(d["seconds"], 2), "markers": d["markers"]}
                                               for n, d in sorted(durations.items())}, indent=1) + "\n")
    print(f"wrote {args.out} and {args.json_out} ({len(durations)} tests)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
