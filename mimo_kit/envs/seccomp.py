"""A seccomp filter for sandboxed commands: system calls with no use in grading fail with ``EPERM``, and a lock is
never taken (Report §4.2).

Namespaces do not cover everything. **Kernel keyrings** are one channel they miss: a key that agent code adds to
its user keyring (``add_key``) outlives every process and is listed, with its description and (when the key's
permissions allow) its payload, in ``/proc/keys`` to a later episode running as another uid; concurrent episodes,
evaluation runs included, could pass fixes or the hidden tests' inputs that way.

**Locks and inode events on shared files** are another. ``/usr``, ``/etc`` and the Python installation are bound
read-only into every sandbox: every sandbox opens the same inodes, and a lock lives on the inode. Agent code
imported by the grader's worker can publish the judge's call inputs as ``flock`` states of ``/usr/bin/*`` (one bit
a file) or as ``fcntl`` read locks on byte ranges (a number in ``l_start``); a concurrent episode's bash decodes them
with ``flock -n`` or ``F_GETLK``. A watch on a shared file (``inotify``, ``fanotify``, dnotify's ``F_NOTIFY``, a
lease's break signal) turns another sandbox's opens and reads of it into the same kind of signal.

The filter installed before the command starts (inherited by everything it runs, irrevocable under
``no_new_privs``) answers:

- the keyring calls ``add_key``, ``request_key``, ``keyctl``: ``EPERM``;
- the calls that take a lock, ``flock`` and ``fcntl`` with ``F_SETLK`` / ``F_SETLKW`` (6, 7) or the
  open-file-description locks ``F_OFD_SETLK`` / ``F_OFD_SETLKW`` (37, 38): **0 without taking the lock**
  (``SECCOMP_RET_ERRNO`` with errno 0 skips the call and returns 0), so no lock exists for anyone to see;
- the calls that observe a lock or watch an inode, ``fcntl`` with ``F_GETLK`` / ``F_OFD_GETLK`` (5, 36), the
  leases ``F_SETLEASE`` / ``F_GETLEASE`` (1024, 1025), ``F_NOTIFY`` (1026), and ``inotify_init``, ``inotify_init1``
  (no watch without their descriptor), ``fanotify_init`` (unprivileged since Linux 5.13): ``EPERM``. ``lockf`` is
  ``fcntl(F_SETLK)`` in libc; ``F_GETLK64`` .. ``F_SETLKW64`` (12..14) are 32-bit ``fcntl64`` commands, reached
  only through another ABI's numbers (denied below);
- calls that reach the kernel's deepest attack surface with no use in a build or a test: ``bpf``,
  ``perf_event_open``, ``userfaultfd``, module loading and ``kexec``, ``open_by_handle_at``: ``EPERM``;
- every call of another ABI than the machine's (x32 numbers, 32-bit ``int 0x80``), which would bypass the list:
  ``EPERM``.

Every other ``fcntl`` command stays: Python's startup and every libc program need ``F_GETFD`` / ``F_SETFD`` /
``F_GETFL`` / ``F_SETFL`` / ``F_DUPFD`` / ``F_DUPFD_CLOEXEC``. An inode's write hint (``F_SET_RW_HINT``) can be
set only by the file's owner, which no sandbox uid is for a shared file.

Why 0 rather than ``EPERM`` for taking a lock: SQLite locks its database file with ``F_SETLK`` before every read
and write; under ``EPERM`` every file database inside a sandbox fails (``access permission denied``), the general
tasks' ``shop.db`` included. Answered 0, SQLite's default rollback journal works. What it costs: inside a sandbox a
lock excludes nobody, so the agent's own processes cannot exclude each other with locks (the grader's processes
take none: the judge and worker, gcc, AddressSanitizer, git, which locks with ``O_EXCL`` lock files, Python
imports); SQLite's WAL mode fails (it asks ``F_GETLK`` who holds its shared memory); ``tail -f`` falls back to
polling. Observers fail loudly rather than read a made-up answer. Time: the kernel runs both programs on every
call (a few instructions each); on a 2-core machine 10^6 ``getppid`` calls took no measurable time more, 10^6
``fcntl(F_GETFD)`` about 0.1 µs more each than under :func:`program` alone.

Not closed by any filter: the **page cache** of shared files. A read makes a page resident for every sandbox,
``posix_fadvise(POSIX_FADV_DONTNEED)`` drops it, and ``preadv2(RWF_NOWAIT)`` (or a read's latency) tells another
sandbox which it is; denying the first two would still leave the timing. Access times are no channel: the shared
folders are read-only mounts, where reads update no ``atime`` (a residual risk, ``docs/sandbox.md``).

``ptrace`` stays allowed: AddressSanitizer's leak checker (the cyber tasks) stops the world with it; the per-episode
uid and the PID namespace already confine whom it can reach. ``mount`` stays allowed for the sandbox's own setup
(``unshare --mount-proc``); the unprivileged uid the command runs as can mount only inside a user namespace it
creates itself (``unshare -Ur``), which reaches nothing of the host's (a residual risk, ``docs/sandbox.md``).

Two classic BPF programs (``struct sock_filter``), built here for x86-64 and aarch64 and installed together (the
kernel runs every installed filter; the most restrictive answer wins): :func:`program` answers by call number,
:func:`lock_program` answers ``flock`` and ``fcntl`` by command. Elsewhere both are None and the layers are reported
missing.
"""

