"""The kit against sglang 0.5.23's own code, read from its published wheel (tests/sglang_wheel.py): SGLang's
weight-group helper meets the kit's learner side, SGLang's request types accept what the client sends, and the
client reads answers built by SGLang's code. Without the wheel (no network) these tests skip; under CI they fail.

Wheel files used (under ``sglang/srt/``): ``utils/common.py`` ``init_custom_process_group``, ``utils/network.py``
``NetworkAddress``, ``model_executor/model_runner_components/weight_updater.py``
``WeightUpdater.receive_weights_from_distributed``, ``managers/io_struct.py`` (``GenerateReqInput`` and the
weight, pause, abort request structs), ``utils/msgspec_utils.py`` (how FastAPI validates those structs),
``sampling/sampling_params.py`` ``SamplingParams``, ``sampling/sampling_mask.py`` ``SamplingMaskChunk``,
``managers/schedule_batch.py`` ``FINISH_*``, ``layers/sampler.py``
``top_k_top_p_min_p_sampling_from_probs_torch``."""

import dataclasses
import http.server
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from mimo_kit.dist import free_port
from mimo_kit.infra.engine import GenerationRequest
from mimo_kit.infra.sglang import SGLangEngine

sys.path.insert(0, str(Path(__file__).parent))
from sglang_wheel import source_or_skip  # noqa: E402

TESTS = Path(__file__).parent
REPO = TESTS.parent
#: the acceptance bound: the group forms and one bf16 tensor arrives within this many seconds
GROUP_BOUND_S = 30.0
#: how long a process may take overall (starting Python and importing torch on a loaded 2-core machine included)
PROCESS_LIMIT_S = 180.0


@pytest.fixture(scope="module")
def wheel():
    return source_or_skip()


# ---- the weight group: SGLang's helper (server side) against the kit's (learner side) -------------------------
BARRIER = """
def barrier(folder, me, members):  # every process is up (Python, torch, the wheel's files) before the clock starts
    import os, pathlib, time
    pathlib.Path(folder, me).touch()
    while len(os.listdir(folder)) < members:
        time.sleep(0.05)
"""

SERVER = r"""
import datetime, json, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
from sglang_wheel import WheelSource

src = WheelSource({root!r})
init_custom_process_group = src.get("sglang.srt.utils.common", "init_custom_process_group")
NetworkAddress = src.get("sglang.srt.utils.network", "NetworkAddress")
receive = src.method("sglang.srt.model_executor.model_runner_components.weight_updater", "WeightUpdater",
                     "receive_weights_from_distributed")
tp_rank, tp_size = {tp_rank}, {tp_size}
{barrier}
barrier({ready!r}, "server%d" % tp_rank, {members})
# the server's own world first (its TP group), as SGLang's scheduler holds one before any weight group
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{tp_port}", rank=tp_rank, world_size=tp_size)
t0 = time.monotonic()
# WeightUpdater.init_weights_update_group: rank = rank_offset + tp_rank (the timeout is the test's bound; SGLang
# leaves torch's default)
pg = init_custom_process_group(backend="gloo", init_method=NetworkAddress("127.0.0.1", {port}).to_tcp(),
                               world_size={world}, rank={offset} + tp_rank, group_name={name!r},
                               timeout=datetime.timedelta(seconds={timeout}))

class Updater:  # the fields receive_weights_from_distributed reads
    device = "cpu"
    _model_update_group = {{{name!r}: pg}}

(got,) = receive(Updater(), names=["w"], dtypes=["bfloat16"], shapes=[{shape!r}], group_name={name!r})
print(json.dumps({{"rank": {offset} + tp_rank, "seconds": time.monotonic() - t0, "dtype": str(got[1].dtype),
                  "values": got[1].float().flatten().tolist()}}), flush=True)
"""

LEARNER = r"""
import datetime, json, sys, time
import torch, torch.distributed as dist
from mimo_kit.infra.weight_sync import send, weight_group
{barrier}
barrier({ready!r}, "learner", {members})
t0 = time.monotonic()
if {old_way}:  # a group on the store with one prefix of its own, not SGLang's path
    store = dist.TCPStore("127.0.0.1", {port}, {world}, is_master=True,
                          timeout=datetime.timedelta(seconds={timeout}))
    pg = dist.ProcessGroupGloo(dist.PrefixStore({name!r}, store), 0, {world}, datetime.timedelta(seconds={timeout}))
    opts = dist.BroadcastOptions()
    pg.broadcast([torch.zeros(1)], opts).wait()
else:
    g = weight_group("127.0.0.1", {port}, 0, {world}, group_name={name!r}, backend="gloo", timeout_s={timeout})
    t = (torch.arange({numel}, dtype=torch.float32).reshape({shape!r}) / 7 - 3).to(torch.bfloat16)
    send(g, [t])
print(json.dumps({{"seconds": time.monotonic() - t0}}), flush=True)
"""


