"""The sandbox every environment runs agent commands and graders in (Report §4.2, "environment cleaning and network
isolation"; the threat model is ``docs/sandbox.md``).

:func:`run_sandboxed` runs one command; :func:`spawn_sandboxed` + :func:`pump` run several side by side (the
grader's judge next to the agent's code). Each command, as root, gets every layer of :mod:`mimo_kit.envs.isolation`:

- its own **cgroup** (memory and task budgets for all its processes together; the kill switch), joined by the
  forked child before anything else runs;
- fresh **mount, network, IPC and UTS namespaces**; the filesystem is an **allowlist** (:mod:`mimo_kit.envs.fsview`):
  system folders and Python read-only, the workspace and HOME read-write, a private size-limited scratch tmpfs for
  ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock``; nothing of the kit's repository, of other episodes or of
  the host's sockets;
- a **PID namespace** (``unshare --pid --fork --kill-child --mount-proc``): the command sees only its own
  processes, and when it exits (or is killed) the kernel kills every process it left behind;
- a **leased throw-away uid** (:mod:`mimo_kit.envs.uids`), ``no_new_privs``, no supplementary groups;
- **rlimits** (CPU seconds, file size, processes, address space except for ASan builds, no core files);
- **output truncated** to a head and a tail with a notice of how many bytes were dropped.

Isolation is probed once per process. Where the OS refuses a layer the sandbox still runs, warns once naming the
layer and what it would have stopped, and records the active layers on every result (``SandboxResult.layers``);
``SandboxConfig.require`` turns a missing layer into an error instead.

Departure from production sandboxes (containers, gVisor): no image, no Docker, no seccomp filter; a 2-core CPU runs
a command in a few tens of milliseconds more than a bare ``subprocess.run`` (``benchmarks/RESULTS_grading.md``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import resource
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.envs import fsview
from mimo_kit.envs.cgroups import CommandCgroup
from mimo_kit.envs.health import InfraError
from mimo_kit.envs.isolation import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUTS,
    LAYERS,
    Capabilities,
    capabilities,
    no_new_privs,
    warn_once,
)
from mimo_kit.envs.streams import Tail, drain, pump  # noqa: F401  (pump: run several commands side by side)
from mimo_kit.envs.uids import kill_uid, lease_uid, release_uid, uid_pids, wait_gone  # noqa: F401

#: Extra tasks pids.max allows beyond ``nproc``: the ``unshare`` wrapper outside the PID namespace, and its child.
WRAPPER_TASKS = 2
#: Seconds a finished command waits for its killed processes to finish exiting (they are dying already; on a loaded
#: machine a few stay visible for milliseconds), so the caller never sees one of them.
EXIT_WAIT_S = 5.0
#: What util-linux ``unshare --fork`` prints (then exits 1) when its child died of SIGKILL, which it cannot re-raise.
UNSHARE_SIGKILL = "unshare: sigprocmask unblock failed: Invalid argument\n"

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(InfraError):
    """The sandbox cannot run a command as configured; the message names the layer or value (a failed health
    check: the rollout that needed it is dropped, :mod:`mimo_kit.envs.health`)."""


@dataclasses.dataclass
class SandboxConfig(Config):
    """Limits of one sandboxed command. Every value is unpublished by the report: these are the kit's choices."""

    timeout_s: float = knob(30.0, "a toy test suite finishes in < 1 s; 30 s bounds a stuck command in an RL loop",
                            min=0.01)
    cpu_s: int = knob(60, "RLIMIT_CPU: a busy loop dies even if the wall-clock timeout were lost", min=1)
    fsize_mb: int = knob(64, "RLIMIT_FSIZE: one runaway file stops here (the volume bounds the sum)", min=1)
    nproc: int = knob(64, "RLIMIT_NPROC of the sandbox uid and the cgroup's task budget: enough for git/pytest/gcc",
                      min=4)
    address_space_mb: int = knob(4096, "RLIMIT_AS; 0 = off (ASan reserves ~20 TB of virtual memory)", min=0)
    memory_mb: int = knob(1024, "cgroup memory budget of all processes of a command (tmpfs pages they write too); "
                                "toy tests use < 100 MB", min=16)
    scratch_mb: int = knob(64, "private tmpfs behind /tmp, /var/tmp, /dev/shm, /run/lock; a toy build needs a few MB",
                           min=1)
    disk_mb: int = knob(256, "size of an episode's volume (workspace + HOME on tmpfs); a toy repo is < 1 MB", min=4)
    max_files: int = knob(20_000, "inodes of an episode's volume and of a command's scratch (tmpfs nr_inodes): a "
                                  "toy repo and its build hold hundreds; 40,000 empty files cost the host ~40 MB of "
                                  "kernel memory and the grader's diff seconds", min=64)
    output_limit: int = knob(64_000, "bytes of stdout and of stderr kept (half head, half tail): a model reads it",
                             min=256)
    network: bool = knob(False, "Report §4.2: network isolation; True only for a deliberately uncleaned variant")
    drop_privileges: bool = knob(True, "as root, run as a leased throw-away uid so RLIMIT_NPROC binds and files "
                                       "are guarded")
    uid_base: int = knob(200_000, "throw-away uids come from [uid_base, uid_base + uid_count); no passwd entry",
                         min=1000)
    uid_count: int = knob(50_000, "enough uids for any number of concurrent episodes on one machine", min=1)
    require: tuple[str, ...] = knob((), "isolation layers that must be active (see isolation.LAYERS); a missing one "
                                        "raises instead of warning")

    PRESETS = {"tiny": {}}

    def check(self) -> None:
        unknown = [x for x in self.require if x not in LAYERS]
        if unknown:
            raise ConfigError(f"SandboxConfig.require={list(self.require)}: unknown layers {unknown}; "
                              f"known: {', '.join(LAYERS)}")


