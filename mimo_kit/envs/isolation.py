"""Which isolation layers this machine gives a sandboxed command, probed once per process (Report §4.2).

Each layer stops a class of attack (``docs/sandbox.md`` has the full table):

=====================  ================================================================================
layer                  what it stops
=====================  ================================================================================
``uid``                a throw-away, leased uid: RLIMIT_NPROC binds, files of the host and of other
                       episodes are not writable, no signal or ptrace across episodes
``no_new_privs``       setuid binaries and file capabilities cannot raise privileges again
``network_namespace``  network access, abstract unix sockets of the host
``mount_namespace``    the allowlisted filesystem view (:mod:`mimo_kit.envs.fsview`): no kit repository, no
                       other episodes, private size-limited ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``
``pid_namespace``      host processes and their command lines; every process dies with the command
``cgroup``             total memory and task budgets; the kill switch for what remains
``volume``             the episode's workspace and HOME on a size-limited tmpfs: no disk filling
``seccomp``            kernel keyrings (a channel between episodes no namespace covers), bpf, perf events,
                       module loading: denied with EPERM (:mod:`mimo_kit.envs.seccomp`)
``file_locks``         locks and inode watches on the files every sandbox shares (``/usr``, Python): a
                       channel between concurrent episodes no namespace covers; the same filter makes
                       ``flock`` and ``fcntl`` locks no-ops and refuses ``F_GETLK``, leases, ``F_NOTIFY``,
                       inotify and fanotify (:mod:`mimo_kit.envs.seccomp`)
=====================  ================================================================================

Where a layer is missing the sandbox still runs, warns once naming the layer and the attack class it would have
stopped, and records the active layers on every result, so a trainer can refuse rollouts (``SandboxConfig.require``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import functools
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings

from mimo_kit.envs import cgroups, fsview

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x04000000, 0x08000000, 0x40000000
#: The uid the PID-namespace probe switches to (``nobody``: exists everywhere, never a sandbox uid).
PROBE_UID = 65534

LAYERS = {
    "uid": "a throw-away leased uid per episode (no cross-episode signals, files guarded, RLIMIT_NPROC binds)",
    "no_new_privs": "no privilege gain through setuid binaries or file capabilities",
    "network_namespace": "no network, no abstract unix sockets of the host",
    "mount_namespace": "allowlisted filesystem: no kit repository, no other episodes, private /tmp and /dev/shm",
    "pid_namespace": "host processes invisible; every process of a command dies with it",
    "cgroup": "total memory and task budgets per command; the kill switch",
    "volume": "workspace and HOME on a size-limited tmpfs (disk cannot fill)",
    "seccomp": "no kernel keyrings (add_key/keyctl: a channel between episodes), bpf, perf events or modules",
    "file_locks": "no lock, lease or inotify/fanotify watch on files every sandbox shares (flock, fcntl locks: a "
                  "channel between concurrent episodes)",
}

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NO_NEW_PRIVS = 38  # <linux/prctl.h>


def no_new_privs() -> None:
    """``prctl(PR_SET_NO_NEW_PRIVS, 1)`` in a child before ``exec``: no setuid binary or file capability raises its
    privileges again, and a seccomp filter may be installed without root."""
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(no_new_privs)")


@dataclasses.dataclass(frozen=True)
class Capabilities:
    root: bool
    netns: bool  # a new network namespace in the child (root)
    mountns: bool  # the allowlisted view: mount namespace + pivot_root (root)
    pidns: bool  # `unshare --pid --fork --mount-proc --setuid` works (root)
    cgroup: int  # 1 or 2: the cgroup version that bounds a command; 0 = none
    volume: bool  # size-limited tmpfs episode volumes can be mounted
    unshare_cmd: bool  # `unshare -rn` works (the network fallback for non-root)
    notes: str
    seccomp: bool = False  # the filter of mimo_kit.envs.seccomp installs and denies add_key
    locks: bool = False  # under that filter a lock on a shared file is invisible outside, observers are refused

    @property
    def layers(self) -> dict[str, bool]:
        return {"uid": self.root, "no_new_privs": True, "network_namespace": self.netns or self.unshare_cmd,
                "mount_namespace": self.mountns, "pid_namespace": self.pidns, "cgroup": bool(self.cgroup),
                "volume": self.volume, "seccomp": self.seccomp, "file_locks": self.seccomp and self.locks}


def _unshare_in_child(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")


def _view_in_child(view: fsview.View) -> None:
    _unshare_in_child(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)
    fsview.apply_view(view)


def _seccomp_in_child(flt) -> None:
    no_new_privs()
    flt.install(_libc)


def _seccomp_works() -> bool:
    """The filter installs, and under it ``add_key`` fails with EPERM while an ordinary program runs."""
    from mimo_kit.envs import seccomp

    flt = seccomp.build()
    if flt is None:
        return False
    nr = seccomp.ARCHES[seccomp.platform.machine()][1]["add_key"]
    probe = ("import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
             f"r = libc.syscall({nr}, b'user', b'mimo-seccomp-probe', b'x', 1, ctypes.c_int(-4))\n"
             "sys.exit(0 if r == -1 and ctypes.get_errno() == 1 else 1)")

    return _works([sys.executable, "-I", "-S", "-c", probe], preexec_fn=functools.partial(_seccomp_in_child, flt))


#: The lock probe, run under the filter with the path of a file every sandbox shares: it asks ``F_GETLK`` and
#: ``inotify_init1`` (both must fail with EPERM), takes a ``flock`` and an ``fcntl`` read lock (``lockf``) on the
#: file, prints ``locked ok`` (or ``locked seen``) and waits to be killed, holding whatever it took.
LOCK_PROBE = """import ctypes, fcntl, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
    getlk = False
