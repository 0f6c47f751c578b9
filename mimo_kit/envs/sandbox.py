"""The sandbox every environment runs agent commands and graders in (Report §4.2, "environment cleaning and network
isolation"; DESIGN "Environments, harness, grading").

One call, :func:`run_sandboxed`, runs one command:

- in its **own session and process group** (``setsid``); a timeout SIGKILLs the whole group, and because every
  sandboxed command runs under its **own throw-away uid**, a final sweep kills any process of that uid that escaped
  the group with ``setsid`` or a double fork (peers' lesson: *orphans outlive timeouts*);
- under **rlimits**: CPU seconds, file size, number of processes (and address space, except for ASan builds, which
  reserve terabytes of virtual memory);
- as an **unprivileged user**: as root, ``RLIMIT_NPROC`` does not bind, so the child drops to a fresh uid (from
  ``uid_base``); a fork bomb then stops at ``nproc`` processes;
- with a **private temp HOME**, a minimal environment and the workspace as its only writable directory;
- with **network off** through a new network namespace (only a down loopback inside) and, as root, a private mount
  namespace in which ``hide_paths`` (the kit's task data: gold patches, hidden tests) are covered by an empty tmpfs;
- with **output truncated** to a head and a tail and a notice saying how many bytes were dropped.

Isolation is probed once per process (:func:`capabilities`). Where the OS refuses a namespace the sandbox still
runs, warns once, and records ``network_isolated=False`` on every result so a trainer can refuse such rollouts.

Departure from production sandboxes (containers, gVisor): no image, no Docker, no network; a 2-core CPU runs a
command in a few milliseconds more than a bare ``subprocess.run`` (``benchmarks/RESULTS_grading.md``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import random
import resource
import selectors
import shlex
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from mimo_kit.config.base import Config, ConfigError, knob

_KIT_ROOT = Path(__file__).resolve().parents[2]

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


@dataclasses.dataclass
class SandboxConfig(Config):
    """Limits of one sandboxed command. Every value is unpublished by the report: these are the kit's choices."""

    timeout_s: float = knob(30.0, "a toy test suite finishes in < 1 s; 30 s bounds a stuck command in an RL loop",
                            min=0.01)
    cpu_s: int = knob(60, "RLIMIT_CPU: a busy loop dies even if the wall-clock timeout were lost", min=1)
    fsize_mb: int = knob(64, "RLIMIT_FSIZE: a runaway writer cannot fill the disk", min=1)
    nproc: int = knob(64, "RLIMIT_NPROC for the sandbox uid: enough for git/pytest/gcc, a fork bomb stops here", min=4)
    address_space_mb: int = knob(4096, "RLIMIT_AS; 0 = off (ASan reserves ~20 TB of virtual memory)", min=0)
    output_limit: int = knob(64_000, "bytes of stdout and of stderr kept (half head, half tail): a model reads it",
                             min=256)
    network: bool = knob(False, "Report §4.2: network isolation; True only for a deliberately uncleaned variant")
    drop_privileges: bool = knob(True, "as root, run as a throw-away uid so RLIMIT_NPROC binds and files are guarded")
    uid_base: int = knob(200_000, "throw-away uids are drawn from [uid_base, uid_base + 50000); no passwd entry",
                         min=1000)
    hide_kit_data: bool = knob(True, "cover the kit's data/ (gold patches, hidden tests) with an empty tmpfs")
    private_tmp: bool = knob(True, "mask every entry of the shared roots below except the command's own dirs "
                                   "(other episodes' workspaces, other checkouts of the kit and their gold data)")
    shared_roots: tuple[str, ...] = knob(("/tmp", "/var/tmp", "/work", "/srv", "/home", "/mnt"),
                                         "folders where other episodes, checkouts and users keep files")

    PRESETS = {"tiny": {}}


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
    killed_escapees: int = 0  # processes of the sandbox uid that outlived the command and were killed

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout and stderr as an agent sees them in one observation."""
        return self.stdout + (("\n" if self.stdout and not self.stdout.endswith("\n") else "") + self.stderr
                              if self.stderr else "")


# ---- capability probe ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Capabilities:
    root: bool
    netns: bool  # a new network namespace can be created
    mountns: bool  # a private mount namespace with tmpfs masks (root only)
    unshare_cmd: bool  # `unshare -rn` works (non-root fallback for the network)
    notes: str


def _preexec_probe(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")


@functools.lru_cache(maxsize=1)
def capabilities() -> Capabilities:
    """Probe once what isolation this OS allows (namespaces as root, ``unshare -rn`` otherwise)."""
    root = os.geteuid() == 0
    notes = []

    def works(**kw) -> bool:
        try:
            return subprocess.run(["/bin/true"], timeout=10, **kw).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False

    netns = root and works(preexec_fn=functools.partial(_preexec_probe, CLONE_NEWNET))
    mountns = root and works(preexec_fn=functools.partial(_preexec_probe, CLONE_NEWNET | CLONE_NEWNS))
    unshare_cmd = False
    if not netns:
        try:
            unshare_cmd = subprocess.run(["unshare", "-rn", "/bin/true"], timeout=10,
                                         capture_output=True).returncode == 0
        except (OSError, subprocess.SubprocessError):
            unshare_cmd = False
    if not (netns or unshare_cmd):
        notes.append("no network namespace available: sandboxed commands keep the host network")
    if not mountns:
        notes.append("no private mount namespace: the kit's data/ stays readable from inside the sandbox")
    if not root:
        notes.append("not root: commands run as the current user (RLIMIT_NPROC counts all its processes)")
    return Capabilities(root, netns, mountns, unshare_cmd, "; ".join(notes))


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(f"mimo_kit sandbox: {message}", RuntimeWarning, stacklevel=3)


# ---- helpers ------------------------------------------------------------------------------------------------------
def new_uid(cfg: SandboxConfig) -> int:
    """A throw-away uid for one sandboxed episode (shared by its commands so they can touch their own files)."""
    return cfg.uid_base + random.SystemRandom().randrange(50_000)


def chown_tree(path: str | Path, uid: int) -> None:
    """Hand a workspace (or HOME) to the sandbox uid so it can write there and nowhere else."""
    if os.geteuid() != 0:
        return
    for root, dirs, files in os.walk(path):
        os.lchown(root, uid, uid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def minimal_env(home: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a sandboxed command sees: PATH, HOME, TMPDIR, a locale, no secrets, no proxies."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "USER": "sandbox",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    env.update(extra or {})
    return env


class _Tail:
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


def _uid_pids(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                        break  # a zombie waits for its reaper; it holds no resources
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except OSError:
            continue
    return pids


def kill_uid(uid: int, rounds: int = 20) -> int:
    """SIGKILL every process of ``uid`` (repeat: a fork bomb forks while we kill). Returns how many were killed."""
    killed = 0
    for _ in range(rounds):
        pids = _uid_pids(uid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.005)
    return killed


@functools.lru_cache(maxsize=1)
def _exposures() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Directories the sandbox uid must reach (the Python the kit runs on) but cannot, behind a private ancestor.

    Returns ``(ancestor, (needed, ...))`` pairs: inside the sandbox's mount namespace the ancestor (e.g. root's
    ``/root``, mode 700, where pyenv lives) is covered by an empty tmpfs and only the needed trees are bound back in,
    which also keeps the rest of that home directory out of the agent's reach.
    """
    import sys

    needed = {str(Path(p).resolve()) for p in (sys.base_prefix, sys.prefix)}
    out: dict[str, list[str]] = {}
    for path in sorted(needed):
        parts = Path(path).parents
        for anc in reversed(parts):  # from / downwards: the highest ancestor others cannot traverse
            if str(anc) != "/" and not (os.stat(anc).st_mode & 0o001):
                out.setdefault(str(anc), []).append(path)
                break
    return tuple((a, tuple(n)) for a, n in out.items())