def _run_group(root: Path, tp_size: int, ready: Path, *, old_way: bool = False,
               timeout: float = GROUP_BOUND_S) -> list:
    """The learner and ``tp_size`` server ranks (offsets 1 …), each in a process of its own, starting together once
    all are up (files in ``ready``) → their processes' (return code, stdout, stderr), learner first."""
    port, tp_port, name, shape = free_port(), free_port(), "mimo-kit-test-group", [3, 5]
    world = 1 + tp_size
    common = {"barrier": BARRIER, "ready": str(ready), "members": world}
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    learner = LEARNER.format(port=port, world=world, name=name, timeout=timeout, shape=shape, numel=15,
                             old_way=old_way, **common)
    procs = [subprocess.Popen([sys.executable, "-c", learner], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)]
    for tp_rank in range(tp_size):
        code = SERVER.format(tests=str(TESTS), root=str(root), tp_rank=tp_rank, tp_size=tp_size, tp_port=tp_port,
                             port=port, world=world, offset=1, name=name, timeout=timeout, shape=shape, **common)
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=PROCESS_LIMIT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        out.append((p.returncode, stdout, stderr))
    return out


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("tp_size", [1, 2], ids=["tp1", "tp2"])
def test_sglang_s_group_helper_meets_the_kit_s_learner(wheel, tp_size, tmp_path):
    """SGLang's ``init_custom_process_group`` (server ranks at offsets 1 … tp_size, its TP group initialised first)
    and the kit's :func:`~mimo_kit.infra.weight_sync.weight_group` (rank 0) form one group over gloo on
    127.0.0.1, and the learner's bf16 tensor reaches every server rank bit for bit, received by SGLang's own
    ``receive_weights_from_distributed``, within 30 s."""
    results = _run_group(wheel.root, tp_size, tmp_path)
    for rc, _, stderr in results:
        assert rc == 0, stderr[-3000:]
    want = ((torch.arange(15, dtype=torch.float32) / 7 - 3).to(torch.bfloat16)).float().tolist()
    ranks = []
    for _, stdout, _ in results[1:]:
        got = json.loads(stdout.strip().splitlines()[-1])
        assert got["dtype"] == "torch.bfloat16" and got["values"] == want
        assert got["seconds"] < GROUP_BOUND_S, got
        ranks.append(got["rank"])
    assert sorted(ranks) == list(range(1, tp_size + 1))


@pytest.mark.slow
@pytest.mark.distributed
def test_a_group_with_one_prefix_does_not_meet_sglang_s(wheel, tmp_path):
    """The control: a learner that wraps the store in one ``PrefixStore`` and builds its gloo group directly waits
    on other keys than SGLang's helper, and neither side forms a group (each gives up at its 8 s timeout)."""
    results = _run_group(wheel.root, 1, tmp_path, old_way=True, timeout=8.0)
    assert all(rc != 0 for rc, _, _ in results), [r[1] for r in results]
    for _, _, stderr in results:
        assert "timed out" in stderr.lower() or "timeout" in stderr.lower(), stderr[-2000:]


# ---- SGLang's request types against the client's payloads ------------------------------------------------------
IO = "sglang.srt.managers.io_struct"
ROUTE_TYPES = {
    "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
    "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
    "/begin_weight_update": "BeginWeightUpdateReqInput",
    "/end_weight_update": "EndWeightUpdateReqInput",
    "/pause_generation": "PauseGenerationReqInput",
    "/continue_generation": "ContinueGenerationReqInput",
    "/abort_request": "AbortReq",
}
VOCAB = 64


