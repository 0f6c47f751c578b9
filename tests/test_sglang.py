"""SGLangEngine without a GPU: the top-p candidate set rebuilt from top-k logprobs (Report §6.1), and the client
against request/response pairs transcribed from sglang 0.5.23's source (tests/fixtures/sglang_0.5.23.json, each
entry names its file), replayed by a loopback server."""

import http.server
import json
import math
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mimo_kit.infra.engine import GenerationRequest
from mimo_kit.infra.sglang import (
    SGLangEngine,
    SGLangError,
    SGLangUnreachable,
    decode_routed_experts,
    encode_routed_experts,
    topp_from_top_logprobs,
)
from mimo_kit.model.generate import truncate_logits


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(2, 60), scale=st.floats(0.1, 8.0),
       T=st.floats(0.3, 2.0), top_p=st.floats(0.05, 1.0), top_k=st.integers(0, 70), K=st.integers(1, 30))
def test_rebuilt_topp_set_equals_the_exact_one_when_it_fits(seed, V, scale, T, top_p, top_k, K):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(V, generator=g, dtype=torch.float64) * scale
    scaled = z / T
    exact = set(torch.isfinite(truncate_logits(scaled[None], top_k, top_p))[0].nonzero()[:, 0].tolist())
    lsm = scaled.log_softmax(-1)
    p = lsm.exp()
    # away from the boundary: no cumulative mass within rounding of top_p · Z (either path may round either way)
    order = p.argsort(descending=True)
    kk = top_k if 0 < top_k < V else V
    z_k = p[order[:kk]].sum()
    before = torch.cat([torch.zeros(1, dtype=p.dtype), p[order[:kk]].cumsum(0)[:-1]])
    assume(bool(((before - top_p * z_k).abs() > 1e-9).all()))
    top = lsm.topk(min(K, V))
    rows = [(float(v), int(i)) for v, i in zip(top.values, top.indices)]
    got, ok = topp_from_top_logprobs(rows, top_p=top_p, top_k=top_k, vocab_size=V)
    if ok:
        assert set(got) == exact
    else:
        assert len(exact) > K or 0 < top_k < V and top_k > K  # flagged only when the set may not fit
    if len(exact) <= K and not (top_k > K and top_k < V):
        assert ok  # it fits and the normaliser is known: exact
    assert got and got[0] == rows[0][1] and set(got) <= {i for _, i in rows}


def test_rebuilt_set_edge_cases():
    rows = [(-0.1, 5), (-3.0, 2), (-4.0, 9)]
    assert topp_from_top_logprobs(rows, top_p=0.5) == ([5], True)  # p(5) = 0.90 ≥ 0.5: the top token alone
    assert topp_from_top_logprobs(rows, top_p=1.0, top_k=2) == ([5, 2], True)  # top-k inside K: exact
    ids, ok = topp_from_top_logprobs(rows, top_p=1.0, vocab_size=40)
    assert ids == [5, 2, 9] and not ok  # the set reaches past the K returned tokens: flagged
    with pytest.raises(ValueError, match="top_logprobs_num"):
        topp_from_top_logprobs([], top_p=0.9)


def test_routed_experts_base64_roundtrip():
    t = torch.randint(0, 8, (7, 3, 2), dtype=torch.int32)  # [tokens, layers, k]
    assert torch.equal(decode_routed_experts(encode_routed_experts(t), 7, 2), t)


# ---- the client against sglang 0.5.23's own answers (tests/fixtures/sglang_0.5.23.json) -------------------------
FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "sglang_0.5.23.json").read_text())


