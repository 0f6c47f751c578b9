"""A chapter's markdown never types a measured seed count: such a sentence is rendered from the claim record.

"prompt-mean grows less on only 3 of 5 seeds" typed into a markdown cell stays when the run is redone and the
count changes, and can contradict the claim table beside it. The chapters print such sentences from the record
(``nb.say``, ``nb.seeds_agree``) in a code cell instead.
"""

import re
from pathlib import Path

import nbformat
import pytest

from mimo_kit import nb
from mimo_kit.claims import Claim

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))

_COUNT = r"(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten)"
#: "2 of 3 seeds", "on 4\nof 5 seeds each", "three out of five runs": a count of seeds (runs, rounds) typed as prose
SEED_COUNT = re.compile(rf"\b{_COUNT}\s+(?:out\s+)?of\s+(?:the\s+)?{_COUNT}\s+(?:seeds?|runs?|rounds?)\b",
                        re.IGNORECASE)


def typed_counts(text: str) -> list[str]:
    return [" ".join(m.group(0).split()) for m in SEED_COUNT.finditer(text)]


@pytest.mark.parametrize("text, found", [
    ("recovered on 2 of 3 seeds", ["2 of 3 seeds"]),
    ("prompt-mean grows less on only 3 of 5 seeds: not shown", ["3 of 5 seeds"]),
    ("then opens as entropy falls, on 4\nof 5 seeds to 0.32", ["4 of 5 seeds"]),
    ("three out of five runs agree", ["three out of five runs"]),
    ("4 of 6 rounds above 1", ["4 of 6 rounds"]),
    ("every seed agrees; all 5 seeds agreeing gives p = 1/32", []),
    ("the seeds' count is printed below", []),
    ("5 of the tasks", []),
])
def test_the_pattern_catches_typed_seed_counts(text, found):
    assert typed_counts(text) == found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_markdown_cell_types_a_seed_count(path):
    book = nbformat.read(path, as_version=4)
    hits = [(i, hit) for i, c in enumerate(book.cells) if c.cell_type == "markdown" for hit in typed_counts(c.source)]
    assert not hits, f"{path.name}: render these from the claim record (nb.say) instead: {hits}"


def _claim(**kw):
    return Claim(**{"chapter": "chX", "claim": "x beats y", "section": "§5", "kind": "experiment",
                    "verdict": "not shown at toy scale", "seeds": 3, "why": "toy scale", **kw})


def test_seeds_agree_words_a_claim_records_count():
    assert nb.seeds_agree(_claim(agree="2 of 3")) == "2 of 3 seeds"
    assert nb.seeds_agree(_claim(agree="4 of 6 rounds above 1")) == "4 of 6 rounds above 1"
    assert nb.seeds_agree(_claim()) == "3 seeds"


def test_say_prints_outside_a_kernel(capsys):
    nb.say(f"recovered on {nb.seeds_agree(_claim(agree='3 of 3'))}")
    assert capsys.readouterr().out == "recovered on 3 of 3 seeds\n"