class SGLangShaped:
    """A loopback server that reads each body as sglang 0.5.23's FastAPI app does (pydantic through the type's
    own schema; a body it cannot read is 422) and answers as its handlers do; ``answers`` may replace a route's
    answer. Records (path, body)."""

    def __init__(self, wheel, answers: dict | None = None):
        from pydantic import TypeAdapter

        self.wheel, self.seen, self.errors = wheel, [], []
        self.answers = answers or {}
        self.adapters = {path: TypeAdapter(wheel.get(IO, name)) for path, name in ROUTE_TYPES.items()}
        self.generate_type = wheel.get(IO, "GenerateReqInput")
        self.adapters["/generate"] = TypeAdapter(self.generate_type)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/model_info":
                    return self._reply(200, {"model_path": "m", "weight_version": "default"})
                if self.path == "/server_info":
                    return self._reply(200, {"tp_size": 1, "dp_size": 1, "pp_size": 1})
                return self._reply(404, {"detail": "Not Found"})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else {}
                outer.seen.append((self.path, body))
                try:
                    obj = outer.adapters[self.path].validate_python(body)
                    outer.check(self.path, body, obj)
                except Exception as e:  # noqa: BLE001 - FastAPI's 422, with the reason kept for the test
                    outer.errors.append((self.path, f"{type(e).__name__}: {e}"))
                    return self._reply(422, {"detail": str(e)})
                if self.path in outer.answers:
                    return self._reply(200, outer.answers[self.path](body))
                if self.path == "/abort_request":
                    return self._reply(200, {})
                if self.path in ("/pause_generation", "/continue_generation"):
                    return self._reply(200, {"message": "ok", "status": "ok"})
                return self._reply(200, {"success": True, "message": "Success", "num_paused_requests": 0})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def check(self, path: str, body: dict, obj) -> None:
        """What the server does after parsing: no field it would ignore; a generate body normalised as the tokenizer
        manager does, each request's sampling params built and verified as the scheduler does."""
        import msgspec

        fields = ({f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj)
                  else {f.name for f in msgspec.structs.fields(type(obj))})
        ignored = sorted(set(body) - fields)
        if ignored:
            raise ValueError(f"{path}: fields {ignored} are not in {type(obj).__name__}: SGLang ignores them")
        if path == "/generate":
            SamplingParams = self.wheel.get("sglang.srt.sampling.sampling_params", "SamplingParams")
            obj.normalize_batch_and_arguments()
            for i in range(obj.batch_size):
                item = obj[i]
                sp = SamplingParams(**(item.sampling_params or {}))
                sp.normalize(None)
                sp.verify(VOCAB)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _answers(ids_of):
    """A /generate answer per request as the tokenizer manager shapes it, the tokens from ``ids_of(rid)``: top
    logprobs when asked, and a sampling set of the drawn token alone where ``return_sampling_mask`` asked."""
    def generate(body):
        out = []
        masks = body.get("return_sampling_mask") or [False] * len(body["rid"])
        for rid, mask in zip(body["rid"], masks):
            ids = ids_of(rid)
            meta = {"id": rid, "finish_reason": {"type": "length", "length": len(ids)}, "weight_version": "default",
                    "output_token_logprobs": [[-0.5, t, None] for t in ids]}
            if body.get("top_logprobs_num"):
                meta["output_top_logprobs"] = [[[-0.5, t, None]] for t in ids]
            if mask:
                meta.update({"output_token_sampling_mask": [[t] for t in ids],
                             "output_token_sampling_logprobs": [0.0 for _ in ids]})
            out.append({"text": "", "output_ids": ids, "meta_info": meta})
        return out
    return generate


def test_sglang_s_request_types_accept_every_payload_the_client_sends(wheel, tmp_path):
    srv = SGLangShaped(wheel, {"/generate": _answers(lambda rid: [3, 4])})
    try:
        eng = SGLangEngine(srv.url, seed=7, vocab_size=VOCAB, experts_per_token=2, weights_dir=tmp_path)
        reqs = [GenerationRequest("a", [1, 2, 3], 2, temperature=1.0, top_p=0.9, stop_token_ids=(5, 2)),
                GenerationRequest("b", [4], 2, temperature=0.0, return_candidates=True),
                GenerationRequest("c", [6, 7], 2, temperature=0.7, top_k=8, return_candidates=True),
                GenerationRequest("d", [8], 2, temperature=1.0, top_p=1.0, top_k=0, return_candidates=True)]
        eng.generate(reqs)
        eng.generate([GenerationRequest("e", [9, 10], 2, return_routed_experts=True)])
        eng.update_weights({"w": torch.ones(2, 2)}, 1)  # through the disk
        eng.pause_generation("retract")
        eng.continue_generation()
        eng.abort()
        eng.abort_request("a")
        eng.init_weights_update_group("127.0.0.1", 29500, 1, 3, "g", "gloo")
        with eng._weight_update_session():
            eng.update_weights_from_distributed(["w"], ["bfloat16"], [[2, 2]], 2, "g")
        eng.destroy_weights_update_group("g")
        eng.close()
    finally:
        srv.close()
    assert srv.errors == []
    sent = {path for path, _ in srv.seen}
    assert sent == set(ROUTE_TYPES) | {"/generate"}, sent
    first = next(b for p, b in srv.seen if p == "/generate")
    # sampling sets asked for where they stay within the server's limit: greedy, a top-k cut, a vocabulary of 64
    assert first["return_sampling_mask"] == [False, True, True, True]


