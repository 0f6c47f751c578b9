"""``mimo-kit serve``: the kit's :class:`~mimo_kit.infra.engine.InProcessEngine` behind SGLang's native HTTP API.

The subset :class:`~mimo_kit.infra.sglang.SGLangEngine` uses (Report §6 "Engines"), as sglang 0.5.23 defines it
(``python/sglang/srt/entrypoints/http_server.py``, ``managers/io_struct.py``, ``utils/auth.py``):
``POST /generate``, ``POST /abort_request``, ``POST /update_weights_from_disk``, ``POST /pause_generation``,
``POST /continue_generation``, ``GET|POST /flush_cache``, ``GET /health``, ``GET /health_generate``,
``GET /ready``, ``GET /model_info`` (and its deprecated alias ``/get_model_info``), ``GET /server_info`` (and
``/get_server_info``; with SGLang's ``tp_size`` / ``dp_size`` / ``pp_size``, all 1: one process), and weight sync
over a torch.distributed group (:mod:`mimo_kit.infra.weight_sync`): ``POST /init_weights_update_group`` (the
server joins as rank ``rank_offset``, its only TP rank), ``POST /begin_weight_update``,
``POST /update_weights_from_distributed`` (inside a begin/end session, as 0.5.23 requires),
``POST /end_weight_update``, ``POST /destroy_weights_update_group``. Token-in/token-out only (``input_ids``; no
tokenizer, like SGLang's ``--skip-tokenizer-init``). There is no ``/get_weight_version`` (0.5.23 removed it): the
version is in ``/model_info`` and in every answer's ``meta_info``.

Device (``--device``): the model and its forwards live on ``cpu`` or ``cuda`` (``auto``: CUDA when there is one).
Weights sent over a group are received into tensors where the backend needs them: on that CUDA device under
``nccl`` (which carries CUDA tensors only, so a CPU server refuses it), on the CPU under ``gloo``; they are then
copied into the model. Sampling sets (``return_sampling_mask``): the server knows them, so it returns them as 0.5.23
does (``output_token_sampling_mask``, ``output_token_sampling_logprobs`` in the selected mode), computed from the
logits each token was drawn from with the sampler's own truncation.

Server: ``aiohttp.web`` (installed with the kit's dependencies): handlers stay on one event loop, so an
``/abort_request`` is served while a ``/generate`` decodes. Generation runs on **one** worker thread (the model is
not re-entrant); ``on_step`` between decode steps checks the abort set and the pause state. It binds 127.0.0.1 and
refuses any other address unless ``allow_remote`` (``--allow-remote``).

API keys as SGLang checks them: with ``api_key`` every route but ``/health*`` and ``/ready`` wants
``Authorization: Bearer <key>``; with ``admin_api_key`` the weight, pause, abort and flush routes want that key
instead (and the others are open unless ``api_key`` is set); a refused key is 401 {"error": "Unauthorized"}.

Errors as SGLang answers them: malformed JSON or wrong field types → 400 with {"object": "error", "message",
"type": "Bad Request", "param": null, "code": 400} (its ``RequestValidationError`` handler); a request the engine
rejects (ids out of vocabulary, bad sampling parameters) → 400 with {"error": {"message"}}
(``_create_error_response``), for the whole batch; a failed weight update → 400 with {"success": false, "message"}.

Kit extension (not in SGLang): ``tokens_generated`` and ``device`` in ``/server_info``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import ipaddress
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from mimo_kit.infra.engine import GenerationRequest, InProcessEngine
from mimo_kit.model.hf import read_checkpoint_state

LOOPBACK = ("127.0.0.1", "::1", "localhost")
#: SGLang sampling params the kit accepts at their defaults only (anything else is refused, never ignored)
_DEFAULTS_ONLY = {"n": 1, "min_new_tokens": 0, "ignore_eos": False, "min_p": 0.0, "frequency_penalty": 0.0,
                  "presence_penalty": 0.0, "repetition_penalty": 1.0, "stop": None, "json_schema": None,
                  "regex": None, "ebnf": None, "logit_bias": None}
_IGNORED = {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval"}


class BadRequest(ValueError):
    """A request SGLang would answer with 400."""


def check_host(host: str, allow_remote: bool = False) -> str:
    """``host`` if it is a loopback address, or anything with ``allow_remote``; else a ValueError."""
    loop = host in LOOPBACK
    if not loop:
        try:
            loop = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loop = False
    if not loop and not allow_remote:
        raise ValueError(f"mimo-kit serve binds loopback addresses only (got {host!r}); the server has no "
                         "authentication: pass --allow-remote to bind another address on purpose")
    return host


# ---- models ---------------------------------------------------------------------------------------------
def tiny_kit_model(vocab_size: int = 40, seed: int = 0) -> torch.nn.Module:
    """A tiny random kit decoder (tests, smoke runs)."""
    from mimo_kit.model import MiMoConfig, MiMoForCausalLM

    torch.manual_seed(seed)
    cfg = MiMoConfig.preset("tiny", vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, global_layers=(0, 1),
                            intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4, head_dim=16,
                            v_head_dim=16, initializer_range=0.2)
    return MiMoForCausalLM(cfg)


def load_model(path: str | Path) -> torch.nn.Module:
    """A model from a folder: a kit run folder (``config.yaml`` + ``model.safetensors``, written by
    :func:`~mimo_kit.pretrain.loop.run_pretrain`), a kit checkpoint in transformers format (``config.json`` with
    ``model_type`` mimo_v2_flash), or any transformers ``save_pretrained`` causal LM."""
    folder = Path(path)
    if (folder / "config.yaml").is_file() and (folder / "model.safetensors").is_file():
        import yaml
        from safetensors.torch import load_file

        from mimo_kit.model import MiMoConfig, MiMoForCausalLM

        run = yaml.safe_load((folder / "config.yaml").read_text()) or {}
        if not isinstance(run, dict) or not isinstance(run.get("model"), dict):
            raise ValueError(f"{folder / 'config.yaml'}: no 'model' section (expected a kit run's config)")
        model = MiMoForCausalLM(MiMoConfig.from_dict(run["model"]))
        model.load_state_dict(load_file(folder / "model.safetensors"))
        return model.eval()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: neither a kit run folder (config.yaml + model.safetensors) nor a "
                                "transformers checkpoint (config.json)")
    if json.loads((folder / "config.json").read_text()).get("model_type") == "mimo_v2_flash":
        from mimo_kit.model.hf import load_checkpoint

        return load_checkpoint(folder)[0].eval()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


# ---- the engine side --------------------------------------------------------------------------------------
def sampling_sets(step_logits: list[torch.Tensor], tokens: list[int], temperature: float, top_k: int,
                  top_p: float) -> tuple[list[list[int]], list[float]]:
    """Each drawn token's sampling set and its logprob within that set, as sglang 0.5.23's sampler reports them
    (``layers/sampler.py``: the ids of positive weight after top-k/top-p, most likely first, and
    log(p_a / Σ_{c ∈ C} p_c); greedy: the token alone and 0). The set is the kit sampler's own
    (:func:`~mimo_kit.model.generate.truncate_logits` of z / T), from the logits [V] the token was drawn from: the
    set this server sampled from. It equals SGLang's under one cut; under top-k and top-p together the kit
    renormalises after the top-k cut where SGLang cuts both on the raw distribution, so SGLang's set can be larger
    (``tests/test_sglang_wheel.py``)."""
    from mimo_kit.model.generate import truncate_logits

    sets, within = [], []
    for z, tok in zip(step_logits, tokens):
        if temperature == 0:
            sets.append([int(tok)])
            within.append(0.0)
            continue
        scaled = z.float() / temperature
        ids = torch.isfinite(truncate_logits(scaled[None], top_k, top_p))[0].nonzero()[:, 0]
        lsm = scaled.log_softmax(-1)
        ids = ids[lsm[ids].argsort(descending=True, stable=True)]
        sets.append(ids.tolist())
        within.append(float(lsm[tok] - torch.logsumexp(lsm[ids], 0)))
    return sets, within


class _RecordingEngine(InProcessEngine):
    """InProcessEngine that keeps each decode step's logits [B, V] (for ``output_top_logprobs``)."""

    def _generate_batch(self, reqs, version):
        self.step_logits: list[torch.Tensor] = []
        outs = super()._generate_batch(reqs, version)
        for b, o in enumerate(outs):
            o.step_logits = [self.step_logits[s][b] for s in range(len(o.token_ids))]  # [n][V]
        return outs

    def _forward(self, ids, cache, prefixes=None):
        logits, cache = super()._forward(ids, cache, prefixes)
        self.step_logits.append(logits)
        return logits, cache


