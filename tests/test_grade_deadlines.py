"""`mimo-kit grade` always finishes: a class of chapter 4c hand-ins made from the instructor key, with a busy loop,
a loop inside a bare `except`, `os._exit`, a `setsid` fork and wrong answers, graded sandboxed and not, under a
per-cell and a per-notebook deadline and a SIGTERM to the grader. Each keeps the answers it gave before its bad cell;
no process of a graded kernel outlives the grading."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from mimo_kit.grade import grade, sandbox_available
from mimo_kit.grade_kernel import TOKEN_ENV, marked_pids

REPO = Path(__file__).resolve().parents[1]
KEY = REPO / "instructor" / "ch04c_groupwise_grading_key.ipynb"
#: cells a hand-in inserts after exercise 3's check
BAD = {"loop": "while True:\n    pass",
       "except": "while True:\n    try:\n        while True:\n            pass\n    except:  # noqa\n        pass",
       "exit": "import os\nos._exit(1)",
       "fork": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    while True:\n        time.sleep(1)\n"
               "while True:\n    pass",
       # a double fork that leaves the session and clears its environment: no token marks it
       "escape": "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                 "        os.execve('/bin/sleep', ['sleep', '{tag}'], {{}})\n    os._exit(0)"}
EXERCISES = range(1, 10)


def hand_in(path: Path, bad: str | None = None, wrong: bool = False, tag: str = "4242.5") -> Path:
    """The key's derivations with a check per exercise (the key asserts instead); ``bad``: a cell after exercise
    3; ``wrong``: exercises 2 and 5 off by one, exercise 6's second part off by one."""
    cells = []
    for c in nbformat.read(KEY, as_version=4).cells:
        if c.cell_type != "code":
            continue
        m = re.match(r'assert exercise\("ch04c", (\d)\)', c.source)
        if not m:
            cells.append(nbformat.v4.new_code_cell(c.source))
            continue
        n = int(m[1])
        change = {2: "answer_2 = answer_2 + 1\n", 5: "answer_5 = answer_5 + 1\n",
                  6: "answer_6 = [answer_6[0], answer_6[1] + 1]\n"}.get(n, "") if wrong else ""
        cells.append(nbformat.v4.new_code_cell(f'{change}exercise("ch04c", {n}).check(answer_{n})'))
        if n == 3 and bad:
            cells.append(nbformat.v4.new_code_cell(BAD[bad].format(tag=tag) if bad == "escape" else BAD[bad]))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def rows_of(path: Path) -> dict[tuple[str, int], dict]:
    return {(r["student"], int(r["exercise"])): r for r in csv.DictReader(path.open())}