except PermissionError:
    getlk = True
watch = libc.inotify_init1(0) == -1 and ctypes.get_errno() == 1
fcntl.flock(fd, fcntl.LOCK_SH)
fcntl.lockf(fd, fcntl.LOCK_SH)
print("locked", "ok" if getlk and watch else "seen", flush=True)
time.sleep(60)
"""


def lock_visible(path: str) -> bool:
    """Whether a lock on ``path`` is visible from here: a non-blocking exclusive ``flock`` is refused, or
    ``F_GETLK`` names a holder (``struct flock { short l_type, l_whence; off_t l_start, l_len; pid_t l_pid; }``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
        return struct.unpack_from("h", got)[0] != fcntl.F_UNLCK
    finally:
        os.close(fd)


def lock_channel_closed(popen: subprocess.Popen, path: str, timeout_s: float = 10.0) -> bool:
    """Given a running :data:`LOCK_PROBE` on ``path``: it found both observers refused, and while it held its locks
    (still running after the check) none was visible from here. The caller kills it."""
    ready, _, _ = select.select([popen.stdout], [], [], timeout_s)
    line = popen.stdout.readline() if ready else b""
    return line.split() == [b"locked", b"ok"] and not lock_visible(path) and popen.poll() is None


def _locks_work() -> bool:
    """Under the filter, the lock probe on the Python binary (a file every sandbox shares) leaves no lock visible
    outside and cannot observe one."""
    from mimo_kit.envs import seccomp

    flt = seccomp.build()
    if flt is None:
        return False
    path = os.path.realpath(sys.executable)
    try:
        p = subprocess.Popen([sys.executable, "-I", "-S", "-c", LOCK_PROBE, path], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             preexec_fn=functools.partial(_seccomp_in_child, flt))
    except (OSError, subprocess.SubprocessError):
        return False
    try:
        return lock_channel_closed(p, path)
    except OSError:
        return False
    finally:
        p.kill()
        p.wait()
        p.stdout.close()


def _works(argv: list[str], **kw) -> bool:
    try:
        return subprocess.run(argv, timeout=10, capture_output=True, **kw).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _volume_works() -> bool:
    d = tempfile.mkdtemp(prefix="mimo-probe-")
    try:
        if _libc.mount(b"tmpfs", d.encode(), b"tmpfs", 0, b"size=1m") != 0:
            return False
        _libc.umount2(d.encode(), 2)
        return True
    finally:
        os.rmdir(d)


@functools.lru_cache(maxsize=1)
def capabilities() -> Capabilities:
    """Probe once what isolation this OS allows; notes name each missing layer and what it would have stopped."""
    root = os.geteuid() == 0
    netns = mountns = pidns = volume = unshare_cmd = False
    cg = 0
    notes = []
    if root:
        netns = _works(["/bin/true"], preexec_fn=functools.partial(_unshare_in_child, CLONE_NEWNET))
        stage, ws = tempfile.mkdtemp(prefix="mimo-probe-"), tempfile.mkdtemp(prefix="mimo-probe-")
        try:
            view = fsview.build_view(stage, ws, home=None, scratch_mb=1, owner=None)
            mountns = _works(["/bin/true"], preexec_fn=functools.partial(_view_in_child, view))
        finally:
            os.rmdir(stage)
            os.rmdir(ws)
        exe = shutil.which("unshare")
        pidns = bool(exe) and _works([exe, "--pid", "--fork", "--kill-child", "--mount-proc", "--setuid",
                                      str(PROBE_UID), "--setgid", str(PROBE_UID), "/bin/true"])
        cg, cg_note = cgroups.probe()
        if not cg:
            notes.append(cg_note)
        volume = _volume_works()
    if not netns:
        unshare_cmd = _works(["unshare", "-rn", "/bin/true"])
    caps = Capabilities(root, netns, mountns, pidns, cg, volume, unshare_cmd, "", _seccomp_works(), _locks_work())
    for layer, active in caps.layers.items():
        if not active:
            notes.append(f"{layer} unavailable, not enforced: {LAYERS[layer]}")
    if not root:
        notes.append("not root: commands run as the current user (run the grader as root for every layer)")
    return dataclasses.replace(caps, notes="; ".join(notes))


@functools.cache
def warn_once(message: str) -> None:
    warnings.warn(f"mimo_kit sandbox: {message}", RuntimeWarning, stacklevel=3)


def report() -> list[tuple[str, bool, str]]:
    """(layer, active, what it stops) for every layer: what ``mimo-kit env-check`` prints."""
    return [(name, active, LAYERS[name]) for name, active in capabilities().layers.items()]
