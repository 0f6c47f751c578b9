"""The grader-compute study and rl-grader's cost shares (Report §4.1: grader compute, the third axis)."""

import pytest

from mimo_kit.train.grader_experiment import (
    GraderComputeConfig,
    compute_figure,
    compute_table,
    cost_shares,
    grader_compute,
    rl_grader_table,
)


def test_cost_shares_split_each_step_over_the_three_axes():
    hist = [{"step_s": 10.0, "rollout_s": 6.0, "grader_seconds": 1.5, "train_s": 3.0, "sync_s": 0.5},
            {"step_s": 4.0, "rollout_s": 2.0, "train_s": 1.0, "sync_s": 0.0}]  # a step without GAR groups
    s = cost_shares(hist)
    assert s["grader"] == [15.0, 0.0] and s["rollout"] == [45.0, 50.0] and s["training"] == [35.0, 25.0]
    assert all(sum(s[k][i] for k in s) <= 100.0 for i in range(2))


@pytest.mark.slow
@pytest.mark.outcome
def test_the_study_measures_each_budget_against_the_rule_grader(tmp_path, monkeypatch):
    monkeypatch.setenv("MIMO_KIT_CACHE", str(tmp_path))
    cfg = GraderComputeConfig.preset("quick", sft_steps=(20,), votes=(1, 2), heldout=10, threads=1)
    res = grader_compute(cfg)
    assert set(res["budgets"]) == {"sft20-tools1-votes1", "sft20-tools1-votes2"}
    one, two = (res["budgets"][b]["runs"][0] for b in ("sft20-tools1-votes1", "sft20-tools1-votes2"))
    assert two["tokens_per_group"] == pytest.approx(2 * one["tokens_per_group"], rel=0.2)  # two gradings a group
    assert res["rule"]["rule_blind"]["tau"] < res["rule"]["mixed"]["tau"]  # diffs alike: the rule grader ties
    assert res["claim"]["verdict"] == "not shown at toy scale"  # one seed: the paired rule needs five
    table = compute_table(res)
    assert "| rule (diffs) |" in table and "sft20-tools1-votes2" in table
    assert compute_figure(res)[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_rl_grader_table_reads_the_shares_and_claims():
    res = {"preset": "tiny", "seeds": [0, 1], "claims": ["not shown at toy scale: x"],
           "arms": {"binary": {"summary": {"late_turns": {"mean": 4.0, "sd": 0.1, "n": 2}}}},
           "cost_shares": {0: {"rollout": [50.0], "training": [40.0], "grader": [5.0]},
                           1: {"rollout": [52.0], "training": [38.0], "grader": [7.0]}}}
    table = rl_grader_table(res)
    assert "| grader | 6.0 ± 1.4 | 12.7 |" in table and "- not shown at toy scale: x" in table