def _always_visible() -> tuple[str, ...]:
    """What sandboxed commands need wherever the kit lives, /tmp included: the Python it runs on (the virtual
    environment and its base install) and the kit's own code (its data/ stays hidden by ``hide_kit_data``)."""
    import sys

    return tuple(dict.fromkeys(str(p) for p in (sys.prefix, sys.base_prefix, Path(sys.prefix).resolve(),
                                                 Path(sys.base_prefix).resolve(), _KIT_ROOT)))


def _tmp_masks(keep: tuple[str, ...], roots: tuple[str, ...] = ("/tmp",)) -> tuple[tuple[str, bool], ...]:
    """(path, is_dir) of every entry of ``roots`` that is neither one of ``keep`` nor an ancestor of one."""
    out = []
    entries = []
    for root in roots:
        try:
            entries += list(os.scandir(root))
        except OSError:  # a root this machine does not have
            continue
    for entry in entries:
        path = entry.path
        if any(k == path or k.startswith(path + "/") for k in keep):
            continue
        try:
            if entry.is_symlink():
                continue
            out.append((path, entry.is_dir()))
        except OSError:
            continue
    return tuple(out)


def _preexec(cfg: SandboxConfig, uid: int | None, hide: tuple[str, ...], netns: bool, mountns: bool,
             stage: str, masks: tuple[tuple[str, bool], ...] = ()) -> None:
    """Runs in the child between fork and exec: namespaces, rlimits, then drop to the sandbox uid."""
    flags = (CLONE_NEWNET if netns else 0) | (CLONE_NEWNS if mountns else 0)
    if flags and _libc.unshare(flags) != 0:
        os._exit(125)
    if mountns:
        _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
        for path in hide:
            _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_RDONLY, b"size=4k,mode=0555")
        for path, is_dir in masks:  # other episodes' and checkouts' files: empty dirs, /dev/null files
            if is_dir:
                _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_RDONLY, b"size=4k,mode=0555")
            else:
                _libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None)
        if uid is not None:
            for i, (ancestor, needed) in enumerate(_exposures()):
                staged = []
                for j, path in enumerate(needed):
                    tmp = f"{stage}/.x{i}_{j}"
                    os.mkdir(tmp)
                    _libc.mount(path.encode(), tmp.encode(), None, MS_BIND | MS_REC, None)
                    staged.append((tmp, path))
                _libc.mount(b"tmpfs", ancestor.encode(), b"tmpfs", 0, b"size=64k,mode=0755")
                for tmp, path in staged:
                    os.makedirs(path, exist_ok=True)
                    _libc.mount(tmp.encode(), path.encode(), None, MS_MOVE, None)
    limits = [(resource.RLIMIT_CPU, cfg.cpu_s), (resource.RLIMIT_FSIZE, cfg.fsize_mb << 20),
              (resource.RLIMIT_CORE, 0)]
    if cfg.address_space_mb:
        limits.append((resource.RLIMIT_AS, cfg.address_space_mb << 20))
    if uid is not None or os.geteuid() != 0:
        limits.append((resource.RLIMIT_NPROC, cfg.nproc))
    for what, value in limits:
        resource.setrlimit(what, (value, value))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