@dataclasses.dataclass
class _Item:
    """One parsed ``/generate`` item: the kit request and SGLang's output options."""

    request: GenerationRequest
    return_logprob: bool
    top_logprobs_num: int
    logprob_start_len: int
    seed: int | None
    return_sampling_mask: bool = False


class KitServer:
    """The state behind the endpoints: the engine, its version, the abort set, the pause state."""

    api_key: str | None = None  # SGLang's --api-key / --admin-api-key (see the module docstring)
    admin_api_key: str | None = None
    weight_session = False  # between /begin_weight_update and /end_weight_update

    def __init__(self, model: torch.nn.Module, *, model_path: str | None = None, seed: int = 0,
                 prefix_cache_bytes: int = 0):
        self.engine = _RecordingEngine(model, seed=seed, copy_weights=False, prefix_cache_bytes=prefix_cache_bytes)
        self.device = next(self.engine.model.parameters()).device  # the model's, where its forwards run
        self.model_path = model_path
        self.vocab_size = int(self.engine.model.get_output_embeddings().weight.shape[0]) if not self.engine.is_kit \
            else self.engine.model.config.vocab_size
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="mimo-kit-generate")  # generation, weight loads
        self.lock = threading.Lock()  # the model: held by a generate (released while paused in place) or a load
        self.state = threading.Lock()  # inflight / cut
        self.inflight: set[str] = set()  # rids queued or decoding
        self.cut: set[str] = set()  # rids to abort at the next decode step
        self.running = threading.Event()  # set: not paused
        self.running.set()
        self.groups: dict[str, tuple[Any, str]] = {}  # weight-update groups by name → (WeightGroup, backend)
        self.receiving: set[str] = set()  # groups a /update_weights_from_distributed is receiving on

    # -- parsing --------------------------------------------------------------------------------------------
    def parse_generate(self, body: Any) -> tuple[list[_Item], bool]:
        """SGLang's ``GenerateReqInput`` (single or batch) → items, and whether the answer is a list."""
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object (GenerateReqInput)")
        if body.get("stream"):
            raise BadRequest("stream=true is not supported by mimo-kit serve")
        if body.get("text") is not None or body.get("input_embeds") is not None:
            raise BadRequest("mimo-kit serve is token-in only: pass input_ids (no tokenizer is loaded)")
        ids = body.get("input_ids")
        if ids is None:
            raise BadRequest("Either text, input_ids or input_embeds should be provided.")
        batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        prompts = ids if batch else [ids]
        n = len(prompts)

        def per(key: str, default: Any) -> list[Any]:
            v = body.get(key, default)
            if v is None:
                v = default
            if batch and isinstance(v, list) and key != "sampling_params":
                if len(v) != n:
                    raise BadRequest(f"{key} has {len(v)} entries for a batch of {n}")
                return v
            if batch and key == "sampling_params" and isinstance(v, list):
                if len(v) != n:
                    raise BadRequest(f"sampling_params has {len(v)} entries for a batch of {n}")
                return v
            return [v] * n

        rids = body.get("rid")
        if rids is None:
            rids = [uuid.uuid4().hex for _ in range(n)]
        elif batch and isinstance(rids, str):
            rids = [f"{rids}_{i}" for i in range(n)]
        elif not batch:
            rids = [rids]
        if len(rids) != n or not all(isinstance(r, str) for r in rids):
            raise BadRequest(f"rid must be a string (or one per prompt: {n})")
        items = []
        for i, (prompt, rid, sp, lp, top, start, mask) in enumerate(zip(
                prompts, rids, per("sampling_params", {}), per("return_logprob", False),
                per("top_logprobs_num", 0), per("logprob_start_len", -1), per("return_sampling_mask", False))):
            if not isinstance(prompt, list) or not prompt or not all(type(t) is int for t in prompt):
                raise BadRequest(f"input_ids[{i}] must be a non-empty list of integers")
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise BadRequest(f"The input_ids {bad[:5]} contain values outside the vocabulary "
                                 f"[0, {self.vocab_size}).")
            if not isinstance(top, int) or top < 0 or not isinstance(start, int):
                raise BadRequest(f"top_logprobs_num={top!r} (int >= 0) and logprob_start_len={start!r} (int) expected")
            if not isinstance(mask, bool):
                raise BadRequest(f"return_sampling_mask={mask!r}: a boolean (or one per prompt) expected")
            items.append(self._item(rid, prompt, sp, bool(lp), int(top), int(start),
                                    bool(body.get("return_routed_experts", False)), mask))
        if len(set(r.request.request_id for r in items)) != n:
            raise BadRequest("rid values in a batch must be distinct")
        return items, batch

    def _item(self, rid: str, prompt: list[int], sp: Any, lp: bool, top: int, start: int, routed: bool,
              mask: bool = False) -> _Item:
        if not isinstance(sp, dict):
            raise BadRequest("sampling_params must be an object")
        sp = dict(sp)
        for k, default in _DEFAULTS_ONLY.items():
            if k in sp and sp.pop(k) not in (default, None):
                raise BadRequest(f"sampling_params.{k} is not supported by mimo-kit serve (only {default!r})")
        for k in _IGNORED:
            sp.pop(k, None)
        known = {"temperature", "top_p", "top_k", "max_new_tokens", "stop_token_ids", "sampling_seed"}
        unknown = sorted(set(sp) - known)
        if unknown:
            raise BadRequest(f"unknown sampling_params: {unknown}")
        try:
            temperature = float(sp.get("temperature", 1.0) if sp.get("temperature") is not None else 1.0)
            top_p = float(sp.get("top_p", 1.0) if sp.get("top_p") is not None else 1.0)
            top_k = int(sp.get("top_k", -1) if sp.get("top_k") is not None else -1)
            max_new = int(sp.get("max_new_tokens", 128) if sp.get("max_new_tokens") is not None else 128)
            stops = tuple(int(t) for t in (sp.get("stop_token_ids") or ()))
            seed = None if sp.get("sampling_seed") is None else int(sp["sampling_seed"])
        except (TypeError, ValueError) as e:
            raise BadRequest(f"sampling_params: {e}") from e
        # SGLang's SamplingParams.verify (sampling/sampling_params.py), same messages
        if not (temperature >= 0.0 and temperature < float("inf")):
            raise BadRequest(f"temperature must be a non-negative finite number, got {temperature}.")
        if not 0.0 < top_p <= 1.0:
            raise BadRequest(f"top_p must be in (0, 1], got {top_p}.")
        if top_k < 1 and top_k != -1:
            raise BadRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
        if max_new < 1:
            raise BadRequest(f"max_new_tokens must be at least 1 in mimo-kit serve, got {max_new}.")
        try:
            req = GenerationRequest(rid, prompt, max_new, temperature=temperature, top_p=top_p,
                                    top_k=top_k if top_k > 0 else 0, stop_token_ids=stops,
                                    return_routed_experts=routed)
        except ValueError as e:
            raise BadRequest(str(e)) from e
        if routed and not self.engine.is_kit:
            raise BadRequest("return_routed_experts needs a MoE model that records its routing (the kit decoder)")
        return _Item(req, lp, top, start, seed, mask)

    # -- running (worker thread) ------------------------------------------------------------------------------
    def _on_step(self, rids: set[str]) -> None:
        if not self.running.is_set():  # paused in place: hold the decode loop, let weight loads run
            self.lock.release()
            try:
                self.running.wait()
            finally:
                self.lock.acquire()
        if self.cut & rids:
            self.engine.abort()

    def run_generate(self, items: list[_Item]) -> list[dict[str, Any]]:
        rids = {it.request.request_id for it in items}
        t0 = time.time()
        with self.lock:
            self.running.wait()
            version = self.engine.policy_version
            seeds = [it.seed for it in items if it.seed is not None]
            if seeds:  # one stream per batch: reseed from the batch's sampling_seed values
                self.engine.generator.manual_seed(hash(tuple(seeds)) & 0x7FFFFFFF)
            if self.cut & rids:
                outs = [self._aborted(it) for it in items]
            else:
                outs = self.engine.generate([it.request for it in items], on_step=lambda: self._on_step(rids))
            return [self._answer(it, o, version, t0) for it, o in zip(items, outs)]

    def _aborted(self, it: _Item):
        from mimo_kit.infra.engine import GenerationOutput

        return GenerationOutput(it.request.request_id, [], [], "abort", self.engine.policy_version)

    def _answer(self, it: _Item, o, version: int, t0: float) -> dict[str, Any]:
        r = it.request
        n = len(o.token_ids)
        if o.finish_reason == "stop":
            reason: dict[str, Any] = {"type": "stop", "matched": o.token_ids[-1]}
        elif o.finish_reason == "length":
            reason = {"type": "length", "length": n}
        else:
            reason = {"type": "abort", "message": "Aborted by /abort_request", "status_code": None,
                      "err_type": None}
        meta: dict[str, Any] = {"id": r.request_id, "finish_reason": reason, "prompt_tokens": len(r.prompt_ids),
                                "completion_tokens": n, "cached_tokens": 0, "weight_version": str(version),
                                "e2e_latency": time.time() - t0}
        if it.return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(o.logprobs, o.token_ids)]
            if it.top_logprobs_num:
                T = r.temperature if r.temperature > 0 else 1.0
                rows = []
                for z in getattr(o, "step_logits", [])[:n]:
                    top = (z.float() / T).log_softmax(-1).topk(min(it.top_logprobs_num, z.shape[-1]))
                    rows.append([[float(v), int(i), None] for v, i in zip(top.values, top.indices)])
                meta["output_top_logprobs"] = rows
            if it.logprob_start_len >= 0:
                meta["input_token_logprobs"] = self._input_logprobs(r.prompt_ids, it.logprob_start_len)
        if it.return_sampling_mask:  # 0.5.23's meta_info keys (managers/tokenizer_manager.py), selected mode
            sets, within = sampling_sets(getattr(o, "step_logits", [])[:n], o.token_ids, r.temperature, r.top_k,
                                         r.top_p)
            meta.update({"output_token_sampling_mask": sets, "output_token_sampling_logprobs": within,
                         "output_token_sampling_mask_length": len(sets)})
        if r.return_routed_experts and o.routed_experts is not None:
            from mimo_kit.infra.sglang import encode_routed_experts

            # SGLang covers [0, seqlen − 1): the last sampled token is never fed back
            meta["routed_experts"] = encode_routed_experts(torch.tensor(o.routed_experts)[:-1])
        return {"text": "", "output_ids": list(o.token_ids), "meta_info": meta}

    def _input_logprobs(self, prompt: list[int], start: int) -> list[list[Any]]:
        """[(logprob, id, None)] of prompt positions start.. (the first prompt token has none, as in SGLang)."""
        m = self.engine.model
        ids = torch.tensor([prompt], device=self.engine.device)
        with torch.no_grad():
            logits = (m(ids) if self.engine.is_kit else m(input_ids=ids)).logits[0].float().cpu()  # [T, V]
        lsm = logits.log_softmax(-1)
        out = [[None if i == 0 else float(lsm[i - 1, t]), t, None] for i, t in enumerate(prompt)]
        return out[start:]

    def run_update(self, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            raise BadRequest("model_path (a string) is required")
        if body.get("abort_all_requests"):
            self.abort(None, True)
        with self.lock:
            status, out = self._load(lambda: read_checkpoint_state(body["model_path"]), body.get("weight_version"))
            if status == 200:
                self.model_path = body["model_path"]
        return status, out

    def _load(self, state_of, wv: Any) -> tuple[int, dict[str, Any]]:
        """Load ``state_of()`` into the engine as version ``wv`` (default: the current one + 1); the lock is held."""
        old = self.engine.policy_version
        try:
            new = old + 1 if wv is None else int(wv)
        except (TypeError, ValueError):
            return 400, {"success": False, "message": f"weight_version {wv!r}: mimo-kit serve counts versions as "
                         "integers", "num_paused_requests": 0}
        try:
            state = state_of()
            self.engine.policy_version = min(old, new)  # SGLang sets any version; the engine checks order
            self.engine.update_weights(state, new)
        except (FileNotFoundError, ValueError, RuntimeError) as e:
            self.engine.policy_version = old
            return 400, {"success": False, "message": f"Failed to update weights: {e}", "num_paused_requests": 0}
        return 200, {"success": True, "message": f"Succeeded to update model weights. Weight version updated to "
                     f"{new}.", "num_paused_requests": 0}

    # -- weight sync over a torch.distributed group (SGLang's protocol, mimo_kit.infra.weight_sync) ----------
    def run_init_group(self, body: Any) -> tuple[int, dict[str, Any]]:
        """``/init_weights_update_group``: join a group as rank ``rank_offset`` (one process: TP rank 0 of 1),
        formed as SGLang forms it; blocks until every member joined. ``nccl`` needs this server on CUDA."""
        from mimo_kit.infra.weight_sync import DEFAULT_GROUP, weight_group

        if not isinstance(body, dict):
            raise BadRequest("the body must be an object (InitWeightsUpdateGroupReqInput)")
        for key, kind in (("master_address", str), ("master_port", int), ("rank_offset", int), ("world_size", int)):
            if not isinstance(body.get(key), kind) or isinstance(body.get(key), bool):
                raise BadRequest(f"{key} ({kind.__name__}) is required")
        name, backend = body.get("group_name", DEFAULT_GROUP), body.get("backend", "nccl")
        if name in self.groups:
            return 400, {"success": False, "message": f"group {name!r} exists already; destroy it first"}
        if backend == "nccl" and self.device.type != "cuda":
            return 400, {"success": False, "message": f"Failed to init group: backend 'nccl' carries CUDA tensors "
                         f"and this server runs on {self.device.type}; start it with --device cuda, or send "
                         "backend 'gloo'"}
        try:
            self.groups[name] = (weight_group(body["master_address"], body["master_port"], body["rank_offset"],
                                              body["world_size"], group_name=name, backend=backend), backend)
        except (ValueError, RuntimeError, OSError) as e:  # a bad backend or rank, or the learner never came
            return 400, {"success": False, "message": f"Failed to init group: {e}"}
        return 200, {"success": True, "message": "Succeeded to initialize custom process group."}

    def run_update_distributed(self, body: Any) -> tuple[int, dict[str, Any]]:
        """``/update_weights_from_distributed``: receive ``names`` (of ``dtypes`` and ``shapes``) from rank 0 of the
        group in order, then load them as ``weight_version``. Names or shapes the model does not have are refused
        before anything is received."""
        from mimo_kit.infra.weight_sync import DEFAULT_GROUP, parse_dtype, receive

        if not isinstance(body, dict):
            raise BadRequest("the body must be an object (UpdateWeightsFromDistributedReqInput)")
        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)) or not (
                len(names) == len(dtypes) == len(shapes)):
            raise BadRequest("names, dtypes and shapes (lists of one length) are required")
        if not self.weight_session:  # sglang 0.5.23's weight updater, same message
            return 400, {"success": False, "message": "update_weights_from_distributed must run between "
                         "begin_weight_update() and end_weight_update()"}
        group, backend = self.groups.get(body.get("group_name", DEFAULT_GROUP), (None, None))
        fail = lambda msg: (400, {"success": False, "message": f"Failed to update weights: {msg}"})  # noqa: E731
        if group is None:
            return fail(f"no group {body.get('group_name', DEFAULT_GROUP)!r}; call /init_weights_update_group first")
        own = self.engine.model.state_dict()
        for n, dt, shape in zip(names, dtypes, shapes):
            try:
                parse_dtype(dt)
            except ValueError as e:
                return fail(str(e))
            if n not in own:
                return fail(f"state dict does not fit the engine's model: {n!r} is not one of its parameters")
            if list(own[n].shape) != list(shape):
                return fail(f"state dict does not fit the engine's model: {n!r} has shape {list(own[n].shape)}, "
                            f"the request says {shape}")
        if body.get("abort_all_requests"):
            self.abort(None, True)
        name = body.get("group_name", DEFAULT_GROUP)
        self.receiving.add(name)
        try:  # nccl carries CUDA tensors (the model's device), gloo receives on the CPU; the load copies them over
            got = receive(group, names, dtypes, shapes, self.device if backend == "nccl" else "cpu")
        except RuntimeError as e:  # the learner went away mid-broadcast
            return fail(f"broadcast failed: {e}")
        finally:
            self.receiving.discard(name)
        with self.lock:
            return self._load(lambda: {**own, **got}, body.get("weight_version"))

    def run_destroy_group(self, body: Any) -> tuple[int, dict[str, Any]]:
        from mimo_kit.infra.weight_sync import DEFAULT_GROUP

        name = (body or {}).get("group_name", DEFAULT_GROUP) if isinstance(body, dict) else DEFAULT_GROUP
        group, _ = self.groups.pop(name, (None, None))
        if group is None:
            return 400, {"success": False, "message": "The group to be destroyed does not exist."}
        try:  # a group still receiving (its learner gave up halfway) is abandoned: shutting it down would wait
            group.abandon() if name in self.receiving else group.destroy()
        except (RuntimeError, ValueError) as e:
            return 400, {"success": False, "message": f"Failed to destroy custom process group: {e}."}
        return 200, {"success": True, "message": "Succeeded to destroy custom process group."}

    # -- control (event loop) --------------------------------------------------------------------------------
    def abort(self, rid: str | None, abort_all: bool) -> None:
        """Mark requests to cut: a running one stops at its next decode step (``_on_step``), a queued one returns
        at once with no tokens; an unknown ``rid`` is ignored, as in SGLang."""
        with self.state:
            self.cut |= set(self.inflight) if abort_all else ({rid} & self.inflight)

    def admit(self, rids: set[str]) -> str | None:
        """Register rids as in flight; the first one already in flight, if any (refused)."""
        with self.state:
            clash = sorted(rids & self.inflight)
            if clash:
                return clash[0]
            self.inflight |= rids
            return None

    def release(self, rids: set[str]) -> None:
        with self.state:
            self.inflight -= rids
            self.cut -= rids