class FakeSGLang:
    """A loopback HTTP server answering each route from a table of (status, body) or callables, recording what
    the client sent (method, path, headers, JSON body)."""

    def __init__(self, routes: dict):
        self.routes, self.seen = routes, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                body = json.loads(raw) if raw else None
                outer.seen.append((self.command, self.path, dict(self.headers), body))
                route = outer.routes.get(self.path, FIXTURES["not_found"])
                if callable(route):
                    route = route(body, dict(self.headers))
                data = route.get("text", "").encode() if "text" in route else json.dumps(route["body"]).encode()
                self.send_response(route["status"])
                self.send_header("Content-Type", "text/plain" if "text" in route else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _answer

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def paths(self):
        return [p for _, p, _, _ in self.seen]


def model_info(path: str, version: str = "default") -> dict:
    body = json.loads(json.dumps(FIXTURES["model_info"]["body"]).replace("MODEL_PATH", path))
    return {"status": 200, "body": {**body, "weight_version": version}}


@pytest.fixture
def fake():
    servers = []

    def make(routes):
        servers.append(FakeSGLang(routes))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def test_model_facts_come_from_model_info_and_the_checkpoint_config(fake, tmp_path):
    """/model_info carries no vocabulary or MoE top-k (0.5.23): they come from the checkpoint's config.json
    (nested text_config too), or from the caller; the weight version from /model_info, never /get_weight_version."""
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 248320, "num_experts_per_tok": 8}}))
    srv = fake({"/model_info": model_info(str(tmp_path), "5")})
    eng = SGLangEngine(srv.url)
    assert (eng.vocab_size, eng.experts_per_token, eng.policy_version) == (248320, 8, 5)
    srv.routes["/model_info"] = model_info(str(tmp_path), "6")
    assert eng.refresh_version() == 6
    assert "/get_weight_version" not in srv.paths() and set(srv.paths()) == {"/model_info"}
    other = SGLangEngine(srv.url, vocab_size=100, experts_per_token=2)  # the caller's facts win
    assert (other.vocab_size, other.experts_per_token) == (100, 2)
    unreadable = fake({"/model_info": model_info("Qwen/Qwen3.5-9B")})  # a Hub id the client cannot read
    eng2 = SGLangEngine(unreadable.url)
    assert (eng2.vocab_size, eng2.experts_per_token, eng2.policy_version) == (None, None, 0)  # "default" → 0


def test_an_older_server_is_read_through_get_model_info(fake):
    srv = fake({"/get_model_info": json.loads(json.dumps(FIXTURES["get_model_info_0.5.3"]).replace("MODEL_PATH", "m"))})
    eng = SGLangEngine(srv.url)
    assert eng.policy_version == 7 and eng.model_path == "m" and srv.paths() == ["/model_info", "/get_model_info"]


def test_a_batch_answer_is_read_in_request_order(fake):
    srv = fake({"/model_info": model_info("m"), "/generate": FIXTURES["generate_batch"]})
    eng = SGLangEngine(srv.url)
    reqs = [GenerationRequest(r, p, 4) for r, p in zip("abc", ([1, 2, 3], [4, 5], [6]))]
    outs = eng.generate(reqs)
    sent = srv.seen[-1][3]
    for key, value in FIXTURES["generate_batch"]["request"].items():
        assert sent[key] == value, key
    assert [o.finish_reason for o in outs] == ["stop", "length", "abort"]
    assert [o.token_ids for o in outs] == [[11, 12, 2], [13, 14], [15]]
    assert outs[0].logprobs == [-0.5, -1.25, -0.125] and all(o.error is None for o in outs)


def test_candidates_are_rebuilt_from_output_top_logprobs(fake):
    srv = fake({"/model_info": model_info("m"), "/generate": FIXTURES["generate_top_logprobs"]})
    eng = SGLangEngine(srv.url, vocab_size=16)
    (out,) = eng.generate([GenerationRequest("t", [1, 2], 1, temperature=1.0, top_p=0.75,
                                             return_candidates=True)])
    # probabilities 0.5, 0.3, 0.1, 0.02: the set ends once 0.75 of the mass is before a token → {7, 9}
    assert out.candidates == [[7, 9]] and out.candidates_truncated == [False]
    assert out.logprobs[0] == pytest.approx(math.log(0.5 / 0.8))  # log π(a | a ∈ C)
    assert srv.seen[-1][3]["top_logprobs_num"] > 0


def test_a_rejected_request_fails_only_itself(fake):
    """SGLang answers a batch holding one bad request with 400 for all of it; the client sends each alone and
    only the bad one comes back as finish_reason 'error' with the server's message."""
    def generate(body, headers):
        ids = body["input_ids"]
        if any(t >= 512 for p in ids for t in p):
            return FIXTURES["generate_rejected"]
        rid = body["rid"][0]
        return {"status": 200, "body": [{"output_ids": [3], "meta_info": {
            "id": rid, "finish_reason": {"type": "length", "length": 1}, "weight_version": "default",
            "output_token_logprobs": [[-0.1, 3, None]]}}]}
    srv = fake({"/model_info": model_info("m"), "/generate": generate})
    eng = SGLangEngine(srv.url)
    outs = eng.generate([GenerationRequest("ok1", [1], 1), GenerationRequest("bad", [99999], 1),
                         GenerationRequest("ok2", [2], 1)])
    assert [o.request_id for o in outs] == ["ok1", "bad", "ok2"]
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert "outside the vocabulary" in outs[1].error and outs[1].token_ids == []
    (alone,) = eng.generate([GenerationRequest("bad", [99999], 1)])
    assert alone.finish_reason == "error"


