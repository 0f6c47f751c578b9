"""Running hidden tests: the judge and the agent's worker side by side (Report §4.2, grader forgery).

The grading folder holds the hidden tests and the grader's three scripts (``_wire.py``, ``_judge.py``,
``_worker.py``, copied from the kit). Two sandboxes start, each with its own leased uid and namespaces, joined only
by a socket pair: the **worker** sees the patched repository (read-only) and the scripts, never a test; the
**judge** sees the tests and the scripts, never the agent's files. The judge executes the tests, every use of agent
code becomes a request the worker answers with data, and the judge writes one verdict line per test to a file
only it holds open (a descriptor passed to it alone, in a root-only folder): not its stdout, where test code
prints, and never anything the worker can reach. Nothing the worker or a test prints can become a verdict.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from mimo_kit.envs import sandbox as _sandbox
from mimo_kit.envs.patches import chmod_tree
from mimo_kit.envs.sandbox import SandboxConfig, SandboxError, pump, spawn_sandboxed

#: The grader's scripts, copied read-only into each grading folder (the kit's own tree is never visible inside).
GRADER_FILES = tuple(Path(__file__).resolve().parent / n for n in ("_wire.py", "_judge.py", "_worker.py"))
#: Bytes of verdicts read back (one line per test, at most ~600 bytes each; a task has at most a few hundred tests).
VERDICT_LIMIT = 4 << 20
#: Seconds the judge stops before the grader's deadline, so it reports what it decided instead of being killed.
JUDGE_MARGIN_S = 0.5
#: Seconds the worker gets to exit by itself once the judge has closed the wire (its last prints reach the log).
WORKER_GRACE_S = 0.5


def _world_reachable(path: str) -> bool:
    real = os.path.realpath(path)
    parts = Path(real).parents
    return os.path.isfile(real) and all(os.stat(p).st_mode & 0o001 for p in [real, *parts])


def grader_python() -> str:
    """The interpreter for the judge and the worker (stdlib only): the grader's own where the sandbox's view binds
    it; on a machine without a mount namespace, one the throw-away uid can reach (the grader's may sit in /root)."""
    caps = _sandbox.capabilities()  # looked up on the module: a test may simulate a machine without layers
    if caps.mountns or not caps.root:
        return sys.executable
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if _world_reachable(candidate):
            return candidate
    raise SandboxError(f"no Python the sandbox uid can execute: {sys.executable} is behind a private folder and "
                       "there is no /usr/bin/python3; give the machine a mount namespace or a system python3")


def judge_tests(hidden_tests: Path, repo_dir: Path, ids: list[str], modules: list[str], sandbox: SandboxConfig,
                timeout_s: float) -> tuple[dict, str]:
    """Run test ``ids`` of ``hidden_tests`` against the agent's code in ``repo_dir``: the judge in one sandbox,
    the worker importing ``modules`` in another, a socket between them. Returns ({id: outcome}, output: the agent's
    prints, then the judge's notes on failures)."""
    work = Path(tempfile.mkdtemp(prefix="mimo-grade-"))  # root-only; each sandbox sees one of its folders
    judge_end, worker_end = socket.socketpair()
    verdict_fd = -1
    try:
        # the judge's verdicts: a file in the root-only folder, opened here, reached by the judge only through the
        # descriptor it inherits (its stdout carries the tests' own prints)
        verdict_fd = os.open(work / "verdicts", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        tests, grader = work / "tests", work / "grader"
        shutil.copytree(hidden_tests, tests)
        grader.mkdir()
        for f in GRADER_FILES:
            shutil.copy(f, grader / f.name)
        work.chmod(0o711)
        chmod_tree(tests)
        chmod_tree(grader)
        deadline_s = max(0.1, timeout_s - JUDGE_MARGIN_S)
        fd = {"MIMO_WIRE_FD": str(worker_end.fileno())}
        python = grader_python()
        worker = spawn_sandboxed([python, "-I", "-S", "-u", str(grader / "_worker.py"), str(repo_dir)],
                                 repo_dir, cfg=sandbox, pass_fds=(worker_end.fileno(),), env=fd,
                                 visible=(grader,))
        worker_end.close()
        try:
            judge = spawn_sandboxed([python, "-I", "-S", str(grader / "_judge.py"), str(tests),
                                     ",".join(modules), f"{deadline_s:.3f}", *ids], grader,
                                    cfg=sandbox, pass_fds=(judge_end.fileno(), verdict_fd),
                                    env={"MIMO_WIRE_FD": str(judge_end.fileno()),
                                         "MIMO_VERDICT_FD": str(verdict_fd)}, visible=(tests,))
        except BaseException:
            worker.finish(True)
            raise
        judge_end.close()
        deadline = judge.t0 + timeout_s
        timed_out = pump([worker, judge], deadline, judge)
        verdict = judge.finish(timed_out)
        late = pump([worker], min(deadline, time.perf_counter() + WORKER_GRACE_S), worker)
        agent = worker.finish(late)  # whatever the agent's process still does, it ends here
        verdict_lines = os.pread(verdict_fd, VERDICT_LIMIT, 0).split(b"\n")  # b"\n" only: never str.splitlines
    finally:
        judge_end.close()
        worker_end.close()
        if verdict_fd >= 0:
            os.close(verdict_fd)
        shutil.rmtree(work, ignore_errors=True)
    outcomes = {tid: "missing" for tid in ids}
    notes = []
    for line in verdict_lines:
        try:
            rec = json.loads(line.decode("ascii"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(rec, dict) and outcomes.get(rec.get("id")) == "missing" and \
                rec.get("outcome") in ("passed", "failed", "skipped"):
            outcomes[rec["id"]] = rec["outcome"]
            if rec.get("message"):
                notes.append(f"{rec['id']}: {rec['outcome']}: {rec['message']}")
    if verdict.returncode != 0 and not verdict.timed_out:
        notes.append(f"[judge exited with {verdict.returncode}] {verdict.stderr[-500:]}")
    output = agent.output + ("\n" if agent.output and notes else "") + "\n".join(notes)
    return outcomes, output + ("\n[timed out]" if verdict.timed_out else "")
