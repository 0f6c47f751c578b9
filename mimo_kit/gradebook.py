"""The gradebook: each exercise's recorded answer judged by the registry, with the feedback a student can act on.

One row per submission and registered exercise (:data:`FIELDS`)::

    student, notebook, chapter, exercise, answer, verdict, points, explanation, error

* ``answer``: the last answer the notebook recorded (its repr, shortened), empty when none was;
* ``verdict``: ``correct``; ``partial`` (an answer with parts, some of them right); ``wrong``; ``unanswered`` (the
  check ran on ``None``); ``not run`` (the notebook asks it but no answer was recorded: its cell raised first, or
  the kernel was stopped before it); ``missing`` (the notebook never asks it);
* ``points``: 1 for a correct answer, the share of right parts for a partial one (:func:`parts_right`), else 0;
* ``explanation``: what the registry says of a wrong answer (:meth:`~mimo_kit.exercises.Exercise.explain`: a
  known near miss, a wrong type or shape, a percent for a ratio) and which parts are off;
* ``error``: why the exercise's cell failed (the exception it raised, a deadline it ran over, the kernel dying).

:class:`GradebookWriter` appends a submission's rows as soon as it is graded, so a stopped run keeps every row it
finished; :func:`feedback_page` renders one student's rows as an HTML page to hand back.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import nbformat

#: an exercise check in a notebook cell: ``exercise("ch04c", 3).check(``
CALL = re.compile(r'exercise\(\s*"(\w+)"\s*,\s*(\d+)\s*\)\s*\.check\(')
FIELDS = ("student", "notebook", "chapter", "exercise", "answer", "verdict", "points", "explanation", "error")
#: characters of an answer's repr the gradebook keeps (a 10,000-element list is named by its start)
ANSWER_CHARS = 200


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


def exercise_cells(nb: nbformat.NotebookNode, chapter: str) -> dict[int, int]:
    """Exercise number → index of the last cell that checks it."""
    cells = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for ch, n in CALL.findall(cell.source):
                if ch == chapter:
                    cells[int(n)] = i
    return cells


def parse_selection(text: str | None, known: Iterable[int]) -> set[int] | None:
    """``--exercises 1-5,7`` as a set of numbers (None: all); a clear error for a malformed range or a number the
    registry does not know for every graded chapter."""
    if text is None:
        return None
    known = sorted(set(known))
    picked: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)(?:\s*[-–]\s*(\d+))?", part)
        if not m or (m[2] and int(m[2]) < int(m[1])):
            raise ValueError(f"grade: --exercises {text!r}: {part!r} is not a number or a range like 1-5")
        picked |= set(range(int(m[1]), int(m[2] or m[1]) + 1))
    if not picked:
        raise ValueError(f"grade: --exercises {text!r} names no exercise")
    unknown = sorted(picked - set(known))
    if unknown:
        raise ValueError(f"grade: --exercises {text!r}: no exercise {unknown} (registered: {known})")
    return picked


def parts_right(chapter: str, number: int, answer: Any) -> tuple[int, int] | None:
    """(right parts, parts) of an answer to an exercise whose reference is an ordered list of several values, when
    the answer has the same length; the best over the reference and the text's alternatives. None when the
    exercise has no parts (a number, a string, a set asked as a sorted list) or the answer's shape differs."""
    from mimo_kit.exercises import _match, exercise

    ex = exercise(chapter, number)
    if ex.unordered:
        return None
    best = None
    for ref in [ex.reference(), *ex.alternatives()]:
        a, r = ex._pair(answer, ref)
        if not (isinstance(r, list) and len(r) > 1 and isinstance(a, list) and len(a) == len(r)):
            continue
        tols = ex.tol if isinstance(ex.tol, tuple) else (ex.tol,) * len(r)
        decs = ex.decimals if isinstance(ex.decimals, tuple) else (ex.decimals,) * len(r)
        right = sum(_match(x, y, t, d) for x, y, t, d in zip(a, r, tols, decs))
        best = max(best or (0, len(r)), (right, len(r)))
    return best


@dataclasses.dataclass
class Row:
    """One exercise of one submission, as the gradebook writes it."""

    exercise: int
    verdict: str
    points: float = 0.0
    answer: str = ""
    explanation: str = ""
    error: str = ""


def short(answer: Any) -> str:
    text = repr(answer)
    return text if len(text) <= ANSWER_CHARS else text[:ANSWER_CHARS - 3] + "..."


