"""The rollout-engine contract (Report §6): every engine passes these; parametrised over engine factories.

``ENGINES`` maps a name to (model factory, engine factory). ``serve`` is :class:`SGLangEngine`, the SGLang
native-API client, driving ``mimo-kit serve`` in a separate process on 127.0.0.1: the engine gets the test's
model through ``/update_weights_from_disk`` (a remote engine holds its own weights by construction).
"""

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from mimo_kit.infra import GenerationRequest, InProcessEngine, RolloutEngine, resume_request, teacher_forced_logprobs
from mimo_kit.infra.local_servers import local_servers
from mimo_kit.model import MiMoConfig, MiMoForCausalLM

V = 40

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest)



def kit_model(seed=0):
    torch.manual_seed(seed)
    cfg = MiMoConfig.preset("tiny", vocab_size=V, hidden_size=32, num_hidden_layers=2, global_layers=(0, 1),
                            intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4, head_dim=16,
                            v_head_dim=16, initializer_range=0.2)
    return MiMoForCausalLM(cfg)


def hf_model(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2)
    return LlamaForCausalLM(cfg).eval()


def hf_lora_model(seed=0):
    """A transformers model wrapped with a PEFT LoRA adapter (the distill path's policy)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(hf_model(seed), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                      init_lora_weights=False))
    return model.eval()


def save_kit_checkpoint(model, folder: Path) -> Path:
    """The kit decoder as a transformers checkpoint folder (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    from mimo_kit.model.hf import to_hf

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(to_hf(model.config).to_dict()))
    save_file({k: v.detach().contiguous().clone() for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def kit_server(tmp_path_factory):
    """``mimo-kit serve`` as a real process on a free loopback port, serving a kit-format checkpoint."""
    folder = save_kit_checkpoint(kit_model(0), tmp_path_factory.mktemp("served"))
    with local_servers(1, ["--model", str(folder)], timeout=60) as (server,):
        yield server.url


_SERVER: dict = {}


def remote_engine(model, seed=None, weight_sync="disk"):
    """SGLangEngine on ``mimo-kit serve`` holding ``model``'s weights at version 0 (sent the ``weight_sync`` way)."""
    from mimo_kit.infra.sglang import SGLangEngine

    # the model facts SGLang's /model_info does not carry come from the caller's model, as the trainer passes them
    eng = SGLangEngine(_SERVER["url"], seed=seed, timeout=60, weight_sync=weight_sync,
                       vocab_size=model.config.vocab_size, experts_per_token=model.config.num_experts_per_tok)
    eng.policy_version = 0  # each test starts the served weights over at version 0
    eng.update_weights(model.state_dict(), version=0)  # → POST /update_weights_from_disk, weight_version "0"
    return eng


def in_process(model, seed=0):
    return InProcessEngine(model, seed=seed)


def remote_engine_dist(model, seed=None):
    """The same, its weights sent over a torch.distributed group (gloo) instead of a folder."""
    return remote_engine(model, seed, weight_sync="dist")


ENGINES = {"kit": (kit_model, in_process), "hf": (hf_model, in_process), "hf-lora": (hf_lora_model, in_process),
           "serve": (kit_model, remote_engine), "serve-dist": (kit_model, remote_engine_dist)}


@pytest.fixture(params=[pytest.param(n, marks=pytest.mark.slow) if n.startswith("serve") else n
                        for n in sorted(ENGINES)])
def factory(request):
    if request.param.startswith("serve"):
        _SERVER["url"] = request.getfixturevalue("kit_server")
    make, engine = ENGINES[request.param]
    return request.param, make, engine


def progress(eng) -> int:
    """Tokens generated so far: the engine's counter, or ``mimo-kit serve``'s (``/server_info``, a kit field)."""
    if hasattr(eng, "tokens_generated"):
        return eng.tokens_generated
    import requests

    return requests.get(eng.url + "/server_info", timeout=10).json()["tokens_generated"]


def decoding(eng, request) -> tuple[threading.Thread, dict]:
    """Start ``eng.generate([request])`` in a thread and return once it is decoding: (thread, {"out": outputs})."""
    result: dict = {}
    th = threading.Thread(target=lambda: result.setdefault("out", eng.generate([request])))
    start = progress(eng)
    th.start()
    while progress(eng) == start and th.is_alive():
        time.sleep(0.001)
    return th, result


def _step_logsoftmax(model, ids) -> torch.Tensor:
    """log softmax(z) [V] of the next token after ``ids`` (T = 1), one full forward."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits if isinstance(model, MiMoForCausalLM) else model(input_ids=x).logits
    return logits[0, -1].float().log_softmax(-1)


def req(rid, prompt, n=8, **kw):
    return GenerationRequest(rid, list(prompt), n, **kw)


@pytest.mark.outcome  # samples (temperature 0.7 and 1.0); the `serve` engines are in the slow tier
def test_protocol_and_fields(factory):
    _, make, engine = factory
    eng = engine(make(), seed=1)
    assert isinstance(eng, RolloutEngine)
    outs = eng.generate([req("a", [1, 2, 3], 6), req("b", [4, 5], 4, temperature=0.7)])
    assert [o.request_id for o in outs] == ["a", "b"]
    for o, n in zip(outs, (6, 4)):
        assert len(o.token_ids) == len(o.logprobs) == n and o.finish_reason == "length"
        assert all(0 <= t < V for t in o.token_ids) and all(lp <= 0 for lp in o.logprobs)
        assert o.policy_version == 0


@pytest.mark.outcome
def test_logprobs_match_teacher_forcing(factory, no_near_ties):
    """The engine's rollout logprobs equal a fresh full forward of prompt + tokens (no cache drift)."""
    _, make, engine = factory
    model = make()
    eng = engine(model, seed=3)
    for T in (0.0, 1.0, 0.7):
        o = eng.generate([req("a", [3, 1, 4, 1, 5], 10, temperature=T)])[0]
        # cached decode and one full forward round differently; without router near ties they route alike
        no_near_ties(model, torch.tensor([[3, 1, 4, 1, 5] + o.token_ids[:-1]]))
        ref = teacher_forced_logprobs(model, [3, 1, 4, 1, 5], o.token_ids, temperature=T if T else 1.0)
        torch.testing.assert_close(torch.tensor(o.logprobs), ref, atol=2e-4, rtol=0)


def test_stop_tokens_and_greedy_batch_invariance(factory, no_near_ties):
    _, make, engine = factory
    model = make()
    eng = engine(model)
    prompts = [[1, 2, 3], [7, 8], [1, 2, 3], [9, 9, 9, 9]]
    together = eng.generate([req(str(i), p, 7, temperature=0.0) for i, p in enumerate(prompts)])
    alone = [eng.generate([req(str(i), p, 7, temperature=0.0)])[0] for i, p in enumerate(prompts)]
    # a batch and a single row round differently; without near ties their greedy tokens are equal
    for p, o in zip(prompts, alone):
        no_near_ties(model, torch.tensor([p + o.token_ids[:-1]]), greedy_from=len(p) - 1)
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert together[0].token_ids == together[2].token_ids
    stop = together[0].token_ids[2]
    o = eng.generate([req("s", [1, 2, 3], 7, temperature=0.0, stop_token_ids=(stop,))])[0]
    assert o.finish_reason == "stop" and o.token_ids[-1] == stop and stop not in o.token_ids[:-1]


@pytest.mark.outcome
def test_seeded_sampling_is_reproducible(factory):
    _, make, engine = factory
    m = make()
    a = engine(m, seed=5).generate([req("a", [1, 2], 12), req("b", [1, 2], 12)])
    eng = engine(m, seed=5)
    if not hasattr(eng, "rng_state"):  # a remote engine: seeds travel per request (sampling_seed), no stream
        b = eng.generate([req("a", [1, 2], 12), req("b", [1, 2], 12)])
        assert [o.token_ids for o in a] == [o.token_ids for o in b]
        assert a[0].token_ids != a[1].token_ids  # per-request seeds differ: a group's rollouts are not copies
        return
    state = eng.rng_state()
    b = eng.generate([req("a", [1, 2], 12), req("b", [1, 2], 12)])
    eng.set_rng_state(state)
    c = eng.generate([req("a", [1, 2], 12), req("b", [1, 2], 12)])
    assert a[0].token_ids != a[1].token_ids
    # the same calls on the same weights and random stream: equal bit for bit
    assert [o.token_ids for o in a] == [o.token_ids for o in b] == [o.token_ids for o in c]


def test_update_weights_and_version_stamp(factory, no_near_ties):
    _, make, engine = factory
    eng = engine(make(0))
    before = eng.generate([req("a", [1, 2, 3], 6, temperature=0.0)])[0]
    new = make(1)
    eng.update_weights(new.state_dict(), version=3)
    after = eng.generate([req("a", [1, 2, 3], 6, temperature=0.0)])[0]
    assert after.policy_version == 3 and before.policy_version == 0
    no_near_ties(new, torch.tensor([[1, 2, 3] + after.token_ids[:-1]]))  # decode and full forward route alike
    ref = teacher_forced_logprobs(new, [1, 2, 3], after.token_ids)
    torch.testing.assert_close(torch.tensor(after.logprobs), ref, atol=2e-4, rtol=0)
    with pytest.raises(ValueError, match="older"):
        eng.update_weights(new.state_dict(), version=2)
    with pytest.raises(ValueError, match="does not fit"):
        eng.update_weights({"nonsense.weight": torch.zeros(1)}, version=4)


def test_engine_keeps_its_own_weights(factory):
    """Training the policy in place must not change the engine until update_weights (staleness is real)."""
    _, make, engine = factory
    model = make()
    eng = engine(model)
    a = eng.generate([req("a", [1, 2], 5, temperature=0.0)])[0]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g))
    b = eng.generate([req("a", [1, 2], 5, temperature=0.0)])[0]
    assert a.logprobs == b.logprobs  # the same calls on the engine's unchanged weights: equal bit for bit


