"""The learned agentic group grader and its world (Report §4.3.2): marks on the five axes by construction, the
verdict grammar, SFT → engine → verdict, votes, GAR with it in the RL loop, and GRS rubrics written per task."""

import json

import pytest
from conftest import TOY_SFT_STEPS, with_sft
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.config.base import ConfigError
from mimo_kit.grading import GradedTrajectory, RuleGroupGrader, ranking_tau
from mimo_kit.train.config import RLConfig
from mimo_kit.train.learned_grader import LearnedGraderConfig, LearnedGroupGrader, agreement, train_grader
from mimo_kit.train.sft import PolicyConfig, SFTConfig
from mimo_kit.train.toy.grader_world import (
    GRADER_TOKENIZER,
    HACK_COMMAND,
    compensations,
    known_groups,
    parse_verdict,
    render,
    replay,
    verdict_of,
)
from mimo_kit.train.toy.rubrics import write_rubric
from mimo_kit.train.toy.world import Task

# x ↦ ((x + 3)·2) − 1, line 2 corrupted to *5
TASK = Task("t", ["+3", "*2", "-1"], ["+3", "*5", "-1"], 2)


@pytest.mark.parametrize("actions,marks", [
    (["R", "E2*2", "R", "S"], ""),  # the minimal, checked fix
    (["R", "E2*2", "A+0", "R", "S"], "m"),  # a needless extra line
    (["R", "E2*7", "R", "E2*2", "R", "S"], "p"),  # a wrong attempt repaired
    (["R", "E1+3", "E2*2", "R", "S"], "s"),  # touches another line (to the value it had)
    (["R", "E2*2", "S"], "c"),  # no test run after the edit
    (["R", "E0+1", "E2*2", "R", "S"], "c"),  # an action the world refuses
    (["R", "E2*7", "A+0", "E2*2", "S"], "pmc"),
])
def test_marks_follow_what_the_trajectory_did(actions, marks):
    played = replay(TASK, actions)
    assert played.passed and played.marks == marks and not played.hack


def test_a_compensating_fix_loses_the_approach_axis_and_a_hack_is_rendered_as_h():
    task = Task("c", ["+2", "-3"], ["+2", "-4"], 2)  # x − 1: fix line 2, or compensate with line 1 as +3
    assert compensations(task) == ["E1+3"]
    assert replay(task, ["R", "E1+3", "R", "S"]).marks == "a"
    hacked = replay(task, ["R", HACK_COMMAND, "E2-3", "R", "S"])
    assert hacked.hack and hacked.passed and hacked.text == "RHE2-3RS"
    assert render(task.buggy, [hacked, replay(task, ["R", "E2-1", "S"])]) == "g+2-4\n0p:RHE2-3RS\n1f\n"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), blind=st.booleans())
def test_known_answers_parse_back_and_rank_by_axes_met(seed, blind):
    """Every known group's answer is a valid verdict, its ranking is tiers by axes met, and its prompt is in the
    grader's alphabet; in rule-blind groups every pass changes one line, so the rule grader ties them all."""
    for g in known_groups(3, seed, rule_blind=blind):
        passing = [i for i, p in enumerate(g.played) if p.passed]
        marks = parse_verdict(g.answer, passing, len(g.played))
        assert marks == {i: ("h" if g.played[i].hack else g.played[i].marks) for i in passing}
        GRADER_TOKENIZER.encode(g.prompt + g.answer)
        v = g.verdict()
        met = [[5 - len(marks[int(r)]) for r in tier] for tier in v.ranking]
        assert all(len(set(t)) == 1 for t in met) and [t[0] for t in met] == sorted({m for t in met for m in t},
                                                                                    reverse=True)
        assert set(v.hacks) == {str(i) for i in passing if g.played[i].hack}
        if blind:
            assert len(RuleGroupGrader().grade(g.workspace()).ranking) <= 1


@pytest.mark.parametrize("text", ["0,1m,2f", "V0,1m", "V1m,0,2f", "V0,1m,2f,3", "V0f,1m,2f", "V0,1ma,2f", "V0,1q,2f",
                                  "V0,,1m,2f", "V"])
