"""One submission's run for ``mimo-kit grade``: its cells in a fresh kernel, each under a deadline it cannot outlast.

``python -m mimo_kit.grade_kernel SPEC.json`` is the grader's worker process (one per notebook, so several run at
once and the grader can end any of them). It starts a kernel, sandboxed or not (:func:`start_kernel`), and sends
the notebook's code cells one at a time (:func:`run_cells`). A cell gets ``cell_timeout`` seconds; then the kernel
is interrupted (SIGINT to its process group: a ``KeyboardInterrupt``), and a cell that is still busy
``KILL_GRACE`` seconds later (a loop inside a bare ``except``) has its kernel killed with every process that
carries the run's token (:func:`kill_marked`: forks and ``setsid`` children included); the worker is its
descendants' subreaper, so one that also cleared its environment is killed with them (:func:`kill_descendants`).
A kernel that dies
(``os._exit``, a segfault, the OOM killer) is noticed within :data:`POLL` seconds. After a kill or a death the
remaining cells are "not run". Each cell's outcome is appended to the outcomes file as it ends, so the grader,
which also holds a per-notebook deadline over this whole process, keeps what was done whatever stops it.

Kernels talk over Unix sockets when sandboxed (``unshare -rn`` leaves no loopback to share) and otherwise over
CurveZMQ-encrypted TCP or Unix sockets (:func:`mimo_kit.course.kernel_manager`).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import time
from pathlib import Path

#: seconds between an interrupt and the kill of a kernel whose cell is still busy (a KeyboardInterrupt that a bare
#: `except` swallows); an interrupted cell normally answers within a second
KILL_GRACE = 5.0
#: seconds between checks that the kernel is alive while a cell runs
POLL = 0.5
#: the environment variable that marks every process of one graded kernel (see :func:`kill_marked`)
TOKEN_ENV = "MIMO_KIT_GRADE_TOKEN"


def marked_pids(token: str) -> list[int]:
    """Processes whose environment carries ``TOKEN_ENV=token``: a graded kernel and everything it started, whatever
    its process group or session."""
    needle = f"{TOKEN_ENV}={token}".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return pids


def kill_marked(token: str, rounds: int = 5) -> int:
    """SIGKILL every process marked with ``token`` until none is left (a fork made between two scans is caught by
    the next); returns how many were killed."""
    killed = 0
    for _ in range(rounds):
        pids = marked_pids(token)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.05)
    return killed


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``): a kernel's
    double-forked child that also clears its environment is then still this worker's descendant, and
    :func:`kill_descendants` finds it. False where the call is refused."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # 36: PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (from each process's parent in ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants(rounds: int = 5) -> None:
    """SIGKILL every descendant of this process until none is left, reaping them."""
    for _ in range(rounds):
        pids = descendants(os.getpid())
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
        while True:  # reap what was killed (orphans adopted by this subreaper too)
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


def sandboxed_manager_class():
    from jupyter_client import KernelManager

    class SandboxedKernelManager(KernelManager):
        """A kernel started under ``unshare -rn``: its own user and network namespace (no network)."""

        def format_kernel_cmd(self, extra_arguments=None):
            return ["unshare", "-rn", *super().format_kernel_cmd(extra_arguments)]

    return SandboxedKernelManager


def start_kernel(*, sandbox: bool, sockets: Path, cwd: Path, env: dict[str, str], timeout: float = 120.0):
    """A started kernel and its blocking client, ready for requests."""
    from jupyter_client import KernelManager

    from mimo_kit.course import kernel_manager

    if sandbox:  # Unix sockets cross the network namespace; TCP on the loopback would not
        km = sandboxed_manager_class()(kernel_name="python3", transport="ipc", ip=str(sockets / "kernel"))
    else:
        km = kernel_manager(sockets, manager_class=KernelManager)
    km.start_kernel(env=env, cwd=str(cwd))
    kc = km.client()
    kc.allow_stdin = False  # input() raises in the kernel instead of waiting for an answer nobody gives
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=timeout)
    except RuntimeError:
        kc.stop_channels()
        raise
    return km, kc


def _log(path: Path, **record) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def run_cell(km, kc, source: str, *, timeout: float, grace: float = KILL_GRACE) -> dict:
    """Execute one cell; its outcome: ``status`` ok, error (with ``ename`` / ``evalue``), interrupted (over the
    deadline, stopped by the interrupt), killed (still busy after the grace) or died (the kernel exited)."""
    msg_id = kc.execute(source, store_history=True, allow_stdin=False, stop_on_error=False)
    start = time.monotonic()
    interrupted_at = None
    error = None
    while True:
        now = time.monotonic()
        if interrupted_at is None and now - start > timeout:
            km.interrupt_kernel()
            interrupted_at = now
        if interrupted_at is not None and now - interrupted_at > grace:
            return {"status": "killed", "seconds": round(now - start, 2)}
        try:
            msg = kc.get_iopub_msg(timeout=POLL)
        except queue.Empty:
            if not km.is_alive():
                return {"status": "died", "seconds": round(time.monotonic() - start, 2)}
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "error":
            error = {"ename": content.get("ename", ""), "evalue": str(content.get("evalue", ""))[:300]}
        elif kind == "status" and content.get("execution_state") == "idle":
            seconds = round(time.monotonic() - start, 2)
            if interrupted_at is not None:
                return {"status": "interrupted", "seconds": seconds, **(error or {})}
            return {"status": "error" if error else "ok", "seconds": seconds, **(error or {})}


def run_cells(spec: dict) -> None:
    """Run the spec's notebook cell by cell and append each outcome to ``spec["outcomes"]``."""
    import nbformat

    outcomes = Path(spec["outcomes"])
    nb = nbformat.read(spec["notebook"], as_version=4)
    env = {**spec["env"], TOKEN_ENV: spec["token"]}
    try:
        km, kc = start_kernel(sandbox=spec["sandbox"], sockets=Path(spec["sockets"]), cwd=Path(spec["cwd"]), env=env)
    except Exception as e:  # noqa: BLE001 - a kernel that does not start is this submission's failure
        _log(outcomes, cell=None, status="no kernel", ename=type(e).__name__, evalue=str(e)[:300])
        kill_marked(spec["token"])
        kill_descendants()
        return
    stop = None
    try:
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            if stop is not None:
                _log(outcomes, cell=i, status="not run")
                continue
            outcome = run_cell(km, kc, cell.source, timeout=spec["cell_timeout"], grace=spec.get("grace", KILL_GRACE))
            _log(outcomes, cell=i, **outcome)
            if outcome["status"] in ("killed", "died"):
                stop = outcome["status"]
    finally:
        kc.stop_channels()
        try:
            km.shutdown_kernel(now=True)
        except Exception:  # noqa: BLE001 - a kernel already dead or killed has nothing left to shut down
            pass
        kill_marked(spec["token"])
        kill_descendants()
        km.cleanup_resources()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks kill the kernel on the way out
    become_subreaper()
    run_cells(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