@pytest.mark.outcome
def test_abort_and_resume(factory):
    """abort() from another thread cuts the request; the continuation re-prefills and finishes the budget."""
    name, make, engine = factory
    eng = engine(make(), seed=2)
    r = req("a", [1, 2, 3], 120, temperature=1.0)
    th, result = decoding(eng, r)
    eng.abort()
    th.join()
    part = result["out"][0]
    assert part.finish_reason == "abort" and 0 < len(part.token_ids) < 120
    eng.update_weights(make(1).state_dict(), version=1)
    cont_req = resume_request(r, part)
    assert cont_req.prompt_ids == [1, 2, 3] + part.token_ids
    cont = eng.generate([cont_req])[0]
    assert cont.finish_reason == "length" and len(part.token_ids) + len(cont.token_ids) == 120
    assert cont.policy_version == 1 and part.policy_version == 0
    with pytest.raises(ValueError, match="only aborted"):
        resume_request(cont_req, cont)


@pytest.mark.outcome
def test_on_step_runs_while_decoding_and_may_cut_the_batch(factory):
    """``generate(on_step=...)``: the caller's hook runs while the engine decodes (between decode steps in process,
    every poll while a server decodes) and may abort; the requests then return what they have, as "abort"
    (partial rollouts grade and cut this way, Report §4.1)."""
    name, make, engine = factory
    eng = engine(make(), seed=2)
    calls = []

    def on_step():
        calls.append(time.perf_counter())
        if len(calls) >= 3:  # the third call on: by then the request is in flight on a server too
            eng.abort()

    outs = eng.generate([req("a", [1, 2, 3], 400, temperature=1.0), req("b", [4, 5], 400, temperature=1.0)],
                        on_step=on_step)
    assert len(calls) >= 3
    for o in outs:
        assert o.finish_reason == "abort" and len(o.token_ids) < 400 and len(o.logprobs) == len(o.token_ids)


