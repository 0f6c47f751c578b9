"""Autograding: execute students' chapter notebooks and collect every exercise's verdict into a gradebook.

``mimo-kit grade SUBMISSIONS… --out grades.csv`` runs each submitted notebook top to bottom in a fresh kernel, the
way a student ran it (quick mode, the ``tiny`` preset), in a private copy of its folder (what it writes stays
there), each cell bounded by ``timeout`` seconds (a cell that runs over is interrupted) and errors allowed: a
failing cell is recorded and the cells after it still run, so a broken notebook keeps what it answered.

The kernel is sandboxed where the machine allows it: it starts under ``unshare -rn`` (a user and a network
namespace: no network, not even the loopback) and talks to the grader over Unix sockets (Jupyter's ``ipc``
transport) instead of TCP. Where ``unshare`` is refused (a container without user namespaces) the kernel runs
unsandboxed and the grader says so.

Verdicts are judged here, not in the kernel. The kernel imports a view of the kit without its references
(:func:`answer_free_kit`: links to every part of the checkout but ``mimo_kit/solutions``, which is also blocked
from any other import path), so a submission cannot look an answer up; its ``exercise(c, n).check(answer)`` records
the answer (:mod:`mimo_kit.answers`) and the grader judges the last recorded answer of each exercise with the
registry (:meth:`~mimo_kit.exercises.Exercise.accepts`). Nothing the notebook prints is read as a verdict, and a
monkeypatched checker changes nothing. Every exercise the chapter registers gets a row, also those the notebook
asked but never reached (``not run``) or never asked (``missing``). The gradebook has one row per submission and
exercise:

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
from typing import Any

import nbformat

CALL = re.compile(r'exercise\(\s*"(\w+)"\s*,\s*(\d+)\s*\)\s*\.check\(')
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


def verdicts_of(nb: nbformat.NotebookNode, chapter: str, recorded: dict[int, Any]) -> tuple[dict[int, str], list[str]]:
    """Each registered exercise's verdict, judged on its last ``recorded`` answer, and the errors the executed
    notebook's cells raised. An exercise asked in the notebook but with no recorded answer is ``not run``."""
    from mimo_kit.exercises import chapter_exercises, exercise

    found: dict[int, str] = {e.number: "missing" for e in chapter_exercises(chapter)}
    errors = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for ch, n in CALL.findall(cell.source):
            if ch == chapter and int(n) in found:
                found[int(n)] = "not run"
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                errors.append(f"cell {i}: {o.get('ename')}: {str(o.get('evalue'))[:200]}")
    for n, answer in recorded.items():
        if n not in found:
            continue
        if answer is None:
            found[n] = "unanswered"
            continue
        try:
            found[n] = "correct" if exercise(chapter, n).accepts(answer) else "wrong"
        except Exception:  # noqa: BLE001 - an answer the registry cannot compare is a wrong one
            found[n] = "wrong"
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


#: the kernel's first import hook: ``mimo_kit.solutions`` is not importable, whatever the path (an editable
#: install's finder maps the package's submodules to the checkout)
_BLOCK_REFERENCES = """import sys


class _NoReferences:
    def find_spec(self, name, path=None, target=None):
        if name == "mimo_kit.solutions" or name.startswith("mimo_kit.solutions."):
            raise ModuleNotFoundError(f"{name}: a kernel that mimo-kit grade runs has no reference answers")
        return None


sys.meta_path.insert(0, _NoReferences())
"""


def answer_free_kit(root: Path) -> Path:
    """A view of the checkout without the references, for graded kernels (``PYTHONPATH=root``): ``root`` links to
    every top-level entry of the checkout but ``mimo_kit`` and ``instructor``; ``root/mimo_kit`` links to every
    entry of the package but ``solutions``; ``root/sitecustomize.py`` blocks importing ``mimo_kit.solutions`` by
    any other path. Paths the kit resolves from its own files (``data/``, ``notebooks/``) still lead to the
    checkout."""
    import mimo_kit

    package = Path(mimo_kit.__file__).resolve().parent
    root.mkdir(parents=True, exist_ok=True)
    for entry in package.parent.iterdir():
        if entry.name not in ("mimo_kit", "instructor", ".git", ".venv"):
            (root / entry.name).symlink_to(entry)
    (root / "mimo_kit").mkdir()
    for entry in package.iterdir():
        if entry.name not in ("solutions", "__pycache__"):
            (root / "mimo_kit" / entry.name).symlink_to(entry)
    (root / "sitecustomize.py").write_text(_BLOCK_REFERENCES)
    return root


def grade_one(path: Path, *, student: str, timeout: int = 600, preset: str = "tiny",
              sandbox: bool | None = None) -> Graded:
    """Execute one submission in a private copy of its folder and judge its recorded answers. ``sandbox``: the
    kernel without network (default: wherever ``unshare -rn`` works)."""
    import os

    from nbclient import NotebookClient

    from mimo_kit.answers import ANSWERS_ENV, recorded
    from mimo_kit.course import kernel_env, kernel_manager

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    chapter = chapter_of(nb, path)
    sandbox = sandbox_available() if sandbox is None else sandbox
    with tempfile.TemporaryDirectory(prefix="mimo-kit-grade-") as tmp:
        work, answers = Path(tmp) / "work", Path(tmp) / "answers.jsonl"
        # the folder's files, less notebooks, runs and anything that would shadow the kit
        shutil.copytree(path.parent, work, ignore=shutil.ignore_patterns(
            "*.ipynb", "runs", ".ipynb_checkpoints", "mimo_kit", "sitecustomize.py", "usercustomize.py", "*.pth"))
        kit = answer_free_kit(Path(tmp) / "kit")
        env = kernel_env(quick=True, preset=preset)
        env["PYTHONPATH"] = os.pathsep.join([str(kit), *filter(None, [env.get("PYTHONPATH")])])
        env[ANSWERS_ENV] = str(answers)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                interrupt_on_timeout=True, resources={"metadata": {"path": str(work)}})
        if sandbox:  # Unix sockets cross the network namespace; TCP on the loopback would not
            client.km = _sandboxed_kernel_class()(kernel_name="python3", transport="ipc",
                                                  ip=str(Path(tmp) / "kernel"))
        else:  # encrypted TCP, or Unix sockets: never plain TCP that another local user could read
            client.km = kernel_manager(Path(tmp))
        try:
            client.execute(env=env)
            failure = None
        except Exception as e:  # noqa: BLE001 - a kernel that dies is this submission's failure, not the grader's
            failure = f"the kernel stopped: {type(e).__name__}: {str(e)[:200]}"
        verdicts, errors = verdicts_of(nb, chapter, recorded(answers, chapter))
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
