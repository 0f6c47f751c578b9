"""The student edition (``mimo-kit course --student``): the kit without reference answers, keys or tests, in which
an exercise check records the answer instead of judging it."""

import subprocess
import sys
import zipfile

from mimo_kit import student
from mimo_kit.cli import main
from mimo_kit.course import notebooks


def test_edition_withholds_answers_keys_and_tests(tmp_path, capsys):
    assert main(["course", "--student", "--out", str(tmp_path)]) == 0
    root, archive = tmp_path / student.NAME, tmp_path / f"{student.NAME}.zip"
    assert str(root.resolve()) in capsys.readouterr().out and archive.is_file()
    files = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert not [f for f in files if f.startswith(student.WITHHELD)]
    assert {f"notebooks/{p.name}" for p in notebooks()} <= files
    assert {"STUDENT.md", "README.md", "Makefile", "pyproject.toml", "mimo_kit/exercises.py",
            "mimo_kit/web/vendor/mathjax/tex-chtml-full.js"} <= files
    with zipfile.ZipFile(archive) as z:
        zipped = {n.removeprefix(f"{student.NAME}/") for n in z.namelist() if not n.endswith("/")}
    assert zipped == files

    # in the edition the check records an answer, says so, and the reference is not there to look up
    probe = ("import mimo_kit, mimo_kit.exercises as e\n"
             f"assert mimo_kit.__file__.startswith({str(root)!r}), mimo_kit.__file__\n"
             "assert not e.references_shipped()\n"
             "assert e.exercise('ch04c', 3).check(0.25) is None\n"
             "assert e.exercise('ch04c', 3).check(None) is None\n"
             "try:\n    e.exercise('ch04c', 3).reference()\nexcept LookupError as x:\n    print('refused:', x)\n")
    run = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "answer recorded (0.25)" in run.stdout and "not answered yet" in run.stdout
    assert "refused: this copy of the kit (the student edition" in run.stdout and "mimo-kit grade" in run.stdout
    # a second edition into the same folder replaces the first
    (root / "stale.txt").write_text("old")
    student.write_student_edition(tmp_path)
    assert not (root / "stale.txt").exists()


def test_edition_from_a_folder_that_is_not_a_checkout(tmp_path):
    repo = tmp_path / "kit"
    for rel in ("mimo_kit/__init__.py", "mimo_kit/solutions/ch01.py", "instructor/ch01_key.ipynb", "tests/t.py",
                "notebooks/ch01.ipynb", "runs/x/out.json", ".venv/bin/python", "mimo_kit/__pycache__/a.pyc"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x")
    assert student.edition_files(repo) == ["mimo_kit/__init__.py", "notebooks/ch01.ipynb"]
