"""The exercises as a chapter states them: every registered exercise has its item in the chapter's Exercises cell
and a check cell; those the registry marks ``derive`` ask for a derivation or a choice that no kit call gives (their
text and their cell's hint name no function that computes the answer), at least two per chapter."""

from __future__ import annotations

import re

import nbformat
import pytest

from mimo_kit.course import notebooks
from mimo_kit.exercises import CHAPTERS, chapter_exercises

#: a call in a code span of the text (`rl.keep_probability(p, G)`), or a pointer to a function that checks the
#: answer ("check with `qdq`", "use `count_parameters`")
TEXT_CALL = re.compile(r"`[^`]*\w\([^`]*`|(?i:check (?:it )?with|\buse)\s+`")
#: a call in the hint comment of the check cell (`# e.g. rl.length_penalty(...)`)
HINT_CALL = re.compile(r"\w\(")
#: derivation exercises a chapter has at least
MIN_DERIVE = 2


def _chapter_texts(chapter: str) -> tuple[dict[int, str], dict[int, str]]:
    """Exercise number → its item in the Exercises cell, and → the hint comment of its check cell."""
    (path,) = [p for p in notebooks() if p.stem.split("_")[0] == chapter]
    nb = nbformat.read(path, as_version=4)
    items, hints = {}, {}
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("## Exercises"):
            for item in re.split(r"\n(?=\d+\. )", cell.source)[1:]:
                number, _, text = item.partition(". ")
                items[int(number)] = text
        if cell.cell_type == "code":
            for m in re.finditer(r"answer_(\d+) = None\s*#(.*)", cell.source):
                hints[int(m[1])] = m[2]
    return items, hints


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_exercise_is_stated_and_derivations_name_no_kit_call(chapter):
    items, hints = _chapter_texts(chapter)
    numbers = [e.number for e in chapter_exercises(chapter)]
    assert sorted(items) == numbers and sorted(hints) == numbers, (chapter, sorted(items), sorted(hints))
    derive = [e.number for e in chapter_exercises(chapter) if e.derive]
    assert len(derive) >= MIN_DERIVE, f"{chapter}: only {derive} ask for a derivation or a choice"
    for n in derive:
        assert not TEXT_CALL.search(items[n]), f"{chapter} exercise {n} names a kit call: {TEXT_CALL.search(items[n])}"
        assert not HINT_CALL.search(hints[n]), f"{chapter} exercise {n}'s hint names a kit call: {hints[n]!r}"