@pytest.mark.outcome
def test_candidates_contain_sampled_token(factory, no_near_ties):
    _, make, engine = factory
    model = make()
    eng = engine(model, seed=4)
    o = eng.generate([req("a", [1, 2], 10, temperature=1.0, top_p=0.8, return_candidates=True)])[0]
    no_near_ties(model, torch.tensor([[1, 2] + o.token_ids[:-1]]))  # decode and full forwards route alike
    assert len(o.candidates) == 10
    for t, c in zip(o.token_ids, o.candidates):
        assert t in c and len(c) < V
    # the reported logprob is log π(a | a ∈ C) = log π(a) − log π(C) (Report §6.1)
    full = teacher_forced_logprobs(model, [1, 2], o.token_ids)
    for j, c in enumerate(o.candidates):
        if o.candidates_truncated and o.candidates_truncated[j]:
            continue  # approximate set: the renormalisation is approximate too
        lsm = _step_logsoftmax(model, [1, 2] + o.token_ids[:j])
        assert abs(o.logprobs[j] - (float(full[j]) - float(lsm[c].logsumexp(0)))) < 2e-4


def test_bad_requests_raise():
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        GenerationRequest("x", [1], 0)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        GenerationRequest("x", [], 3)
    with pytest.raises(ValueError, match="top_p=1.5"):
        GenerationRequest("x", [1], 3, top_p=1.5)
    with pytest.raises(TypeError, match="expected GenerationRequest"):
        InProcessEngine(kit_model()).generate([{"prompt_ids": [1]}])


