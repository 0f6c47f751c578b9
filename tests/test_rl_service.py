"""The rollout service (Report §6): several engines behind one play, sticky placement, KV admission, faults."""

import random
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.config.base import ConfigError
from mimo_kit.infra import rollout
from mimo_kit.infra.engine import InProcessEngine
from mimo_kit.infra.service import NoEngineLeft, RolloutService
from mimo_kit.train.config import RLConfig
from mimo_kit.train.sft import PolicyConfig, build_policy
from mimo_kit.train.toy.world import ToyWorld

WORLD = ToyWorld(max_turns=3)
SETTINGS = WORLD.rollout_settings(1.0, 1.0, False, False)


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return build_policy(PolicyConfig(), 0, vocab_size=WORLD.vocab_size)


def tasks(n, seed=1):
    return WORLD.tasks(n, seed=seed, prefix=f"svc{seed}")


def groups(ts, size=3):
    return [WORLD.episodes(t, size) for t in ts]


def tokens(samples):
    return [[(q.sequence_id, [t for c in q.contexts for t in c.token_ids()],
              [lp for c in q.contexts for s in c.segments if s.logprobs for lp in s.logprobs], q.finish_reason)
             for q in s.sequences] for s in samples]


class Recorder:
    """An engine that notes which requests it served per generate call (and may sleep, or die after n calls)."""

    def __init__(self, engine, *, die_after=None, jitter=None):
        self.engine, self.die_after, self.jitter = engine, die_after, jitter
        self.calls: list[list[str]] = []
        self.policy_version = 0

    def generate(self, requests):
        if self.jitter is not None:
            time.sleep(self.jitter.random() * 0.01)
        if self.die_after is not None and len(self.calls) >= self.die_after:
            raise ConnectionError("the engine's server went away")
        self.calls.append([r.request_id for r in requests])
        return self.engine.generate(requests)

    def update_weights(self, state_dict, version):
        self.engine.update_weights(state_dict, version)
        self.policy_version = version

    def abort(self):
        self.engine.abort()


class Closing:
    """A toy episode that records being closed."""

    closed: list[str] = []

    def __init__(self, ep, name):
        self.ep, self.name = ep, name
        self.domain, self.group_metadata = getattr(ep, "domain", "code"), getattr(ep, "group_metadata", {})

    def prompt(self):
        return self.ep.prompt()

    def act(self, action, reason):
        return self.ep.act(action, reason)

    def outcome(self):
        return self.ep.outcome()

    def close(self):
        Closing.closed.append(self.name)


def test_one_engine_plays_exactly_as_the_driver(policy):
    """A service of one engine is the plain driver: the same tokens, logprobs and endings from the same seed."""
    ts = tasks(3)
    svc = RolloutService([InProcessEngine(policy, seed=3)])
    assert tokens(svc.play(groups(ts), SETTINGS)) == tokens(rollout.play(InProcessEngine(policy, seed=3),
                                                                          groups(ts), SETTINGS))


def test_episodes_stay_on_their_engine_and_groups_spread_by_planned_kv(policy):
    ts = tasks(7, seed=2)
    engines = [Recorder(InProcessEngine(policy, seed=i)) for i in range(3)]
    svc = RolloutService(engines)
    samples = rollout.play(svc, groups(ts), SETTINGS)  # the driver hands a service its groups
    assert [s.prompt_id for s in samples] == [t.task_id for t in ts]
    served = [{rid for call in e.calls for rid in call} for e in engines]
    for s in samples:  # sticky: every turn of every episode of a group on the engine it was placed on
        rids = {q.sequence_id for q in s.sequences}
        owners = [i for i, got in enumerate(served) if rids & got]
        assert owners == [svc.last_placement[s.prompt_id]], (s.prompt_id, owners)
    # the plan: each group to the engine with the least KV planned so far
    est = [svc.kv_estimate(rollout.start_groups([g])[0][1], SETTINGS) for g in groups(ts)]
    load = [0.0] * 3
    for x, e in zip(est, svc.place(est)):
        assert load[e] == min(load)
        load[e] += x
    assert all(served), "every engine served"


