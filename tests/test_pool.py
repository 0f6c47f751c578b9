"""Harness pool and payload porter (Report §6): tenants on persistent hosts, in process and on a local Ray head."""

import pickle
import time

import pytest
from conftest import RAY_GROUP, require

from mimo_kit.infra import rollout
from mimo_kit.infra.pool import (
    ActorPerRollout,
    FailingBuild,
    HarnessPool,
    TenantSpec,
    open_fds,
    ray_processes,
    start_local_head,
    stop_local_head,
)
from mimo_kit.infra.porter import LocalStore, Porter, RayStore, ray_rollout_worker
from mimo_kit.rl.trajectory import flatten
from mimo_kit.train.toy.pooled import RepoBuild, SeededToyEngine, ToyBuild
from mimo_kit.train.toy.world import episodes, make_tasks, rollout_settings

SETTINGS = rollout_settings(max_turns=6, return_routed_experts=True, return_candidates=True)


def reference(tasks, group_size, engine):
    return rollout.play(engine, [episodes(t, group_size) for t in tasks], SETTINGS)


def pooled(pool, tasks, group_size, engine):
    return rollout.play(engine, pool.groups([(t.task_id, [ToyBuild(t)] * group_size) for t in tasks]), SETTINGS)


def same(a, b):
    return [s.to_dict() for s in a] == [s.to_dict() for s in b]


# ---- in process -----------------------------------------------------------------------------------------------------
def test_local_pool_matches_in_process_play_and_balances_tenants():
    tasks, engine = make_tasks(8, 1), SeededToyEngine(3)
    pool = HarnessPool(3)
    eps = pool.groups([(t.task_id, [ToyBuild(t)] * 8) for t in tasks])
    assert sorted(pool.load) == [21, 21, 22]  # least-loaded placement
    samples = rollout.play(engine, eps, SETTINGS)
    assert same(samples, reference(tasks, 8, engine))
    assert pool.load == [0, 0, 0] and not pool.placement  # graded tenants are closed
    assert {q.finish_reason for s in samples for q in s.sequences} >= {"stop", "length"}  # seeded replies vary
    pool.shutdown()


def test_local_actor_per_rollout_matches_and_releases_hosts():
    tasks, engine = make_tasks(2, 2), SeededToyEngine(5)
    apr = ActorPerRollout()
    assert same(pooled(apr, tasks, 4, engine), reference(tasks, 4, engine))
    assert apr.created == 8 and apr.actors == 0


def test_tenants_are_isolated_and_a_failing_tenant_spares_its_neighbours():
    tasks, engine = make_tasks(1, 4), SeededToyEngine(1)
    pool = HarnessPool(1)  # every tenant on the one host
    builds = [ToyBuild(tasks[0]), FailingBuild(ToyBuild(tasks[0]), fail_at=1), ToyBuild(tasks[0])]
    [sample] = rollout.play(engine, pool.groups([(tasks[0].task_id, builds)]), SETTINGS)
    [ref] = reference(tasks, 3, engine)
    bad = sample.sequences[1]
    assert bad.finish_reason == "infra_error" and "failure injected" in bad.metadata["infra_error"]
    for i in (0, 2):  # the neighbours ran exactly as alone
        assert pickle.dumps(sample.sequences[i]) == pickle.dumps(ref.sequences[i])
    host = pool.hosts[0]
    assert host.failed == 1 and not host.tenants


def test_per_tenant_state_does_not_leak():
    t = make_tasks(1, 9)[0]
    pool = HarnessPool(1)
    a, b = pool.open([TenantSpec("g/0", ToyBuild(t)), TenantSpec("g/1", ToyBuild(t))])
    from mimo_kit.train.toy.world import TOKENIZER

    edit = f"E{t.bug_line}{t.reference[t.bug_line - 1]}\n"
    pool.act_many([(a, TOKENIZER.encode(edit), "stop"), (b, TOKENIZER.encode("R\n"), "stop")])
    pool.act_many([(a, TOKENIZER.encode("S\n"), "stop"), (b, TOKENIZER.encode("S\n"), "stop")])
    oa, ob = pool.outcome_many([a, b])
    assert oa.passed and not ob.passed
    assert oa.metadata["actions"] == [edit[:-1], "S"] and ob.metadata["actions"] == ["R", "S"]


def test_local_porter_round_trip_is_exact():
    tasks, engine = make_tasks(3, 6), SeededToyEngine(2, layers=4, k=2)
    samples = reference(tasks, 4, engine)
    porter = Porter(LocalStore())
    manifests = porter.ship(samples)
    assert [m.rewards for m in manifests] == [[q.reward for q in s.sequences] for s in samples]
    assert len(pickle.dumps(manifests)) < len(pickle.dumps(samples)) / 3  # the driver holds the small part
    back = porter.fetch(manifests, free=True)
    assert same(back, samples) and not porter.store.objects
    fa, fb = flatten(back), flatten(samples)
    assert all((getattr(fa, k) is None and getattr(fb, k) is None) or getattr(fa, k).equal(getattr(fb, k))
               for k in ("input_ids", "logprobs", "routed_experts", "topp_candidates", "loss_mask"))