def test_a_payload_sglang_would_not_read_is_caught(wheel):
    """The check above can fail: a field SGLang's type does not have, or a value of the wrong type."""
    srv = SGLangShaped(wheel)
    try:
        import requests

        bad_port = {"master_address": "h", "master_port": "x", "rank_offset": 1, "world_size": 2}
        r = requests.post(srv.url + "/init_weights_update_group", json=bad_port, timeout=10)
        r2 = requests.post(srv.url + "/update_weights_from_disk", json={"model_path": "/m", "version": "3"},
                           timeout=10)
        r3 = requests.post(srv.url + "/generate", json={"input_ids": [[1]], "sampling_params": [{"top_k": 0}]},
                           timeout=10)
    finally:
        srv.close()
    assert (r.status_code, r2.status_code, r3.status_code) == (422, 422, 422)
    assert "version" in srv.errors[1][1] and "top_k must be -1" in srv.errors[2][1]


# ---- answers built by SGLang's code --------------------------------------------------------------------------------
def test_sampling_sets_built_by_sglang_s_code_become_exact_candidates(wheel):
    """``output_token_sampling_mask`` as the tokenizer manager assembles it from a ``SamplingMaskChunk``
    (``to_lists``, selected mode) becomes the exact candidate sets with the within-set logprobs; a request the
    server aborts for an oversized set (its ``FINISH_ABORT``) is that request's error."""
    import numpy as np

    Chunk = wheel.get("sglang.srt.sampling.sampling_mask", "SamplingMaskChunk")
    FINISH_ABORT = wheel.get("sglang.srt.managers.schedule_batch", "FINISH_ABORT")
    FINISH_LENGTH = wheel.get("sglang.srt.managers.schedule_batch", "FINISH_LENGTH")
    from http import HTTPStatus

    # two tokens: sets {7, 9, 2} (7 drawn) and {4} (greedy-like), most likely first as the sampler packs them
    chunk = Chunk(lengths=np.array([3, 1], dtype=np.int32), token_ids=np.array([9, 7, 2, 4], dtype=np.int32),
                  logprobs=np.array([math.log(0.3 / 0.9), 0.0], dtype=np.float32))
    masks, within = chunk.to_lists(support_logprobs=False)
    overflow = FINISH_ABORT("Sampling support exceeds --sampling-mask-max-tokens=4096", HTTPStatus.BAD_REQUEST,
                            "BadRequestError").to_json()

    def generate(body):
        ok = {"text": "", "output_ids": [7, 4], "meta_info": {
            "id": body["rid"][0], "finish_reason": FINISH_LENGTH(2).to_json(), "weight_version": "3",
            "output_token_logprobs": [[-1.2, 7, None], [-0.01, 4, None]],
            "output_token_sampling_mask": masks, "output_token_sampling_logprobs": within,
            "output_token_sampling_mask_length": len(masks)}}
        if len(body["rid"]) == 1:
            return [ok]
        bad = {"text": "", "output_ids": [], "meta_info": {"id": body["rid"][1], "finish_reason": json.loads(
            json.dumps(overflow)), "weight_version": "3"}}
        return [ok, bad]

    srv = SGLangShaped(wheel, {"/generate": generate})
    try:
        eng = SGLangEngine(srv.url, vocab_size=VOCAB)
        ok, bad = eng.generate([GenerationRequest("x", [1], 2, temperature=1.0, top_p=0.9, return_candidates=True),
                                GenerationRequest("y", [1], 2, temperature=1.0, top_p=0.9, return_candidates=True)])
        follow = srv.seen[-1][1]
        eng.generate([GenerationRequest("z", [1], 2, temperature=1.0, top_p=0.9, return_candidates=True)])
    finally:
        srv.close()
    assert srv.errors == []
    assert ok.candidates == [[9, 7, 2], [4]] and ok.candidates_truncated == [False, False]
    assert ok.logprobs == pytest.approx([math.log(0.3 / 0.9), 0.0], abs=1e-6)
    assert bad.finish_reason == "error" and "sampling-mask-max-tokens" in bad.error
    assert follow["top_logprobs_num"] > 0  # before the server was seen to return sets: top logprobs as a fallback
    assert srv.seen[-1][1]["top_logprobs_num"] == 0  # after: the sets alone