def test_routed_experts_replay_reproduces_logprobs(no_near_ties):
    """R3 (Report §6.1): the experts recorded at rollout, replayed in a teacher-forced forward, give the same
    logprobs even after the router weights moved."""
    model = kit_model()
    eng = InProcessEngine(model, seed=0)
    prompts = [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8]]
    outs = eng.generate([req(str(i), p, 9, temperature=1.0, return_routed_experts=True, stop_token_ids=(7,))
                         for i, p in enumerate(prompts)])
    moved = kit_model()
    moved.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in moved.moe_layers():
            m.gate.weight.add_(torch.randn(m.gate.weight.shape, generator=g))
    n_layers = len(model.moe_layers())
    for p, o in zip(prompts, outs):
        routed = torch.tensor(o.routed_experts)  # [T + n, layers, k]
        assert routed.shape == (len(p) + len(o.token_ids), n_layers, model.config.num_experts_per_tok)
        replay = routed[:-1].permute(1, 0, 2)  # training feeds prompt + generated[:-1]
        ref = teacher_forced_logprobs(model, p, o.token_ids)
        torch.testing.assert_close(torch.tensor(o.logprobs), ref, atol=2e-4, rtol=0)
        free = teacher_forced_logprobs(moved, p, o.token_ids)
        replayed = teacher_forced_logprobs(moved, p, o.token_ids, routed_experts=replay)
        # replay forces the rollout's experts: the routing part of the mismatch is gone
        with model.capture_routing() as rec:
            teacher_forced_logprobs(model, p, o.token_ids)
        # batched decode and one forward round differently; without near ties the router's choices are equal
        no_near_ties(model, torch.tensor([p + o.token_ids[:-1]]))
        assert torch.equal(rec.indices, replay)
        assert not torch.allclose(free, replayed)