# ---- on a local Ray head --------------------------------------------------------------------------------------------


def test_dist_store_porter_round_trip_through_a_tcp_store():
    """DistStore: payloads in a torch.distributed TCPStore on loopback (what a learner's ranks share), read back by
    a second client of the store, only the sequences asked for, and freed."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    from mimo_kit.infra.porter import DistStore

    tasks, engine = make_tasks(2, 6), SeededToyEngine(2, layers=4, k=2)
    samples = reference(tasks, 3, engine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host = dist.TCPStore("127.0.0.1", port, 2, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=30))
    manifests = Porter(DistStore(host)).ship(samples)
    reader = Porter(DistStore(client))
    assert same(reader.fetch(manifests), samples)
    part = reader.fetch(manifests, only=[[2], []])  # one rank's share: sequence 2 of group 0
    assert [len(x.sequences) for x in part] == [1, 0]
    assert same([type(samples[0])(samples[0].prompt_id, [samples[0].sequences[2]], domain=samples[0].domain,
                                  metadata=samples[0].metadata)], part[:1])
    keys = [k for m in manifests for k in m.keys]
    reader.store.free(keys)
    assert not any(host.check([k]) for k in keys)

@pytest.fixture(scope="module")
def ray_head():
    require("ray", "`pip install -e .[ray]`")
    info = start_local_head(num_cpus=2)
    yield info
    stop_local_head()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.xdist_group(RAY_GROUP)
def test_ray_head_listens_on_loopback_only(ray_head):
    import psutil

    assert ray_head["node_ip"] == "127.0.0.1"
    procs = ray_processes()
    assert procs["gcs_server"] and procs["raylet"]
    mine = {p for v in procs.values() for p in v}
    listening = [c for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.pid in mine]
    assert listening and all(c.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for c in listening), listening
    assert open_fds(procs["gcs_server"]) > 0


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.xdist_group(RAY_GROUP)
def test_ray_pool_hosts_64_concurrent_tenants_and_matches_in_process_play(ray_head):
    tasks, engine = make_tasks(12, 11), SeededToyEngine(7)
    pool = HarnessPool(2, backend="ray", tool_threads=8)
    builds = [(t.task_id, [ToyBuild(t)] * 6) for t in tasks]
    builds[0] = (builds[0][0], [ToyBuild(tasks[0])] * 5 + [FailingBuild(ToyBuild(tasks[0]), fail_at=2)])
    eps = pool.groups(builds)  # 72 tenants open at once on 2 actors
    stats = pool.stats()
    assert sum(s["tenants"] for s in stats) == 72 and len({s["pid"] for s in stats}) == 2
    samples = rollout.play(engine, eps, SETTINGS)
    ref = reference(tasks, 6, engine)
    assert same(samples[1:], ref[1:])
    bad = samples[0].sequences[5]
    assert bad.finish_reason == "infra_error" and "failure injected at turn 2" in bad.metadata["infra_error"]
    assert same([type(samples[0])(samples[0].prompt_id, samples[0].sequences[:5], samples[0].domain,
                                  samples[0].metadata)],
                [type(ref[0])(ref[0].prompt_id, ref[0].sequences[:5], ref[0].domain, ref[0].metadata)])
    assert sum(s["failed"] for s in pool.stats()) == 1 and all(s["tenants"] == 0 for s in pool.stats())
    pool.shutdown()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.xdist_group(RAY_GROUP)
def test_a_killed_pool_actor_ends_its_tenants_as_infra_errors_and_is_replaced(ray_head):
    """An actor of the pool dies mid-rollout (SIGKILL-like ``ray.kill``): the tenants it hosted end as
    ``infra_error`` rollouts at their next turn, the other actor's tenants play on exactly as in process, and a
    fresh actor takes the dead one's place, so the next groups play in full (Report §6, faults)."""
    import ray

    tasks, engine = make_tasks(4, 13), SeededToyEngine(9)
    pool = HarnessPool(2, backend="ray", tool_threads=4)
    eps = pool.groups([(t.task_id, [ToyBuild(t)] * 4) for t in tasks])  # 16 tenants, 8 per actor
    victim = pool.hosts[0]
    lost = {tid for tid, h in pool.placement.items() if h is victim}
    ray.kill(victim)
    deadline = time.monotonic() + 60  # ray.kill is asynchronous: on a loaded machine the actor may serve calls first
    while time.monotonic() < deadline:
        try:
            ray.get(victim.ping.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            break
        except ray.exceptions.GetTimeoutError:
            continue
    samples = rollout.play(engine, eps, SETTINGS)
    ref = {q.sequence_id: q for s in reference(tasks, 4, engine) for q in s.sequences}
    played = [q for s in samples for q in s.sequences]
    assert len(played) == 16 and len(lost) == 8
    for q in played:
        if q.sequence_id in lost:
            assert q.finish_reason == "infra_error" and "pool host died" in q.metadata["infra_error"]
        else:
            assert q == ref[q.sequence_id]
    assert pool.replaced == 1 and pool.hosts[0] is not victim and len(pool.stats()) == 2
    again = make_tasks(2, 14)
    assert same(pooled(pool, again, 4, engine), reference(again, 4, engine))  # the new actor serves
    pool.shutdown()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.xdist_group(RAY_GROUP)
def test_ray_actor_per_rollout_matches(ray_head):
    tasks, engine = make_tasks(1, 12), SeededToyEngine(8)
    apr = ActorPerRollout(backend="ray")
    assert same(pooled(apr, tasks, 2, engine), reference(tasks, 2, engine))
    assert apr.created == 2 and apr.actors == 0


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.xdist_group(RAY_GROUP)
def test_ray_pool_runs_repo_world_episodes(ray_head, tmp_path):
    import random

    from mimo_kit.harness.config import ScriptedPolicy, get_harness
    from mimo_kit.harness.episode import ByteTokenizer, PolicyEngine
    from mimo_kit.train.toy import repo

    task = repo.make_repo_tasks(1, 0)[0]
    h = get_harness("mini-bash")
    replies = repo.expert_replies(task, h, "clean", random.Random(0))
    pool = HarnessPool(1, backend="ray", tool_threads=2)
    [(gid, eps)] = pool.groups([("repo", [RepoBuild(task, "mini-bash", str(tmp_path))] * 2)])

    class View:  # what PolicyEngine reads of an episode (the episodes themselves live in the actor)
        tok, view, policy_error = ByteTokenizer(), [], None

    engine = PolicyEngine({ep.tenant_id: (ScriptedPolicy(replies), View()) for ep in eps})
    settings = rollout.RolloutSettings(max_turns=8, max_action_tokens=10**9, stop_token_ids=(ByteTokenizer.end_id,))
    [sample] = rollout.play(engine, [(gid, eps)], settings)
    assert [q.passed for q in sample.sequences] == [True, True]
    assert all(q.metadata["finish"] == "submitted" for q in sample.sequences)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.xdist_group(RAY_GROUP)
def test_ray_porter_learner_reassembles_the_same_samples(ray_head):
    import ray

    tasks, engine = make_tasks(4, 13), SeededToyEngine(4, layers=8, k=2)
    worker = ray_rollout_worker(engine, SETTINGS)
    groups = [(t.task_id, [ToyBuild(t)] * 4) for t in tasks]
    manifests = ray.get(worker.run_built.remote(groups, True))  # the driver gets the control plane only
    assert all(isinstance(k, ray.ObjectRef) for m in manifests for k in m.keys)
    ref = reference(tasks, 4, engine)
    assert [m.rewards for m in manifests] == [[q.reward for q in s.sequences] for s in ref]

    @ray.remote(num_cpus=0)
    def learner(ms):  # another process fetches the payloads and builds the training tensors
        from mimo_kit.infra.porter import Porter, RayStore
        from mimo_kit.rl.trajectory import flatten

        samples = Porter(RayStore()).fetch(ms)
        return [s.to_dict() for s in samples], flatten(samples).routed_experts.sum().item()

    dicts, routed_sum = ray.get(learner.remote(manifests))
    assert dicts == [s.to_dict() for s in ref]
    assert routed_sum == flatten(ref).routed_experts.sum().item()
    assert same(Porter(RayStore()).fetch(manifests), ref)
    ray.kill(worker)


def test_a_head_that_misses_rays_start_deadline_is_started_again(monkeypatch):
    """Ray waits a fixed 30 s for a new raylet; on a loaded machine the start is tried again, other errors stand."""
    ray = require("ray", "`pip install -e .[ray]`")
    from mimo_kit.infra import pool

    calls = []

    class Ctx:
        address_info = {"gcs_address": "127.0.0.1:1", "node_ip_address": "127.0.0.1"}

    def init(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise Exception("The current node timed out during startup. This could happen because ...")
        return Ctx()

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(pool, "_kill_ray_children", lambda: None)
    assert start_local_head() == {"address": "127.0.0.1:1", "node_ip": "127.0.0.1"} and len(calls) == 2

    def broken(**kwargs):
        raise ValueError("bad object store size")

    monkeypatch.setattr(ray, "init", broken)
    with pytest.raises(ValueError, match="bad object store"):
        start_local_head()
    monkeypatch.setattr(ray, "init", lambda **kw: (_ for _ in ()).throw(Exception("timed out during startup")))
    with pytest.raises(Exception, match="timed out during startup"):
        start_local_head()


def test_reserved_ports_lie_below_the_ephemeral_range_and_bind():
    """Ray's agents bind their ports seconds after the pick: the pick stays out of the range the OS hands out."""
    import random
    import socket

    from mimo_kit.dist import reserved_port

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except OSError:
        low = 32768
    rng = random.Random(0)
    ports = {reserved_port(rng) for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) > 1
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free when picked (nothing here holds them)
