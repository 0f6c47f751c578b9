"""Autograding: three submissions of chapter 2a's exercises (all right, half right, broken) executed by
`mimo-kit grade`, and the gradebook they make."""

import csv

import nbformat
import pytest

from mimo_kit.cli import main
from mimo_kit.exercises import chapter_exercises, exercise
from mimo_kit.grade import chapter_of, verdicts_of


def submission(path, answers: dict, broken: bool = False):
    """A chapter 2a notebook: one cell per exercise, ``answers[n]`` written as a literal (None: unanswered)."""
    cells = [nbformat.v4.new_code_cell("from mimo_kit.exercises import exercise")]
    if broken:  # a cell that raises before the answers, and one that is not Python at all
        cells += [nbformat.v4.new_code_cell("raise RuntimeError('my model diverged')"),
                  nbformat.v4.new_code_cell("def (:")]
    for n in (1, 2, 3):
        cells.append(nbformat.v4.new_code_cell(f"answer_{n} = {answers.get(n)!r}\n"
                                               f'exercise("ch02a", {n}).check(answer_{n})'))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


@pytest.mark.slow
def test_grade_writes_the_gradebook_of_three_submissions(tmp_path, capsys):
    refs = {n: exercise("ch02a", n).reference() for n in (1, 2, 3)}
    right = submission(tmp_path / "alice" / "ch02a_architecture.ipynb", refs)
    half = submission(tmp_path / "bob" / "ch02a_architecture.ipynb", {1: refs[1], 2: refs[2] + 1.0})
    broken = submission(tmp_path / "carol" / "ch02a_architecture.ipynb", {1: refs[1], 3: refs[3] + 7}, broken=True)
    out = tmp_path / "grades.csv"
    assert main(["grade", str(right), str(half), str(broken), "--out", str(out), "--timeout", "120"]) == 0
    rows = list(csv.DictReader(out.open()))
    got = {(r["student"], int(r["exercise"])): (r["verdict"], int(r["points"])) for r in rows}
    later = {(s, e.number): ("missing", 0) for s in ("alice", "bob", "carol") for e in chapter_exercises("ch02a")
             if e.number > 3}  # exercises the submissions do not ask
    assert got == later | {("alice", 1): ("correct", 1), ("alice", 2): ("correct", 1), ("alice", 3): ("correct", 1),
                   ("bob", 1): ("correct", 1), ("bob", 2): ("wrong", 0), ("bob", 3): ("unanswered", 0),
                   ("carol", 1): ("correct", 1), ("carol", 2): ("unanswered", 0), ("carol", 3): ("wrong", 0)}
    assert {r["chapter"] for r in rows} == {"ch02a"} and {r["notebook"] for r in rows} == {"ch02a_architecture.ipynb"}
    printed = capsys.readouterr().out
    n = len(chapter_exercises("ch02a"))
    assert "alice" in printed and f"3/{n}" in printed and f"1/{n}" in printed and "2 cell error(s)" in printed
    assert not (tmp_path / "alice" / "runs").exists()  # executed in a private copy of the folder


def test_verdicts_are_judged_on_recorded_answers_not_on_printed_lines():
    """A printed "✓ correct" counts for nothing; the recorded answer is judged; an exercise asked in a cell that
    raised first is "not run", one never asked "missing"."""
    ref = exercise("ch02a", 1).reference()
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell('exercise("ch02a", 1).check(x)', outputs=[nbformat.v4.new_output(
            "stream", name="stdout", text="exercise 1 (GiB to 2 decimals): ✓ correct\n")]),
        nbformat.v4.new_code_cell('exercise("ch02a", 2).check(y)', outputs=[nbformat.v4.new_output(
            "error", ename="NameError", evalue="name 'y' is not defined", traceback=[])])])
    rest = {e.number: "missing" for e in chapter_exercises("ch02a") if e.number > 3}
    assert verdicts_of(nb, "ch02a", {})[0] == {1: "not run", 2: "not run", 3: "missing"} | rest
    verdicts, errors = verdicts_of(nb, "ch02a", {1: ref})
    assert verdicts == {1: "correct", 2: "not run", 3: "missing"} | rest
    assert errors == ["cell 1: NameError: name 'y' is not defined"]
    assert verdicts_of(nb, "ch02a", {1: ref + 1.0, 3: None})[0] == {1: "wrong", 2: "not run", 3: "unanswered"} | rest
    assert set(verdicts) == {e.number for e in chapter_exercises("ch02a")}


