"""The partial-rollout buffer (Report §4.1): batch cut when full, in-flight episodes resumed, stale groups expired."""

import random

import pytest

from mimo_kit.infra import InProcessEngine
from mimo_kit.infra.partial import PartialRolloutBuffer, version_lag
from mimo_kit.infra.rollout import Outcome, RolloutSettings, Turn
from mimo_kit.rl.trajectory import Segment
from mimo_kit.train.sft import PolicyConfig, build_policy
from mimo_kit.train.toy.world import episodes, make_tasks, rollout_settings

SETTINGS = rollout_settings(max_turns=6)


def drawer(pool, rng, group_size):
    return lambda: episodes(rng.choice(pool), group_size)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest)



@pytest.fixture(scope="module")
def engine():
    return InProcessEngine(build_policy(PolicyConfig(hidden_size=32), seed=0), seed=0)


def test_cut_resume_and_expire(engine):
    pool = make_tasks(20, 1)
    buf = PartialRolloutBuffer(group_size=3, staleness=1, in_flight=6)
    rng = random.Random(0)
    batch = buf.collect(engine, 2, drawer(pool, rng, 3), SETTINGS)
    assert len(batch) == 2 and all(len(s.sequences) == 3 for s in batch)
    assert all(q.finish_reason in ("stop", "length") for s in batch for q in s.sequences)
    assert len(buf.groups) == 4  # the rest stay in flight, some cut mid-episode
    started = [g for g in buf.groups if any(len(s.episode.actions) for s in g[1])]
    assert started, "no in-flight group had started: the batch cut nothing"
    assert version_lag(batch, engine.policy_version) == {"lag_mean": 0.0, "lag_max": 0.0}
    # two weight updates later the started groups (tokens of version 0) are 2 > S = 1 versions old: expired
    engine.update_weights(engine.model.state_dict(), 2)
    n = buf.expire(engine.policy_version)
    assert n == len(started) and buf.expired == n
    assert all(s.oldest_version() is None for g in buf.groups for s in g[1])
    # a new collection tops up and mixes resumed episodes with fresh ones; no trained token is older than S
    engine.update_weights(engine.model.state_dict(), 3)
    for _ in range(3):
        batch = buf.collect(engine, 2, drawer(pool, rng, 3), SETTINGS)
        assert version_lag(batch, engine.policy_version)["lag_max"] <= 1
        engine.update_weights(engine.model.state_dict(), engine.policy_version + 1)


def test_bad_buffer_arguments(engine):
    with pytest.raises(ValueError, match="staleness=-1"):
        PartialRolloutBuffer(group_size=2, staleness=-1, in_flight=2)
    buf = PartialRolloutBuffer(group_size=2, staleness=1, in_flight=2)
    with pytest.raises(ValueError, match="prompts=3 exceeds in_flight=2"):
        buf.collect(engine, 3, drawer(make_tasks(3, 0), random.Random(0), 2), SETTINGS)
    with pytest.raises(ValueError, match="has 3 episodes, expected 2"):
        buf.collect(engine, 1, drawer(make_tasks(3, 0), random.Random(0), 3), SETTINGS)


class Countdown:
    """A test episode that ends after ``turns`` actions, whatever the model writes: groups finish at different
    turns, so the batch fills while other groups are still generating."""

    domain, group_metadata = "test", {}

    def __init__(self, turns: int):
        self.turns, self.n = turns, 0

    def prompt(self):
        return [Segment("user", [5, 6, 7])]

    def act(self, action, finish_reason):
        self.n += 1
        return Turn(Segment("tool", [8]), done=self.n >= self.turns)

    def outcome(self):
        return Outcome(float(self.turns % 2), bool(self.turns % 2))


def test_a_full_batch_aborts_the_actions_in_flight_and_they_resume_under_new_weights():
    """Grading overlaps the next turn; when the batch fills mid-generation the engine aborts, and the cut action
    resumes after the weight update (re-prefill), its tokens stamped with both versions."""
    eng = InProcessEngine(build_policy(PolicyConfig(hidden_size=32), seed=0), seed=3)
    rng = random.Random(1)
    counter = iter(range(10_000))

    def draw():
        turns = rng.randint(1, 4)
        return f"g{next(counter)}", [Countdown(turns) for _ in range(2)]

    settings = RolloutSettings(max_turns=10, max_action_tokens=12, stop_token_ids=())
    buf = PartialRolloutBuffer(group_size=2, staleness=3, in_flight=6)
    buf.collect(eng, 2, draw, settings)
    pending = [r for _, rs in buf.groups for r in rs if r.pending is not None]
    assert buf.aborted > 0 and pending, "the batch filled between turns: nothing was in flight to abort"
    assert all(r.pending[1].finish_reason == "abort" and len(r.pending[1].token_ids) < 12 for r in pending)
    eng.update_weights(eng.model.state_dict(), 1)
    mixed = []
    for _ in range(4):
        for smp in buf.collect(eng, 2, draw, settings):
            for q in smp.sequences:
                assert all(len(seg) == 12 for seg in q.contexts[0].segments if seg.role == "assistant")
                mixed += [seg.policy_versions for seg in q.contexts[0].segments
                          if seg.policy_versions and len(set(seg.policy_versions)) > 1]
        eng.update_weights(eng.model.state_dict(), eng.policy_version + 1)
    assert mixed, "no aborted action was resumed under newer weights"
    assert all(v == sorted(v) for v in mixed)  # older tokens first: the prefix, then the continuation


def test_an_action_cut_twice_keeps_each_part_s_version():
    """Aborted at version 0, resumed and aborted again at version 1, finished at version 2: every token of the
    action carries the version that sampled it, and the rollout's oldest version is the first part's."""
    from mimo_kit.infra.engine import GenerationOutput
    from mimo_kit.infra.rollout import Rollout, advance

    class Cutting:
        policy_version = 0
        parts = [([1, 2], "abort"), ([3], "abort"), ([4, 9], "stop")]

        def generate(self, requests):
            ids, reason = self.parts.pop(0)
            return [GenerationOutput(r.request_id, ids, [-0.1] * len(ids), reason, self.policy_version)
                    for r in requests]

    eng = Cutting()
    r = Rollout.start(Countdown(1), "g", 0)
    settings = RolloutSettings(max_turns=3, max_action_tokens=8, stop_token_ids=(9,))
    advance(eng, [r], settings)
    assert r.pending is not None and r.oldest_version() == 0
    eng.policy_version = 1
    advance(eng, [r], settings)
    assert r.pending_versions == [0, 0, 1]
    eng.policy_version = 2
    advance(eng, [r], settings)
    [seg] = [s for s in r.contexts[0] if s.role == "assistant"]
    assert seg.token_ids == [1, 2, 3, 4, 9] and seg.policy_versions == [0, 0, 1, 2, 2]
    assert r.finish == "stop" and r.pending is None and r.oldest_version() == 0
