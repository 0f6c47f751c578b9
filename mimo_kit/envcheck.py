"""``mimo-kit env-check``: one OK/FAIL line per dependency, the machine, and which sandbox isolation layers are active.

Each isolation layer (``mimo_kit.envs.isolation.LAYERS``; the threat model is ``docs/sandbox.md``) gets an ``OK`` or
``WARN`` line saying what it stops; a missing layer does not fail the check (the sandbox degrades with a warning).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: (import name, distribution name, what the kit uses it for). Required: the kit's core and its notebooks.
REQUIRED = [
    ("torch", "torch", "tensors, models, training"),
    ("transformers", "transformers", "model conformance, checkpoints, tokenizers"),
    ("trl", "trl", "the distill path's SFT and RL trainers"),
    ("peft", "peft", "LoRA adapters on the distill path"),
    ("accelerate", "accelerate", "multi-process launch of the TRL path"),
    ("tokenizers", "tokenizers", "byte-level BPE trained on local text"),
    ("matplotlib", "matplotlib", "figures"),
    ("tqdm", "tqdm", "progress bars"),
    ("yaml", "pyyaml", "config files"),
    ("nbclient", "nbclient", "headless notebook execution"),
    ("nbformat", "nbformat", "notebook files"),
    ("nbconvert", "nbconvert", "HTML pages of executed chapters"),
    ("ipykernel", "ipykernel", "the notebook kernel"),
    ("scipy", "scipy", "the claims' statistics (sign test, t interval)"),
    ("tensorboard", "tensorboard", "live metrics of every training loop (RUN/tb/)"),
]
#: Optional: extras and tools; missing ones are reported but do not fail the check.
OPTIONAL = [
    ("ray", "ray", "harness pools and multi-node rollouts (extra: ray)"),
    ("jupyterlab", "jupyterlab", "make lab"),
    ("pytest", "pytest", "tests (extra: dev)"),
    ("hypothesis", "hypothesis", "property tests (extra: dev)"),
]


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    required: bool


def check_module(module: str, dist: str, purpose: str, required: bool) -> Check:
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is a FAIL line, with its reason
        return Check(dist, False, f"{type(e).__name__}: {e} ({purpose})", required)
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return Check(dist, True, f"{version:<12} {purpose}", required)


def network_isolation() -> tuple[bool, str]:
    """Whether ``unshare -rn`` can give a sandboxed command a private network namespace here."""
    exe = shutil.which("unshare")
    if exe is None:
        return False, "unshare not found: sandboxes run with the host network (a warning is recorded)"
    try:
        r = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"unshare -rn failed ({e})"
    if r.returncode == 0:
        return True, "unshare -rn works: sandboxed commands get no network"
    return False, f"unshare -rn refused ({r.stderr.decode(errors='replace').strip()[:120]})"


def sandboxed_lock_probe() -> tuple[bool, str]:
    """Whether a command run as the sandbox runs agent commands (its uid, namespaces, filter) can leave a lock on a
    file every sandbox shares, or observe one: the lock channel between concurrent episodes
    (:mod:`mimo_kit.envs.seccomp`). The command takes a ``flock`` and an ``fcntl`` lock on the Python binary and
    holds them while this process looks for them; ``F_GETLK`` and ``inotify_init1`` must fail in it."""
    import sys
    import tempfile

    from mimo_kit.envs.isolation import LOCK_PROBE, lock_channel_closed
    from mimo_kit.envs.sandbox import SandboxError, spawn_sandboxed

    path = os.path.realpath(sys.executable)
    with tempfile.TemporaryDirectory(prefix="mimo-probe-") as tmp:
        os.chmod(tmp, 0o711)
        try:
            proc = spawn_sandboxed([sys.executable, "-I", "-S", "-c", LOCK_PROBE, path], tmp)
        except (OSError, SandboxError) as e:
            return False, f"the sandboxed lock probe did not start ({e})"
        try:
            closed = lock_channel_closed(proc.popen, path)
        except OSError:
            closed = False
        try:
            proc.finish(False)  # kills the probe
        except SandboxError as e:
            return False, f"the sandboxed lock probe did not start ({e})"
    if closed:
        return True, f"a sandboxed command's locks on {path} were invisible outside, F_GETLK and inotify refused"
    return False, f"a sandboxed command left a lock on {path} visible outside, or could observe one"


def isolation_layers() -> list[tuple[bool, str]]:
    """(active, line) for every sandbox isolation layer, probed the way the sandbox probes them; the ``file_locks``
    layer also through a real sandboxed command (:func:`sandboxed_lock_probe`)."""
    from mimo_kit.envs.isolation import capabilities, report

    caps = capabilities()
    out = []
    for name, active, what in report():
        extra = ""
        if name == "file_locks" and active:
            active, detail = sandboxed_lock_probe()
            extra = "" if active else f"; {detail}"
        out.append((active, f"sandbox {name.replace('_', ' ')}: {'active' if active else 'MISSING'} ({what}){extra}"))
    if caps.notes:
        out.append((False, f"sandbox notes: {caps.notes}"))
    return out


def sanitizer_toolchain() -> tuple[bool, str]:
    """Whether gcc can build and run a program with ``-fsanitize=address,undefined`` (the cyber tasks need it)."""
    import tempfile

    cc = shutil.which("gcc")
    if cc is None:
        return False, "gcc not found: cyber tasks (chapter 4b) cannot build their targets"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "t.c"
        src.write_text("int main(void) { return 0; }\n")
        try:
            r = subprocess.run([cc, "-fsanitize=address,undefined", "-o", str(Path(tmp) / "t"), str(src)],
                               capture_output=True, timeout=60)
            if r.returncode == 0:
                r = subprocess.run([str(Path(tmp) / "t")], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"gcc -fsanitize failed ({e})"
    if r.returncode != 0:
        return False, f"gcc -fsanitize=address,undefined does not work here ({r.stderr.decode()[:120].strip()})"
    return True, "gcc builds and runs ASan/UBSan programs (cyber tasks)"


def machine() -> list[str]:
    lines = [f"python {platform.python_version()} on {platform.system()} {platform.machine()}",
             f"cpu cores: {os.cpu_count()}"]
    try:
        import torch

        lines.append(f"torch threads: {torch.get_num_threads()}")
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                lines.append(f"gpu {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB")
        else:
            lines.append("gpu: none (CUDA not available): the tiny and small presets run on the CPU")
    except ImportError:
        pass
    return lines


def run_env_check(required=None, optional=None, print_fn=print) -> int:
    """Print the report; return 0 when every required dependency imports, else 1."""
    checks = [check_module(*spec, required=True) for spec in (REQUIRED if required is None else required)]
    checks += [check_module(*spec, required=False) for spec in (OPTIONAL if optional is None else optional)]
    for c in checks:
        status = "OK  " if c.ok else ("FAIL" if c.required else "MISS")
        print_fn(f"{status} {c.name:<13} {c.detail}")
    for line in machine():
        print_fn(f"INFO {line}")
    ok, detail = network_isolation()
    print_fn(f"{'OK  ' if ok else 'WARN'} network isolation: {detail}")
    for ok, line in isolation_layers():
        print_fn(f"{'OK  ' if ok else 'WARN'} {line}")
    for tool in ("git",):
        print_fn(f"{'OK  ' if shutil.which(tool) else 'WARN'} {tool}: "
                 f"{'found' if shutil.which(tool) else 'not found (code tasks need it)'}")
    ok, detail = sanitizer_toolchain()
    print_fn(f"{'OK  ' if ok else 'WARN'} sanitizers: {detail}")
    missing = [c.name for c in checks if c.required and not c.ok]
    if missing:
        print_fn(f"env-check: required dependencies missing: {', '.join(missing)}")
        return 1
    return 0
