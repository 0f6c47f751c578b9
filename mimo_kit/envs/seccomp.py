"""A seccomp filter for sandboxed commands: system calls with no use in grading fail with ``EPERM`` (Report §4.2).

Namespaces do not cover everything. **Kernel keyrings** are one channel they miss: a key that agent code adds to
its user keyring (``add_key``) outlives every process and is listed, with its description and (when the key's
permissions allow) its payload, in ``/proc/keys`` to a later episode running as another uid; concurrent episodes,
evaluation runs included, could pass fixes or the hidden tests' inputs that way. The filter installed before the
command starts (inherited by everything it runs, irrevocable under ``no_new_privs``) denies:

- the keyring calls ``add_key``, ``request_key``, ``keyctl``;
- calls that reach the kernel's deepest attack surface with no use in a build or a test: ``bpf``,
  ``perf_event_open``, ``userfaultfd``, module loading and ``kexec``, ``open_by_handle_at``;
- every call of another ABI than the machine's (x32 numbers, 32-bit ``int 0x80``), which would bypass the list.

``ptrace`` stays allowed: AddressSanitizer's leak checker (the cyber tasks) stops the world with it; the per-episode
uid and the PID namespace already confine whom it can reach. ``mount`` stays allowed for the sandbox's own setup
(``unshare --mount-proc``); the unprivileged uid the command runs as can mount only inside a user namespace it
creates itself (``unshare -Ur``), which reaches nothing of the host's (a residual risk, ``docs/sandbox.md``).

A classic BPF program (``struct sock_filter``), built here for x86-64 and aarch64; elsewhere :func:`program`
returns None and the layer is reported missing.
"""

from __future__ import annotations

import ctypes
import platform
import struct

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, EPERM = 0x7FFF0000, 0x00050000, 1
_NR_OFFSET, _ARCH_OFFSET = 0, 4  # struct seccomp_data: int nr; __u32 arch; ...
X32_SYSCALL_BIT = 0x40000000

#: The denied calls by name (see the module docstring for why each).
DENIED = ("add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "init_module",
          "finit_module", "delete_module", "kexec_load", "kexec_file_load", "open_by_handle_at")
#: (AUDIT_ARCH, {call: number}) of the machines the filter is built for.
ARCHES = {
    "x86_64": (0xC000003E, {"add_key": 248, "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298,
                            "userfaultfd": 323, "init_module": 175, "finit_module": 313, "delete_module": 176,
                            "kexec_load": 246, "kexec_file_load": 320, "open_by_handle_at": 304}),
    "aarch64": (0xC00000B7, {"add_key": 217, "request_key": 218, "keyctl": 219, "bpf": 280, "perf_event_open": 241,
                             "userfaultfd": 282, "init_module": 105, "finit_module": 273, "delete_module": 106,
                             "kexec_load": 104, "kexec_file_load": 294, "open_by_handle_at": 265}),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter's instructions for ``machine`` (default: this one), or None where it has no table.

    Layout: load ``arch``; another ABI → deny; load ``nr``; (x86-64) an x32 number → deny; one ``JEQ`` per denied
    call jumping to the final deny; else allow."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    arch, numbers = ARCHES[machine]
    deny = SECCOMP_RET_ERRNO | EPERM
    nrs = [numbers[name] for name in DENIED]
    d = len(nrs)
    out = [_insn(_LD_W_ABS, 0, 0, _ARCH_OFFSET), _insn(_JEQ_K, 1, 0, arch), _insn(_RET_K, 0, 0, deny),
           _insn(_LD_W_ABS, 0, 0, _NR_OFFSET)]
    if machine == "x86_64":
        out.append(_insn(_JGE_K, d + 1, 0, X32_SYSCALL_BIT))
    out += [_insn(_JEQ_K, d - j, 0, nr) for j, nr in enumerate(nrs)]
    out += [_insn(_RET_K, 0, 0, SECCOMP_RET_ALLOW), _insn(_RET_K, 0, 0, deny)]
    return b"".join(out)


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Filter:
    """The program in memory, ready for :meth:`install` in a child before ``exec`` (built in the parent: the
    child only calls ``prctl``)."""

    def __init__(self, code: bytes):
        self._buf = ctypes.create_string_buffer(code, len(code))
        self._prog = _Prog(len(code) // 8, ctypes.cast(self._buf, ctypes.c_void_p))

    def install(self, libc) -> None:
        """``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)``; needs ``no_new_privs`` (or root) first."""
        if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(self._prog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def build() -> Filter | None:
    """This machine's filter, or None where there is no table for it."""
    code = program()
    return Filter(code) if code is not None else None
