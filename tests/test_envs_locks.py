"""Locks and inode events on shared files are no channel between concurrent episodes (Report §4.2; docs/sandbox.md;
:mod:`mimo_kit.envs.seccomp`).

Every sandbox opens the same inodes of ``/usr`` and the Python installation (bound read-only), and a lock lives on
the inode: an episode could publish the judge's call inputs as locks on them and a concurrent episode read them
back. Under the filter a lock taken in a sandbox is never taken (the call returns 0), every way to observe a lock
or watch an inode fails with EPERM, and the ``fcntl`` commands every program needs still work. Tests that run
sandboxed commands skip, saying why, where this machine has no such filter."""

import ctypes
import fcntl
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.envs import seccomp
from mimo_kit.envs.isolation import LAYERS, capabilities, lock_visible
from mimo_kit.envs.sandbox import SandboxConfig, chown_tree, new_uid, run_sandboxed, spawn_sandboxed
from mimo_kit.envs.uids import release_uid

CAPS = capabilities()
needs_filter = pytest.mark.skipif(not CAPS.layers["file_locks"], reason="no seccomp lock filter on this machine "
                                  "(see mimo-kit env-check): the sandbox warns and records the missing layer")
#: Files every sandbox shares, read-only: a system binary and a module of the standard library.
SHARED = [p for p in ("/usr/bin/env", os.path.realpath(os.__file__)) if os.path.isfile(p)]
ALLOW, EPERM = seccomp.SECCOMP_RET_ALLOW, seccomp.SECCOMP_RET_ERRNO | seccomp.EPERM
NOTHING = seccomp.SECCOMP_RET_ERRNO | 0  # the call returns 0 and does nothing