def test_an_in_band_abort_with_a_status_is_that_request_s_error(fake):
    body = json.loads(json.dumps(FIXTURES["generate_batch"]["body"]))
    body[1]["meta_info"]["finish_reason"] = FIXTURES["abort_in_band_400"]["finish_reason"]
    srv = fake({"/model_info": model_info("m"), "/generate": {"status": 200, "body": body}})
    outs = SGLangEngine(srv.url).generate([GenerationRequest(r, [1], 4) for r in "abc"])
    assert [o.finish_reason for o in outs] == ["stop", "error", "abort"] and "context length" in outs[1].error


def test_api_keys_go_as_bearer_tokens_admin_routes_with_the_admin_key(fake, monkeypatch):
    def guarded(want, answer):
        def route(body, headers):
            return answer if headers.get("Authorization") == f"Bearer {want}" else FIXTURES["unauthorized"]
        return route
    srv = fake({"/model_info": guarded("user", model_info("m")),
                "/pause_generation": guarded("admin", FIXTURES["pause_generation"]),
                "/continue_generation": guarded("admin", FIXTURES["continue_generation"])})
    with pytest.raises(SGLangError, match="401.*api.key"):
        SGLangEngine(srv.url)
    eng = SGLangEngine(srv.url, api_key="user", admin_api_key="admin")
    eng.pause_generation("retract")
    eng.continue_generation()
    assert [b for _, p, _, b in srv.seen if p.endswith("_generation")] == [{"mode": "retract"}, {}]  # bodies required
    monkeypatch.setenv("SGLANG_API_KEY", "user")
    assert SGLangEngine(srv.url).api_key == "user"  # from the environment: keys stay out of run configs


def test_weights_from_disk_go_by_absolute_path_and_a_refusal_says_why(fake, tmp_path, monkeypatch):
    srv = fake({"/model_info": model_info("m"), "/update_weights_from_disk": FIXTURES["update_weights_from_disk_ok"]})
    monkeypatch.chdir(tmp_path)
    eng = SGLangEngine(srv.url)
    eng.load_weights("runs/engine_weights/v1", 1)
    sent = srv.seen[-1][3]
    assert sent["model_path"] == str(tmp_path / "runs/engine_weights/v1") and sent["weight_version"] == "1"
    assert eng.policy_version == 1
    srv.routes["/update_weights_from_disk"] = FIXTURES["update_weights_from_disk_failed"]
    with pytest.raises(ValueError, match="repository not found"):
        eng.load_weights("runs/engine_weights/v2", 2)
    assert eng.policy_version == 1


def test_a_distributed_update_runs_inside_a_weight_update_session(fake):
    """0.5.23 refuses /update_weights_from_distributed outside /begin_weight_update … /end_weight_update."""
    srv = fake({"/model_info": model_info("m"), "/begin_weight_update": FIXTURES["begin_weight_update"],
                "/end_weight_update": FIXTURES["begin_weight_update"]})
    eng = SGLangEngine(srv.url)
    with eng._weight_update_session():
        assert srv.paths()[-1] == "/begin_weight_update"
    assert srv.paths()[-1] == "/end_weight_update"
    older = fake({"/model_info": model_info("m")})  # no session routes (404): updated without one
    with SGLangEngine(older.url)._weight_update_session():
        pass
    assert older.paths()[-1] == "/begin_weight_update"


# ---- sampling sets, group layout, disk folders, timeouts (sglang 0.5.23) -----------------------------------------
#: a /generate answer carrying the sampling sets, keys as managers/tokenizer_manager.py's _handle_batch_output
#: writes them from sampling/sampling_mask.py's SamplingMaskChunk.to_lists (selected mode: one logprob per token)
MASKED = {"status": 200, "body": [{"text": "", "output_ids": [9, 4], "meta_info": {
    "id": "m", "finish_reason": {"type": "length", "length": 2}, "weight_version": "default",
    "output_token_logprobs": [[-1.2, 9, None], [-0.01, 4, None]],
    "output_token_sampling_mask": [[7, 9, 2], [4]],
    "output_token_sampling_logprobs": [math.log(0.3 / 0.9), 0.0], "output_token_sampling_mask_length": 2}}]}


