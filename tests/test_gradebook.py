"""The gradebook's judgement of recorded answers: partial credit, the registry's explanation, a selection of
exercises, the CSV written a submission at a time, a feedback page that escapes what a student wrote."""

import csv

import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.exercises import EXERCISES, chapter_exercises, exercise
from mimo_kit.gradebook import (
    FIELDS,
    GradebookWriter,
    feedback_page,
    judge,
    judge_submission,
    parse_selection,
    parts_right,
)


def _parts(chapter, n):
    ref = exercise(chapter, n).reference()
    return [float(x) for x in (ref.tolist() if hasattr(ref, "tolist") else ref)]


def test_a_two_part_answer_with_one_part_right_earns_half():
    a, b = _parts("ch04c", 6)
    assert judge("ch04c", 6, [a, b]).verdict == "correct"
    row = judge("ch04c", 6, [a, b + 1.0])
    assert (row.verdict, row.points) == ("partial", 0.5) and "1 of 2 parts right" in row.explanation
    assert parts_right("ch04c", 6, [a, b + 1.0]) == (1, 2) and parts_right("ch04c", 5, 3) is None
    assert judge("ch04c", 6, [a + 1.0, b + 1.0]).verdict == "wrong"  # no part right: no credit
    assert judge("ch04c", 6, [a]).verdict == "wrong"  # another shape has no parts to credit
    assert "expected a list of 2" in judge("ch04c", 6, [a]).explanation


def test_a_known_near_miss_is_explained_and_unanswered_is_not_wrong():
    import math

    p, G, B = 0.9, 8, 64
    q = 1 - p**G - (1 - p) ** G
    row = judge("ch04c", 5, math.ceil(B / q))  # the mean, not the 90% bound: the registry knows this one
    assert row.verdict == "wrong" and row.explanation and row.answer == repr(math.ceil(B / q))
    assert judge("ch04c", 5, None).verdict == "unanswered"


@pytest.mark.slow  # the first reference of some chapters runs the hack suite or builds a sanitizer target
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(EXERCISES)), st.integers(0, 2**16))
def test_points_are_one_only_for_an_accepted_answer_and_partial_only_below_one(key, salt):
    """Property over the registry: the reference earns 1; a perturbed answer earns < 1 and ≥ 0, partial only when
    some part is right."""
    chapter, n = key
    ref = exercise(chapter, n).reference()
    assert judge(chapter, n, ref).points == 1.0
    value = ref.tolist() if hasattr(ref, "tolist") else ref
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
        off = list(value)
        off[salt % len(off)] = off[salt % len(off)] + 1000.0 + salt
        row = judge(chapter, n, off)
        assert 0.0 <= row.points < 1.0 and (row.verdict == "partial") == (row.points > 0)


def test_the_selection_parses_ranges_and_names_a_bad_one():
    known = range(1, 8)
    assert parse_selection(None, known) is None
    assert parse_selection("1-5", known) == {1, 2, 3, 4, 5} and parse_selection("1,3, 5–7", known) == {1, 3, 5, 6, 7}
    for bad, why in (("5-1", "not a number or a range"), ("x", "not a number"), ("9", r"no exercise \[9\]"),
                     (",", "names no exercise")):
        with pytest.raises(ValueError, match=why):
            parse_selection(bad, known)


def test_rows_say_why_an_exercise_has_no_answer():
    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[v4.new_code_cell('exercise("ch04c", 1).check(a)'),
                                v4.new_code_cell('exercise("ch04c", 2).check(b)')])
    rows = {r.exercise: r for r in judge_submission(nb, "ch04c", {}, {0: "NameError: name 'a' is not defined"},
                                                    stopped="not run: the kernel died in cell 0")}
    assert rows[1].verdict == "not run" and rows[1].error == "cell 0: NameError: name 'a' is not defined"
    assert rows[2].verdict == "not run" and "kernel died" in rows[2].error
    assert rows[3].verdict == "missing" and len(rows) == len(chapter_exercises("ch04c"))
    picked = judge_submission(nb, "ch04c", {}, selection={2, 3})
    assert [r.exercise for r in picked] == [2, 3]


def test_the_csv_is_on_disk_after_each_submission(tmp_path):
    out = tmp_path / "g.csv"
    writer = GradebookWriter(out)
    writer.write("ann", "ch04c.ipynb", "ch04c", [judge("ch04c", 5, None)])
    rows = list(csv.DictReader(out.open()))  # read while the writer is still open
    assert tuple(rows[0]) == FIELDS and rows[0]["student"] == "ann" and rows[0]["verdict"] == "unanswered"
    writer.close()


def test_the_feedback_page_escapes_what_the_student_wrote():
    row = judge("ch04c", 2, "<script>alert(1)</script>")
    page = feedback_page("<b>eve</b>", [("ch04c.ipynb", "ch04c", [row])])
    assert "<script>alert" not in page and "&lt;script&gt;" in page and "&lt;b&gt;eve" in page
    assert exercise("ch04c", 2).form.split()[0] in page
