"""The instructor key (``instructor/``): a key cell for every registered exercise, each key notebook runs top to
bottom (so the registry accepts every hand derivation in it), and no key reads the kit's own reference answers."""

import importlib.util
import re
import sys
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


def test_keys_match_their_builder():
    """The notebooks are what ``instructor/build_keys.py`` writes: edit a derivation there, then rebuild."""
    spec = importlib.util.spec_from_file_location("build_keys", KEY_DIR / "build_keys.py")
    builder = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = builder  # dataclasses look their module up there
    try:
        spec.loader.exec_module(builder)
    finally:
        del sys.modules[spec.name]
    for ch in builder.CHAPTERS:
        built = nbformat.writes(builder._notebook(ch))
        path = KEY_DIR / f"{ch.stem}_key.ipynb"
        assert built.rstrip() == path.read_text().rstrip(), f"{path.name}: run `python instructor/build_keys.py`"


@pytest.mark.notebook
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", KEYS, ids=[p.stem for p in KEYS])
def test_key_executes(path, tmp_path):
    nb = execute(path, quick=True, cwd=tmp_path)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
