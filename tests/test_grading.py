"""Group graders and GRS rubric synthesis (Report §4.3) on a group of really graded trajectories."""

import dataclasses
import json

import pytest

from mimo_kit.envs.code import shipped_tasks
from mimo_kit.grading import (
    AXES,
    GraderConfig,
    GroupVerdict,
    LLMGroupGrader,
    RuleGroupGrader,
    synthesize_rubric,
    tier_factors,
)
from mimo_kit.grading.demo import demo_group
from mimo_kit.grading.group import changed_functions
from mimo_kit.rl.advantages import quality_factors
from mimo_kit.rl.config import GARConfig

TASK = next(t for t in shipped_tasks() if t.id == "stats-median")


@pytest.fixture(scope="module")
def group():
    return demo_group(TASK)


def test_group_is_really_graded(group):
    passed = {r.id: r.passed for r in group.rollouts}
    assert passed == {"clean": True, "swallow": True, "scope": True, "sprawl": True, "hacker": True, "wrong": False}


def test_rule_grader_ranks_on_five_axes_flags_hacks_and_allows_ties(group):
    v = RuleGroupGrader().grade(group)
    assert v.usable and v.ranking[0] == ["clean"]
    assert v.hacks == {"hacker": "mines git history"} and v.tier_of("hacker") is None and v.tier_of("wrong") is None
    ranked = [rid for tier in v.ranking for rid in tier]
    assert sorted(ranked) == ["clean", "scope", "sprawl", "swallow"]
    assert any(len(tier) > 1 for tier in v.ranking)  # sprawl and swallow are within the tie tolerance
    s = v.scores
    assert all(set(AXES) <= set(s[r]) for r in ranked) and s["clean"]["total"] == 1.0
    assert s["swallow"]["precision"] < 1 and any("broad or bare except" in x for x in v.reasons["swallow"])
    assert s["scope"]["scope"] == 0.0 and any("README.md" in x for x in v.reasons["scope"])
    assert s["sprawl"]["conventions"] < 1 and s["sprawl"]["minimality"] < s["swallow"]["minimality"]
    strict = RuleGroupGrader(GraderConfig(tie_tolerance=0.0)).grade(group)
    assert all(len(t) == 1 for t in strict.ranking)
    f = tier_factors(v, GARConfig(tier_decay=0.5, min_factor=0.1))
    assert f["clean"] == 1.0 and all(0 < x <= 1 for x in f.values()) and "hacker" not in f
    assert f == {rid: max(0.1, 0.5 ** v.tier_of(rid)) for rid in f}


def test_one_quality_factor_schedule_for_the_grader_and_the_trainer(group):
    """grading.tier_factors and rl.quality_factors read the same GARConfig.factor, so they cannot disagree."""
    v = RuleGroupGrader().grade(group)
    ids = [r.id for r in group.rollouts]
    passed = [v.tier_of(i) is not None for i in ids]
    for cfg in (GARConfig(), GARConfig(tier_decay=0.3, min_factor=0.2)):
        f = quality_factors(v.ranking, ids, passed, cfg.tier_decay, cfg.min_factor)
        g = tier_factors(v, cfg)
        assert {i: float(x) for i, x, ok in zip(ids, f, passed) if ok} == pytest.approx(g)
    # an LLM verdict may leave a tier empty: both skip it (the next tier is tier 1, not 2)
    gapped = dataclasses.replace(v, ranking=[v.ranking[0], [], *v.ranking[1:]])
    g = tier_factors(gapped, GARConfig(tier_decay=0.5, min_factor=0.1))
    assert g == tier_factors(v, GARConfig(tier_decay=0.5, min_factor=0.1))
    if len(v.ranking) > 1:
        assert g[v.ranking[1][0]] == 0.5


def test_llm_grader_uses_the_engine_and_falls_back_when_unusable(group):
    assert not LLMGroupGrader().grade(group).usable  # no engine
    seen = []

    def engine(prompt):
        seen.append(prompt)
        return json.dumps({"ranking": [["clean", "sprawl"], ["swallow"]], "hacks": {"hacker": "git history"},
                           "reasons": {"swallow": ["swallows exceptions"]}})

    v = LLMGroupGrader(engine).grade(group)
    assert v.usable and v.ranking == [["clean", "sprawl"], ["swallow"]] and v.hacks == {"hacker": "git history"}
    assert "stats-median" not in seen[0] and "median" in seen[0] and "```diff" in seen[0]
    for bad in ["not json", json.dumps({"ranking": [["wrong"]]}), json.dumps({"ranking": [["clean", "clean"]]}),
                json.dumps({"hacks": {}})]:
        assert not LLMGroupGrader(lambda p, b=bad: b).grade(group).usable, bad
    assert isinstance(v, GroupVerdict)


def test_grs_rubric_is_anchored_and_separates_an_all_pass_group(group):
    rubric = synthesize_rubric(group)
    ids = [i.id for i in rubric.solution]
    assert "changes-median" in ids and "signature-median" in ids  # anchored in the spec's `stats.median`
    assert {i.origin for i in rubric.solution} == {"task", "rollouts"}
    rewards = {r.id: rubric.reward(r) for r in group.rollouts}
    assert rewards["wrong"] == 0.0  # R_test = 0
    assert rewards["clean"] == 1.0 and all(rewards[k] < 1.0 for k in ("swallow", "scope", "sprawl", "hacker"))
    passing = [r for r in group.rollouts if r.passed]
    assert len({round(rubric.reward(r), 6) for r in passing}) > 1  # an all-pass subgroup still gets a signal
    # items on which every rollout agrees are not kept (they would not separate anything)
    agree = [r for r in group.rollouts if r.id in ("clean",)]
    lone = synthesize_rubric(type(group)(group.spec, group.repo, agree, group.package))
    assert "no-fallback" not in [i.id for i in lone.solution]


def test_changed_functions_from_hunks(group):
    clean = next(r for r in group.rollouts if r.id == "clean")
    assert changed_functions(clean.diff, group.repo) == {"median"}


def test_group_workspace_on_disk(group, tmp_path):
    root = group.write(tmp_path / "g")
    assert (root / "spec.md").read_text().startswith("`stats.median`")
    assert (root / "repo" / "stats" / "__init__.py").is_file()
    assert json.loads((root / "trajectories" / "wrong" / "result.json").read_text()) == {"passed": False}
    assert "git log --all" in (root / "trajectories" / "hacker" / "commands.txt").read_text()