def _sglang_support(sample, z: torch.Tensor, T: float, top_k: int, top_p: float) -> tuple[set[int], int]:
    """The support of SGLang's PyTorch sampler on logits z [V] (its filtered weights > 0) and the token it drew."""
    V = z.shape[-1]
    tok, filtered, idx, _ = sample((z / T).softmax(-1)[None], torch.tensor([top_k or V]), torch.tensor([top_p]),
                                   torch.tensor([0.0]), False, None, None, return_filtered_probs=True, max_top_k=V)
    return set(idx[0][filtered[0] > 0].tolist()), int(tok[0])


@pytest.mark.slow  # reading the sampler's file and its imports
@pytest.mark.outcome  # SGLang's sampler draws (torch.multinomial); the sets compared do not depend on the draw
def test_the_sets_mimo_kit_serve_returns_are_sglang_s_under_one_cut(wheel):
    """With top-k alone or top-p alone, the sets `mimo-kit serve` returns (its sampler's truncation,
    :func:`~mimo_kit.infra.serve.sampling_sets`) equal the support of SGLang's own PyTorch sampler
    (``top_k_top_p_min_p_sampling_from_probs_torch``, ``return_filtered_probs``) on the same logits, and the
    logprob within the set is log(p_a / Σ_C p) (seeded logits, 48 rows, no mass within 1e-6 of a cut)."""
    from mimo_kit.infra.serve import sampling_sets

    sample = wheel.get("sglang.srt.layers.sampler", "top_k_top_p_min_p_sampling_from_probs_torch")
    g = torch.Generator().manual_seed(0)
    for row in range(48):
        z = torch.randn(50, generator=g) * 3
        T = 0.8
        top_k, top_p = ([5, 20, 0, 0][row % 4], [1.0, 1.0, 0.9, 0.5][row % 4])
        p = (z / T).softmax(-1).sort(descending=True).values
        assert top_p == 1.0 or ((p.cumsum(0) - p - top_p).abs() > 1e-6).all()  # no tie at the top-p cut
        support, tok = _sglang_support(sample, z, T, top_k, top_p)
        sets, within = sampling_sets([z], [tok], T, top_k, top_p)
        assert set(sets[0]) == support, (row, top_k, top_p)
        lsm = (z / T).log_softmax(-1)
        assert within[0] == pytest.approx(float(lsm[tok] - torch.logsumexp(lsm[sets[0]], 0)), abs=1e-6)


def test_sglang_cuts_top_k_and_top_p_jointly(wheel):
    """With both cuts SGLang keeps the i-th most likely token iff i ≤ k and the raw mass before it is ≤ top_p
    (its top-p is not renormalised after the top-k cut; the flashinfer path samples with
    ``filter_apply_order="joint"``): on the chapter 6 example (0.5, 0.2, 0.15, 0.1, 0.05; k = 3, p = 0.75) that is
    {7, 3, 11}, where the kit's sampler, renormalising first, keeps {7, 3}. The client therefore asks for the
    server's own sets whenever a request has a cut, and flags a set rebuilt from top logprobs under both cuts."""
    from mimo_kit.infra.serve import sampling_sets
    from mimo_kit.infra.sglang import topp_from_top_logprobs

    sample = wheel.get("sglang.srt.layers.sampler", "top_k_top_p_min_p_sampling_from_probs_torch")
    probs = {7: 0.5, 3: 0.2, 11: 0.15, 4: 0.1, 8: 0.05}
    z = torch.full((12,), -30.0)
    for i, q in probs.items():
        z[i] = math.log(q)
    support, tok = _sglang_support(sample, z, 1.0, 3, 0.75)
    assert support == {7, 3, 11}
    kit = set(sampling_sets([z], [7], 1.0, 3, 0.75)[0][0])
    rebuilt, _ = topp_from_top_logprobs([(math.log(q), i) for i, q in probs.items()], top_p=0.75, top_k=3)
    assert kit == set(rebuilt) == {7, 3}


def test_the_rendezvous_address_is_written_as_sglang_writes_it(wheel):
    """The learner's ``tcp://`` address is the one the server builds from the same host and port
    (``NetworkAddress(host, port).to_tcp()``), IPv6 hosts in brackets."""
    from mimo_kit.infra.weight_sync import tcp_address

    NetworkAddress = wheel.get("sglang.srt.utils.network", "NetworkAddress")
    for host in ("127.0.0.1", "node-3", "::1", "[::1]", "fe80::1"):
        assert tcp_address(host, 29500) == NetworkAddress(host, 29500).to_tcp(), host