@pytest.mark.parametrize("capacity_groups", [0, 1.5, 2.5])
def test_kv_capacity_bounds_the_groups_decoding_at_once(policy, capacity_groups):
    """Predictive dispatch on each engine: a group is admitted only when its estimated KV fits what is free."""
    task = tasks(1, seed=3)[0]
    same = [(f"g{i}", WORLD.episodes(task, 3)[1]) for i in range(6)]  # six groups of one task: equal KV estimates
    est = RolloutService.kv_estimate(rollout.start_groups(same[:1])[0][1], SETTINGS)
    engine = Recorder(InProcessEngine(policy, seed=0))
    svc = RolloutService([engine], kv_capacity=capacity_groups * est * 1.01)
    samples = svc.play(same, SETTINGS)
    at_once = max(len({rid.split("/")[0] for rid in call}) for call in engine.calls)
    assert at_once == (len(same) if capacity_groups == 0 else int(capacity_groups))
    assert [s.prompt_id for s in samples] == [g for g, _ in same] and all(len(s.sequences) == 3 for s in samples)


def test_samples_do_not_depend_on_thread_timing(policy):
    """Placement is planned before the engines start, so each engine's sampling stream sees the same requests in
    the same order however the threads interleave."""
    ts = tasks(6, seed=4)
    runs = []
    for jitter_seed in (0, 1):
        svc = RolloutService([Recorder(InProcessEngine(policy, seed=i), jitter=random.Random(jitter_seed + 10 * i))
                              for i in range(2)])
        runs.append(tokens(svc.play(groups(ts), SETTINGS)))
    assert runs[0] == runs[1]


def test_a_failed_engine_s_groups_are_played_again_on_another(policy):
    ts = tasks(6, seed=5)
    by_id = {t.task_id: t for t in ts}
    Closing.closed = []
    n_built = {"n": 0}

    def build(t):
        gid, eps = WORLD.episodes(t, 3)
        n_built["n"] += 1
        return gid, [Closing(e, f"{gid}#{n_built['n']}/{i}") for i, e in enumerate(eps)]

    est = [RolloutService.kv_estimate(rollout.start_groups([g])[0][1], SETTINGS) for g in groups(ts)]
    lost = [t.task_id for t, e in zip(ts, RolloutService([None, None]).place(est)) if e == 0]  # engine 0's plan
    dying = Recorder(InProcessEngine(policy, seed=0), die_after=1)
    svc = RolloutService([dying, Recorder(InProcessEngine(policy, seed=1))])
    samples = svc.play([build(t) for t in ts], SETTINGS, rebuild=lambda gid: build(by_id[gid])[1])
    assert svc.alive == [False, True] and "went away" in svc.failures[0]
    assert [s.prompt_id for s in samples] == [t.task_id for t in ts]  # every group once, in order
    assert all(len(s.sequences) == 3 and all(q.finish_reason in ("stop", "length") for q in s.sequences)
               for s in samples)
    assert set(svc.last_placement.values()) == {1}
    assert sorted({c.split("#")[0] for c in Closing.closed}) == sorted(lost), "the abandoned episodes were closed"
    # without rebuild the lost groups end as infrastructure errors (the penalty module drops them)
    svc = RolloutService([Recorder(InProcessEngine(policy, seed=0), die_after=1),
                          Recorder(InProcessEngine(policy, seed=1))])
    samples = svc.play(groups(ts), SETTINGS)
    bad = {s.prompt_id for s in samples if any(q.finish_reason == "infra_error" for q in s.sequences)}
    assert bad == set(lost)


def test_no_engine_left_raises_naming_each_failure(policy):
    svc = RolloutService([Recorder(InProcessEngine(policy, seed=i), die_after=0) for i in range(2)])
    with pytest.raises(NoEngineLeft, match="engine 0: ConnectionError.*engine 1: ConnectionError"):
        svc.play(groups(tasks(2)), SETTINGS, rebuild=lambda gid: WORLD.episodes(tasks(2)[0], 3)[1])


