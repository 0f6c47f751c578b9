"""The instructor key (``instructor/``): a key cell for every registered exercise, each key notebook runs top to
bottom (so the registry accepts every hand derivation in it), and no key reads the kit's own reference answers."""

import re
from pathlib import Path

import nbformat
import pytest

from mimo_kit.course import execute
from mimo_kit.exercises import EXERCISES

KEY_DIR = Path(__file__).resolve().parents[1] / "instructor"
KEYS = sorted(KEY_DIR.glob("*_key.ipynb"))
CHAPTERS = sorted({c for c, _ in EXERCISES})


def _chapter(path: Path) -> str:
    return path.name.split("_", 1)[0]


def _code(path: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


def test_one_key_per_chapter():
    assert sorted(_chapter(p) for p in KEYS) == CHAPTERS


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_exercise_has_a_key_cell(chapter):
    path = next(p for p in KEYS if _chapter(p) == chapter)
    found = {int(n) for n in re.findall(rf'exercise\("{chapter}", (\d+)\)\.accepts\(', _code(path))}
    assert found == {n for c, n in EXERCISES if c == chapter}


@pytest.mark.parametrize("path", KEYS, ids=[p.stem for p in KEYS])
def test_key_never_reads_the_reference(path):
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    assert "solution(" not in text and ".reference(" not in text


@pytest.mark.parametrize("path", KEYS, ids=[p.stem for p in KEYS])
def test_key_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.outputs and c.execution_count is None for c in nb.cells if c.cell_type == "code")


@pytest.mark.notebook
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", KEYS, ids=[p.stem for p in KEYS])
def test_key_executes(path):
    nb = execute(path, quick=True)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
