"""Autograding: execute students' chapter notebooks and collect every exercise's verdict into a gradebook.

``mimo-kit grade SUBMISSIONS… --out grades.csv`` runs each submitted notebook top to bottom in a fresh kernel, the
way a student ran it (quick mode, the ``tiny`` preset), in a private copy of its folder (what it writes stays
there), each cell bounded by ``timeout`` seconds (a cell that runs over is interrupted) and errors allowed: a
failing cell is recorded and the cells after it still run, so a broken notebook keeps what it answered.

The kernel is sandboxed where the machine allows it: it starts under ``unshare -rn`` (a user and a network
namespace: no network, not even the loopback) and talks to the grader over Unix sockets (Jupyter's ``ipc``
transport) instead of TCP. Where ``unshare`` is refused (a container without user namespaces) the kernel runs
unsandboxed and the grader says so.

Verdicts are the registry's own (:meth:`mimo_kit.exercises.Exercise.check` prints ``exercise N (form): ✓ correct``,
``✗ not quite…`` or ``not answered yet``), read from the output of the cell that called
``exercise("chXX", N).check(…)``. Every exercise the chapter registers gets a row, also those the notebook never
reached (``not run``) or removed (``missing``). The gradebook has one row per submission and exercise:

    student, notebook, chapter, exercise, verdict, points

``student`` is the submission's folder (``submissions/alice/ch04c_….ipynb`` → ``alice``), or the file's name
when several submissions share a folder. One point per correct exercise.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import nbformat

#: the registry's check line (mimo_kit.exercises.Exercise.check)
VERDICT = re.compile(r"^exercise (\d+) \(.*\): (✓ correct|✗ not quite|not answered yet)", re.MULTILINE)
CALL = re.compile(r'exercise\(\s*"(\w+)"\s*,\s*(\d+)\s*\)\s*\.check\(')
VERDICTS = {"✓ correct": "correct", "✗ not quite": "wrong", "not answered yet": "unanswered"}
FIELDS = ("student", "notebook", "chapter", "exercise", "verdict", "points")


@dataclasses.dataclass
class Graded:
    """One submission: its verdict per exercise, the cells that raised, and the score."""

    student: str
    notebook: str
    chapter: str
    verdicts: dict[int, str]
    errors: list[str]
    sandboxed: bool = False  # the kernel ran without network (unshare -rn)

    @property
    def score(self) -> int:
        return sum(v == "correct" for v in self.verdicts.values())

    def rows(self) -> list[dict]:
        return [{"student": self.student, "notebook": self.notebook, "chapter": self.chapter, "exercise": n,
                 "verdict": v, "points": int(v == "correct")} for n, v in sorted(self.verdicts.items())]


def _text(outputs: list) -> str:
    parts = []
    for o in outputs:
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        elif o.get("output_type") in ("execute_result", "display_data"):
            parts.append(o.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def chapter_of(nb: nbformat.NotebookNode, path: Path) -> str:
    """The chapter a notebook answers: the exercise calls' chapter, else the file name's prefix (``ch04c_…``)."""
    from mimo_kit.exercises import CHAPTERS

    calls = {ch for c in nb.cells if c.cell_type == "code" for ch, _ in CALL.findall(c.source)}
    if len(calls) == 1:
        return calls.pop()
    prefix = path.stem.split("_")[0]
    if prefix in CHAPTERS:
        return prefix
    raise ValueError(f"grade: {path} names no chapter (exercise calls of {sorted(calls) or 'none'}; the file name "
                     f"should start with one of {', '.join(CHAPTERS)})")


def verdicts_of(nb: nbformat.NotebookNode, chapter: str) -> tuple[dict[int, str], list[str]]:
    """Each registered exercise's verdict in an executed notebook, and the errors its cells raised."""
    from mimo_kit.exercises import chapter_exercises

    found: dict[int, str] = {e.number: "missing" for e in chapter_exercises(chapter)}
    errors = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        asked = [int(n) for ch, n in CALL.findall(cell.source) if ch == chapter and int(n) in found]
        for n in asked:
            if found[n] == "missing":
                found[n] = "not run"  # asked here; replaced by the check's own line when the cell printed it
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                errors.append(f"cell {i}: {o.get('ename')}: {str(o.get('evalue'))[:200]}")
        for n, verdict in VERDICT.findall(_text(cell.get("outputs", []))):
            if int(n) in found and int(n) in asked:
                found[int(n)] = VERDICTS[verdict]
    return found, errors


def student_of(path: Path, paths: Sequence[Path]) -> str:
    shared = sum(p.parent == path.parent for p in paths) > 1
    return path.stem if shared or path.parent == Path(".") else path.parent.name


@functools.cache
def sandbox_available() -> bool:
    """Whether ``unshare -rn`` runs here (user namespaces allowed)."""
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _sandboxed_kernel_class():
    from jupyter_client import KernelManager

    class SandboxedKernelManager(KernelManager):
        """A kernel started under ``unshare -rn``: its own user and network namespace (no network)."""

        def format_kernel_cmd(self, extra_arguments=None):
            return ["unshare", "-rn", *super().format_kernel_cmd(extra_arguments)]

    return SandboxedKernelManager


def grade_one(path: Path, *, student: str, timeout: int = 600, preset: str = "tiny",
              sandbox: bool | None = None) -> Graded:
    """Execute one submission in a private copy of its folder and read its verdicts. ``sandbox``: the kernel
    without network (default: wherever ``unshare -rn`` works)."""
    from nbclient import NotebookClient

    from mimo_kit.course import kernel_env

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    chapter = chapter_of(nb, path)
    sandbox = sandbox_available() if sandbox is None else sandbox
    with tempfile.TemporaryDirectory(prefix="mimo-kit-grade-") as tmp:
        work = Path(tmp) / "work"
        shutil.copytree(path.parent, work, ignore=shutil.ignore_patterns("*.ipynb", "runs", ".ipynb_checkpoints"))
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                interrupt_on_timeout=True, resources={"metadata": {"path": str(work)}})
        if sandbox:  # Unix sockets cross the network namespace; TCP on the loopback would not
            client.km = _sandboxed_kernel_class()(kernel_name="python3", transport="ipc",
                                                  ip=str(Path(tmp) / "kernel"))
        try:
            client.execute(env=kernel_env(quick=True, preset=preset))
            failure = None
        except Exception as e:  # noqa: BLE001 - a kernel that dies is this submission's failure, not the grader's
            failure = f"the kernel stopped: {type(e).__name__}: {str(e)[:200]}"
    verdicts, errors = verdicts_of(nb, chapter)
    return Graded(student, path.name, chapter, verdicts, errors + ([failure] if failure else []), sandbox)


def grade(paths: Sequence[str | Path], out: str | Path, *, timeout: int = 600, preset: str = "tiny",
          sandbox: bool | None = None) -> list[Graded]:
    """Grade every submission and write the gradebook CSV to ``out``."""
    paths = [Path(p) for p in paths]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"grade: no such notebook: {', '.join(missing)}")
    graded = [grade_one(p, student=student_of(p, paths), timeout=timeout, preset=preset, sandbox=sandbox)
              for p in paths]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for g in graded:
            writer.writerows(g.rows())
    return graded
