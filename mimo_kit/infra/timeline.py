"""A timeline of the RL system's work: who generated, ran tools, graded, trained or synced weights, and when
(Report §6: the point of disaggregation is that these overlap).

Each piece of work is a span ``(lane, kind, t0, t1)``; the lane is the thread that did it (the learner's main
thread, the rollout thread of asynchronous steps, one ``rollout-engine-i`` thread per engine of a
:class:`~mimo_kit.infra.service.RolloutService`). Out-of-process engines show as the spans of the threads that wait
on their HTTP answers. The kinds:

- ``generate``: one batched ``engine.generate`` (a turn of every live episode of a loop);
- ``tools``: the episodes acting on their actions (sandboxed commands, harness tools);
- ``grade``: hidden tests and graders of finished episodes;
- ``train``: the learner's PPO update of one step;
- ``sync``: the new weights to the engines (gathered, sent, loaded);
- ``wait``: the learner waiting for a step's batch.

Recording is off unless a :class:`Timeline` is active (:func:`recording`); :func:`span` then costs one
``perf_counter`` pair and a list append under a lock.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

KINDS = ("generate", "tools", "grade", "train", "sync", "wait")


class Timeline:
    """Spans recorded while active: ``[(lane, kind, t0, t1), ...]`` in seconds since the timeline began."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.spans: list[tuple[str, str, float, float]] = []
        self._lock = threading.Lock()
        self._flushed = 0  # spans already written by flush()

    def add(self, lane: str, kind: str, t0: float, t1: float) -> None:
        with self._lock:
            self.spans.append((lane, kind, t0 - self.t0, t1 - self.t0))

    def busy(self, kind: str) -> float:
        """Seconds spent in ``kind``, summed over lanes (overlapping spans of one lane counted once each)."""
        return sum(t1 - t0 for _, k, t0, t1 in self.spans if k == kind)

    def flush(self, path: str | Path) -> int:
        """Append the spans recorded since the last flush to ``path``, one JSON line each ({"lane", "kind", "t0",
        "t1"}); returns how many. A long run flushes every step and never rewrites what it wrote."""
        with self._lock:
            new, self._flushed = self.spans[self._flushed:], len(self.spans)
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("a") as f:
            f.write("".join(json.dumps({"lane": lane, "kind": k, "t0": round(a, 6), "t1": round(b, 6)}) + "\n"
                            for lane, k, a, b in new))
        return len(new)


_active: Timeline | None = None


@contextlib.contextmanager
def recording(timeline: Timeline) -> Iterator[Timeline]:
    """Record every :func:`span` of every thread into ``timeline`` while the block runs."""
    global _active
    previous, _active = _active, timeline
    try:
        yield timeline
    finally:
        _active = previous


@contextlib.contextmanager
def span(kind: str, lane: str | None = None) -> Iterator[None]:
    """Time the block as one ``kind`` span of this thread (or of ``lane``); nothing when no timeline is active."""
    tl = _active
    if tl is None:
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        tl.add(lane or threading.current_thread().name, kind, t0, time.perf_counter())


def load(path: str | Path) -> list[dict]:
    """The spans :meth:`Timeline.flush` wrote."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals merged where they overlap, sorted: the time covered by any of them."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(spans: list[dict], first: dict[str, str], second: dict[str, str]) -> float:
    """Seconds during which a span matching ``first`` and one matching ``second`` ran at once (each a filter on
    span fields, e.g. ``{"kind": "train", "lane": "learner"}``); several lanes' spans of one side count once."""
    def pick(f: dict[str, str]) -> list[tuple[float, float]]:
        return union([(s["t0"], s["t1"]) for s in spans if all(s.get(k) == v for k, v in f.items())])

    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in pick(first) for c, d in pick(second))


#: a colour per kind (matplotlib's tab10), so every figure of the kit reads alike
COLORS = {"generate": "tab:blue", "tools": "tab:orange", "grade": "tab:green", "train": "tab:red",
          "sync": "tab:purple", "wait": "0.85"}


def plot(spans: list[dict], ax=None, *, title: str = "", lanes: list[str] | None = None):
    """A Gantt chart of ``spans`` (:func:`load`'s dicts): one row per lane (the learner on top), one bar per span
    coloured by kind. Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.5 + 0.45 * len({s["lane"] for s in spans})))
    order = lanes or sorted({s["lane"] for s in spans}, key=lambda n: (n != "learner", n))
    for y, lane in enumerate(order):
        for kind in KINDS:
            bars = [(s["t0"], s["t1"] - s["t0"]) for s in spans if s["lane"] == lane and s["kind"] == kind]
            if bars:
                ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=COLORS[kind])
    ax.set_yticks(range(len(order)), order)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in KINDS], ncol=len(KINDS), loc="lower center",
              bbox_to_anchor=(0.5, 1.0), frameon=False, fontsize=8)
    if title:
        ax.set_title(title, pad=22)
    return ax