# ---- HTTP -----------------------------------------------------------------------------------------------
def build_app(server: KitServer):
    from aiohttp import web

    def error(message: str, status: int = 400) -> web.Response:  # SGLang's _create_error_response
        return web.json_response({"error": {"message": message}}, status=status)

    def validation(message: str) -> web.Response:  # SGLang's RequestValidationError handler (ErrorResponse)
        return web.json_response({"object": "error", "message": message, "type": "Bad Request", "param": None,
                                  "code": 400}, status=400)

    async def body_of(request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise web.HTTPException() from e

    async def parse(request: web.Request) -> tuple[Any, web.Response | None]:
        try:
            return await body_of(request), None
        except web.HTTPException as e:
            return None, validation(f"JSON decode error: {e.__cause__}")

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def model_info(request: web.Request) -> web.Response:  # sglang 0.5.23's 14 keys, no model config
        m = server.engine.model
        cfg = getattr(m, "config", None)
        return web.json_response({
            "model_path": server.model_path, "served_model_name": server.model_path, "tokenizer_path": None,
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": str(server.engine.policy_version), "load_format": "safetensors",
            "reasoning_parser": None, "tool_call_parser": None, "disaggregation_mode": "null",
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": getattr(cfg, "model_type", None), "architectures": [type(m).__name__]})

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": server.model_path, "version": "mimo-kit", "frontend": "python",
                                  "tp_size": 1, "dp_size": 1, "pp_size": 1, "device": server.device.type,
                                  "weight_version": str(server.engine.policy_version),
                                  "tokens_generated": server.engine.tokens_generated,
                                  "paused": not server.running.is_set(), "inflight": len(server.inflight)})

    async def session(request: web.Request) -> web.Response:  # /begin_weight_update, /end_weight_update
        body, bad = await parse(request)
        if bad is not None:
            return bad
        begin = request.path == "/begin_weight_update"
        if begin == server.weight_session:
            return web.json_response({"success": False, "message": (
                "a weight-update session is already open; call end_weight_update() first" if begin else
                "no weight-update session is open; call begin_weight_update() first")}, status=400)
        server.weight_session = begin
        return web.json_response({"success": True, "message": "Success"})

    async def generate(request: web.Request) -> web.Response:
        body, bad = await parse(request)
        if bad is not None:
            return bad
        try:
            items, batch = server.parse_generate(body)
        except BadRequest as e:
            return error(str(e))
        rids = {it.request.request_id for it in items}
        clash = server.admit(rids)
        if clash is not None:
            return error(f"rid {clash!r} is already in flight")
        try:
            answers = await asyncio.get_running_loop().run_in_executor(server.worker, server.run_generate, items)
        except (ValueError, TypeError) as e:
            return error(str(e))
        finally:
            server.release(rids)
        return web.json_response(answers if batch else answers[0])

    async def abort_request(request: web.Request) -> web.Response:
        body, bad = await parse(request)
        if bad is not None:
            return bad
        if not isinstance(body, dict):
            return validation("the body must be an object (AbortReq)")
        server.abort(body.get("rid"), bool(body.get("abort_all", False)))
        return web.Response(status=200)

    def weight_route(run):  # a blocking weight call: off the event loop, and off the generation worker (a decode
        # loop paused in place must not block an update)
        async def handler(request: web.Request) -> web.Response:
            body, bad = await parse(request)
            if bad is not None:
                return bad
            try:
                status, out = await asyncio.get_running_loop().run_in_executor(None, run, body)
            except BadRequest as e:
                return validation(str(e))
            return web.json_response(out, status=status)
        return handler

    async def pause(request: web.Request) -> web.Response:
        body, bad = await parse(request)
        if bad is not None:
            return bad
        mode = (body or {}).get("mode", "abort") if isinstance(body, dict) else None
        if mode not in ("abort", "retract", "in_place"):
            return validation(f"Invalid mode: {mode!r}. Expected one of ['abort', 'retract', 'in_place'].")
        server.running.clear()
        if mode == "abort":
            server.abort(None, True)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def cont(request: web.Request) -> web.Response:
        server.running.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(request: web.Request) -> web.Response:
        # the kit keeps no prefix cache across requests; SGLang refuses while requests run
        ok = not server.inflight
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are running "
                            "or waiting requests, the operation will not be performed.)\n", status=200 if ok else 400)

    @web.middleware
    async def auth(request: web.Request, handler):  # SGLang's decide_request_auth (utils/auth.py)
        path = request.path
        if request.method == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")):
            return await handler(request)
        from mimo_kit.infra.sglang import ADMIN_PATHS

        want = (server.admin_api_key or server.api_key) if path in ADMIN_PATHS else server.api_key
        if want:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token, want):
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    app = web.Application(client_max_size=64 * 1024 ** 2, middlewares=[auth])
    app.add_routes([
        web.get("/health", health), web.get("/health_generate", health), web.get("/ready", health),
        web.get("/model_info", model_info), web.get("/get_model_info", model_info),
        web.get("/server_info", server_info), web.get("/get_server_info", server_info),
        web.post("/begin_weight_update", session), web.post("/end_weight_update", session),
        web.post("/generate", generate), web.put("/generate", generate), web.post("/abort_request", abort_request),
        web.post("/update_weights_from_disk", weight_route(server.run_update)), web.post("/pause_generation", pause),
        web.post("/continue_generation", cont), web.get("/flush_cache", flush_cache),
        web.post("/init_weights_update_group", weight_route(server.run_init_group)),
        web.post("/update_weights_from_distributed", weight_route(server.run_update_distributed)),
        web.post("/destroy_weights_update_group", weight_route(server.run_destroy_group)),
        web.post("/flush_cache", flush_cache)])
    return app


def serve(model: torch.nn.Module, *, host: str = "127.0.0.1", port: int = 30000, allow_remote: bool = False,
          model_path: str | None = None, seed: int = 0, api_key: str | None = None,
          admin_api_key: str | None = None, prefix_cache_bytes: int = 0, device: str = "auto") -> None:
    """Run the server until interrupted (blocking); ``prefix_cache_bytes`` > 0: the engine keeps each finished
    request's KV and prefills a prompt that extends one over its suffix only (:mod:`mimo_kit.infra.prefix_cache`);
    ``device``: ``auto`` (CUDA when there is one), ``cpu`` or ``cuda``, where the model runs."""
    from aiohttp import web

    from mimo_kit.dist import resolve_device

    check_host(host, allow_remote)
    server = KitServer(model.to(resolve_device(device)), model_path=model_path, seed=seed,
                       prefix_cache_bytes=prefix_cache_bytes)
    server.api_key, server.admin_api_key = api_key or None, admin_api_key or None
    app = build_app(server)
    print(f"mimo-kit serve: http://{host}:{port} (SGLang native API subset)", flush=True)
    web.run_app(app, host=host, port=port, print=None, access_log=None)