@dataclasses.dataclass
class SandboxResult:
    """What one sandboxed command left behind."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    network_isolated: bool
    wall_s: float
    stdout_bytes: int = 0  # bytes the command wrote before truncation
    stderr_bytes: int = 0
    uid: int | None = None
    killed_escapees: int = 0  # processes that outlived the command and were killed by the cgroup or uid sweep
    layers: tuple[str, ...] = ()  # isolation layers active for this command
    oom_killed: bool = False  # the memory budget was exceeded and the kernel killed a process
    tasks_refused: int = 0  # forks refused at the task budget
    peak_memory_mb: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout and stderr as an agent sees them in one observation."""
        return self.stdout + (("\n" if self.stdout and not self.stdout.endswith("\n") else "") + self.stderr
                              if self.stderr else "")


# ---- helpers ------------------------------------------------------------------------------------------------------
def new_uid(cfg: SandboxConfig) -> int:
    """Lease a throw-away uid for one episode (shared by its commands); give it back with :func:`release_uid`."""
    return lease_uid(cfg.uid_base, cfg.uid_count)


def chown_tree(path: str | Path, uid: int | None) -> None:
    """Hand a workspace (or HOME) to the sandbox uid so it can write there and nowhere else (never follows links)."""
    if os.geteuid() != 0 or uid is None:
        return
    for root, dirs, files in os.walk(path):
        os.lchown(root, uid, uid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def minimal_env(home: str, extra: dict[str, str] | None = None, tmp: str | None = None) -> dict[str, str]:
    """The environment a sandboxed command sees: PATH, HOME, TMPDIR, a locale, no secrets, no proxies."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": tmp or home, "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "USER": "sandbox",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    env.update(extra or {})
    return env


# ---- the child's side: between fork and exec ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Plan:
    join_fds: tuple[int, ...]
    unshare_flags: int
    view: fsview.View | None
    hidepid_proc: bool  # no PID namespace: a /proc that shows only the sandbox uid's processes
    limits: tuple[tuple[int, int], ...]
    drop_to: int | None  # uid to switch to here (when the PID-namespace wrapper does not)
    seccomp: object = None  # a mimo_kit.envs.seccomp.Filter, installed after no_new_privs


@functools.cache
def _seccomp_filter():
    from mimo_kit.envs import seccomp

    return seccomp.build()


def _preexec(plan: _Plan) -> None:
    """Cgroup, namespaces, filesystem view, rlimits, no_new_privs, the seccomp filter, then the uid. Errors exit
    125 with a message."""
    try:
        for fd in plan.join_fds:
            os.write(fd, b"0")  # 0 = the writing process: joins before any agent code runs
        if plan.unshare_flags and _libc.unshare(plan.unshare_flags) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        if plan.view is not None:
            fsview.apply_view(plan.view)
            if plan.hidepid_proc:
                fsview._mount(b"proc", b"/proc", b"proc", fsview.MS_NOSUID | fsview.MS_NODEV | fsview.MS_NOEXEC,
                              b"hidepid=2")
        for what, value in plan.limits:
            resource.setrlimit(what, (value, value))
        no_new_privs()
        if plan.seccomp is not None:
            plan.seccomp.install(_libc)
        if plan.drop_to is not None:
            os.setgroups([])
            os.setgid(plan.drop_to)
            os.setuid(plan.drop_to)
    except BaseException as e:  # noqa: BLE001 - report any setup failure through stderr, never run unconfined
        os.write(2, f"sandbox setup failed: {e!r}\n".encode())
        os._exit(125)


# ---- one running command ------------------------------------------------------------------------------------------
class SandboxProcess:
    """A sandboxed command in flight: its pipes are drained by :func:`pump`; :meth:`finish` kills what is left."""

    def __init__(self, argv, popen, cfg, *, uid, own_uid, cgroup, stage, own_home, netns, layers, t0):
        self.argv, self.popen, self.cfg = argv, popen, cfg
        self.uid, self.own_uid, self.cgroup, self.stage, self.own_home = uid, own_uid, cgroup, stage, own_home
        self.netns, self.layers, self.t0 = netns, layers, t0
        self.out, self.err = Tail(cfg.output_limit), Tail(cfg.output_limit)

    def finish(self, timed_out: bool) -> SandboxResult:
        """Kill every process of the command (the group, the cgroup, the uid sweep as a fallback), collect results."""
        p = self.popen
        killed = timed_out or p.poll() is None
        try:
            if killed:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            escapees = 0
            if self.cgroup is not None:
                escapees = self.cgroup.kill()
            if self.uid is not None and "pid_namespace" not in self.layers:
                escapees += kill_uid(self.uid)
            p.wait()
            if killed and self.uid is not None and not wait_gone(lambda: uid_pids(self.uid), EXIT_WAIT_S):
                escapees += kill_uid(self.uid)  # the dying had EXIT_WAIT_S to finish exiting; what is left escaped
            for f, tail in ((p.stdout, self.out), (p.stderr, self.err)):
                drain(f, tail)  # what the command wrote before it died
                f.close()
            events = self.cgroup.events() if self.cgroup is not None else {}
            peak = self.cgroup.peak_memory_mb() if self.cgroup is not None else 0.0
        finally:
            if self.cgroup is not None:
                self.cgroup.remove()
            if self.stage:
                shutil.rmtree(self.stage, ignore_errors=True)
            if self.own_home:
                shutil.rmtree(self.own_home, ignore_errors=True)
            if self.own_uid:
                release_uid(self.uid)
        rc = p.returncode
        err = self.err.text()
        if "pid_namespace" in self.layers and rc == 1 and err.endswith(UNSHARE_SIGKILL):
            rc, err = -signal.SIGKILL, err[: -len(UNSHARE_SIGKILL)]  # the command was SIGKILLed (CPU limit, OOM)
        if rc == 125 and err.startswith("sandbox setup failed"):
            raise SandboxError(f"{err.strip()} (argv {describe_command(self.argv)!r})")
        oom = events.get("oom_kills", 0) > 0
        if oom:
            err += f"\n[sandbox: memory budget of {self.cfg.memory_mb} MB exceeded; the kernel killed a process]\n"
        if events.get("pids_refused", 0):
            err += f"\n[sandbox: task budget of {self.cfg.nproc} reached; {events['pids_refused']} forks refused]\n"
        return SandboxResult(argv=self.argv, returncode=rc if not timed_out else -9, stdout=self.out.text(),
                             stderr=err, timed_out=timed_out, network_isolated=self.netns,
                             wall_s=time.perf_counter() - self.t0, stdout_bytes=self.out.total,
                             stderr_bytes=self.err.total, uid=self.uid, killed_escapees=escapees,
                             layers=self.layers, oom_killed=oom, tasks_refused=events.get("pids_refused", 0),
                             peak_memory_mb=peak)


def _argv(cmd: str | Sequence[str]) -> list[str]:
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    if isinstance(cmd, Sequence) and cmd and all(isinstance(a, str) for a in cmd):
        return list(cmd)
    raise ConfigError(f"run_sandboxed: cmd={cmd!r}, expected a shell string or a non-empty list of strings")


def spawn_sandboxed(cmd: str | Sequence[str], cwd: str | Path, *, cfg: SandboxConfig | None = None,
                    home: str | Path | None = None, uid: int | None = None, env: dict[str, str] | None = None,
                    stdin: bytes | None = None, hide_paths: Sequence[str | Path] = (), network: bool | None = None,
                    pass_fds: Sequence[int] = (), visible: Sequence[str | Path] = (),
                    writable: Sequence[str | Path] = ()) -> SandboxProcess:
    """Start ``cmd`` under the sandbox and return at once; see :func:`run_sandboxed` for the arguments."""
    cfg = cfg or SandboxConfig()
    argv = _argv(cmd)
    cwd = Path(cwd)
    if not cwd.is_dir():
        raise ConfigError(f"run_sandboxed: cwd={str(cwd)!r} is not a directory")
    caps: Capabilities = capabilities()
    want_net_off = not (cfg.network if network is None else network)
    own_uid = caps.root and cfg.drop_privileges and uid is None
    uid = (new_uid(cfg) if own_uid else uid) if caps.root and cfg.drop_privileges else None
    view_on, pidns = caps.mountns, caps.mountns and caps.pidns and uid is not None
    netns = want_net_off and (caps.netns if caps.root else caps.unshare_cmd)
    flags = (CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS if view_on else 0) | (
        CLONE_NEWNET if want_net_off and caps.netns else 0)
    if want_net_off and netns and not caps.netns:
        argv = ["unshare", "-rn", "--"] + argv
    layers = tuple(x for x, on in {"uid": uid is not None, "no_new_privs": True, "network_namespace": netns,
                                   "mount_namespace": view_on, "pid_namespace": pidns,
                                   "cgroup": bool(caps.cgroup), "seccomp": caps.seccomp,
                                   "file_locks": caps.layers["file_locks"]}.items() if on)
    missing = [x for x in cfg.require if x not in layers and x != "volume"]
    if missing:
        if own_uid:
            release_uid(uid)
        raise SandboxError(f"isolation layers {missing} are required (SandboxConfig.require) but not available "
                           f"here: {caps.notes or 'see mimo-kit env-check'}")
    if caps.notes:
        warn_once(caps.notes)
    stage = own_home = None
    cgroup = None
    join_fds: list[int] = []
    try:
        if view_on:
            stage = tempfile.mkdtemp(prefix="mimo-stage-")
            view = fsview.build_view(stage, str(cwd), home=str(home) if home else None, scratch_mb=cfg.scratch_mb,
                                     scratch_files=cfg.max_files,
                                     owner=uid, visible=tuple(str(v) for v in visible),
                                     writable=tuple(str(w) for w in writable),
                                     hide=tuple(str(h) for h in hide_paths))
            home_inside = str(home) if home else "/tmp/home"
        else:
            view = None
            if home is None:
                own_home = tempfile.mkdtemp(prefix="mimo-home-")
                if uid is not None:
                    os.chown(own_home, uid, uid)
            home_inside = str(home) if home else own_home
        if caps.cgroup:
            cgroup = CommandCgroup.create(caps.cgroup, cfg.memory_mb, cfg.nproc + WRAPPER_TASKS)
            join_fds = cgroup.open_join_fds()
        limits = [(resource.RLIMIT_CPU, cfg.cpu_s), (resource.RLIMIT_FSIZE, cfg.fsize_mb << 20),
                  (resource.RLIMIT_CORE, 0)]
        if cfg.address_space_mb:
            limits.append((resource.RLIMIT_AS, cfg.address_space_mb << 20))
        if uid is not None or not caps.root:
            limits.append((resource.RLIMIT_NPROC, cfg.nproc))
        if pidns:
            argv_exec = [shutil.which("unshare") or "/usr/bin/unshare", "--pid", "--fork", "--kill-child",
                         "--mount-proc", "--setuid", str(uid), "--setgid", str(uid), "--", *argv]
        else:
            argv_exec = argv
        plan = _Plan(tuple(join_fds), flags, view, view_on and not pidns and caps.root, tuple(limits),
                     uid if not pidns else None, _seccomp_filter() if caps.seccomp else None)
        t0 = time.perf_counter()
        popen = subprocess.Popen(
            argv_exec, cwd=str(cwd), env=minimal_env(home_inside, env, "/tmp" if view_on else None),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, close_fds=True, pass_fds=tuple(pass_fds),
            preexec_fn=functools.partial(_preexec, plan))
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        for d in (stage, own_home):
            if d:
                shutil.rmtree(d, ignore_errors=True)
        if own_uid:
            release_uid(uid)
        raise
    finally:
        for fd in join_fds:
            os.close(fd)
    if stdin:
        try:
            popen.stdin.write(stdin)
            popen.stdin.close()
        except BrokenPipeError:
            pass
    return SandboxProcess(argv, popen, cfg, uid=uid, own_uid=own_uid, cgroup=cgroup, stage=stage, own_home=own_home,
                          netns=netns, layers=layers, t0=t0)


def run_sandboxed(cmd: str | Sequence[str], cwd: str | Path, timeout_s: float | None = None, *,
                  cfg: SandboxConfig | None = None, home: str | Path | None = None, uid: int | None = None,
                  env: dict[str, str] | None = None, stdin: bytes | None = None,
                  hide_paths: Sequence[str | Path] = (), network: bool | None = None,
                  pass_fds: Sequence[int] = (), visible: Sequence[str | Path] = (),
                  writable: Sequence[str | Path] = ()) -> SandboxResult:
    """Run ``cmd`` (an argv list, or a shell string run by ``/bin/sh -c``) in ``cwd`` under the sandbox.

    ``uid``: the episode's leased uid (:func:`new_uid`); a fresh one is leased for this call when None. ``cwd``
    (and ``home``, and ``writable``) are bound read-write: :func:`chown_tree` them to ``uid`` first. ``home``: a
    HOME that persists across the episode's commands (a fresh one on the private scratch tmpfs when None).
    ``visible``: extra paths the command may read. ``hide_paths``: folders inside the view covered by an empty
    tmpfs. ``pass_fds``: descriptors the command inherits. ``network``: overrides ``cfg.network``.
    """
    cfg = cfg or SandboxConfig()
    timeout = cfg.timeout_s if timeout_s is None else float(timeout_s)
    if timeout <= 0:
        raise ConfigError(f"run_sandboxed: timeout_s={timeout_s!r}, expected a positive number of seconds")
    proc = spawn_sandboxed(cmd, cwd, cfg=cfg, home=home, uid=uid, env=env, stdin=stdin, hide_paths=hide_paths,
                           network=network, pass_fds=pass_fds, visible=visible, writable=writable)
    timed_out = pump([proc], proc.t0 + timeout, proc)
    return proc.finish(timed_out)


def describe_command(cmd: str | Sequence[str]) -> str:
    return cmd if isinstance(cmd, str) else shlex.join(cmd)