# ---- the one entry point ------------------------------------------------------------------------------------------
def run_sandboxed(cmd: str | Sequence[str], cwd: str | Path, timeout_s: float | None = None, *,
                  cfg: SandboxConfig | None = None, home: str | Path | None = None, uid: int | None = None,
                  env: dict[str, str] | None = None, stdin: bytes | None = None,
                  hide_paths: Sequence[str | Path] = (), network: bool | None = None,
                  pass_fds: Sequence[int] = (), visible: Sequence[str | Path] = ()) -> SandboxResult:
    """Run ``cmd`` (an argv list, or a shell string run by ``/bin/sh -c``) in ``cwd`` under the sandbox.

    ``uid``: the episode's sandbox uid (:func:`new_uid`); a fresh one is drawn when None. The caller owns ``cwd``'s
    permissions: :func:`chown_tree` it to ``uid`` to make it writable. ``home``: a private HOME (a fresh temp dir,
    removed afterwards, when None). ``env`` adds to :func:`minimal_env`. ``hide_paths`` are masked with an empty
    tmpfs (plus the kit's ``data/`` when ``cfg.hide_kit_data``). ``pass_fds``: descriptors the command inherits
    (the grader's write-only result file). With ``cfg.private_tmp`` every other entry of ``/tmp`` is masked; list
    extra paths the command needs there (besides ``cwd`` and ``home``) in ``visible``.
    """
    cfg = cfg or SandboxConfig()
    timeout = cfg.timeout_s if timeout_s is None else float(timeout_s)
    if timeout <= 0:
        raise ConfigError(f"run_sandboxed: timeout_s={timeout_s!r}, expected a positive number of seconds")
    if isinstance(cmd, str):
        argv = ["/bin/sh", "-c", cmd]
    elif isinstance(cmd, Sequence) and cmd and all(isinstance(a, str) for a in cmd):
        argv = list(cmd)
    else:
        raise ConfigError(f"run_sandboxed: cmd={cmd!r}, expected a shell string or a non-empty list of strings")
    cwd = Path(cwd)
    if not cwd.is_dir():
        raise ConfigError(f"run_sandboxed: cwd={str(cwd)!r} is not a directory")
    caps = capabilities()
    want_net_off = not (cfg.network if network is None else network)
    root = caps.root
    if root and cfg.drop_privileges:
        uid = new_uid(cfg) if uid is None else uid
    else:
        uid = None
    netns = want_net_off and caps.netns
    hide = tuple(str(Path(p).resolve()) for p in hide_paths) + (
        (str(_KIT_ROOT / "data"),) if cfg.hide_kit_data and (_KIT_ROOT / "data").is_dir() else ())
    mountns = caps.mountns and (bool(hide) or uid is not None)
    if want_net_off and not netns and caps.unshare_cmd:
        argv = ["unshare", "-rn", "--"] + argv
        netns_used = True
    else:
        netns_used = netns
    if want_net_off and not netns_used:
        _warn_once(caps.notes or "network isolation unavailable")
    if hide and not mountns:
        _warn_once(caps.notes or "cannot hide paths")

    own_home = home is None
    home_dir = Path(tempfile.mkdtemp(prefix="mimo-home-")) if own_home else Path(home)
    if own_home and uid is not None:
        os.chown(home_dir, uid, uid)
    stage = tempfile.mkdtemp(prefix="mimo-stage-")  # root-only mount points for the exposure binds
    keep = tuple(str(Path(p).resolve()) for p in (cwd, home_dir, stage, *visible, *_always_visible()))
    masks = _tmp_masks(keep, cfg.shared_roots) if (mountns and cfg.private_tmp) else ()
    t0 = time.perf_counter()
    timed_out = False
    out, err = _Tail(cfg.output_limit), _Tail(cfg.output_limit)
    try:
        proc = subprocess.Popen(
            argv, cwd=str(cwd), env=minimal_env(str(home_dir), env), stdin=subprocess.PIPE if stdin else
            subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            close_fds=True, pass_fds=tuple(pass_fds),
            preexec_fn=functools.partial(_preexec, cfg, uid, hide, netns, mountns, stage, masks))
        if stdin:
            try:
                proc.stdin.write(stdin)
                proc.stdin.close()
            except BrokenPipeError:
                pass
        deadline = t0 + timeout
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        grace_end = None  # once the command exits, its pipes get a short grace (a background child may hold them)
        while sel.get_map():
            now = time.perf_counter()
            if grace_end is None and proc.poll() is not None:
                grace_end = now + 0.2
            if grace_end is not None and now >= grace_end:
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
        if not timed_out:
            try:
                proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        escapees = kill_uid(uid) if uid is not None else 0
        proc.wait()
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    finally:
        import shutil

        if own_home:
            shutil.rmtree(home_dir, ignore_errors=True)
        shutil.rmtree(stage, ignore_errors=True)
    rc = proc.returncode
    if rc == 125 and (netns or mountns) and not out.total and not err.total:
        raise RuntimeError("sandbox: unshare failed in the child although the probe succeeded")
    return SandboxResult(argv=argv, returncode=rc if not timed_out else -9, stdout=out.text(), stderr=err.text(),
                         timed_out=timed_out, network_isolated=netns_used,
                         wall_s=time.perf_counter() - t0, stdout_bytes=out.total, stderr_bytes=err.total, uid=uid,
                         killed_escapees=escapees)


def describe_command(cmd: str | Sequence[str]) -> str:
    return cmd if isinstance(cmd, str) else shlex.join(cmd)
