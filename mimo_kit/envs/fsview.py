"""The filesystem a sandboxed command sees: an allowlist, not a list of masks (Report §4.2, environment cleaning).

The parent computes a :class:`View` (plain data); the forked child applies it between fork and exec, inside its
own mount namespace, with nothing but ``mount``/``mkdir``/``symlink`` calls (no imports, no allocation-heavy code:
other threads of the grader may hold locks at fork time). The new root is an empty tmpfs into which exactly these
are bound, then ``pivot_root`` makes it ``/`` and the old root is detached, so nothing else of the host exists:

- **read-only**: the system folders (``/usr``, ``/etc`` and the ``/bin``, ``/lib*``, ``/sbin`` links or folders)
  and the Python installation the grader runs on, at their own paths (a Python under ``/root`` brings only its
  prefix, not the rest of ``/root``); extra ``visible`` paths (the grader's scripts, a cyber target's build);
- **read-write**: the command's workspace and HOME only (both on the episode's size-limited volume);
- **private, size-limited tmpfs**: one scratch filesystem serving ``/tmp``, ``/var/tmp``, ``/dev/shm`` and
  ``/run/lock``, gone with the namespace, so nothing an episode writes there persists or reaches another episode;
- ``/dev`` with ``null``, ``zero``, ``full``, ``random``, ``urandom`` only; ``/proc`` mounted later for the
  command's own PID namespace (or with ``hidepid=2`` where there is none).

Not in the view: the kit's repository (its ``.git``, ``data/``, tests), ``/home``, ``/root``, ``/work``, ``/srv``,
``/mnt``, ``/run`` (host sockets), other episodes' workspaces and grading folders.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import platform
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 0x4000, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
MNT_DETACH = 2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 1, 2, 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added after the syscall tables were unified)

#: System folders bound read-only (or re-created as the same symlinks, on a merged-/usr system).
SYSTEM_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Device nodes a command may open; everything else of /dev does not exist inside.
DEVICES = ("null", "zero", "full", "random", "urandom")
#: Size of the empty tmpfs the new root is built on: it holds only folders and links, never data.
ROOT_TMPFS = "size=256k,mode=0755"
#: The folders served by the private scratch tmpfs (one budget for all four).
SCRATCH_DIRS = {"/tmp": "tmp", "/var/tmp": "var-tmp", "/dev/shm": "shm", "/run/lock": "lock"}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


@dataclasses.dataclass(frozen=True)
class Bind:
    source: bytes
    target: bytes  # the path inside the view
    writable: bool
    is_dir: bool
    locked_flags: int  # mount flags of the source a remount must keep (nosuid, nodev, noexec, atime)


@dataclasses.dataclass(frozen=True)
class View:
    """Everything the child needs, as bytes and ints: computed in the parent, applied after fork."""

    stage: bytes  # an empty host folder the new root is mounted on (in the child's namespace only)
    links: tuple[tuple[bytes, bytes], ...]  # (link path inside, link target)
    binds: tuple[Bind, ...]
    scratch_opts: bytes  # tmpfs options of the private /tmp, /var/tmp, /dev/shm, /run/lock
    home: bytes | None  # a HOME to create inside the scratch tmpfs (when the caller gave none)
    owner: int | None  # uid owning the scratch HOME
    hide: tuple[bytes, ...]  # paths inside the view covered by an empty read-only tmpfs
    cwd: bytes
    pivot: int  # pivot_root syscall number; 0 = chroot (an architecture without a known number)


def _locked_flags(path: str) -> int:
    try:
        f = os.statvfs(path).f_flag
    except OSError:
        return 0
    out = 0
    for st, ms in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                   (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME)):
        if f & st:
            out |= ms
    return out


def python_paths() -> tuple[str, ...]:
    """The Python installation(s) a sandboxed ``sys.executable`` needs: the virtual environment and its base."""
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    paths |= {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix)}
    return tuple(sorted(p for p in paths if not any(p == s or p.startswith(s + "/") for s in SYSTEM_PATHS)))


def _covered(path: str, binds: list[Bind]) -> bool:
    return any(path == b.target.decode() or path.startswith(b.target.decode().rstrip("/") + "/") for b in binds)


def build_view(stage: str, cwd: str, *, home: str | None, scratch_mb: int, owner: int | None,
               visible: tuple[str, ...] = (), writable: tuple[str, ...] = (), hide: tuple[str, ...] = (),
               scratch_files: int | None = None) -> View:
    """Plan the view: system folders and Python read-only, ``cwd`` + ``home`` + ``writable`` read-write, the rest
    of ``visible`` read-only, a private scratch tmpfs, and ``hide`` covered. Paths must be absolute."""
    links: list[tuple[bytes, bytes]] = []
    binds: list[Bind] = []
    for p in SYSTEM_PATHS:
        if os.path.islink(p):
            links.append((p.encode(), os.readlink(p).encode()))
        elif os.path.isdir(p):
            binds.append(Bind(p.encode(), p.encode(), False, True, _locked_flags(p)))
    rw = [os.path.realpath(p) for p in (cwd, *([home] if home else []), *writable)]
    ro = [os.path.realpath(p) for p in (*python_paths(), *visible)]
    for path in dict.fromkeys(rw + ro):
        if not os.path.exists(path):
            raise FileNotFoundError(f"sandbox view: {path!r} does not exist")
        if path in rw or not _covered(path, binds):
            binds.append(Bind(path.encode(), path.encode(), path in rw, os.path.isdir(path), _locked_flags(path)))
    scratch = f"size={scratch_mb}m,mode=0755" + (f",nr_inodes={scratch_files}" if scratch_files else "")
    return View(stage.encode(), tuple(links), tuple(binds), scratch.encode(),
                None if home else b"/tmp/home", owner, tuple(os.path.realpath(h).encode() for h in hide),
                os.path.realpath(cwd).encode(), SYS_PIVOT_ROOT.get(platform.machine(), 0))


# ---- applied in the child (between fork and exec) ------------------------------------------------------------------
def _check(rc: int, what: bytes) -> None:
    if rc != 0:
        raise OSError(ctypes.get_errno(), "sandbox view: " + what.decode(errors="replace"))


def _mount(src, dst, fstype, flags, data) -> None:
    _check(_libc.mount(src, dst, fstype, flags, data), b"mount " + (dst or b""))


def _makedirs(path: bytes, mode: int = 0o755) -> None:
    if not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent != path:
            _makedirs(parent, mode)
        os.mkdir(path, mode)


def _make_readonly(target: bytes, extra_flags: int) -> None:
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    if _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, target, AT_RECURSIVE, ctypes.byref(attr),
                     ctypes.sizeof(attr)) == 0:
        return  # every submount too (an /etc with bind-mounted files stays read-only throughout)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | extra_flags, None)


def apply_view(v: View) -> None:
    """Build the new root on ``v.stage`` and switch to it. Call in a fresh mount namespace, with privileges."""
    root = v.stage
    _mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
    _mount(b"tmpfs", root, b"tmpfs", MS_NOSUID | MS_NODEV, ROOT_TMPFS.encode())
    for path, target in v.links:
        os.symlink(target, root + path)
    # private scratch: one tmpfs, four folders, mounted before the binds that may live below /tmp
    scratch = root + b"/.scratch"
    os.mkdir(scratch, 0o700)
    _mount(b"tmpfs", scratch, b"tmpfs", MS_NOSUID | MS_NODEV, v.scratch_opts)
    for inside, sub in SCRATCH_DIRS.items():
        src = scratch + b"/" + sub.encode()
        os.mkdir(src)
        os.chmod(src, 0o1777)
        _makedirs(root + inside.encode())
        _mount(src, root + inside.encode(), None, MS_BIND, None)
    _check(_libc.umount2(scratch, MNT_DETACH), b"umount scratch")
    os.rmdir(scratch)
    # /dev: a few nodes bound from the host
    dev = root + b"/dev"
    for name in DEVICES:
        node = dev + b"/" + name.encode()
        os.close(os.open(node, os.O_CREAT | os.O_WRONLY, 0o666))
        _mount(b"/dev/" + name.encode(), node, None, MS_BIND, None)
    for name, target in ((b"fd", b"/proc/self/fd"), (b"stdin", b"/proc/self/fd/0"), (b"stdout", b"/proc/self/fd/1"),
                         (b"stderr", b"/proc/self/fd/2")):
        os.symlink(target, dev + b"/" + name)
    os.mkdir(root + b"/proc", 0o555)
    for b in v.binds:
        target = root + b.target
        if b.is_dir:
            _makedirs(target)
        else:
            _makedirs(os.path.dirname(target))
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(b.source, target, None, MS_BIND | (0 if b.writable else MS_REC), None)
        if b.writable:
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | b.locked_flags, None)
        else:
            _make_readonly(target, b.locked_flags)
    if v.home is not None:
        _makedirs(root + v.home, 0o700)
        if v.owner is not None:
            os.chown(root + v.home, v.owner, v.owner)
    for path in v.hide:
        if os.path.isdir(root + path):
            _mount(b"tmpfs", root + path, b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k,mode=0555")
    if v.pivot:
        os.chdir(root)
        _check(_libc.syscall(v.pivot, b".", b"."), b"pivot_root")
        _check(_libc.umount2(b".", MNT_DETACH), b"detach the old root")
    else:
        os.chroot(root)
    os.chdir(b"/")
    _mount(None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    os.chdir(v.cwd)