# ---- the specification, written out apart from the module's tables -----------------------------------------------
#: Lock and inode-event calls by machine (``<asm/unistd_64.h>``, ``<asm-generic/unistd.h>``).
CALLS = {"x86_64": {"flock": 73, "fcntl": 72, "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300},
         "aarch64": {"flock": 32, "fcntl": 25, "inotify_init1": 26, "fanotify_init": 262}}
#: fcntl commands that take a lock (answered 0, nothing taken) and that observe one or watch an inode (EPERM).
TAKE = {"F_SETLK": 6, "F_SETLKW": 7, "F_OFD_SETLK": 37, "F_OFD_SETLKW": 38}
OBSERVE = {"F_GETLK": 5, "F_OFD_GETLK": 36, "F_SETLEASE": 1024, "F_GETLEASE": 1025, "F_NOTIFY": 1026}
#: fcntl commands Python's startup and every libc program use: allowed.
NEEDED = {"F_DUPFD": 0, "F_GETFD": 1, "F_SETFD": 2, "F_GETFL": 3, "F_SETFL": 4, "F_DUPFD_CLOEXEC": 1030}


def test_the_tables_are_the_specification():
    for machine, calls in CALLS.items():
        numbers = seccomp.ARCHES[machine][1]
        for name in ("inotify_init", "inotify_init1", "fanotify_init"):
            assert numbers.get(name) == calls.get(name), (machine, name)
        assert seccomp.LOCK_CALLS[machine] == {"flock": calls["flock"], "fcntl": calls["fcntl"]}
        assert not {calls["flock"], calls["fcntl"]} & set(numbers.values())  # answered by the lock program alone
    assert seccomp.FCNTL_NOTHING == TAKE and seccomp.FCNTL_DENIED == OBSERVE
    for name, cmd in {**TAKE, **OBSERVE, **NEEDED}.items():  # this Python's <fcntl.h> agrees
        assert getattr(fcntl, name, cmd) == cmd, name
    assert "file_locks" in LAYERS


def _header(path: str, name: str) -> int | None:
    try:
        m = re.search(rf"#define\s+__NR(?:3264)?_{name}\s+(\d+)\b", Path(path).read_text())
    except OSError:
        return None
    return int(m.group(1)) if m else None


@pytest.mark.parametrize("machine,header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                            ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_the_numbers_match_the_kernel_headers(machine, header):
    if not os.path.isfile(header):
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    for name, nr in CALLS[machine].items():
        assert _header(header, name) == nr, (machine, name)
    if machine == "aarch64":
        assert _header(header, "inotify_init") is None  # the generic table never had it


# ---- the programs, run by a classic-BPF interpreter over struct seccomp_data ------------------------------------
def _data(nr: int, arch: int, args: tuple[int, ...] = (0,) * 6) -> bytes:
    """``struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }``, little-endian."""
    return struct.pack("<IIQ6Q", nr & 0xFFFFFFFF, arch, 0x401000, *args)


def _run(code: bytes, data: bytes) -> int:
    insns = [struct.unpack("HBBI", code[i:i + 8]) for i in range(0, len(code), 8)]
    pc = acc = 0
    while True:
        op, jt, jf, k = insns[pc]
        if op == 0x20:  # BPF_LD | BPF_W | BPF_ABS: aligned, inside the struct
            assert k % 4 == 0 and k + 4 <= len(data), k
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x15:
            pc += jt if acc == k else jf
        elif op == 0x35:
            pc += jt if acc >= k else jf
        elif op == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected BPF opcode {op:#x}")
        pc += 1
        assert pc < len(insns), "jumped past the end"


def _verdict(machine: str, nr: int, args: tuple[int, ...] = (0,) * 6, arch: int | None = None) -> int:
    """What the kernel answers with both programs installed: each runs, most recent first; a more restrictive
    action replaces the answer (``ACTION_ONLY`` as a signed int, smaller wins)."""
    data = _data(nr, seccomp.ARCHES[machine][0] if arch is None else arch, args)
    answers = [_run(seccomp.lock_program(machine), data), _run(seccomp.program(machine), data)]
    best = answers[0]
    for a in answers[1:]:
        if ctypes.c_int32(a & 0xFFFF0000).value < ctypes.c_int32(best & 0xFFFF0000).value:
            best = a
    return best


def _expected(machine: str, nr: int, cmd: int) -> int:
    calls = CALLS[machine]
    if machine == "x86_64" and nr >= seccomp.X32_SYSCALL_BIT:
        return EPERM
    if nr in set(seccomp.ARCHES[machine][1].values()):  # keyrings, bpf, ... and the inode-event calls
        return EPERM
    if nr == calls["flock"]:
        return NOTHING
    if nr == calls["fcntl"]:
        low = cmd & 0xFFFFFFFF  # the kernel's `unsigned int cmd`
        return NOTHING if low in TAKE.values() else EPERM if low in OBSERVE.values() else ALLOW
    return ALLOW


def test_every_fcntl_command_and_every_call_number_get_exactly_their_answer():
    for machine, calls in CALLS.items():
        for cmd in [*range(0, 2048), 0x7FFFFFFF, 0xFFFFFFFF]:
            assert _verdict(machine, calls["fcntl"], (3, cmd, 0, 0, 0, 0)) == _expected(machine, calls["fcntl"], cmd)
        for nr in range(0, 1024):
            assert _verdict(machine, nr, (3, 6, 0, 0, 0, 0)) == _expected(machine, nr, 6), (machine, nr)
        for name in NEEDED:
            assert _verdict(machine, calls["fcntl"], (0, NEEDED[name], 0, 0, 0, 0)) == ALLOW, name
        for name in ("inotify_init", "inotify_init1", "fanotify_init"):
            if name in calls:
                assert _verdict(machine, calls[name]) == EPERM
        for other in (0x40000003, 0x40000028, 0xC000003E if machine == "aarch64" else 0xC00000B7):
            assert _verdict(machine, calls["flock"], arch=other) == EPERM  # another ABI never passes
            assert _verdict(machine, calls["fcntl"], (0, 1, 0, 0, 0, 0), arch=other) == EPERM
    x32 = seccomp.X32_SYSCALL_BIT
    assert _verdict("x86_64", x32 + 73) == EPERM and _verdict("x86_64", x32 + 72, (0, 1, 0, 0, 0, 0)) == EPERM


_NRS = sorted({nr for calls in CALLS.values() for nr in calls.values()} | {0, 1, 59, 221, 435})
_CMDS = sorted({*TAKE.values(), *OBSERVE.values(), *NEEDED.values(), 12, 13, 14, 1027, 1033, 1035, 1036})


@settings(max_examples=400, deadline=None)
@given(machine=st.sampled_from(sorted(CALLS)),
       nr=st.one_of(st.sampled_from(_NRS), st.integers(0, 0x4FFFFFFF)),
       cmd=st.one_of(st.sampled_from(_CMDS), st.integers(0, 0xFFFFFFFF)),
       high=st.one_of(st.just(0), st.integers(0, 0xFFFFFFFF)),
       rest=st.lists(st.integers(0, 2**64 - 1), min_size=5, max_size=5))
def test_the_filter_answers_by_call_and_by_the_low_half_of_the_command(machine, nr, cmd, high, rest):
    """The high half of ``args[1]`` never matters: the kernel truncates ``cmd`` to 32 bits."""
    args = (rest[0], high << 32 | cmd, *rest[1:])
    assert _verdict(machine, nr, args) == _expected(machine, nr, cmd)


# ---- inside a sandbox ---------------------------------------------------------------------------------------------
@pytest.fixture
def workspaces():
    """Workspaces for two episodes, each owned by its own leased uid where this machine leases uids."""
    made = []

    def make():
        d = Path(tempfile.mkdtemp(prefix="mimo-locks-"))
        d.chmod(0o711)
        uid = new_uid(SandboxConfig()) if CAPS.root else None
        chown_tree(d, uid)
        made.append((d, uid))
        return d, uid

    yield make
    for d, uid in made:
        release_uid(uid)
        shutil.rmtree(d, ignore_errors=True)


COMMANDS = r"""import ctypes, fcntl, json, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
calls = json.loads(sys.argv[2])
F = "hhqqi"  # struct flock: l_type, l_whence, l_start, l_len, l_pid
fd = os.open(sys.argv[1], os.O_RDONLY)
dfd = os.open(os.path.dirname(sys.argv[1]), os.O_RDONLY)
def raw(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return [r, ctypes.get_errno() if r < 0 else 0]
def lock(cmd, kind=fcntl.F_RDLCK, high=0):
    buf = ctypes.create_string_buffer(struct.pack(F, kind, 0, 0, 1, 0), 64)
    r = libc.syscall(ctypes.c_long(calls["fcntl"]), ctypes.c_long(fd), ctypes.c_long(high << 32 | cmd), buf)
    return [r, ctypes.get_errno() if r < 0 else 0]
out = {"F_GETFD": raw(calls["fcntl"], fd, 1), "F_SETFD": raw(calls["fcntl"], fd, 2, 1),
       "F_GETFL": raw(calls["fcntl"], fd, 3), "F_SETFL": raw(calls["fcntl"], fd, 4, os.O_NONBLOCK),
       "F_DUPFD": raw(calls["fcntl"], fd, 0, 50), "F_DUPFD_CLOEXEC": raw(calls["fcntl"], fd, 1030, 60),
       "F_GETFD high": raw(calls["fcntl"], fd, 1 << 32 | 1)}
for name, cmd in {"F_GETLK": 5, "F_SETLK": 6, "F_SETLKW": 7, "F_OFD_GETLK": 36, "F_OFD_SETLK": 37,
                  "F_OFD_SETLKW": 38}.items():
    out[name] = lock(cmd, fcntl.F_WRLCK if name.endswith("GETLK") else fcntl.F_RDLCK)
    out[name + " high"] = lock(cmd, fcntl.F_WRLCK, high=1)
out["F_SETLEASE"] = raw(calls["fcntl"], fd, 1024, fcntl.F_RDLCK)
out["F_GETLEASE"] = raw(calls["fcntl"], fd, 1025)
out["F_NOTIFY"] = raw(calls["fcntl"], dfd, 1026, fcntl.DN_ACCESS)
out["flock"] = raw(calls["flock"], fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
for name in ("inotify_init", "inotify_init1", "fanotify_init"):
    if name in calls:
        out[name] = raw(calls[name], *([] if name == "inotify_init" else [0, 0]))
print(json.dumps(out))
"""


@needs_filter
def test_the_fcntl_commands_every_program_needs_still_work_and_the_rest_do_nothing(workspaces):
    ws, uid = workspaces()
    machine = seccomp.platform.machine()
    r = run_sandboxed([sys.executable, "-c", COMMANDS, SHARED[0], json.dumps(CALLS[machine])], ws, uid=uid)
    assert r.returncode == 0 and "file_locks" in r.layers, r.output
    out = json.loads(r.stdout)
    assert out["F_GETFD"] == [1, 0] and out["F_SETFD"] == [0, 0] and out["F_GETFD high"] == [1, 0]  # FD_CLOEXEC
    assert out["F_GETFL"][0] >= 0 and out["F_SETFL"] == [0, 0]
    assert out["F_DUPFD"][0] >= 50 and out["F_DUPFD_CLOEXEC"][0] >= 60
    for name in TAKE:  # answered 0, taken by nobody (a write lock on a read-only descriptor would be EBADF)
        assert out[name] == [0, 0] and out[name + " high"] == [0, 0], name
    for name in OBSERVE:
        assert out[name] == [-1, 1], name
        if name + " high" in out:
            assert out[name + " high"] == [-1, 1], name
    assert out["flock"] == [0, 0]
    for name in ("inotify_init", "inotify_init1", "fanotify_init"):
        if name in CALLS[machine]:
            assert out[name] == [-1, 1], name


#: Episode A: locks on each shared file a number could be read from (a flock; an fcntl read lock at byte 900; an
#: OFD read lock at byte 1994), then opens and reads the files again and again, for a watch to see.
HOLDER = r"""import fcntl, os, struct, sys, time
for path in sys.argv[1:]:
    a, b, c = (os.open(path, os.O_RDONLY) for _ in range(3))
    fcntl.flock(a, fcntl.LOCK_SH)
    fcntl.lockf(b, fcntl.LOCK_SH, 1, 900)
    fcntl.fcntl(c, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 1994, 1, 0))
print("held", flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            f.read(4096)
    time.sleep(0.01)
"""
#: Episode B: every way to see A's locks or A's opens of the same files.
PROBER = r"""import ctypes, fcntl, json, os, select, shutil, signal, struct, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
signal.signal(signal.SIGIO, signal.SIG_IGN)  # what a dnotify watch sends
F = "hhqqi"
def attempt(f):
    try:
        r = f()
    except OSError as e:
        return ["errno", e.errno]
    return ["ok", list(struct.unpack_from(F, r)) if isinstance(r, bytes) else r]
out = {}
for path in sys.argv[1:]:
    fd, dfd = os.open(path, os.O_RDONLY), os.open(os.path.dirname(path), os.O_RDONLY)
    util = shutil.which("flock")  # util-linux: exit 1 when the lock is held elsewhere
    o = {"flock -n": subprocess.run([util, "-n", path, "true"], capture_output=True).returncode if util else None,
         "flock": attempt(lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)),
         "lockf": attempt(lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 900)),
         "F_GETLK": attempt(lambda: fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(F, fcntl.F_WRLCK, 0, 0, 0, 0))),
         "F_OFD_GETLK": attempt(lambda: fcntl.fcntl(fd, fcntl.F_OFD_GETLK, struct.pack(F, fcntl.F_WRLCK, 0, 0, 0, 0))),
         "F_GETLEASE": attempt(lambda: fcntl.fcntl(fd, fcntl.F_GETLEASE)),
         "F_NOTIFY": attempt(lambda: fcntl.fcntl(dfd, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT))}
    ino = libc.inotify_init1(0)
    o["inotify"] = [ino, ctypes.get_errno() if ino < 0 else 0]
    if ino >= 0:  # without the filter: a watch, and whether A's reads show up within half a second
        libc.inotify_add_watch(ino, path.encode(), 0x1 | 0x20)  # IN_ACCESS | IN_OPEN
        o["inotify"].append(bool(select.select([ino], [], [], 0.5)[0]))
    fan = libc.fanotify_init(0, 0)
    o["fanotify"] = [fan, ctypes.get_errno() if fan < 0 else 0]
    out[path] = o
print(json.dumps(out))
"""


def _hold(argv, start):
    """Start the holder with ``start(argv)``; return it once it says it holds its locks."""
    proc = start(argv)
    popen = getattr(proc, "popen", proc)
    ready, _, _ = select.select([popen.stdout], [], [], 30)
    line = popen.stdout.readline() if ready else b""
    assert line == b"held\n", (line, popen.poll())
    return proc


@needs_filter
def test_locks_and_inode_events_are_no_channel_between_concurrent_episodes(workspaces):
    """A (one episode, one uid) holds flock, fcntl and OFD locks on shared read-only files and keeps opening them;
    B (a concurrent episode, another uid) probes them every way it can: what B sees is what it sees with no A, every
    observer fails with EPERM, and from outside any sandbox no lock exists while A holds its own."""
    (ws_a, uid_a), (ws_b, uid_b) = workspaces(), workspaces()
    probe = [sys.executable, "-c", PROBER, *SHARED]
    alone = run_sandboxed(probe, ws_b, uid=uid_b)
    assert alone.returncode == 0, alone.output
    holder = _hold([sys.executable, "-c", HOLDER, *SHARED], lambda argv: spawn_sandboxed(argv, ws_a, uid=uid_a))
    try:
        beside = run_sandboxed(probe, ws_b, uid=uid_b)
        outside = {path: lock_visible(path) for path in SHARED}
        assert holder.popen.poll() is None  # A still held its locks and kept reading through all of it
    finally:
        a = holder.finish(False)
    assert beside.returncode == 0 and "file_locks" in beside.layers and "file_locks" in a.layers, beside.output
    assert uid_a is None or uid_a != uid_b
    seen = json.loads(beside.stdout)
    assert seen == json.loads(alone.stdout)  # B learns nothing from A
    assert outside == {path: False for path in SHARED}
    for path, o in seen.items():
        for name in ("F_GETLK", "F_OFD_GETLK", "F_GETLEASE", "F_NOTIFY"):
            assert o[name] == ["errno", 1], (path, name, o)
        assert o["inotify"] == [-1, 1] and o["fanotify"] == [-1, 1], (path, o)
        assert o["flock -n"] in (0, None) and o["flock"] == ["ok", None] and o["lockf"] == ["ok", None], (path, o)


def test_without_the_filter_the_same_locks_are_a_channel():
    """The control: the same holder and prober as plain processes (no sandbox) publish and decode A's numbers."""
    holder = _hold([sys.executable, "-c", HOLDER, *SHARED],
                   lambda argv: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    try:
        assert all(lock_visible(path) for path in SHARED)
        seen = json.loads(subprocess.run([sys.executable, "-c", PROBER, *SHARED], capture_output=True,
                                         timeout=60).stdout)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    for path, o in seen.items():
        assert o["flock -n"] in (1, None) and o["flock"] == ["errno", 11], (path, o)  # EWOULDBLOCK: A holds it
        assert o["F_GETLK"][0] == "ok" and o["F_GETLK"][1][2] in (900, 1994), (path, o)  # l_start: A's number
        assert o["F_OFD_GETLK"][1][2] in (900, 1994), (path, o)


#: What the grader and agent code run in a sandbox that touches locks: git (O_EXCL lock files) and SQLite.
TOOLS = r"""set -e
git init -q repo && cd repo && git config user.email a@b.c && git config user.name a
echo one > f.txt && git add f.txt && git commit -qm one && echo two > f.txt && git diff --stat && cd ..
python3 - <<'X'
import sqlite3
c = sqlite3.connect("shop.db")
c.execute("CREATE TABLE t (x)")
c.execute("INSERT INTO t VALUES (1)")
c.commit()
print("rollback", sqlite3.connect("shop.db").execute("SELECT count(*) FROM t").fetchone()[0])
n = sqlite3.connect("file:n.db?nolock=1", uri=True)
n.execute("CREATE TABLE t (x)")
print("nolock", n.execute("SELECT count(*) FROM t").fetchone()[0])
try:
    w = sqlite3.connect("wal.db")
    w.execute("PRAGMA journal_mode=wal")
    w.execute("CREATE TABLE t (x)")
    print("wal works")
except sqlite3.OperationalError as e:
    print("wal fails:", e)
X
"""


@needs_filter
def test_git_and_sqlite_work_in_a_sandbox(workspaces):
    """The costs the module docstring names: git and SQLite's default rollback journal work (a lock is answered 0);
    WAL mode fails (it asks F_GETLK who holds its shared memory)."""
    ws, uid = workspaces()
    r = run_sandboxed(TOOLS, ws, uid=uid, timeout_s=60)
    assert r.returncode == 0, r.output
    assert "1 file changed" in r.stdout and "rollback 1" in r.stdout and "nolock 0" in r.stdout, r.output
    assert "wal fails" in r.stdout, r.output
