"""docs/syllabus.md assigns every chapter's exercises as the registry (``mimo_kit.exercises``) has them."""

import itertools
import re
from pathlib import Path

from mimo_kit.exercises import CHAPTERS, chapter_exercises

SYLLABUS = Path(__file__).resolve().parents[1] / "docs" / "syllabus.md"
#: an assignment: "ch04c exercises 1–7" (a range, en dash or hyphen) or "ch04c exercise 3"
ASSIGNED = re.compile(r"\b(ch\d\d[a-z]?) exercises? (\d+)(?:\s*[–-]\s*(\d+))?")


def plan_assignments(text: str) -> list[tuple[str, list[int]]]:
    """(chapter, exercise numbers) for every assignment in the 12-week plan's "assignment" column."""
    plan = text.split("## A 12-week plan", 1)[1].split("\n## ", 1)[0]
    lines = plan.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))  # the section's first table
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    column = header.index("assignment")
    out = []
    for row in rows[2:]:  # below the header and its rule
        cell = [c.strip() for c in row.strip("|").split("|")][column]
        for chapter, first, last in ASSIGNED.findall(cell):
            out.append((chapter, list(range(int(first), int(last or first) + 1))))
        # every chapter's exercises the cell names are in a form the pattern reads
        assert len(re.findall(r"\bch\d\d[a-z]? exercise", cell)) == len(ASSIGNED.findall(cell)), cell
    return out


def test_the_plan_assigns_every_registered_exercise():
    assigned: dict[str, list[int]] = {}
    for chapter, numbers in plan_assignments(SYLLABUS.read_text()):
        assigned.setdefault(chapter, []).extend(numbers)
    registered = {c: sorted(e.number for e in chapter_exercises(c)) for c in CHAPTERS if chapter_exercises(c)}
    assert set(assigned) == set(registered), (sorted(set(registered) - set(assigned)),
                                              sorted(set(assigned) - set(registered)))
    for chapter, numbers in assigned.items():
        assert len(numbers) == len(set(numbers)), f"{chapter}: an exercise assigned twice: {numbers}"
        assert sorted(numbers) == registered[chapter], \
            f"{chapter}: the syllabus assigns {numbers}, the registry has {registered[chapter]}"


def test_the_parser_reads_ranges_single_exercises_and_refuses_other_forms():
    table = ("## A 12-week plan\n\n| week | chapter | assignment |\n|---|---|---|\n"
             "| 1 | ch01 | ch01 exercises 1–5 |\n| 2 | ch02a | ch02a exercise 3, ch02c exercises 1-2 |\n\n## Next\n")
    assert plan_assignments(table) == [("ch01", [1, 2, 3, 4, 5]), ("ch02a", [3]), ("ch02c", [1, 2])]
    try:
        plan_assignments(table.replace("ch01 exercises 1–5", "ch01 exercises one to five"))
    except AssertionError:
        pass
    else:
        raise AssertionError("an assignment the pattern cannot read passed")
