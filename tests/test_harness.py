"""The mini-harness (Report §4.2): formats, tools, limits, context management, recorder, 7 configurations."""

from pathlib import Path

import pytest

from mimo_kit.envs.code import shipped_tasks
from mimo_kit.envs.cyber import shipped_targets
from mimo_kit.harness import (
    FORMATS,
    HARNESSES,
    FormatError,
    HarnessConfig,
    ScriptedPolicy,
    ToolCall,
    error_segments,
    generated_segments,
    get_format,
    render_call,
    run_episode,
)
from mimo_kit.harness.config import manage_context, truncate
from mimo_kit.harness.envs import CodeEnv, CyberEnv
from mimo_kit.rl import load_jsonl, save_jsonl

TASK = next(t for t in shipped_tasks() if t.id == "stats-median")
OLD = "    mid = len(values) // 2\n    return values[mid]\n"
NEW = ("    mid = len(values) // 2\n    if len(values) % 2:\n        return values[mid]\n"
       "    return (values[mid - 1] + values[mid]) / 2\n")
PATCH_CMD = (f"python3 - <<'X'\np = 'stats/__init__.py'\ns = open(p).read()\n"
             f"open(p, 'w').write(s.replace({OLD!r}, {NEW!r}))\nX")


def solve_script(h: HarnessConfig) -> list[str]:
    f = h.action_format
    if "str_replace" in h.tools:
        return [render_call(f, "view", {"path": "stats/__init__.py"}), "I think I should look around",
                render_call(f, "str_replace", {"path": "stats/__init__.py", "old_str": OLD, "new_str": NEW}),
                render_call(f, "submit", {})]
    return [render_call(f, "bash", {"command": "cat stats/__init__.py"}), "I think I should look around",
            render_call(f, "bash", {"command": PATCH_CMD}), render_call(f, "submit", {})]


def test_seven_configurations_four_train_three_held_out():
    splits = [h.split for h in HARNESSES.values()]
    assert len(HARNESSES) >= 7 and splits.count("train") >= 4 and splits.count("eval") == 3
    assert {h.action_format for h in HARNESSES.values()} == set(FORMATS)


@pytest.mark.parametrize("name", [n for n, h in HARNESSES.items() if "bash" in h.tools or "str_replace" in h.tools])
def test_every_code_harness_solves_a_task_with_a_scripted_policy(name, tmp_path):
    h = HARNESSES[name]
    with CodeEnv(TASK) as env:
        sample = run_episode(ScriptedPolicy(solve_script(h)), env, h)
    seq = sample.sequences[0]
    assert seq.reward == 1.0 and seq.passed and seq.metadata["finish"] == "submitted"
    errs = error_segments(seq)
    assert len(errs) == 1 and errs[0]["kind"] == "format"  # the chatty turn became a recorded error
    assert errs[0]["action"] == "I think I should look around" and errs[0]["feedback"].startswith("\n### tool")
    assert len(generated_segments(seq)) == 4
    # one schema: the harness episode saves and loads as the trainer's trajectories, token for token
    [back] = load_jsonl(save_jsonl([sample], tmp_path / "s.jsonl"))
    assert back.to_dict() == sample.to_dict()


def test_without_a_fix_the_reward_is_zero():
    h = HARNESSES["mini-bash"]
    with CodeEnv(TASK) as env:
        seq = run_episode(ScriptedPolicy([render_call("fenced", "submit", {})]), env, h).sequences[0]
    assert seq.reward == 0.0 and not seq.passed and seq.metadata["finish"] == "submitted"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_formats_round_trip_and_reject_malformed_actions(fmt):
    f = get_format(fmt)
    for name, args in [("view", {"path": "a.py", "start": 2}), ("str_replace", {"path": "x", "old_str": "a b",
                                                                                "new_str": "c"})]:
        assert f.parse(render_call(fmt, name, args)) == [ToolCall(name, args)]
    for bad in ["", "just text", "```python\nx\n``` ```bash\nls\n```", '{"tool_calls": []}', '<tool name="x">oops',
                '{"tool_calls": [{"function": {"name": "view", "arguments": "{bad"}}]}']:
        with pytest.raises(FormatError):
            f.parse(bad)


def test_malformed_calls_become_error_segments_and_limits_stop_the_loop():
    h = HarnessConfig(name="t", action_format="openai", tools=("bash", "view", "submit"), max_format_errors=2)
    replies = [render_call("openai", "nope", {}), render_call("openai", "view", {"path": 3}),
               render_call("openai", "view", {"path": "../../etc/passwd"}),
               render_call("openai", "view", {"pth": "x"}), "not json", "still not json", "never reached"]
    with CodeEnv(TASK) as env:
        seq = run_episode(ScriptedPolicy(replies), env, h).sequences[0]
    errs = error_segments(seq)
    msgs = [e["feedback"] for e in errs]
    assert seq.metadata["finish"] == "format_errors" and seq.reward == 0.0
    assert "unknown tool 'nope'" in msgs[0] and "path=3, expected string" in msgs[1]
    assert "outside the workspace" in msgs[2] and "unknown argument 'pth'" in msgs[3]
    assert [e["kind"] for e in errs] == ["unknown_tool", "tool_arguments", "tool_arguments", "tool_arguments",
                                         "format", "format"]
    with CodeEnv(TASK) as env:
        seq = run_episode(ScriptedPolicy([render_call("fenced", "bash", {"command": "true"})]), env,
                          HarnessConfig(max_steps=3)).sequences[0]
    assert seq.metadata["finish"] == "max_steps" and len(generated_segments(seq)) == 3

    def boom(messages):
        raise RuntimeError("engine down")

    with CodeEnv(TASK) as env:
        seq = run_episode(boom, env, "mini-bash").sequences[0]
    assert seq.finish_reason == "infra_error" and error_segments(seq)[-1]["kind"] == "infra"
    assert "engine down" in seq.metadata["infra_error"]