def test_a_bug_in_an_engine_is_raised_not_hidden(policy):
    """Only an unreachable engine (an OSError) leaves the service; any other exception is the caller's."""

    class Buggy(Recorder):
        def generate(self, requests):
            raise ValueError("a bad request")

    svc = RolloutService([Buggy(InProcessEngine(policy, seed=0)), Recorder(InProcessEngine(policy, seed=1))])
    with pytest.raises(ValueError, match="a bad request"):
        svc.play(groups(tasks(2)), SETTINGS)
    assert svc.alive == [True, True]


def test_an_engine_gone_at_the_weight_sync_leaves_the_service(policy):
    class Gone(Recorder):
        def update_weights(self, state_dict, version):
            raise ConnectionRefusedError("connection refused")

    svc = RolloutService([Gone(InProcessEngine(policy, seed=0)), Recorder(InProcessEngine(policy, seed=1))])
    svc.update_weights(policy.state_dict(), 1)
    assert svc.alive == [False, True] and svc.policy_version == 1 and "refused" in svc.failures[0]
    svc.play(groups(tasks(2)), SETTINGS)
    assert set(svc.last_placement.values()) == {1}
    with pytest.raises(NoEngineLeft):
        RolloutService([Gone(InProcessEngine(policy, seed=0))]).update_weights(policy.state_dict(), 1)


def test_engines_run_side_by_side(policy):
    """One loop per engine in its own thread: two engines' generate calls overlap in time."""
    active, peak, lock = [0], [0], threading.Lock()

    class Slow(Recorder):
        def generate(self, requests):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.02)
            try:
                return super().generate(requests)
            finally:
                with lock:
                    active[0] -= 1

    RolloutService([Slow(InProcessEngine(policy, seed=i)) for i in range(2)]).play(groups(tasks(4)), SETTINGS)
    assert peak[0] == 2


def test_weights_reach_every_engine(policy):
    engines = [Recorder(InProcessEngine(policy, seed=i)) for i in range(3)]
    svc = RolloutService(engines)
    state = {k: v + 0.01 for k, v in policy.state_dict().items()}
    svc.update_weights(state, 4)
    assert svc.policy_version == 4
    for e in engines:
        got = e.engine.model.state_dict()
        assert all(torch.equal(got[k], v) for k, v in state.items() if k in got)


@pytest.mark.parametrize("overrides, match", [
    ({"engines": 2, "staleness": 2}, "partial rollouts run on one engine"),
    ({"engine_url": "http://127.0.0.1:1,ftp://x"}, "'ftp://x' is not an http"),
    ({"engine_url": "http://127.0.0.1:1,http://127.0.0.1:2", "engines": 3}, "the servers are the engines"),
])
def test_bad_engine_configs_name_the_value(overrides, match):
    with pytest.raises(ConfigError, match=match):
        RLConfig.preset("toy", **overrides)


def test_engine_urls_make_one_engine_each():
    cfg = RLConfig.preset("toy", engine_url=" http://127.0.0.1:1, http://127.0.0.1:2 ")
    assert cfg.engine_urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"] and cfg.n_engines == 2
    assert RLConfig.preset("toy", engines=3).n_engines == 3


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=8), st.lists(st.integers(0, 2), max_size=5))
def test_start_groups_gives_every_request_in_flight_its_own_id(drawn, in_flight):
    """A task drawn more than once (in one batch, or again beside groups of it in flight) gets the smallest free
    copy number: the request ids of everything in flight are unique, and a task drawn once keeps the plain id."""
    ts = tasks(3, seed=9)
    beside = rollout.start_groups([WORLD.episodes(ts[i], 2) for i in in_flight])
    started = rollout.start_groups([WORLD.episodes(ts[i], 2) for i in drawn], beside=beside)
    ids = [r.request_id for _, rs in beside + started for r in rs]
    assert len(ids) == len(set(ids))
    for gid in {g for g, _ in beside + started}:  # copies 0..n−1 of each task: no gaps
        copies = sorted(rs[0].copy for g, rs in beside + started if g == gid)
        assert copies == list(range(len(copies)))
    if len(drawn) == len(set(drawn)) and not in_flight:
        assert all(r.request_id == f"{g}/{r.index}" for g, rs in started for r in rs)