@pytest.mark.slow
def test_a_submission_cannot_forge_a_verdict_or_look_an_answer_up(tmp_path):
    """Printing a verdict line, monkeypatching the checker, asking the registry for the reference, importing the
    references, shipping a fake `mimo_kit` beside the notebook: none of it earns a point."""
    from mimo_kit.grade import grade_one

    path = tmp_path / "eve" / "ch02a_architecture.ipynb"
    fake = path.parent / "mimo_kit"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "exercises.py").write_text("def exercise(c, n):\n    raise SystemExit('the fake kit was imported')\n")
    cells = ["from mimo_kit.exercises import Exercise, exercise",
             'print("exercise 1 (GiB to 2 decimals): ✓ correct")\nexercise("ch02a", 1).check(None)',
             'Exercise.accepts = lambda self, answer: True\nexercise("ch02a", 2).check(12345.0)',
             'answer_3 = exercise("ch02a", 3).reference()\nexercise("ch02a", 3).check(answer_3)',
             "import mimo_kit.solutions.ch02a"]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
    graded = grade_one(path, student="eve", timeout=120)
    rest = {e.number: "missing" for e in chapter_exercises("ch02a") if e.number > 3}
    assert graded.verdicts == {1: "unanswered", 2: "wrong", 3: "not run"} | rest and graded.score == 0
    assert [e.split(":")[1].strip() for e in graded.errors] == ["LookupError", "ModuleNotFoundError"], graded.errors


def test_answers_survive_the_record(tmp_path, monkeypatch):
    """Every answer form the registry accepts reads the same after the kernel's record and the grader's decode."""
    import decimal
    import fractions

    import numpy as np
    import torch

    from mimo_kit import answers

    monkeypatch.setenv(answers.ANSWERS_ENV, str(tmp_path / "a.jsonl"))
    forms = {1: np.float32(4.16), 2: torch.tensor([0.5, 0.25]), 3: fractions.Fraction(1, 3), 4: decimal.Decimal("2.50"),
             5: (1, "x"), 6: {3, 1}, 7: [np.int64(2), 1.5], 8: None, 9: "2:+5", 10: object()}
    for n, x in forms.items():
        answers.record("chX", n, x)
    got = answers.recorded(tmp_path / "a.jsonl", "chX")
    assert got[1].dtype == np.float32 and float(got[1]) == float(np.float32(4.16))
    assert got[2].dtype == np.float32 and got[2].tolist() == [0.5, 0.25]
    assert got[3] == fractions.Fraction(1, 3) and got[4] == decimal.Decimal("2.50")
    assert got[5] == (1, "x") and got[6] == {1, 3} and got[7][0] == 2 and got[7][1] == 1.5
    assert got[8] is None and got[9] == "2:+5" and isinstance(got[10], answers.Unreadable)
    answers.record("chX", 1, 7)  # the last answer counts
    assert answers.recorded(tmp_path / "a.jsonl", "chX")[1] == 7 and answers.recorded(tmp_path / "a.jsonl", "chY") == {}


def test_a_notebook_that_names_no_chapter_is_refused(tmp_path, capsys):
    path = tmp_path / "homework.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), path)
    with pytest.raises(ValueError, match="names no chapter"):
        chapter_of(nbformat.read(path, as_version=4), path)
    assert main(["grade", str(path), "--out", str(tmp_path / "g.csv")]) == 2
    assert main(["grade", str(tmp_path / "nope.ipynb"), "--out", str(tmp_path / "g.csv")]) == 2
    assert "no such notebook" in capsys.readouterr().err


@pytest.mark.slow
def test_a_sandboxed_kernel_has_no_network(tmp_path):
    """Where `unshare -rn` works the kernel has its own network namespace: a listener the grader opens on
    127.0.0.1 is out of the kernel's reach, while the same cell unsandboxed reaches it."""
    import socket

    from mimo_kit.grade import grade_one, sandbox_available

    if not sandbox_available():
        pytest.skip("unshare -rn is refused on this machine (no user namespaces)")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        reach = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
                 "    answer_1 = 1\nexcept OSError:\n    answer_1 = None\n"
                 'exercise("ch02a", 1).check(answer_1)')
        path = tmp_path / "dana" / "ch02a_architecture.ipynb"
        path.parent.mkdir()
        nbformat.write(nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_code_cell("from mimo_kit.exercises import exercise"), nbformat.v4.new_code_cell(reach)]),
            path)
        boxed = grade_one(path, student="dana", timeout=60, sandbox=True)
        open_ = grade_one(path, student="dana", timeout=60, sandbox=False)
    assert boxed.sandboxed and boxed.verdicts[1] == "unanswered"  # the connection failed inside the sandbox
    assert not open_.sandboxed and open_.verdicts[1] == "wrong"  # it connected (1 is not the answer)
