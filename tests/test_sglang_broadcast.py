"""Several `mimo-kit serve` engines in one weight-update group (Report §6): one broadcast per tensor feeds them all,
in bf16 when the learner computes in bf16, and a server that dies leaves the group while the others keep taking
versions. The servers are real processes on 127.0.0.1 (`--device cpu`, gloo)."""

import pytest
import requests
import torch

from mimo_kit.infra.engine import GenerationRequest, InProcessEngine
from mimo_kit.infra.local_servers import local_servers
from mimo_kit.infra.serve import tiny_kit_model
from mimo_kit.infra.sglang import SGLangEngine, SGLangUnreachable, WeightBroadcast

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.usefixtures("one_thread")]
V = 40


@pytest.fixture(scope="module")
def servers():
    with local_servers(2, ["--random-kit", "--vocab-size", str(V), "--device", "cpu"], timeout=120) as s:
        yield s


def bf16_rounded(model):
    """``model`` with every floating-point weight rounded to bf16 (what a server takes from a bf16 wire)."""
    state = {k: v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    return model


def greedy(engine):
    (out,) = engine.generate([GenerationRequest("g", [1, 2, 3], 6, temperature=0.0)])
    return out


def test_nccl_is_refused_by_a_cpu_server(servers):
    r = requests.post(servers[0].url + "/init_weights_update_group", timeout=30, json={
        "master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2, "group_name": "x",
        "backend": "nccl"})
    assert r.status_code == 400 and "--device cuda" in r.json()["message"]
    info = requests.get(servers[0].url + "/server_info", timeout=30).json()
    assert (info["tp_size"], info["dp_size"], info["device"]) == (1, 1, "cpu")


def test_one_broadcast_feeds_every_server_and_a_dead_one_leaves_the_group(servers):
    engines = [SGLangEngine(s.url, timeout=60, weight_sync="dist", sync_dtype=torch.bfloat16, vocab_size=V)
               for s in servers]
    group = WeightBroadcast(engines)
    for version, seed in ((1, 1), (2, 2)):
        if version == 2:  # one server dies between versions
            servers[0].kill()
            servers[0].proc.wait(timeout=30)
        state = tiny_kit_model(V, seed=seed).state_dict()
        sent_before = group.broadcasts
        outcomes = []
        for e in engines:  # as a rollout service updates its engines, one after the other
            try:
                e.update_weights(state, version)
                outcomes.append("ok")
            except SGLangUnreachable:
                outcomes.append("gone")
        assert outcomes == (["ok", "ok"] if version == 1 else ["gone", "ok"])
        assert group.broadcasts - sent_before == len(state)  # one broadcast per tensor, whatever the server count
        want = greedy(InProcessEngine(bf16_rounded(tiny_kit_model(V, seed=seed))))
        for e, outcome in zip(engines, outcomes):
            if outcome == "ok":
                got = greedy(e)
                assert got.token_ids == want.token_ids and got.policy_version == version
                assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    assert requests.get(servers[1].url + "/model_info", timeout=30).json()["weight_version"] == "2"
    for e in engines:
        e.close()