from __future__ import annotations

import ctypes
import platform
import struct

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, EPERM = 0x7FFF0000, 0x00050000, 1
#: struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }: byte offsets.
_NR_OFFSET, _ARCH_OFFSET, _ARGS_OFFSET = 0, 4, 16
#: ``fcntl(fd, cmd, arg)``: the low 32 bits of ``args[1]`` (both machines here are little-endian). The high half is
#: not compared because the kernel never reads it: ``SYSCALL_DEFINE3(fcntl, unsigned int, fd, unsigned int, cmd,
#: unsigned long, arg)`` truncates ``cmd``, so ``0x1_00000006`` is ``F_SETLK``; a 64-bit compare would let exactly
#: those values through.
_FCNTL_CMD_OFFSET = _ARGS_OFFSET + 8 * 1
X32_SYSCALL_BIT = 0x40000000

#: The calls denied with EPERM on every machine (see the module docstring for why each).
DENIED = ("add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "init_module",
          "finit_module", "delete_module", "kexec_load", "kexec_file_load", "open_by_handle_at",
          "inotify_init1", "fanotify_init")
#: Denied where the machine's ABI has them (aarch64's generic table never had ``inotify_init``).
DENIED_WHERE_PRESENT = ("inotify_init",)
#: (AUDIT_ARCH, {call: number}) of the machines the filter is built for, every call denied with EPERM:
#: ``<asm/unistd_64.h>`` for x86-64, ``<asm-generic/unistd.h>`` for aarch64.
ARCHES = {
    "x86_64": (0xC000003E, {"add_key": 248, "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298,
                            "userfaultfd": 323, "init_module": 175, "finit_module": 313, "delete_module": 176,
                            "kexec_load": 246, "kexec_file_load": 320, "open_by_handle_at": 304,
                            "inotify_init1": 294, "fanotify_init": 300, "inotify_init": 253}),
    "aarch64": (0xC00000B7, {"add_key": 217, "request_key": 218, "keyctl": 219, "bpf": 280, "perf_event_open": 241,
                             "userfaultfd": 282, "init_module": 105, "finit_module": 273, "delete_module": 106,
                             "kexec_load": 104, "kexec_file_load": 294, "open_by_handle_at": 265,
                             "inotify_init1": 26, "fanotify_init": 262}),
}
#: The lock calls :func:`lock_program` answers, by machine.
LOCK_CALLS = {"x86_64": {"flock": 73, "fcntl": 72}, "aarch64": {"flock": 32, "fcntl": 25}}
#: ``fcntl`` commands that take a lock: 0, the lock not taken (``<asm-generic/fcntl.h>``).
FCNTL_NOTHING = {"F_SETLK": 6, "F_SETLKW": 7, "F_OFD_SETLK": 37, "F_OFD_SETLKW": 38}
#: ``fcntl`` commands that observe a lock or watch an inode: EPERM (``<linux/fcntl.h>``: ``F_LINUX_SPECIFIC_BASE``
#: is 1024).
FCNTL_DENIED = {"F_GETLK": 5, "F_OFD_GETLK": 36, "F_SETLEASE": 1024, "F_GETLEASE": 1025, "F_NOTIFY": 1026}
#: What :func:`lock_program` returns for a lock taken (``flock`` and :data:`FCNTL_NOTHING`): 0 from the call.
NOTHING = SECCOMP_RET_ERRNO | 0


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def denied_numbers(machine: str) -> list[int]:
    """The call numbers :func:`program` denies on ``machine``: :data:`DENIED`, then those of
    :data:`DENIED_WHERE_PRESENT` the machine has."""
    numbers = ARCHES[machine][1]
    return [numbers[name] for name in DENIED + DENIED_WHERE_PRESENT if name in numbers]