def _cmdline(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def no_process_left(tokens) -> None:
    left = {t: marked_pids(t) for t in tokens if t}
    assert not any(left.values()), f"processes of graded kernels outlived the grading: {left}"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed-ipc", "unsandboxed-tcp"])
def test_a_class_with_hanging_and_dying_kernels_is_graded(tmp_path, sandbox):
    if sandbox and not sandbox_available():
        pytest.skip("unshare -rn is refused on this machine (no user namespaces)")
    paths = [hand_in(tmp_path / "key" / "ch04c_groupwise_grading.ipynb"),
             hand_in(tmp_path / "wrong" / "ch04c_groupwise_grading.ipynb", wrong=True)]
    tag = f"4242.{os.getpid()}{int(sandbox)}"  # the escaped sleep's argument: this run's only
    paths += [hand_in(tmp_path / b / "ch04c_groupwise_grading.ipynb", bad=b, tag=tag) for b in BAD]
    out, feedback = tmp_path / "grades.csv", tmp_path / "feedback"
    graded = grade(paths, out, timeout=8, grace=2, sandbox=sandbox, jobs=2, feedback=feedback)
    no_process_left(g.token for g in graded)
    escaped = [p for p in filter(str.isdigit, os.listdir("/proc")) if _cmdline(p) == ["sleep", tag]]
    assert escaped == [], "a double-forked child with a cleared environment outlived the grading"
    assert all(g.sandboxed == sandbox for g in graded)
    rows = rows_of(out)
    assert {s for s, _ in rows} == {"key", "wrong", *BAD} and len(rows) == len(paths) * len(EXERCISES)
    verdict = {k: r["verdict"] for k, r in rows.items()}
    assert all(verdict["key", n] == "correct" for n in EXERCISES)
    for student in BAD:  # the answers given before the bad cell are kept
        assert all(verdict[student, n] == "correct" for n in (1, 2, 3)), student
    # an interrupted loop stops at the interrupt and the notebook goes on
    assert all(verdict["loop", n] == "correct" for n in EXERCISES)
    assert all(verdict["fork", n] == "correct" for n in EXERCISES)
    assert all(verdict["escape", n] == "correct" for n in EXERCISES)
    # a loop that swallows the interrupt has its kernel killed; a kernel that exits is noticed
    for student, why in (("except", "its kernel was killed"), ("exit", "the kernel died")):
        for n in range(4, EXERCISES.stop):
            assert verdict[student, n] == "not run" and why in rows[student, n]["error"], rows[student, n]
    bad_cell = [g for g in graded if g.student == "except"][0].errors
    assert any("ignored the interrupt" in e for e in bad_cell), bad_cell
    # a wrong answer: its value, the registry's explanation, partial credit for a two-part answer
    assert verdict["wrong", 2] == verdict["wrong", 5] == "wrong" and rows["wrong", 5]["answer"]
    assert "binomial" in rows["wrong", 5]["explanation"]  # the registry knows this near miss
    assert verdict["wrong", 6] == "partial" and float(rows["wrong", 6]["points"]) == 0.5
    assert "1 of 2 parts right" in rows["wrong", 6]["explanation"]
    assert sum(float(r["points"]) for (s, _), r in rows.items() if s == "wrong") == len(EXERCISES) - 2.5
    page = (feedback / "wrong.html").read_text()
    assert "partial" in page and "1 of 2 parts right" in page and (feedback / "except.html").is_file()
    assert not any("deadline and was stopped" in e for g in graded for e in g.errors)  # cell deadlines sufficed


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_notebook_deadline_stops_a_run_and_keeps_its_answers(tmp_path):
    """A cell deadline longer than the notebook's: the notebook's deadline stops the worker and its kernel; the
    answers recorded before stay; ``exercises`` grades only the selected ones."""
    path = hand_in(tmp_path / "loop" / "ch04c_groupwise_grading.ipynb", bad="loop")
    out = tmp_path / "g.csv"
    (g,) = grade([path], out, timeout=600, notebook_timeout=20, exercises="1-5", sandbox=False)
    no_process_left([g.token])
    rows = rows_of(out)
    assert sorted(n for _, n in rows) == [1, 2, 3, 4, 5]
    assert [rows["loop", n]["verdict"] for n in (1, 2, 3)] == ["correct"] * 3
    assert all(rows["loop", n]["verdict"] == "not run" and "20 s deadline" in rows["loop", n]["error"]
               for n in (4, 5))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_ends_the_grader_with_every_finished_row_written(tmp_path):
    key = hand_in(tmp_path / "key" / "ch04c_groupwise_grading.ipynb")
    loop = hand_in(tmp_path / "loop" / "ch04c_groupwise_grading.ipynb", bad="loop")
    later = hand_in(tmp_path / "later" / "ch04c_groupwise_grading.ipynb")
    out = tmp_path / "g.csv"
    proc = subprocess.Popen([sys.executable, "-m", "mimo_kit.cli", "grade", str(key), str(loop), str(later),
                             "--out", str(out), "--timeout", "600", "--no-sandbox"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})  # the kernels' folders name this test
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and not (out.is_file() and "key," in out.read_text()):
        time.sleep(0.5)  # the key is written as soon as it is graded; the loop's cell runs for 600 s
    time.sleep(8)  # the loop's kernel is in its bad cell
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert "stopped" in stderr and "1 not started" in stderr
    rows = rows_of(out)
    assert {s for s, _ in rows} == {"key", "loop"}
    assert all(rows["key", n]["verdict"] == "correct" for n in EXERCISES)
    assert [rows["loop", n]["verdict"] for n in (1, 2, 3)] == ["correct"] * 3
    assert "grading stopped (SIGTERM)" in rows["loop", 4]["error"]
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):  # no process of this grader's kernels is left
        try:
            if f"{TOKEN_ENV}=".encode() in (env := Path(f"/proc/{pid}/environ").read_bytes()) \
                    and str(tmp_path).encode() in env:
                left.append(pid)
        except OSError:
            continue
    assert left == []
