"""The toy agentic world (mimo_kit.train.toy.world): tasks, actions, scripted expert, token-in/token-out episodes."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.infra import GenerationOutput
from mimo_kit.rl.advantages import gar_advantages, grpo_advantages
from mimo_kit.rl.trajectory import flatten, unflatten
from mimo_kit.train.toy.world import (
    TOKENIZER,
    ToyEpisode,
    equivalent,
    expert_actions,
    expert_dataset,
    grade_group,
    make_tasks,
    play,
    run_program,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest)



def test_program_semantics_and_tokenizer():
    assert run_program(["+3", "*2", "-1"], 1) == 7
    assert equivalent(["+3"], ["+3", "+0"]) and not equivalent(["+3"], ["+4"])
    text = "fix +3*2-1\nR\n2:*2\n"
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text
    with pytest.raises(ValueError, match="'#'"):
        TOKENIZER.encode("fix #")


@given(st.integers(0, 10_000), st.integers(1, 5))
@settings(max_examples=40, deadline=None)
def test_tasks_have_exactly_one_visible_bug(seed, n_lines):
    for t in make_tasks(3, seed, n_lines):
        diff = [i for i, (a, b) in enumerate(zip(t.reference, t.buggy)) if a != b]
        assert diff == [t.bug_line - 1] and not equivalent(t.reference, t.buggy)
    assert [t.buggy for t in make_tasks(3, seed, n_lines)] == [t.buggy for t in make_tasks(3, seed, n_lines)]


@given(st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_expert_styles(seed):
    rng = random.Random(seed)
    t = make_tasks(1, seed)[0]
    for style, passes, needless in (("clean", True, 0), ("needless", True, 1), ("wrong", False, 0)):
        ep = ToyEpisode(t)
        for a in expert_actions(t, style, rng):
            ep.step(a)
        assert ep.passed is passes and ep.needless_edits == needless
        assert ep.format_errors == 0


def test_tests_point_at_the_bug_and_malformed_actions_are_errors():
    t = make_tasks(1, 7)[0]
    ep = ToyEpisode(t)
    assert ep.step("R") == f"{t.bug_line}:{t.reference[t.bug_line - 1]}\n"
    assert ep.step("X9") == "err\n" and ep.step("E9+1") == "err\n" and ep.format_errors == 2
    assert ep.step(f"E{t.bug_line}{t.reference[t.bug_line - 1]}") == "done\n"
    assert ep.step("R") == "ok\n" and ep.step("S") == "" and ep.passed
    assert ep.diff().startswith("diff --git a/prog.txt b/prog.txt") and ep.needless_edits == 0


def test_expert_dataset_masks_only_actions():
    tasks = make_tasks(40, 1)
    data = expert_dataset(tasks, 0)
    styles = {info["style"] for _, _, info in data}
    assert styles == {"clean", "needless", "wrong"}
    for ids, mask, _ in data:
        text = TOKENIZER.decode(ids)
        assert len(ids) == len(mask) and text.startswith("fix ")
        trained = TOKENIZER.decode([i for i, m in zip(ids, mask) if m])
        assert set(trained.split("\n")[:-1]) <= {ln for ln in text.split("\n")} and trained.endswith("S\n")


class ScriptedEngine:
    """A fake engine that 'generates' scripted actions, to test the episode loop and the grader."""

    policy_version = 2

    def __init__(self, scripts):
        self.scripts = scripts  # request index in the group → list of actions
        self.turn = {}

    def generate(self, requests):
        outs = []
        for r in requests:
            j = int(r.request_id.rsplit("/", 1)[1])
            k = self.turn.get(j, 0)
            self.turn[j] = k + 1
            ids = TOKENIZER.encode(self.scripts[j][k] + "\n")
            outs.append(GenerationOutput(r.request_id, ids, [-0.5] * len(ids), "stop", self.policy_version))
        return outs


def test_play_records_tokens_and_grader_prefers_minimal_passes():
    t = make_tasks(1, 3)[0]
    rng = random.Random(0)
    scripts = [expert_actions(t, s, rng, retry_prob=0.0) for s in ("clean", "needless", "wrong", "clean")]
    [sample] = play(ScriptedEngine(scripts), [t], group_size=4)
    assert [s.passed for s in sample.sequences] == [True, True, False, True]
    assert [s.metadata["needless_edits"] for s in sample.sequences] == [0, 1, 0, 0]
    seq = sample.sequences[1]
    segs = seq.contexts[0].segments
    assert [s.role for s in segs[:3]] == ["user", "assistant", "tool"]
    assert all(s.policy_versions == [2] * len(s) for s in segs if s.role == "assistant")
    text = TOKENIZER.decode(seq.contexts[0].token_ids())
    assert text == t.prompt + "R\n" + f"{t.bug_line}:{t.reference[t.bug_line - 1]}\n" + text.split("\n", 3)[3]
    sample.validate()
    assert unflatten(flatten([sample]))[0].to_dict() == sample.to_dict()  # token-in/token-out round trip
    verdict = grade_group(sample)
    ids = [s.sequence_id for s in sample.sequences]
    assert verdict.tier_of(ids[0]) == verdict.tier_of(ids[3]) == 0 and verdict.tier_of(ids[1]) > 0
    res = gar_advantages([s.reward for s in sample.sequences], [s.passed for s in sample.sequences], ids, verdict)
    grpo = grpo_advantages([s.reward for s in sample.sequences])
    assert res.fallback is None and res.advantages[1] < grpo[1] and res.advantages[0] > grpo[0]


def test_the_trainer_composes_advantages_in_the_one_stated_order():
    """collection.group_advantages with GAR and the length penalty on a played group equals
    compose.sequence_advantages called by hand on the same outcomes, lengths and verdict."""
    from mimo_kit.rl.compose import sequence_advantages
    from mimo_kit.train.collection import group_advantages
    from mimo_kit.train.config import RLConfig

    t = make_tasks(1, 5)[0]
    rng = random.Random(1)
    styles = ("clean", "needless", "clean", "wrong", "needless", "clean")
    [sample] = play(ScriptedEngine([expert_actions(t, s, rng, retry_prob=0.0) for s in styles]), [t], group_size=6)
    cfg = RLConfig.preset("toy", advantage="gar", length_penalty=True)
    rewards, advs, logs = group_advantages([sample], cfg, cfg.make_world())
    seqs = sample.sequences
    lengths = [sum(len(seg) for seg in q.contexts[0].segments if seg.trainable) for q in seqs]
    ref = sequence_advantages([q.passed for q in seqs], rewards=[q.reward for q in seqs], lengths=lengths,
                              gar=True, verdict=grade_group(sample), ids=[q.sequence_id for q in seqs])
    assert logs[0]["fallback"] is None
    torch.testing.assert_close(torch.tensor(advs[0]), ref.advantages)
    torch.testing.assert_close(torch.tensor(rewards[0]), ref.rewards)
    assert len(set(lengths)) > 1  # the length penalty had something to act on