def judge(chapter: str, number: int, answer: Any) -> Row:
    """The verdict, points and explanation of one recorded answer."""
    from mimo_kit.exercises import exercise

    if answer is None:
        return Row(number, "unanswered", answer="None")
    ex = exercise(chapter, number)
    try:
        if ex.accepts(answer):
            return Row(number, "correct", 1.0, short(answer))
        why = ex.explain(answer) or ""
        parts = parts_right(chapter, number, answer)
    except Exception as e:  # noqa: BLE001 - an answer the registry cannot compare is a wrong one
        return Row(number, "wrong", 0.0, short(answer), f"the answer could not be compared ({type(e).__name__})")
    if parts and parts[0]:
        right, n = parts
        note = f"{right} of {n} parts right"
        return Row(number, "partial", round(right / n, 4), short(answer), f"{note}; {why}" if why else note)
    return Row(number, "wrong", 0.0, short(answer), why)


def judge_submission(nb: nbformat.NotebookNode, chapter: str, recorded: dict[int, Any],
                     cell_errors: dict[int, str] | None = None, stopped: str = "",
                     selection: set[int] | None = None) -> list[Row]:
    """A row per registered exercise (or per selected one): judged on the last ``recorded`` answer.
    ``cell_errors``: cell index → why that cell failed; ``stopped``: why the run ended early (a deadline, the
    kernel dying), given as the error of every asked exercise that recorded nothing and whose cell did not fail."""
    from mimo_kit.exercises import chapter_exercises

    cell_errors = cell_errors or {}
    cells = exercise_cells(nb, chapter)
    rows = []
    for e in chapter_exercises(chapter):
        if selection is not None and e.number not in selection:
            continue
        if e.number in recorded:
            row = judge(chapter, e.number, recorded[e.number])
        elif e.number in cells:
            row = Row(e.number, "not run")
        else:
            row = Row(e.number, "missing", error="the notebook does not ask this exercise")
        cell = cells.get(e.number)
        if cell is not None and cell in cell_errors:
            row.error = f"cell {cell}: {cell_errors[cell]}"
        elif row.verdict == "not run" and stopped:
            row.error = stopped
        rows.append(row)
    return rows


def verdicts_of(nb: nbformat.NotebookNode, chapter: str, recorded: dict[int, Any]) -> tuple[dict[int, str], list[str]]:
    """Each registered exercise's verdict on an executed notebook, and the errors its cells' outputs show."""
    errors, by_cell = [], {}
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if o.get("output_type") == "error":
                by_cell[i] = f"{o.get('ename')}: {str(o.get('evalue'))[:200]}"
                errors.append(f"cell {i}: {by_cell[i]}")
    rows = judge_submission(nb, chapter, recorded, by_cell)
    return {r.exercise: r.verdict for r in rows}, errors


class GradebookWriter:
    """The CSV, written a submission at a time and flushed, so what is graded is on disk whatever happens next."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=FIELDS)
        self._csv.writeheader()
        self._file.flush()

    def write(self, student: str, notebook: str, chapter: str, rows: Iterable[Row]) -> None:
        for r in rows:
            self._csv.writerow({"student": student, "notebook": notebook, "chapter": chapter, "exercise": r.exercise,
                                "answer": r.answer, "verdict": r.verdict, "points": f"{r.points:g}",
                                "explanation": r.explanation, "error": r.error})
        self._file.flush()

    def close(self) -> None:
        self._file.close()


VERDICT_COLOURS = {"correct": "#d8f3dc", "partial": "#fff3bf", "wrong": "#ffe3e3", "unanswered": "#f1f3f5",
                   "not run": "#ffe8cc", "missing": "#f1f3f5"}


def feedback_page(student: str, graded: Iterable[tuple[str, str, list[Row]]]) -> str:
    """One student's feedback as a standalone HTML page: per notebook, each exercise's form, the answer given, the
    verdict, points, what the registry says of it and the cell's error."""
    from mimo_kit.exercises import exercise

    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Feedback: {e(student)}</title><style>"
             "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;width:100%}"
             "td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left}"
             "code{white-space:pre-wrap;word-break:break-all}</style></head><body>",
             f"<h1>Feedback for {e(student)}</h1>"]
    for notebook, chapter, rows in graded:
        total = sum(r.points for r in rows)
        parts.append(f"<h2>{e(notebook)} ({e(chapter)}): {total:g} / {len(rows)} points</h2><table><tr><th>#</th>"
                     "<th>asked for</th><th>your answer</th><th>verdict</th><th>points</th><th>why</th></tr>")
        for r in rows:
            why = "<br>".join(e(x) for x in (r.explanation, r.error) if x)
            parts.append(f"<tr style='background:{VERDICT_COLOURS.get(r.verdict, '#fff')}'><td>{r.exercise}</td>"
                         f"<td>{e(exercise(chapter, r.exercise).form)}</td><td><code>{e(r.answer)}</code></td>"
                         f"<td>{e(r.verdict)}</td><td>{r.points:g}</td><td>{why}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)