def program(machine: str | None = None) -> bytes | None:
    """The call-number filter for ``machine`` (default: this one), or None where it has no table.

    Layout: load ``arch``; another ABI → deny; load ``nr``; (x86-64) an x32 number → deny; one ``JEQ`` per denied
    call jumping to the final deny; else allow."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    arch = ARCHES[machine][0]
    deny = SECCOMP_RET_ERRNO | EPERM
    nrs = denied_numbers(machine)
    d = len(nrs)
    out = [_insn(_LD_W_ABS, 0, 0, _ARCH_OFFSET), _insn(_JEQ_K, 1, 0, arch), _insn(_RET_K, 0, 0, deny),
           _insn(_LD_W_ABS, 0, 0, _NR_OFFSET)]
    if machine == "x86_64":
        out.append(_insn(_JGE_K, d + 1, 0, X32_SYSCALL_BIT))
    out += [_insn(_JEQ_K, d - j, 0, nr) for j, nr in enumerate(nrs)]
    out += [_insn(_RET_K, 0, 0, SECCOMP_RET_ALLOW), _insn(_RET_K, 0, 0, deny)]
    return b"".join(out)


def lock_program(machine: str | None = None) -> bytes | None:
    """The lock filter for ``machine`` (default: this one), or None where it has no table.

    Layout (jumps count from the next instruction; the tail is ``allow, nothing, deny``): load ``arch``; another
    ABI → deny; load ``nr``; ``flock`` → nothing; not ``fcntl`` → allow; load ``cmd``, the low half of
    ``args[1]``; one ``JEQ`` per command of :data:`FCNTL_NOTHING` to nothing, one per command of
    :data:`FCNTL_DENIED` to deny; else allow. x32 numbers never equal ``flock``'s or ``fcntl``'s: :func:`program`,
    installed beside it, denies them."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    arch = ARCHES[machine][0]
    deny = SECCOMP_RET_ERRNO | EPERM
    calls = LOCK_CALLS[machine]
    take, observe = list(FCNTL_NOTHING.values()), list(FCNTL_DENIED.values())
    n = len(take) + len(observe)
    out = [_insn(_LD_W_ABS, 0, 0, _ARCH_OFFSET), _insn(_JEQ_K, 1, 0, arch), _insn(_RET_K, 0, 0, deny),
           _insn(_LD_W_ABS, 0, 0, _NR_OFFSET), _insn(_JEQ_K, n + 4, 0, calls["flock"]),  # 4 → nothing at 9 + n
           _insn(_JEQ_K, 1, 0, calls["fcntl"]), _insn(_RET_K, 0, 0, SECCOMP_RET_ALLOW),
           _insn(_LD_W_ABS, 0, 0, _FCNTL_CMD_OFFSET)]
    out += [_insn(_JEQ_K, n - j, 0, cmd) for j, cmd in enumerate(take)]  # 8 + j → 9 + n
    out += [_insn(_JEQ_K, n - len(take) - j + 1, 0, cmd) for j, cmd in enumerate(observe)]  # → 10 + n
    out += [_insn(_RET_K, 0, 0, SECCOMP_RET_ALLOW), _insn(_RET_K, 0, 0, NOTHING), _insn(_RET_K, 0, 0, deny)]
    return b"".join(out)


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Filter:
    """The programs in memory, ready for :meth:`install` in a child before ``exec`` (built in the parent: the
    child only calls ``prctl``)."""

    def __init__(self, *codes: bytes):
        self._bufs = [ctypes.create_string_buffer(code, len(code)) for code in codes]
        self._progs = [_Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p)) for code, buf in zip(codes, self._bufs)]

    def install(self, libc) -> None:
        """``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)`` once per program; needs ``no_new_privs`` (or root)
        first."""
        for prog in self._progs:
            if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def build() -> Filter | None:
    """This machine's filter (both programs), or None where there is no table for it."""
    code = program()
    return Filter(code, lock_program()) if code is not None else None