def test_the_server_s_sampling_sets_are_exact_candidates(fake):
    srv = fake({"/model_info": model_info("m"), "/generate": MASKED})
    eng = SGLangEngine(srv.url, vocab_size=50_000)
    (out,) = eng.generate([GenerationRequest("m", [1, 2], 2, temperature=1.0, top_p=0.95, return_candidates=True)])
    sent = srv.seen[-1][3]
    assert sent["return_sampling_mask"] == [True] and sent["top_logprobs_num"] > 0  # the fallback asked too
    assert out.candidates == [[7, 9, 2], [4]] and out.candidates_truncated == [False, False]
    assert out.logprobs == pytest.approx([math.log(0.3 / 0.9), 0.0])  # log π(a | a ∈ C), the server's
    eng.generate([GenerationRequest("m", [1, 2], 2, temperature=1.0, top_p=0.95, return_candidates=True)])
    assert srv.seen[-1][3]["top_logprobs_num"] == 0  # the server returns sets: no top logprobs any more
    # no cut and a vocabulary past the server's --sampling-mask-max-tokens: the whole vocabulary would abort it,
    # so the set is rebuilt from top logprobs
    srv.routes["/generate"] = FIXTURES["generate_top_logprobs"]
    (rebuilt,) = eng.generate([GenerationRequest("t", [1, 2], 1, temperature=1.0, top_p=1.0, return_candidates=True)])
    assert "return_sampling_mask" not in srv.seen[-1][3] and srv.seen[-1][3]["top_logprobs_num"] > 0
    assert rebuilt.candidates_truncated == [True]  # the whole vocabulary is not in the top logprobs


def test_a_set_rebuilt_under_top_k_and_top_p_is_flagged(fake):
    """SGLang cuts top-k and top-p jointly on the raw distribution; the rebuild from top logprobs renormalises
    after the top-k cut, so under both cuts it is flagged, never passed off as SGLang's set."""
    srv = fake({"/model_info": model_info("m"), "/generate": FIXTURES["generate_top_logprobs"]})
    eng = SGLangEngine(srv.url, vocab_size=16)
    (both,) = eng.generate([GenerationRequest("t", [1, 2], 1, temperature=1.0, top_p=0.75, top_k=3,
                                              return_candidates=True)])
    assert both.candidates_truncated == [True]


def _dist_server(fake, info, seen_init):
    def init(body, headers):
        seen_init.append(body)
        return {"status": 400, "body": {"success": False, "message": "Failed to initialize custom process group."}}
    return fake({"/model_info": model_info("m"), "/server_info": {"status": 200, "body": info},
                 "/init_weights_update_group": init})


def test_a_tensor_parallel_server_gets_a_group_of_one_plus_its_tp_ranks(fake):
    """The group's world is the learner plus every TP rank; a second server of one WeightBroadcast starts after
    the first's ranks. (The servers refuse the group here; what they were asked is the point.)"""
    from mimo_kit.infra.sglang import WeightBroadcast

    seen = []
    a = SGLangEngine(_dist_server(fake, {"tp_size": 2, "dp_size": 1}, seen).url, weight_sync="dist",
                     group_timeout_s=2)
    b = SGLangEngine(_dist_server(fake, {"tp_size": 1, "dp_size": 1}, seen).url, weight_sync="dist",
                     group_timeout_s=2)
    assert (a.tp_size, b.tp_size) == (2, 1)
    with pytest.raises(SGLangError, match="initialize"):
        a.update_weights({"w": torch.ones(2)}, 1)
    assert [(x["world_size"], x["rank_offset"]) for x in seen] == [(3, 1)]
    seen.clear()
    c = SGLangEngine(_dist_server(fake, {"tp_size": 2}, seen).url, weight_sync="dist", group_timeout_s=2)
    WeightBroadcast([c, b])
    with pytest.raises(SGLangError, match="initialize"):
        c.update_weights({"w": torch.ones(2)}, 1)
    time.sleep(1.0)  # the first refusal returns at once: the other member's request may land after it
    asked = [(x["world_size"], x["rank_offset"]) for x in seen]
    assert set(asked[:2]) == {(4, 1), (4, 3)}  # one group: c's two ranks at 1 and 2, b's one at 3
    # a member still waiting when the other refused is asked again alone (world 1 + its TP size)
    assert set(asked[2:]) <= {(3, 1), (2, 1)} and len(asked) <= 3
    with pytest.raises(SGLangError, match="initialize"):
        b.update_weights({"w": torch.ones(2)}, 1)  # the same version: its failure, not sent again
    assert len(seen) == len(asked)


