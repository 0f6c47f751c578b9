"""Throw-away uids for sandboxed episodes, allocated without collision (Report §4.2, environment isolation).

As root, every sandboxed episode runs under a uid of its own, so ``RLIMIT_NPROC`` binds and its files are owned by
nobody else. Two episodes that drew the same uid could signal or trace each other and write each other's files,
so a uid is **leased**: an exclusive ``flock`` on ``<lock_dir>/<uid>.lock``, held by an open descriptor for the
episode's lifetime. The kernel drops the lock when the holder dies, so a crashed grader never leaks a uid, and a
lease is refused to any uid that has a passwd entry or a live process (a uid some other software uses).

:func:`lease_uid` returns a plain ``int`` and keeps the lease in a registry until :func:`release_uid`;
:class:`UidLease` is the context-manager form. :func:`kill_uid` is the fallback sweep for a machine without a PID
namespace or a cgroup (a process that keeps forking can outrun it: the namespace and the cgroup cannot be outrun).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import random
import signal
import threading
import time

#: Where lease files live: root-only, on a filesystem every grader process of this machine shares.
LOCK_DIR = "/run/mimo-kit-uids" if os.path.isdir("/run") else "/tmp/mimo-kit-uids"
#: How many random draws a lease makes before giving up (a nearly full range says so by name).
MAX_DRAWS = 200

_held: dict[int, int] = {}  # uid -> descriptor holding its lock
_mutex = threading.Lock()


class UidError(RuntimeError):
    """No free sandbox uid could be leased; the message names the range."""


def _uid_has_processes(uid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    return True
            except OSError:
                continue
    return False


def _lock_dir(lock_dir: str) -> str:
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    st = os.lstat(lock_dir)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise UidError(f"uid lease folder {lock_dir!r} must be a directory owned by uid {os.geteuid()} with mode "
                       f"0700, found owner {st.st_uid} and mode {oct(st.st_mode & 0o777)}")
    return lock_dir


def lease_uid(base: int, count: int, *, lock_dir: str = LOCK_DIR, rng: random.Random | None = None) -> int:
    """Lease a uid in ``[base, base + count)`` that no live episode of this machine holds; raise UidError if none."""
    if base < 1000 or count < 1:
        raise UidError(f"uid range base={base}, count={count}: expected base >= 1000 (no system uids) and count >= 1")
    directory = _lock_dir(lock_dir)
    rng = rng or random.SystemRandom()
    candidates = range(base, base + count)
    draws = list(candidates) if count <= MAX_DRAWS else [rng.randrange(base, base + count) for _ in range(MAX_DRAWS)]
    if count <= MAX_DRAWS:
        rng.shuffle(draws)
    for uid in draws:
        try:
            pwd.getpwuid(uid)
            continue  # a named user: never borrow it
        except KeyError:
            pass
        fd = os.open(os.path.join(directory, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue
            raise
        if _uid_has_processes(uid):  # something outside the kit runs as this uid
            os.close(fd)
            continue
        with _mutex:
            _held[uid] = fd
        return uid
    raise UidError(f"no free sandbox uid in [{base}, {base + count}) after {len(draws)} draws: too many concurrent "
                   "episodes for the range; raise SandboxConfig.uid_count")


def release_uid(uid: int | None) -> None:
    """Give a leased uid back (a no-op for None or a uid this process does not hold)."""
    if uid is None:
        return
    with _mutex:
        fd = _held.pop(uid, None)
    if fd is not None:
        os.close(fd)


def held_uids() -> list[int]:
    with _mutex:
        return sorted(_held)


class UidLease:
    """``with UidLease(base, count) as uid: ...``: one leased uid, released on exit."""

    def __init__(self, base: int, count: int, **kw):
        self.uid = lease_uid(base, count, **kw)

    def __enter__(self) -> int:
        return self.uid

    def __exit__(self, *exc) -> None:
        release_uid(self.uid)


def uid_pids(uid: int) -> list[int]:
    """Live (non-zombie) processes of ``uid`` on the host."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                        break
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except OSError:
            continue
    return pids


def sigkill_until_gone(pids, rounds: int, pause_s: float) -> int:
    """SIGKILL every pid ``pids()`` lists, again and again until it lists none (a forking process may add more
    between rounds) or ``rounds`` run out; returns how many signals were sent."""
    sent = 0
    for _ in range(rounds):
        members = pids()
        if not members:
            break
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
                sent += 1
            except ProcessLookupError:
                pass
        time.sleep(pause_s)
    return sent


def wait_gone(pids, timeout_s: float, pause_s: float = 0.005) -> bool:
    """Wait until ``pids()`` lists nothing or ``timeout_s`` passes (processes already SIGKILLed finish exiting
    asynchronously: a loaded machine can show them for milliseconds after their namespace's init died); whether
    they are gone."""
    deadline = time.monotonic() + timeout_s
    while pids():
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause_s)
    return True


def kill_uid(uid: int, rounds: int = 20) -> int:
    """SIGKILL every process of ``uid`` (the fallback sweep where there is neither a PID namespace nor a cgroup)."""
    return sigkill_until_gone(lambda: uid_pids(uid), rounds, 0.005)