def test_symlink_escape_is_refused():
    with CodeEnv(TASK) as env:
        (env.workspace.root / "link").symlink_to("/etc")
        seq = run_episode(ScriptedPolicy([render_call("openai", "view", {"path": "link/hostname"}),
                                          render_call("openai", "submit", {})]), env,
                          HarnessConfig(action_format="openai", tools=("view", "submit"))).sequences[0]
    feedback = error_segments(seq)[0]["feedback"]
    host = Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").is_file() else ""
    assert "links are not followed" in feedback and (not host or host not in feedback)


def test_context_management_truncates_elides_and_branches(tmp_path):
    text = "a" * 5000 + "END"
    t = truncate(text, 500)
    assert len(t) <= 500 and t.startswith("aaa") and t.endswith("END") and "elided" in t
    msgs = [{"role": "user", "content": "u"}] + [{"role": "tool", "content": f"o{i}"} for i in range(4)]
    kept = manage_context(msgs, 2)
    assert [m["content"] for m in kept][1:] == ["[earlier observation elided]"] * 2 + ["o2", "o3"]
    h = HarnessConfig(keep_last=1)
    cmds = [render_call("fenced", "bash", {"command": f"echo {i}"}) for i in range(3)] + [
        render_call("fenced", "submit", {})]
    with CodeEnv(TASK) as env:
        sample = run_episode(ScriptedPolicy(cmds), env, h)
    seq = sample.sequences[0]
    assert len(seq.contexts) >= 2
    replayed = [sg for sg in seq.contexts[1].segments if sg.role == "assistant" and sg.source == "env"]
    assert replayed and not any(sg.trainable for sg in replayed)  # history in a new context is not trained twice
    assert seq.contexts[1].segments[-1].trainable  # the model acts on in the new context
    assert any("elided" in (sg.text or "") for sg in seq.contexts[1].segments)
    assert len(generated_segments(seq)) == 4  # replays are not double counted
    [back] = load_jsonl(save_jsonl([sample], tmp_path / "s.jsonl"))
    assert back.to_dict() == sample.to_dict() and back.sequences[0].reward == seq.reward


def test_cyber_episode_through_the_harness():
    target = next(t for t in shipped_targets() if t.id == "session-use-after-free")
    with CyberEnv(target) as env:
        seq = run_episode(ScriptedPolicy([render_call("fenced", "bash", {"command": "printf ORCR > poc.bin"}),
                                          render_call("fenced", "submit", {})]), env, "mini-bash").sequences[0]
    assert seq.reward == 1.0, seq.metadata["grade"]


def test_a_model_acts_in_the_harness_through_the_rollout_driver(tmp_path):
    """Two episodes of a tiny byte-level model in one batched rollout: every action is stored token-in/token-out
    with its rollout logprobs, which the trainer's forward on the stored tokens reproduces."""
    import torch

    from mimo_kit.harness import ByteTokenizer, HarnessEpisode, harness_settings
    from mimo_kit.infra import InProcessEngine
    from mimo_kit.infra.rollout import play
    from mimo_kit.model import MiMoConfig, MiMoForCausalLM
    from mimo_kit.rl.trajectory import flatten
    from mimo_kit.train.update import policy_logprobs

    torch.manual_seed(0)
    tok = ByteTokenizer()
    model = MiMoForCausalLM(MiMoConfig.preset("tiny", vocab_size=tok.vocab_size)).eval()
    h = HarnessConfig(max_steps=2, max_format_errors=5)
    with CodeEnv(TASK) as e1, CodeEnv(TASK) as e2:
        eps = [HarnessEpisode(e1, h, tok), HarnessEpisode(e2, h, tok)]
        [sample] = play(InProcessEngine(model, seed=0), [("stats", eps)],
                        harness_settings(h, tok, max_action_tokens=12))
    assert [len(generated_segments(q)) for q in sample.sequences] == [2, 2]
    assert all(e["kind"] in ("format", "truncated") for q in sample.sequences for e in error_segments(q))
    batch = flatten([sample])
    with torch.no_grad():
        logp, _ = policy_logprobs(model, batch.input_ids, 1.0)
    m = batch.loss_mask[:, 1:]
    torch.testing.assert_close(logp[m], batch.logprobs[:, 1:].float()[m], atol=1e-4, rtol=0)
    [back] = load_jsonl(save_jsonl([sample], tmp_path / "s.jsonl"))
    assert back.to_dict() == sample.to_dict()
