"""Every chapter notebook runs top to bottom in quick mode, and its committed outputs match its sources."""

import nbformat
import pytest
from conftest import RAY_GROUP

from mimo_kit.course import NOTEBOOK_DIR, execute, notebooks, source_hash

NOTEBOOKS = notebooks(NOTEBOOK_DIR)


def _starts_ray(path) -> bool:
    return any("start_local_head" in c.source for c in nbformat.read(path, as_version=4).cells)


#: a chapter that starts a Ray head joins the suite's Ray group (one head at a time, tests/conftest.py)
QUICK_RUNS = [pytest.param(p, id=p.stem, marks=[pytest.mark.xdist_group(RAY_GROUP)] if _starts_ray(p) else [])
              for p in NOTEBOOKS]
PER_NOTEBOOK_TIMEOUT = 600  # seconds per cell; pytest-timeout bounds the whole notebook


def test_there_are_chapter_notebooks():
    assert [p.name for p in NOTEBOOKS][:1] == ["ch01_introduction.ipynb"]


@pytest.mark.notebook
@pytest.mark.outcome  # the chapters train and sample in their kernels, and some cells assert on what comes out
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", QUICK_RUNS)
def test_notebook_executes_in_quick_mode(path, tmp_path):
    # the kernel's folder is private (its runs/ go there), so concurrent suites never share a chapter's run
    nb = execute(path, quick=True, preset="tiny", timeout=PER_NOTEBOOK_TIMEOUT, cwd=tmp_path)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_outputs_are_fresh(path):
    """Policy: notebooks are committed executed on the tiny preset by `make notebooks`, stamped with their sources."""
    nb = nbformat.read(path, as_version=4)
    stamp = nb.metadata.get("mimo_kit", {})
    assert stamp.get("code_sha256") == source_hash(nb), f"{path.name}: code changed; run `make notebooks`"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "not executed top to bottom"
    assert not [o for c in code for o in c.outputs if o.get("output_type") == "error"]


def test_the_chapter_map_lists_every_notebook():
    """Chapter 1's map of the course names each chapter notebook once, and only notebooks that exist."""
    from mimo_kit.intro import chapter_map

    assert [c["notebook"] for c in chapter_map()] == [p.stem for p in NOTEBOOKS]
    assert all(c["status"] == "✓" for c in chapter_map())
