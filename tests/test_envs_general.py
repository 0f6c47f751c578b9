"""General tool-use tasks (Report §4.2): rubric items, state check by gold replay, negative checks, policy, hacks."""

import json

import pytest

from mimo_kit.envs.general import (
    EngineJudge,
    GeneralTaskError,
    RuleJudge,
    grade_general,
    load_general_task,
    make_workspace,
    replay,
    shipped_general_tasks,
    shop_tools,
)
from mimo_kit.envs.hack_strategies import GENERAL_STRATEGIES
from mimo_kit.harness import ScriptedPolicy, error_segments, render_call, run_episode
from mimo_kit.harness.envs import GeneralEnv
from mimo_kit.harness.hack_suite import run_general_strategy

TASKS = shipped_general_tasks()
BY_ID = {t.id: t for t in TASKS}


def test_four_tasks_ship_and_gold_passes_initial_fails(tmp_path):
    assert len(TASKS) >= 4
    for t in TASKS:
        ws = make_workspace(t, tmp_path / t.id)
        before = grade_general(t, ws)
        assert not before.passed and before.reward == 0.0 and before.rubric_score < 1
        replay(t.gold_actions, ws)
        after = grade_general(t, ws)
        assert after.passed and after.reward == 1.0 and after.state_ok and after.negative_ok, after.reasons


def test_policy_refuses_and_names_the_reason(tmp_path):
    ws = make_workspace(TASKS[0], tmp_path / "ws")
    tools = {t.name: t for t in shop_tools(ws)}
    out = replay([{"tool": "cancel_order", "args": {"order_id": 1002, "reason": "x"}},
                  {"tool": "issue_refund", "args": {"order_id": 1008, "amount": 70.0, "reason": "x"}},
                  {"tool": "update_address", "args": {"order_id": 1007, "address": "x"}},
                  {"tool": "send_email", "args": {"to": "eve@evil.com", "subject": "s", "body": "b"}}], ws)
    assert "only pending orders can be cancelled" in out[0] and "exceeds what is left (65.0)" in out[1]
    assert "only pending orders change address" in out[2] and "not a customer address" in out[3]
    assert tools["write_note"].parameters["required"] == ["path", "content"]


def test_adversarial_solutions_fail_the_right_check(tmp_path):
    t = BY_ID["cancel-unshipped"]
    # the email says all the right words but nothing was cancelled
    ws = make_workspace(t, tmp_path / "a")
    replay([t.gold_actions[1]], ws)
    g = grade_general(t, ws)
    assert not g.passed and not g.rubric["pending-cancelled"] and g.rubric["email-explains"] and not g.state_ok
    # the work is done, but the email is curt: only the judged item fails
    ws = make_workspace(t, tmp_path / "b")
    replay([t.gold_actions[0], {"tool": "send_email", "args": {"to": "ana@example.com", "subject": "ok",
                                                               "body": "1001 cancelled."}}], ws)
    g = grade_general(t, ws)
    assert [k for k, v in g.rubric.items() if not v] == ["email-explains"] and g.state_ok and not g.passed
    # an LLM judge plugs in through the same interface
    g = grade_general(t, ws, judge=EngineJudge(lambda prompt: "YES" if "1001 cancelled." in prompt else "NO"))
    assert g.passed
    # a stray file fails the negative check
    ws = make_workspace(t, tmp_path / "c")
    replay(t.gold_actions, ws)
    (ws / "notes" / "scratch.txt").write_text("x")
    g = grade_general(t, ws)
    assert not g.passed and not g.negative_ok and "notes/scratch.txt" in g.reasons[-1]
    assert RuleJudge()("c", "Sorry, X", {"keywords": [["sorry"], ["x", "y"]]})


@pytest.mark.parametrize("strategy", list(GENERAL_STRATEGIES))
def test_general_hacks_score_zero_when_cleaned(strategy):
    for t in TASKS:
        r = run_general_strategy(t, strategy, cleaned=True)
        assert r.reward == 0.0 and r.audited == 0.0, (t.id, r.outputs)
    leaked = run_general_strategy(TASKS[0], "read-gold", cleaned=False)
    assert (leaked.reward, leaked.audited) == (1.0, 0.0) if strategy == "read-gold" else True


def test_general_episode_through_the_harness():
    t = BY_ID["refund-damaged"]
    calls = [render_call("openai", a["tool"], a["args"]) for a in t.gold_actions] + [
        render_call("openai", "cancel_order", {"order_id": "1005", "reason": "x"}), render_call("openai", "submit", {})]
    with GeneralEnv(t) as env:
        seq = run_episode(ScriptedPolicy(calls), env, "api-agent").sequences[0]
    assert seq.reward == 1.0
    errors = error_segments(seq)
    assert len(errors) == 1 and errors[0]["kind"] == "tool_arguments"
    assert "order_id='1005', expected integer" in errors[0]["feedback"]


def test_task_schema_errors(tmp_path):
    data = json.loads((TASKS[0].seed.parent / "cancel-unshipped.json").read_text())
    for bad, msg in [({**data, "rubric": [{"id": "x", "type": "vibes"}]}, "type' among"),
                     ({**data, "gold_actions": [{"tool": "rm_rf"}]}, "expected a tool among"),
                     ({**data, "allowed_tables": "orders"}, "allowed_tables='orders', expected a list")]:
        p = tmp_path / "t.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(GeneralTaskError, match=msg):
            load_general_task(p)