# ---- mimo-kit serve / SGLangEngine specifics (the server process above) ---------------------------------------
@pytest.mark.slow
@pytest.mark.outcome  # the last request samples on the server (temperature 1.0 by default)
def test_serve_bad_requests_get_sglang_errors(kit_server):
    """Bad requests get SGLang's 400 bodies, never a 500 or a dropped connection; the server keeps serving."""
    import requests

    url = kit_server + "/generate"
    r = requests.post(url, data="{not json", headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400 and r.json()["code"] == 400 and "JSON" in r.json()["message"]
    cases = [({"sampling_params": {"max_new_tokens": 2}}, "input_ids"),
             ({"input_ids": [1, V + 5]}, "vocabulary"),
             ({"input_ids": [1, 2], "sampling_params": {"top_p": 1.5}}, "top_p"),
             ({"input_ids": [1, 2], "sampling_params": {"top_k": 0}}, "top_k"),
             ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "temperature"),
             ({"input_ids": [1, 2], "sampling_params": {"frequency_penalty": 1.0}}, "not supported"),
             ({"input_ids": "abc"}, "input_ids"), ({"text": "hello"}, "token-in")]
    for body, word in cases:
        r = requests.post(url, json=body, timeout=10)
        assert r.status_code == 400 and word in r.json()["error"]["message"], (body, r.text)
    r = requests.post(kit_server + "/update_weights_from_disk", json={"model_path": "/nonexistent"}, timeout=10)
    assert r.status_code == 400 and r.json()["success"] is False
    r = requests.post(kit_server + "/pause_generation", json={"mode": "sideways"}, timeout=10)
    assert r.status_code == 400
    assert requests.post(url, json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}},
                         timeout=10).status_code == 200


@pytest.mark.slow
@pytest.mark.outcome  # the server samples (temperature 1.0 by default)
def test_serve_abort_one_request_in_flight(kit_server):
    """``/abort_request`` by rid cuts that request mid-decode; it comes back with "abort" and its tokens so far."""
    from mimo_kit.infra.sglang import SGLangEngine

    eng = remote_engine_at(kit_server)
    th, result = decoding(eng, req("cut-me", [1, 2], 400))
    eng.abort_request("cut-me")
    th.join(30)
    o = result["out"][0]
    assert o.finish_reason == "abort" and 0 < len(o.token_ids) < 400 and len(o.logprobs) == len(o.token_ids)
    with pytest.raises(Exception, match=r"http://127\.0\.0\.1:9/model_info"):
        SGLangEngine("http://127.0.0.1:9", timeout=2)  # nothing listens on port 9: the error names the URL


@pytest.mark.slow
@pytest.mark.outcome  # the server samples (temperature 1.0 by default)
def test_serve_pause_in_place_holds_and_continues(kit_server):
    """``/pause_generation`` in_place holds the decode loop; ``/continue_generation`` finishes the request."""
    eng = remote_engine_at(kit_server)
    th, result = decoding(eng, req("p", [3, 4], 200))
    eng.pause_generation("in_place")
    time.sleep(0.05)
    held = progress(eng)
    time.sleep(0.2)
    assert progress(eng) - held <= 1 and th.is_alive()  # at most the step in progress finished
    eng.continue_generation()
    th.join(30)
    assert result["out"][0].finish_reason == "length" and len(result["out"][0].token_ids) == 200


@pytest.mark.slow
def test_serve_routed_experts_follow_sglang_layout(kit_server, no_near_ties):
    """R3 over HTTP: SGLang's rows cover prompt + generated − 1 tokens; the client pads the last with −1."""
    model = kit_model(0)
    eng = remote_engine_at(kit_server, model)
    o = eng.generate([req("r", [1, 2, 3, 4], 6, temperature=0.0, return_routed_experts=True)])[0]
    routed = torch.tensor(o.routed_experts)  # [T + n, layers, k]
    assert routed.shape == (4 + 6, len(model.moe_layers()), model.config.num_experts_per_tok)
    assert (routed[-1] == -1).all()
    ids = torch.tensor([[1, 2, 3, 4] + o.token_ids[:-1]])
    no_near_ties(model, ids)
    with torch.no_grad(), model.capture_routing() as rec:
        model(ids)
    assert torch.equal(rec.indices.permute(1, 0, 2), routed[:-1].long())


def remote_engine_at(url, model=None):
    _SERVER["url"] = url
    return remote_engine(model if model is not None else kit_model(0))


