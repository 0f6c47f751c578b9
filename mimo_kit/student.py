"""``mimo-kit course --student``: the kit as a class receives it, without the answers.

The student edition is the checkout's tracked files (``git ls-files``; a folder that is not a checkout is walked,
build and run folders left out) less what gives an answer away:

* ``mimo_kit/solutions/``: the functions that compute each exercise's reference answer;
* ``instructor/``: the instructor key (every derivation) and its builder;
* ``tests/`` and ``.ci/``: the tests assert the references and run the keys.

In the edition :mod:`mimo_kit.exercises` finds no references: ``exercise(c, n).check(answer)`` records the answer
("graded by your instructor") instead of judging it, and ``reference()`` raises. The instructor grades the
returned notebooks with ``mimo-kit grade`` from the full kit, which has the references. The edition is written as a
folder and as a zip of it, to hand out; ``STUDENT.md`` at its root (:data:`mimo_kit.EDITION_MARKER`) says what was
left out and why, and marks the folder as an edition.

The edition cannot borrow the references of another copy installed beside it (:mod:`mimo_kit`: a copy without
``solutions/`` refuses ``import mimo_kit.solutions…``, and the full kit imported from inside an edition warns).
Which copy a notebook's kernel imports depends on the environment, not on the folder: a kernel starts in
``notebooks/``, where the package is not on the path, so it imports the kit installed in its environment. The
edition's ``make setup`` installs the edition into its own ``.venv``, and its ``make check`` fails when a Python
started in ``notebooks/`` imports another copy.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from mimo_kit import EDITION_MARKER

REPO = Path(__file__).resolve().parent.parent
#: path prefixes the edition leaves out (relative to the repository root)
WITHHELD = ("mimo_kit/solutions/", "instructor/", "tests/", ".ci/")
#: folders never copied when the source is not a git checkout (builds, runs, caches)
UNTRACKED = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "build",
             "dist", ".ipynb_checkpoints"}
NAME = "mimo_kit_student"

README = """# mimo_kit, student edition

This is the course's copy of mimo_kit without its answers. Left out: `mimo_kit/solutions/` (the reference
answers), `instructor/` (the worked keys), `tests/` (which check both) and `.ci/`. Everything else, the notebooks,
the package, the data and the docs, is as in the full kit.

- Set up with `make setup`: it creates `.venv` in this folder and installs this copy of the kit into it. Then
  `make demo` runs every chapter and `make lab` opens the notebooks in that environment.
- Work in this folder's environment. A notebook imports the `mimo_kit` of the Python that runs it, not the one
  beside it: a Jupyter from another environment that has the full kit installed (a shared course server's, say)
  imports that kit, which then warns that it is not this edition's copy. `mimo_kit.solutions` cannot be imported
  here from any copy.
- An exercise cell's `exercise(chapter, n).check(answer)` records your answer here; it does not say whether it
  is right. Your instructor runs `mimo-kit grade` on the notebooks you hand in, with the reference answers.
- `make check` lints the package, the notebooks and the benchmarks, runs the exercise registry's doctests and
  checks that a notebook here imports this copy of the kit. There are no tests in this edition: `make test` does
  not apply here.
"""


def edition_files(repo: Path = REPO) -> list[str]:
    """The repository's files (relative paths) that the student edition holds."""
    try:
        listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True)
        files = [f for f in listed.stdout.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(repo)) for p in sorted(repo.rglob("*"))
                 if p.is_file() and not UNTRACKED & set(p.relative_to(repo).parts)]
    return [f for f in files if not f.startswith(WITHHELD) and (repo / f).is_file()]


def write_student_edition(out_dir: Path | str = "runs/student", *, repo: Path = REPO) -> tuple[Path, Path]:
    """Write ``out_dir/mimo_kit_student/`` and ``out_dir/mimo_kit_student.zip``; return both paths. An existing
    edition in ``out_dir`` is replaced."""
    out = Path(out_dir)
    root = out / NAME
    if root.exists():
        shutil.rmtree(root)
    for rel in edition_files(repo):
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, target)
    if any(root.joinpath(w).exists() for w in WITHHELD):  # a withheld path must not come back another way
        raise RuntimeError(f"write_student_edition: {root} holds one of {WITHHELD}")
    (root / EDITION_MARKER).write_text(README)
    archive = Path(shutil.make_archive(str(out / NAME), "zip", root_dir=out, base_dir=NAME))
    return root, archive
