"""SGLangEngine without a GPU: the top-p candidate set rebuilt from top-k logprobs (Report §6.1), and the client
against request/response pairs transcribed from sglang 0.5.23's source (tests/fixtures/sglang_0.5.23.json, each
entry names its file), replayed by a loopback server."""

import http.server
import json
import math
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mimo_kit.infra.engine import GenerationRequest
from mimo_kit.infra.sglang import (
    SGLangEngine,
    SGLangError,
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