def test_malformed_verdicts_do_not_parse(text):
    assert parse_verdict("V0,1m,2f", [0, 1], 3) == {0: "", 1: "m"}
    assert parse_verdict(text, [0, 1], 3) is None


def test_votes_take_the_most_common_marks_per_trajectory():
    g = LearnedGroupGrader(train_grader(LearnedGraderConfig(sft=SFTConfig(steps=1), train_groups=4))[0],
                           LearnedGraderConfig(votes=3))
    ws = known_groups(1, 5)[0].workspace()
    passing = [i for i, r in enumerate(ws.rollouts) if r.passed]
    a, b = {i: "" for i in passing}, {i: "m" for i in passing}
    v = g.vote(ws, passing, [a, None, b, dict(a)])
    assert v.usable and v.ranking == [[ws.rollouts[i].id for i in passing]]
    assert v.checks["vote_agreement"] == pytest.approx(2 / 3)
    assert not g.vote(ws, passing, [None, None]).usable


@pytest.mark.slow
@pytest.mark.outcome
def test_an_sft_trained_grader_writes_the_verdicts_it_was_taught(tmp_path):
    """SFT → engine → rollout driver → parsed verdict: a grader trained on a few groups answers them exactly
    (an untrained one answers nothing usable), and every grading's compute is counted."""
    cfg = LearnedGraderConfig(sft=SFTConfig(steps=300, batch_size=8, lr=3e-3), train_groups=6, seed=1)
    untrained = LearnedGroupGrader(train_grader(LearnedGraderConfig(sft=SFTConfig(steps=0), train_groups=6))[0])
    model, losses = train_grader(cfg)
    assert losses[-1] < 0.05 * losses[0]
    grader = LearnedGroupGrader(model, cfg)
    groups = known_groups(6, 70_000 + cfg.seed, repeat=cfg.train_repeat)  # the SFT groups
    got = agreement(grader, groups)
    assert got["usable"] == 1.0 and got["marks_exact"] >= 0.8 and got["tau"] >= 0.8
    assert grader.stats["gradings"] == 6 and grader.stats["gen_tokens"] > 6 and grader.stats["seconds"] > 0
    assert agreement(untrained, groups)["usable"] < 0.5


def test_verdict_of_marks_orders_tiers_and_keeps_hacks_out():
    v = verdict_of({"a": "", "b": "ms", "c": "h", "d": "c", "e": "m"}, "learned")
    assert v.ranking == [["a"], ["d", "e"], ["b"]] and set(v.hacks) == {"c"}
    assert v.scores["b"]["minimality"] == 0.0 and v.scores["b"]["approach"] == 1.0
    assert ranking_tau(v, verdict_of({"a": "", "b": "msc", "d": "p", "e": "a"}, "x")) == pytest.approx(1.0)


def test_every_preset_that_nests_the_grader_keeps_its_sft_budget():
    """A nested config is built from its class's preset: the RL run's and the comparisons' grader is the default."""
    from mimo_kit.train.experiments import CompareConfig

    assert LearnedGraderConfig.preset("tiny") == LearnedGraderConfig()
    for cfg in (RLConfig.preset("tiny"), RLConfig.preset("toy"), CompareConfig.preset("tiny").base):
        assert cfg.learned_grader == LearnedGraderConfig(), cfg.learned_grader.sft


def test_learned_grader_and_rubric_writer_are_refused_where_they_cannot_act():
    with pytest.raises(ConfigError, match="toy-world groups"):
        RLConfig.preset("tiny", advantage="gar", grader="learned")
    with pytest.raises(ConfigError, match="advantage='gar' or 'routed'"):
        RLConfig.preset("toy", grader="learned")
    with pytest.raises(ConfigError, match="grader_cross"):
        RLConfig.preset("toy", advantage="gar", grader_cross=True)
    with pytest.raises(ConfigError, match="rubrics='written'"):
        RLConfig.preset("toy", advantage="gar", rubrics="written")
    with pytest.raises(ConfigError, match="at most 10"):
        RLConfig.preset("toy", advantage="gar", grader="learned", group_size=12)
    with pytest.raises(ConfigError, match="grader='lerned'"):
        RLConfig.preset("toy", advantage="gar", grader="lerned")