@pytest.mark.slow
def test_weight_sync_over_a_group_equals_the_disk_path_and_fails_fast(kit_server, no_near_ties):
    """SGLang's init_weights_update_group / update_weights_from_distributed against mimo-kit serve (gloo): the
    server decodes with exactly the weights a folder would give it; a refused update (a name or shape the model
    lacks) comes back as a ValueError without waiting out the group's timeout, and the next update rebuilds the
    group; a malformed request is a 400 in SGLang's validation shape."""
    import requests

    from mimo_kit.infra.sglang import SGLangEngine

    _SERVER["url"] = kit_server
    disk, dist = remote_engine(kit_model(0)), remote_engine_dist(kit_model(0))
    for version, seed in ((1, 1), (2, 2)):
        new = kit_model(seed)
        # each version to the same server both ways, each followed by the same greedy request
        outs = []
        for eng in (disk, dist):
            eng.update_weights(new.state_dict(), version=version)
            outs.append(eng.generate([req("g", [1, 2, 3], 6, temperature=0.0)])[0])
        assert outs[0].token_ids == outs[1].token_ids and outs[1].policy_version == version
        torch.testing.assert_close(torch.tensor(outs[1].logprobs), torch.tensor(outs[0].logprobs), atol=1e-6, rtol=0)
        assert dist.last_sync_s > 0
    t0 = time.monotonic()
    bad = dict(kit_model(3).state_dict())
    key = next(iter(bad))
    bad[key] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="shape"):
        dist.update_weights(bad, version=3)
    with pytest.raises(ValueError, match="not one of its parameters"):
        dist.update_weights({"nonsense.weight": torch.zeros(2)}, version=3)
    assert time.monotonic() - t0 < 30  # refused at once, never the group's 600 s timeout
    dist.update_weights(kit_model(4).state_dict(), version=3)  # a fresh group
    assert dist.refresh_version() == 3
    r = requests.post(kit_server + "/update_weights_from_distributed", json={"names": ["a"], "dtypes": []})
    assert r.status_code == 400 and r.json()["object"] == "error"
    r = requests.post(kit_server + "/init_weights_update_group", json={"master_address": "127.0.0.1",
                                                                       "master_port": 1, "rank_offset": 1,
                                                                       "world_size": 2, "backend": "nccl"})
    assert r.status_code == 400 and "CUDA" in r.json()["message"]  # a CPU server refuses NCCL at once
    with pytest.raises(ValueError, match="weight_sync"):
        SGLangEngine(kit_server, weight_sync="nccl")
    dist.close()


def test_serve_refuses_non_loopback_hosts(capsys):
    from mimo_kit.cli import main
    from mimo_kit.infra.serve import check_host

    assert check_host("127.0.0.1") == "127.0.0.1" and check_host("::1") == "::1"
    for host in ("0.0.0.0", "192.168.1.10", "example.org"):
        with pytest.raises(ValueError, match="--allow-remote"):
            check_host(host)
    assert check_host("0.0.0.0", allow_remote=True) == "0.0.0.0"
    assert main(["serve", "--random-kit", "--host", "0.0.0.0"]) == 2  # refused before any model is built
    assert "--allow-remote" in capsys.readouterr().err


def test_ragged_batch_equals_one_request_at_a_time(no_near_ties):
    """The kit engine decodes prompts of different lengths in one batch (fast path): same greedy tokens."""
    model = kit_model()
    reqs = [GenerationRequest(f"r{i}", list(range(1, n + 1)), max_new_tokens=6, temperature=0.0)
            for i, n in enumerate((3, 7, 3, 12))]
    batched = InProcessEngine(model).generate(reqs)
    alone = [InProcessEngine(model).generate([r])[0] for r in reqs]
    # a ragged batch and a single row round differently; without near ties their greedy tokens are equal
    for r, a in zip(reqs, alone):
        no_near_ties(model, torch.tensor([r.prompt_ids + a.token_ids[:-1]]), greedy_from=len(r.prompt_ids) - 1)
    for b, a in zip(batched, alone):
        assert b.token_ids == a.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


