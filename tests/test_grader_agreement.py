"""Grader quality checks (Report §4.1, §4.3): a group grader must agree with itself on a reordered group and with a
second grader before its verdict shapes GAR's advantages; a grader that disagrees falls back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.envs.code import load_task
from mimo_kit.envs.patches import tree_diff, tree_files
from mimo_kit.grading import (
    AgreementConfig,
    CheckedGrader,
    GroupVerdict,
    LLMGroupGrader,
    RuleGroupGrader,
    cross_agreement,
    ranking_tau,
    self_agreement,
)
from mimo_kit.grading.demo import _OLD, _variants
from mimo_kit.grading.group import GradedTrajectory, GroupWorkspace

TASK = Path(__file__).resolve().parents[1] / "data" / "code_tasks" / "stats-median"


@pytest.fixture(scope="module")
def group() -> GroupWorkspace:
    """The chapter 4b demo group's six trajectories, their test verdicts known by construction (no sandbox run)."""
    task = load_task(TASK)
    base = tree_files(task.repo)
    rollouts = []
    for rid, (edits, commands) in _variants().items():
        after = dict(base)
        for path, text in edits.items():
            after[path] = (base[path].decode().replace(_OLD, text) if path == "stats/__init__.py" else text).encode()
        rollouts.append(GradedTrajectory(rid, tree_diff(base, after), rid != "wrong", commands))
    return GroupWorkspace(task.instruction, {k: v.decode() for k, v in base.items()}, rollouts, task.package)


def _verdict(*tiers, hacks=()):
    return GroupVerdict([list(t) for t in tiers], {h: "hack" for h in hacks}, {})


def test_tau_counts_ties_and_reversals():
    a = _verdict("x", "y", "z")
    assert ranking_tau(a, a) == 1.0 and ranking_tau(a, _verdict("z", "y", "x")) == pytest.approx(-1.0)
    assert ranking_tau(_verdict("xyz"), _verdict("x", "y", "z")) == 0.0  # all tied against a strict order
    assert ranking_tau(_verdict("xyz"), _verdict("zyx")) == 1.0  # one tier each: nothing to disagree on
    assert 0 < ranking_tau(a, _verdict("x", "yz")) < 1  # one tie where the other orders
    assert ranking_tau(_verdict("x"), _verdict("y")) == 1.0  # no pair in common


@settings(max_examples=60, deadline=None)
@given(st.permutations(range(6)), st.integers(2, 6), st.integers(0, 2**16))
def test_the_rule_grader_agrees_with_itself_in_any_order(group, order, size, seed):
    """Property over sub-groups and orders: the rule grader's verdict does not depend on the order it reads the
    trajectories in (two equally common approaches or file sets are both modal, never the first one read)."""
    sub = dataclasses.replace(group, rollouts=[group.rollouts[i] for i in order[:size]])
    cfg = AgreementConfig(reorders=3, seed=seed)
    assert self_agreement(RuleGroupGrader(), sub, cfg=cfg) == {"self_tau": pytest.approx(1.0),
                                                                "self_hack_jaccard": 1.0}
    verdict = CheckedGrader(RuleGroupGrader(), cfg=cfg).grade(sub)
    assert verdict.usable and verdict.checks["self_tau"] == pytest.approx(1.0)
    assert ("hacker" in verdict.hacks) == any(r.id == "hacker" for r in sub.rollouts)


def test_two_equally_common_file_sets_do_not_rank_by_order(group):
    """The case that was order-dependent: two passes, one also touching files outside the fix."""
    by_id = {r.id: r for r in group.rollouts}
    ranks = {RuleGroupGrader().grade(dataclasses.replace(group, rollouts=[by_id[a], by_id[b]])).ranking[0][0]
             for a, b in (("swallow", "scope"), ("scope", "swallow"))}
    assert ranks == {"swallow"}  # the out-of-scope files cost the same whichever trajectory is read first


class FirstReadFirst:
    """A grader biased by position: it ranks the passing trajectories in the order it reads them."""

    name = "position"

    def grade(self, group):
        return GroupVerdict([[r.id] for r in group.rollouts if r.passed], {}, {})


def test_a_grader_biased_by_position_is_caught_and_falls_back(group):
    verdict = CheckedGrader(FirstReadFirst(), cfg=AgreementConfig(reorders=2)).grade(group)
    assert not verdict.usable and verdict.checks["self_tau"] < AgreementConfig().min_tau
    assert "falls back" in verdict.reasons["*"][0]


def _scripted(ranking, hacks):
    return LLMGroupGrader(lambda prompt: json.dumps({"ranking": ranking, "hacks": hacks, "reasons": {}}))


def test_cross_agreement_keeps_an_agreeing_grader_and_drops_a_reversed_one(group):
    rule = RuleGroupGrader().grade(group)
    agree = _scripted(rule.ranking, rule.hacks)
    reverse = _scripted(rule.ranking[::-1], rule.hacks)
    kept = CheckedGrader(agree, second=RuleGroupGrader()).grade(group)
    assert kept.usable and kept.checks["cross_tau"] == pytest.approx(1.0) and kept.checks["cross_hack_jaccard"] == 1.0
    dropped = CheckedGrader(reverse, second=RuleGroupGrader()).grade(group)
    assert not dropped.usable and dropped.checks["cross_tau"] < 0
    missed = CheckedGrader(_scripted(rule.ranking, {}), second=RuleGroupGrader()).grade(group)
    assert not missed.usable and missed.checks["cross_hack_jaccard"] == 0.0  # the hack went unflagged
    assert cross_agreement(rule, GroupVerdict([], {}, {}, usable=False)) == {"cross_tau": 0.0,
                                                                             "cross_hack_jaccard": 0.0}


def test_an_unusable_verdict_is_passed_through_unchecked(group):
    verdict = CheckedGrader(LLMGroupGrader()).grade(group)  # no engine: unusable, GAR falls back already
    assert not verdict.usable and verdict.checks == {}
