"""Output of running sandboxed commands: drained without blocking, kept as a head and a tail (Report §4.2).

An agent can print 100 MB, fill a pipe and stall, or leave a background child holding the pipe open: the grader
must neither run out of memory, nor block, nor wait forever. :class:`Tail` keeps the first and last halves of a
budget and counts everything; :func:`pump` drains the pipes of several commands at once (the judge and the agent's
worker run side by side) until one of them exits or a deadline passes; :func:`drain` reads what is left after a
kill without blocking.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Sequence

#: After a command exits, how long its pipes may stay open (a background child without a PID namespace).
PIPE_GRACE_S = 0.2
#: Most bytes :func:`drain` reads after a kill (what a dying writer left in the pipe buffers is far less).
DRAIN_LIMIT = 1 << 24


class Tail:
    """Keep the first ``limit // 2`` and the last ``limit // 2`` bytes of a stream, and count all of them."""

    def __init__(self, limit: int):
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.half:
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        tail = bytes(self.tail[-self.half:]) if self.half else b""
        dropped = self.total - len(self.head) - len(tail)
        if dropped <= 0:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")
        notice = f"\n[... output truncated: {dropped:,} of {self.total:,} bytes dropped (head and tail kept) ...]\n"
        return bytes(self.head).decode("utf-8", "replace") + notice + tail.decode("utf-8", "replace")


def drain(f, tail: Tail, limit: int = DRAIN_LIMIT) -> None:
    """Read what is left in a pipe without blocking (a writer that escaped every kill must not hang us)."""
    os.set_blocking(f.fileno(), False)
    got = 0
    while got < limit:
        try:
            chunk = os.read(f.fileno(), 1 << 16)
        except (BlockingIOError, OSError):
            return
        if not chunk:
            return
        got += len(chunk)
        tail.feed(chunk)


def pump(procs: Sequence, deadline: float, until) -> bool:
    """Drain the output of ``procs`` (:class:`mimo_kit.envs.sandbox.SandboxProcess`) until ``until`` has exited (and
    its pipes closed) or ``deadline`` passes (``time.perf_counter()`` seconds). True when the deadline passed first."""
    sel = selectors.DefaultSelector()
    mine = set()
    for p in procs:
        for f, tail in ((p.popen.stdout, p.out), (p.popen.stderr, p.err)):
            sel.register(f, selectors.EVENT_READ, tail)
            if p is until:
                mine.add(f)
    grace_end = None
    timed_out = False
    try:
        while sel.get_map():
            now = time.perf_counter()
            if grace_end is None and until.popen.poll() is not None:
                grace_end = now + PIPE_GRACE_S
            if grace_end is not None and (now >= grace_end or not mine):
                break
            left = deadline - now
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(left, 0.05)):
                chunk = os.read(key.fileobj.fileno(), 1 << 16)
                if chunk:
                    key.data.feed(chunk)
                else:
                    sel.unregister(key.fileobj)
                    mine.discard(key.fileobj)
        if not timed_out:
            try:
                until.popen.wait(timeout=max(0.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        sel.close()
    return timed_out