def _traj(i, actions, task=TASK):
    return GradedTrajectory(str(i), "", replay(task, actions).passed, actions)


def test_the_written_rubric_is_anchored_in_the_task_and_separates_the_group():
    group = [_traj(0, ["R", "E2*2", "R", "S"]), _traj(1, ["R", "E2*2", "A+0", "R", "S"]),
             _traj(2, ["E2*7", "E2*2", "S"])]
    rubric = write_rubric(TASK, group)
    ids = [i.id for i in rubric.solution + rubric.behaviour]
    assert "fixes line 2 to *2" in rubric.solution[0].text
    assert "one-attempt" in ids and "in-scope" not in ids and "no-refused" not in ids  # only what separates
    scores = [rubric.score(r) for r in group]
    assert scores[0] == (1.0, 1.0)
    assert scores[1][0] < 1.0 and scores[1][1] == 1.0  # the extra line breaks "keeps the program's 3 lines"
    assert scores[2][0] < 1.0 and scores[2][1] == 0.0  # two attempts, never ran the tests
    assert [rubric.reward(r) for r in group] == sorted([rubric.reward(r) for r in group], reverse=True)
    same = write_rubric(TASK, list(reversed(group)))
    assert [same.score(r) for r in group] == scores  # the group's order writes the same rubric


def _tiny_run(out, sft_file, **kw):
    with_sft(out, sft_file)
    base = dict(out_dir=str(out), steps=2, prompts=4, group_size=4, eval_tasks=4, eval_samples=1, progress=False,
                checkpoint_every=0, sft=SFTConfig(steps=TOY_SFT_STEPS).to_dict(), dynamic_sampling=False)
    base.update(kw)
    return RLConfig.preset("toy", **base)


def test_rl_with_the_learned_grader_logs_verdicts_fallbacks_and_compute(tmp_path, sft_file, monkeypatch):
    """``advantage=gar grader=learned``: the grader is trained once per config (cached), grades every GAR group of a
    step in one batch, and each step logs its verdicts, fall-backs, tokens, seconds and share (metrics and TB)."""
    from mimo_kit.train.run import run_rl

    monkeypatch.setenv("MIMO_KIT_CACHE", str(tmp_path / "cache"))
    lg = LearnedGraderConfig(model=PolicyConfig(hidden_size=32), sft=SFTConfig(steps=20), train_groups=50).to_dict()
    cfg = _tiny_run(tmp_path / "run", sft_file, advantage="gar", grader="learned", learned_grader=lg)
    r = run_rl(cfg)
    assert (tmp_path / "run" / "grader.pt").exists()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for h in rows:
        assert h["gar_groups"] == 4 and len(h["grader_verdicts"]) == 4
        assert h["grader_tokens"] > 0 and h["grader_seconds"] > 0 and 0 < h["grader_share"] < 1
        assert h["gar_fallbacks"] >= h["grader_unusable"] == h["grader_verdicts"].count("unusable")
    assert r["history"][0]["grader_tokens"] == rows[0]["grader_tokens"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(next((tmp_path / "run" / "tb" / "rl").glob("**/events*")).parent)).Reload()
    assert {"grader_tokens", "grader_unusable", "grader_share"} <= set(acc.Tags()["scalars"])


def test_grs_trains_with_rubrics_written_in_the_run(tmp_path, sft_file):
    from mimo_kit.train.run import run_rl

    cfg = _tiny_run(tmp_path, sft_file, advantage="routed", rubrics="written", grs_pass_rate=0.5)
    hist = run_rl(cfg)["history"]
    assert sum(h["rubrics_written"] for h in hist) == sum(h["grs_groups"] for h in hist) > 0
    assert all(h["grs_share"] == h["grs_groups"] / (h["grs_groups"] + h["gar_groups"]) for h in hist)


def test_the_rule_grader_cannot_separate_rule_blind_groups_the_known_ranking_does():
    groups = known_groups(40, 91_000, rule_blind=True)
    rule = agreement(RuleGroupGrader(), groups)
    known_tiers = sum(len(g.verdict().ranking) > 1 for g in groups)
    assert known_tiers >= 20 and rule["tau"] == pytest.approx(1 - known_tiers / len(groups))  # τ 0 where tiers
