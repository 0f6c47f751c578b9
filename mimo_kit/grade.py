"""Autograding: execute students' chapter notebooks and collect every exercise's verdict into a gradebook.

``mimo-kit grade SUBMISSIONS… --out grades.csv`` runs each submitted notebook top to bottom in a fresh kernel, the
way a student ran it (quick mode, the ``tiny`` preset), in a private copy of its folder (what it writes stays
there). A failing cell is recorded and the cells after it still run, so a broken notebook keeps what it answered.

**It always finishes.** Each notebook runs in its own worker process (:mod:`mimo_kit.grade_kernel`), ``jobs`` at
a time. A cell gets ``timeout`` seconds, then an interrupt, then (a loop inside a bare ``except``) the kill of its
kernel and of every process the kernel started; a kernel that dies (``os._exit``) is noticed at once; the cells
after a kill or a death are "not run". Over all of it the grader holds a per-notebook deadline
(``notebook_timeout``): a worker past it is killed with its kernel, and the notebook keeps the answers it
recorded before. The gradebook is written a submission at a time (:class:`~mimo_kit.gradebook.GradebookWriter`);
SIGTERM or Ctrl-C stops the grader cleanly: running kernels are killed, the submissions in flight are written
with what they answered and the error "grading stopped", and the gradebook holds every row done.

The kernel is sandboxed where the machine allows it: it starts under ``unshare -rn`` (a user and a network
namespace: no network, not even the loopback) and talks to the grader over Unix sockets (Jupyter's ``ipc``
transport) instead of TCP. Where ``unshare`` is refused (a container without user namespaces) the kernel runs
unsandboxed and the grader says so.

Verdicts are judged here, not in the kernel. The kernel imports a view of the kit without its references
(:func:`answer_free_kit`: links to every part of the checkout but ``mimo_kit/solutions``, which is also blocked
from any other import path), so a submission cannot look an answer up; its ``exercise(c, n).check(answer)`` records
the answer (:mod:`mimo_kit.answers`) and the grader judges the last recorded answer of each exercise with the
registry (:mod:`mimo_kit.gradebook`). Nothing the notebook prints is read as a verdict, and a monkeypatched checker
changes nothing. Every registered exercise (or each one ``exercises`` selects) gets a row with the answer given, the
verdict, the points (partial credit for answers with parts), the registry's explanation and the cell's error.
``student`` is the submission's folder (``submissions/alice/ch04c_….ipynb`` → ``alice``), or the file's name
when several submissions share a folder.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import nbformat

from mimo_kit.gradebook import (
    CALL,
    FIELDS,
    GradebookWriter,
    Row,
    chapter_of,
    feedback_page,
    judge_submission,
    parse_selection,
    verdicts_of,
)

__all__ = ["CALL", "FIELDS", "Graded", "chapter_of", "grade", "grade_one", "verdicts_of", "sandbox_available",
           "answer_free_kit"]

#: seconds a whole notebook may take when the caller names no limit: a chapter in quick mode runs in a few
#: minutes on a laptop, so half an hour only stops a notebook that something keeps from ever finishing
NOTEBOOK_TIMEOUT = 1800
#: seconds a stopped worker gets to kill its kernel before it is killed itself
WORKER_GRACE = 10.0


@dataclasses.dataclass
class Graded:
    """One submission: a row per exercise, the cells that raised, and the score."""

    student: str
    notebook: str
    chapter: str
    rows: list[Row]
    errors: list[str]
    sandboxed: bool = False  # the kernel ran without network (unshare -rn)
    seconds: float = 0.0
    token: str = ""  # marks every process of the run (mimo_kit.grade_kernel.TOKEN_ENV); none is left after it

    @property
    def verdicts(self) -> dict[int, str]:
        return {r.exercise: r.verdict for r in self.rows}

    @property
    def score(self) -> float:
        return sum(r.points for r in self.rows)


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




class _Run:
    """One submission on its way through a worker: its private folder, the worker process and its deadline."""

    def __init__(self, path: Path, student: str, *, timeout: float, notebook_timeout: float, preset: str,
                 sandbox: bool, threads: int | None, grace: float | None = None,
                 selection: set[int] | None = None):
        from mimo_kit.answers import ANSWERS_ENV
        from mimo_kit.course import kernel_env

        self.path, self.student, self.sandbox, self.selection = path, student, sandbox, selection
        self.nb = nbformat.read(path, as_version=4)
        self.chapter = chapter_of(self.nb, path)
        self.tmp = Path(tempfile.mkdtemp(prefix="mimo-kit-grade-"))
        work = self.tmp / "work"
        # the folder's files, less notebooks, runs and anything that would shadow the kit
        shutil.copytree(path.parent, work, ignore=shutil.ignore_patterns(
            "*.ipynb", "runs", ".ipynb_checkpoints", "mimo_kit", "sitecustomize.py", "usercustomize.py", "*.pth"))
        kit = answer_free_kit(self.tmp / "kit")
        (self.tmp / "sockets").mkdir(mode=0o700)
        self.answers, self.outcomes = self.tmp / "answers.jsonl", self.tmp / "outcomes.jsonl"
        env = kernel_env(quick=True, preset=preset, threads=threads)
        env["PYTHONPATH"] = os.pathsep.join([str(kit), *filter(None, [env.get("PYTHONPATH")])])
        env[ANSWERS_ENV] = str(self.answers)
        self.token = uuid.uuid4().hex
        spec = {"notebook": str(path.resolve()), "cwd": str(work), "sockets": str(self.tmp / "sockets"),
                "sandbox": sandbox, "cell_timeout": timeout, "env": env, "token": self.token,
                "outcomes": str(self.outcomes)}
        if grace is not None:
            spec["grace"] = grace
        (self.tmp / "spec.json").write_text(json.dumps(spec))
        self.log = (self.tmp / "worker.log").open("wb")
        self.started = time.monotonic()
        self.deadline = self.started + notebook_timeout
        self.notebook_timeout = notebook_timeout
        self.proc = subprocess.Popen([sys.executable, "-m", "mimo_kit.grade_kernel", str(self.tmp / "spec.json")],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def overdue(self) -> bool:
        return time.monotonic() > self.deadline

    def stop(self) -> None:
        """End the worker and its kernel: SIGTERM (the worker kills its kernel), then SIGKILL to both."""
        from mimo_kit.grade_kernel import kill_marked

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=WORKER_GRACE)
            except (OSError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                self.proc.wait()
        kill_marked(self.token)

    def finish(self, stopped: str = "") -> Graded:
        """Judge what the submission recorded; ``stopped``: why the grader ended the run early."""
        from mimo_kit.answers import recorded

        self.stop()  # a finished worker left nothing; a stopped one leaves nothing after this
        self.log.close()
        cell_errors, errors, ended = {}, [], ""
        for line in self.outcomes.read_text().splitlines() if self.outcomes.is_file() else []:
            try:
                o = json.loads(line)
            except ValueError:
                continue
            status, cell = o.get("status"), o.get("cell")
            what = {"error": f"{o.get('ename')}: {o.get('evalue')}",
                    "interrupted": f"ran over the {o.get('seconds', '?')} s cell deadline and was interrupted"
                                   + (f" ({o.get('ename')})" if o.get("ename") else ""),
                    "killed": "ran over the cell deadline, ignored the interrupt, and its kernel was killed",
                    "died": "the kernel died while this cell ran",
                    "no kernel": f"the kernel did not start: {o.get('ename')}: {o.get('evalue')}"}.get(status)
            if what is None:
                continue
            if cell is not None:
                cell_errors[cell] = what
                errors.append(f"cell {cell}: {what}")
            else:
                errors.append(what)
            if status in ("killed", "died", "no kernel"):
                ended = {"killed": f"not run: cell {cell} ran over the cell deadline, ignored the interrupt, and "
                                   "its kernel was killed",
                         "died": f"not run: the kernel died in cell {cell}"}.get(status, f"not run: {what}")
        if stopped:
            errors.append(stopped)
            ended = f"not run: {stopped}"
        rows = judge_submission(self.nb, self.chapter, recorded(self.answers, self.chapter), cell_errors, ended,
                                self.selection)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return Graded(self.student, self.path.name, self.chapter, rows, errors, self.sandbox,
                      round(time.monotonic() - self.started, 1), self.token)


class GradingStopped(Exception):
    """SIGTERM reached the grader."""


def grade(paths: Sequence[str | Path], out: str | Path, *, timeout: float = 600, preset: str = "tiny",
          sandbox: bool | None = None, jobs: int = 1, notebook_timeout: float | None = None,
          exercises: str | None = None, feedback: str | Path | None = None, on_graded=None,
          grace: float | None = None) -> list[Graded]:
    """Grade every submission, ``jobs`` at a time, writing the gradebook CSV to ``out`` as each one finishes.

    ``timeout``: seconds per cell; ``notebook_timeout``: seconds per notebook (default :data:`NOTEBOOK_TIMEOUT`);
    ``exercises``: the exercises to grade (``"1-5,7"``; default all); ``feedback``: a folder for one HTML feedback
    page per student; ``on_graded``: called with each :class:`Graded` as it is written; ``grace``: seconds between
    a cell's interrupt and its kernel's kill (default :data:`mimo_kit.grade_kernel.KILL_GRACE`)."""
    from mimo_kit.exercises import chapter_exercises

    paths = [Path(p) for p in paths]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"grade: no such notebook: {', '.join(missing)}")
    if jobs < 1 or timeout <= 0 or (notebook_timeout is not None and notebook_timeout <= 0):
        raise ValueError(f"grade: jobs must be ≥ 1 and timeouts > 0 (got jobs={jobs}, timeout={timeout}, "
                         f"notebook_timeout={notebook_timeout})")
    chapters = {p: chapter_of(nbformat.read(p, as_version=4), p) for p in paths}  # refuse a bad one before any run
    selection = None
    if exercises is not None:
        known = set.intersection(*({e.number for e in chapter_exercises(c)} for c in set(chapters.values())))
        selection = parse_selection(exercises, known)
    sandbox = sandbox_available() if sandbox is None else sandbox
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None
    notebook_timeout = NOTEBOOK_TIMEOUT if notebook_timeout is None else notebook_timeout

    writer = GradebookWriter(out)
    pending, running, graded = list(paths), [], []
    by_student: dict[str, list] = {}

    def done(run: _Run, stopped: str = "") -> None:
        g = run.finish(stopped)
        graded.append(g)
        writer.write(g.student, g.notebook, g.chapter, g.rows)
        by_student.setdefault(g.student, []).append((g.notebook, g.chapter, g.rows))
        if feedback is not None:
            folder = Path(feedback)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{g.student}.html").write_text(feedback_page(g.student, by_student[g.student]))
        if on_graded is not None:
            on_graded(g)

    def on_signal(signum, frame):
        raise GradingStopped(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, on_signal) if _main_thread() else None
    try:
        while pending or running:
            while pending and len(running) < jobs:
                p = pending.pop(0)
                run = _Run(p, student_of(p, paths), timeout=timeout, notebook_timeout=notebook_timeout,
                           preset=preset, sandbox=sandbox, threads=threads, grace=grace, selection=selection)
                running.append(run)
            for run in list(running):
                if run.proc.poll() is not None:
                    running.remove(run)
                    done(run)
                elif run.overdue():
                    running.remove(run)
                    done(run, f"the notebook ran over its {run.notebook_timeout:g} s deadline and was stopped")
            time.sleep(0.1)
    except (GradingStopped, KeyboardInterrupt) as e:
        why = f"grading stopped ({e or 'interrupted'}) before the notebook finished"
        for run in running:
            done(run, why)
        running.clear()
        raise GradingStopped(f"{len(graded)} of {len(paths)} submissions written to {out}; "
                             f"{len(pending)} not started") from None
    finally:
        for run in running:  # an unexpected error: no kernel outlives the grader
            run.stop()
        writer.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return graded


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def grade_one(path: Path, *, student: str, timeout: float = 600, preset: str = "tiny",
              sandbox: bool | None = None, notebook_timeout: float | None = None) -> Graded:
    """Execute one submission in a private copy of its folder and judge its recorded answers (no gradebook)."""
    sandbox = sandbox_available() if sandbox is None else sandbox
    run = _Run(Path(path), student, timeout=timeout, preset=preset, sandbox=sandbox, threads=None,
               notebook_timeout=NOTEBOOK_TIMEOUT if notebook_timeout is None else notebook_timeout)
    try:
        while run.proc.poll() is None and not run.overdue():
            time.sleep(0.1)
        return run.finish("" if run.proc.poll() is not None else
                          f"the notebook ran over its {run.notebook_timeout:g} s deadline and was stopped")
    finally:
        run.stop()
