"""Claim records: validated when made, displayed with a machine-readable record, and collected back from notebook
outputs into chapter 8's tables."""

import nbformat
import pytest

from mimo_kit import claims, nb
from mimo_kit.claims import MIME, Claim, collect, summary


def test_an_experiment_claim_needs_seeds_and_a_reason():
    with pytest.raises(ValueError, match="1 seed"):
        Claim("ch03", "x", "§3", kind="experiment", verdict="holds", seeds=1, why="w")
    with pytest.raises(ValueError, match="why"):
        Claim("ch03", "x", "§3", kind="experiment", verdict="holds", seeds=3)
    with pytest.raises(ValueError, match="kind"):
        Claim("ch03", "x", "§3", kind="anecdote", verdict="holds")
    with pytest.raises(ValueError, match="verdict"):
        Claim("ch03", "x", "§3", kind="check", verdict="maybe")
    assert claims.verdict_of(False, toy_limited=True) == "not shown at toy scale"
    assert claims.verdict_of(False) == "does not hold" and claims.verdict_of(True) == "holds"


def _notebook_with_claims(tmp_path, records: list[list[Claim]]):
    import dataclasses

    cells = []
    for group in records:
        c = nbformat.v4.new_code_cell("nb.claim(...)")
        c.outputs = [nbformat.v4.new_output("display_data", data={
            "text/plain": "table", MIME: {"claims": [dataclasses.asdict(x) for x in group]}})]
        cells.append(c)
    path = tmp_path / "ch09_demo.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def test_collect_reads_back_every_record_in_order(tmp_path):
    a = Claim("ch09", "a", "§1", kind="exact", verdict="holds", measured="holds")
    b = Claim("ch09", "b", "§2", kind="experiment", verdict="not shown at toy scale", seeds=3, agree="1 of 3",
              why="tiny")
    c = Claim("ch09", "c", "§2", kind="check", verdict="does not hold")
    _notebook_with_claims(tmp_path, [[a], [b, c]])
    assert collect(tmp_path) == [a, b, c]
    (row,) = summary([a, b, c])
    assert row["exact"] == row["experiment"] == row["check"] == 1
    assert (row["holds"], row["does not hold"], row["not shown at toy scale"]) == (1, 1, 1)


def test_nb_claims_print_outside_a_kernel_and_checks_assert(capsys):
    c = nb.claim("ch09", "x beats y", "§5", holds=False, report="x < y", measured="1 vs 2", seeds=3, why="toy",
                 toy_limited=True)
    assert c.verdict == "not shown at toy scale" and "x beats y" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="broken"):
        nb.claim_checks("ch09", {"fine": True, "broken": False}, "§1")


def test_the_committed_chapters_make_claims_chapter_8_can_read():
    from mimo_kit.course import notebooks

    found = collect()
    chapters = {c.chapter for c in found}
    assert {p.stem.split("_")[0] for p in notebooks()} - {"ch08"} <= chapters
    assert all(c.seeds >= claims.MIN_SEEDS for c in found if c.kind == "experiment")
    assert all(c.verdict == "holds" for c in found if c.kind != "experiment")