@pytest.mark.slow
@pytest.mark.outcome  # the server samples the actions (temperature 1.0)
def test_partial_rollouts_on_a_server_cut_resume_and_stamp_each_token(kit_server):
    """Staleness-bounded partial rollouts with the engine out of process (Report §4.1): while the server decodes the
    long episodes' actions, the buffer grades the short ones; once a group is complete it cuts the actions in
    flight through /abort_request; after a weight update each cut action resumes by re-prefill under the new
    version, finishes its token budget, and every token keeps the version that sampled it."""
    from mimo_kit.infra.partial import PartialRolloutBuffer
    from mimo_kit.infra.rollout import Outcome, RolloutSettings, Turn, advance
    from mimo_kit.rl.trajectory import Segment

    class Ep:  # an episode of ``turns`` actions: the short groups end after one, the long after three
        def __init__(self, turns):
            self.turns, self.n = turns, 0

        def prompt(self):
            return [Segment("user", [1, 2, 3])]

        def act(self, action, reason):
            self.n += 1
            return Turn(observation=Segment("tool", [4]), done=self.n >= self.turns)

        def outcome(self):
            return Outcome(float(self.n), True)

    drawn = iter(range(100))

    def draw():
        k = next(drawn)
        return (f"short-{k}", [Ep(1), Ep(1)]) if k % 2 == 0 else (f"long-{k}", [Ep(3), Ep(3)])

    n_tok = 300
    settings = RolloutSettings(max_turns=4, max_action_tokens=n_tok, stop_token_ids=(), temperature=1.0)
    eng = remote_engine_at(kit_server)
    buf = PartialRolloutBuffer(group_size=2, staleness=2, in_flight=4)
    batch = buf.collect(eng, 1, draw, settings)
    assert len(batch) == 1 and batch[0].prompt_id.startswith("short")
    longs = [r for gid, rs in buf.groups if gid.startswith("long") for r in rs]
    cut = [r for r in longs if r.pending is not None]
    assert buf.aborted > 0 and cut  # cut mid-action by the server, tokens kept
    for r in cut:
        assert 0 <= len(r.pending[1].token_ids) < n_tok and set(r.pending_versions) <= {0}
    eng.update_weights(kit_model(1).state_dict(), version=1)
    advance(eng, longs, settings)  # the cut actions resume: re-prefill of prompt + tokens so far, version 1
    for r in cut:
        seg = r.contexts[-1][-2] if r.contexts[-1][-1].role == "tool" else r.contexts[-1][-1]
        assert seg.role == "assistant" and len(seg.token_ids) == n_tok == len(seg.logprobs)
        k = seg.policy_versions.index(1) if 1 in seg.policy_versions else n_tok
        assert seg.policy_versions == [0] * k + [1] * (n_tok - k) and k < n_tok


def test_serve_checks_api_keys_as_sglang_does():
    """`mimo-kit serve --api-key --admin-api-key`: /health stays open; other routes want the API key, the admin
    routes the admin key (401 {"error": "Unauthorized"} otherwise); the client sends each where it belongs."""
    import requests

    from mimo_kit.infra.sglang import SGLangEngine, SGLangError

    with local_servers(1, ["--random-kit", "--api-key", "user", "--admin-api-key", "admin"], timeout=60) as (srv,):
        assert requests.get(srv.url + "/health", timeout=10).status_code == 200
        r = requests.get(srv.url + "/model_info", timeout=10)
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"})
        with pytest.raises(SGLangError, match="401"):
            SGLangEngine(srv.url)
        user_only = SGLangEngine(srv.url, api_key="user")
        with pytest.raises(SGLangError, match="401"):
            user_only.pause_generation()  # an admin route: the API key is not enough
        eng = SGLangEngine(srv.url, api_key="user", admin_api_key="admin")
        eng.pause_generation()
        eng.continue_generation()
        out = eng.generate([req("k", [1, 2, 3], 2, temperature=0.0)])[0]
        assert len(out.token_ids) == 2 and out.finish_reason == "length"
        info = eng.model_info()
        assert "vocab_size" not in info and {"model_path", "weight_version", "model_type"} <= set(info)
        assert requests.get(srv.url + "/get_weight_version", timeout=10,
                            headers={"Authorization": "Bearer user"}).status_code == 404  # as in sglang 0.5.23
