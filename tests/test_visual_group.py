"""Visual outputs graded per output, then compared within their group (Report §4.1): the group's verdict ranks the
passing drawings by their own score, ties within the tolerance, the same in any order."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.envs.visual import VisualGrade, grade_drawing, load_visual_task
from mimo_kit.grading import tier_factors
from mimo_kit.grading.visual_group import VisualGroupConfig, compare_group

HOUSE = Path(__file__).resolve().parents[1] / "data" / "visual" / "replicate-house.json"


@pytest.fixture(scope="module")
def house_group():
    """Five drawings of one replication request, graded for real by the sandboxed renderer."""
    task = load_visual_task(HOUSE)
    ref = task.reference
    programs = {"exact": ref, "roof": ref.replace("32 16", "32 17"), "sun-left": ref.replace("circle 52", "circle 51"),
                "small-sun": ref.replace("circle 52 10 6", "circle 52 10 4"),
                "no-grass": ref.replace("rect 0 48 64 16 #228b22\n", "")}
    return list(programs), [grade_drawing(task, p) for p in programs.values()]


def test_the_closer_copy_ranks_higher_and_a_failing_one_is_not_ranked(house_group):
    ids, grades = house_group
    verdict = compare_group(grades, ids)
    ranked = [rid for tier in verdict.ranking for rid in tier]
    assert ranked[0] == "exact" and "no-grass" not in ranked and ranked[-1] == "small-sun"
    assert set(ranked) == {rid for rid, g in zip(ids, grades) if g.passed}
    scores = {rid: g.score for rid, g in zip(ids, grades)}
    assert all(scores[a] >= scores[b] for a, b in zip(ranked, ranked[1:]))  # best first
    f = tier_factors(verdict)
    assert f["exact"] == 1.0 and f["small-sun"] < f["exact"]  # GAR: the closer copy keeps more of the advantage
    assert "fails" in verdict.reasons["no-grass"][0]


def test_scores_within_the_tolerance_share_a_tier(house_group):
    ids, grades = house_group
    wide = compare_group(grades, ids, VisualGroupConfig(tie_tolerance=0.01))
    assert len(wide.ranking) == 1 and set(wide.ranking[0]) == {"exact", "roof", "sun-left", "small-sun"}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0, 1)), min_size=1, max_size=8), st.randoms())
def test_the_verdict_does_not_depend_on_the_group_order(outputs, rnd):
    grades = [VisualGrade("t", p, float(p), s, {}, "") for p, s in outputs]
    ids = [f"o{i}" for i in range(len(grades))]
    order = list(range(len(ids)))
    rnd.shuffle(order)
    a = compare_group(grades, ids)
    b = compare_group([grades[i] for i in order], [ids[i] for i in order])
    assert a.ranking == b.ranking and a.usable


def test_mismatched_ids_are_refused():
    g = VisualGrade("t", True, 1.0, 1.0, {}, "")
    with pytest.raises(ValueError, match="distinct"):
        compare_group([g, g], ["a", "a"])