def test_a_server_sglang_will_not_update_over_a_group_is_refused_by_name(fake):
    dp = fake({"/model_info": model_info("m"), "/server_info": {"status": 200, "body": {"tp_size": 2, "dp_size": 2}}})
    with pytest.raises(ValueError, match=r"dp_size=2.*data.parallel.*weight_sync='disk'"):
        SGLangEngine(dp.url, weight_sync="dist")
    assert SGLangEngine(dp.url).weight_sync == "disk"  # the disk path stays open
    pp = fake({"/model_info": model_info("m"), "/server_info": {"status": 200, "body": {"tp_size": 1, "pp_size": 2}}})
    with pytest.raises(ValueError, match="pp_size=2"):
        SGLangEngine(pp.url, weight_sync="dist")
    bare = fake({"/model_info": model_info("m")})  # no /server_info, no /get_server_info
    with pytest.raises(SGLangError, match="tp_size="):
        SGLangEngine(bare.url, weight_sync="dist")
    assert SGLangEngine(bare.url, weight_sync="dist", tp_size=4).tp_size == 4
    old = fake({"/model_info": model_info("m"), "/get_server_info": {"status": 200, "body": {"tp_size": 2}}})
    assert SGLangEngine(old.url, weight_sync="dist").tp_size == 2
    for bad in ({"tp_size": 0}, {"timeout": 0}, {"tries": 0}, {"sync_backend": "mpi"}, {"sync_dtype": torch.int8}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SGLangEngine(old.url, **bad)


def test_each_weights_folder_stays_until_the_next_version_is_adopted(fake, tmp_path):
    from safetensors.torch import load_file

    adopted = []

    def load(body, headers):
        adopted.append(body["model_path"])
        ok = "v3" not in body["model_path"]
        return FIXTURES["update_weights_from_disk_ok" if ok else "update_weights_from_disk_failed"]
    srv = fake({"/model_info": model_info("m"), "/update_weights_from_disk": load})
    eng = SGLangEngine(srv.url, weights_dir=tmp_path, sync_dtype=torch.bfloat16)
    state = {"w": torch.randn(3, 3, generator=torch.Generator().manual_seed(0)), "steps": torch.tensor([5]),
             "h": torch.ones(2, dtype=torch.float16)}
    eng.update_weights(state, 1)
    assert (tmp_path / "v1" / "model.safetensors").exists()  # the server serves from it now
    eng.update_weights(state, 2)
    assert not (tmp_path / "v1").exists() and (tmp_path / "v2" / "model.safetensors").exists()
    saved = load_file(tmp_path / "v2" / "model.safetensors")
    assert saved["w"].dtype == torch.bfloat16 and torch.equal(saved["w"], state["w"].to(torch.bfloat16))
    assert saved["steps"].dtype == torch.int64 and saved["h"].dtype == torch.float16  # narrowed only, never widened
    with pytest.raises(ValueError, match="repository not found"):
        eng.update_weights(state, 3)
    assert not (tmp_path / "v3").exists() and (tmp_path / "v2").exists()  # refused: the server still serves v2
    assert adopted == [str(tmp_path / f"v{i}") for i in (1, 2, 3)]


def test_a_timed_out_request_is_sent_again_then_the_engine_is_gone(fake, monkeypatch):
    """A /generate the server does not answer in time is sent again under fresh request ids (the stale ones
    aborted first); after the last try the engine is unreachable."""
    import mimo_kit.infra.sglang as sg

    monkeypatch.setattr(sg, "RETRY_BACKOFF_S", 0.05)
    calls = []

    def slow_then_fast(body, headers):
        calls.append(body["rid"])
        if len(calls) == 1:
            time.sleep(1.0)
        return {"status": 200, "body": [{"output_ids": [3], "meta_info": {
            "id": body["rid"][0], "finish_reason": {"type": "length", "length": 1}, "weight_version": "default",
            "output_token_logprobs": [[-0.1, 3, None]]}}]}
    srv = fake({"/model_info": model_info("m"), "/generate": slow_then_fast,
                "/abort_request": {"status": 200, "body": {}}})
    eng = SGLangEngine(srv.url, timeout=0.3, tries=2)
    (out,) = eng.generate([GenerationRequest("r", [1], 1)])
    assert out.request_id == "r" and out.token_ids == [3]
    assert calls == [["r"], ["r~retry1"]]
    assert [b for _, p, _, b in srv.seen if p == "/abort_request"] == [{"rid": "r"}]

    def never(body, headers):
        time.sleep(1.0)
        return FIXTURES["generate_batch"]
    gone = fake({"/model_info": model_info("m"), "/generate": never, "/abort_request": {"status": 200, "body": {}}})
    with pytest.raises(SGLangUnreachable, match=r"within 0.3 s \(2 tries\)"):
        SGLangEngine(gone.url, timeout=0.3, tries=2).generate([GenerationRequest("r", [1], 1)])
