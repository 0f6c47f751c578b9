"""The partial-rollout buffer (Report §4.1): batch cut when full, in-flight episodes resumed, stale groups expired."""

import random

import pytest
import torch

from mimo_kit.infra import InProcessEngine
from mimo_kit.infra.partial import PartialRolloutBuffer, drawer, version_lag
from mimo_kit.rl.sft import PolicyConfig, build_policy
from mimo_kit.rl.world import make_tasks


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one torch thread avoids oversubscription."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)



@pytest.fixture(scope="module")
def engine():
    return InProcessEngine(build_policy(PolicyConfig(hidden_size=32), seed=0), seed=0)


def test_cut_resume_and_expire(engine):
    pool = make_tasks(20, 1)
    buf = PartialRolloutBuffer(group_size=3, staleness=1, in_flight=6)
    rng = random.Random(0)
    batch = buf.collect(engine, 2, drawer(pool, rng), max_turns=6)
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
        batch = buf.collect(engine, 2, drawer(pool, rng), max_turns=6)
        assert version_lag(batch, engine.policy_version)["lag_max"] <= 1
        engine.update_weights(engine.model.state_dict(), engine.policy_version + 1)


def test_bad_buffer_arguments(engine):
    with pytest.raises(ValueError, match="staleness=-1"):
        PartialRolloutBuffer(group_size=2, staleness=-1, in_flight=2)
    buf = PartialRolloutBuffer(group_size=2, staleness=1, in_flight=2)
    with pytest.raises(ValueError, match="prompts=3 exceeds in_flight=2"):
        buf.collect(engine, 3, drawer(make_tasks(3, 0), random.Random(0)))
