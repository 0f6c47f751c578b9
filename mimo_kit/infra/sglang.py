"""SGLang as a rollout engine: a client of a running server's native HTTP API (Report §6 "Engines").

The report's rollouts run on SGLang; the kit's trainer talks to any engine through
:class:`~mimo_kit.infra.engine.RolloutEngine`. :class:`SGLangEngine` implements that protocol over SGLang's native
endpoints, so the same trainer drives a real SGLang server on a GPU node or ``mimo-kit serve`` (the kit's
:class:`~mimo_kit.infra.engine.InProcessEngine` behind the same endpoints, :mod:`mimo_kit.infra.serve`).

Endpoints and fields used, as sglang 0.5.23 (PyPI, 2026-10-30) defines them (files under ``python/sglang/srt/``;
``tests/fixtures/sglang/`` holds request/response pairs transcribed from them, replayed by ``tests/test_sglang.py``):

- ``generate`` → ``POST /generate`` with ``rid``, ``input_ids``, ``sampling_params`` {``temperature``, ``top_p``,
  ``top_k``, ``max_new_tokens``, ``stop_token_ids``, ``sampling_seed``}, ``return_logprob``, ``logprob_start_len``,
  ``top_logprobs_num``, ``return_routed_experts`` (``managers/io_struct.py`` ``GenerateReqInput``;
  ``sampling/sampling_params.py`` ``SamplingParams``: top_k −1 disables, temperature 0 is greedy);
- its answer, a list in request order: ``output_ids`` and ``meta_info`` with ``output_token_logprobs``
  [[logprob, id, text]], ``output_top_logprobs`` [[[logprob, id, text]]], ``finish_reason`` {``type``: stop |
  length | abort} (``managers/schedule_batch.py`` ``FINISH_*.to_json``), ``routed_experts`` (base64 of int32
  (tokens − 1, layers, k): ``state_capturer/routed_experts.py``), ``weight_version``
  (``managers/tokenizer_manager.py`` ``_handle_batch_output``);
- **a rejected request**: SGLang validates a batch as a whole, and one bad request (a prompt past the context, a
  token outside the vocabulary) fails the call with 400 {``error``: {``message``}}. The client then sends each
  request of that batch alone, so only the bad one fails: it comes back with ``finish_reason="error"`` and the
  server's message, and its rollout ends as ``infra_error`` (dropped, not scored);
- model facts → ``GET /model_info`` (``model_path``, ``weight_version``, ``model_type``, …; ``/get_model_info`` on
  servers before it, ``entrypoints/http_server.py``). It carries neither the vocabulary size nor the MoE top-k:
  those come from the caller (the learner's own model config) or the checkpoint's ``config.json`` when the client
  can read it. The weight version is ``/model_info``'s ``weight_version`` (SGLang has no ``/get_weight_version``
  any more) and each answer's ``meta_info.weight_version``;
- ``abort`` → ``POST /abort_request`` {``rid``, ``abort_all``} (``AbortReq``; 200, empty body);
- ``update_weights`` → ``POST /update_weights_from_disk`` {``model_path``, ``weight_version``,
  ``abort_all_requests``} → {``success``, ``message``, ``num_paused_requests``}, 400 on failure
  (``UpdateWeightFromDiskReqInput``). The path is sent absolute: SGLang resolves a relative one against its own
  working directory, and reads anything that is not a folder as a Hub repo id;
- over a group → ``POST /begin_weight_update``, ``/update_weights_from_distributed``, ``/end_weight_update``
  (0.5.23 refuses a distributed update outside such a session; a server without the session routes answers 404
  and is updated without one);
- partial rollouts → ``POST /pause_generation`` {``mode``: abort | retract | in_place} and
  ``POST /continue_generation`` {} (``PauseGenerationReqInput``; both need a JSON body);
- housekeeping → ``GET /health``, ``POST /flush_cache`` (plain text, 400 while requests run);
- **API keys**: a server started with ``--api-key`` wants ``Authorization: Bearer <key>`` on every route but
  ``/health*``; with ``--admin-api-key`` the weight, pause, abort and flush routes want that key instead
  (``utils/auth.py`` ``decide_request_auth``). A refused key is 401 {``error``: ``Unauthorized``}.

Differences from :class:`InProcessEngine` a caller should know:

- **logprobs**: SGLang reports log softmax(z / T) before top-k/top-p truncation (unless the server runs with
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``, which drops the temperature: keep it off); greedy (T = 0) reports
  log softmax(z), the kit's convention too.
- **top-p candidate sets** (Report §6.1): SGLang returns the top-``top_logprobs_num`` logprobs, not the sampling
  set; :func:`topp_from_top_logprobs` rebuilds the set from them (exact when it fits, flagged when not;
  :attr:`GenerationOutput.candidates_truncated`).
- **routed experts** (R3): SGLang covers prompt + generated − 1 positions (the last token is never fed back); the
  client appends one row of −1 ("not recorded", which the trainer's replay fills from its own router) so the rows
  line up with the kit's [prompt + generated] layout. The server must run with ``--enable-return-routed-experts``.
- **weights**: the engine holds its own copy by construction (it is another process); ``update_weights`` writes the
  state dict as ``model.safetensors`` next to the server's ``config.json`` and loads it with
  ``/update_weights_from_disk``; a trainer that already saved a checkpoint calls :meth:`SGLangEngine.load_weights`.
- **abort** cuts every request in flight (``abort_all``); :meth:`SGLangEngine.abort_request` cuts one ``rid``.
- **seeds**: there is no client-side random stream to snapshot; with ``seed`` set each request carries
  ``sampling_seed`` = f(seed, request id), honoured where the server supports seeded sampling.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from pathlib import Path
from typing import Any

import requests
import torch

from mimo_kit.infra.engine import GenerationOutput, GenerationRequest

#: seconds between ``on_step`` calls while a ``/generate`` runs (a toy decode step takes ~10 ms; grading one episode
#: between calls takes longer, so the poll only bounds how late an abort can be sent)
ON_STEP_POLL_S = 0.02
DEFAULT_TOP_LOGPROBS = 20  # top_logprobs_num asked for when candidates are wanted (Report §6.1: < 5 on average)


#: routes SGLang guards with ``--admin-api-key`` when one is set (``@auth_level(AuthLevel.ADMIN_OPTIONAL)``)
ADMIN_PATHS = ("/abort_request", "/flush_cache", "/pause_generation", "/continue_generation",
               "/update_weights_from_disk", "/init_weights_update_group", "/update_weights_from_distributed",
               "/destroy_weights_update_group", "/begin_weight_update", "/end_weight_update", "/update_weight_version")


class SGLangError(RuntimeError):
    """A SGLang server could not be reached or answered with an error; the message names the URL."""


class SGLangUnreachable(SGLangError, ConnectionError):
    """The server refused the connection or did not answer in time: gone, not wrong (a rollout service takes such
    an engine out of service and plays its groups on the others)."""


class SGLangRejected(SGLangError):
    """The server refused the request with HTTP 400 (a bad input, not a broken server)."""


def checkpoint_facts(folder: str | Path | None) -> dict[str, int]:
    """``vocab_size`` and ``num_experts_per_tok`` from a checkpoint's ``config.json`` (or its ``text_config``), or
    a kit run folder's ``config.yaml`` (its ``model``), when the folder is readable here; ``{}`` otherwise."""
    if not folder:
        return {}
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        try:
            import yaml

            cfg = (yaml.safe_load((Path(folder) / "config.yaml").read_text()) or {}).get("model") or {}
        except (OSError, ValueError, AttributeError, yaml.YAMLError):
            return {}
    if not isinstance(cfg, dict):
        return {}
    out = {}
    for key in ("vocab_size", "num_experts_per_tok"):
        v = cfg.get(key, (cfg.get("text_config") or {}).get(key))
        if isinstance(v, int):
            out[key] = v
    return out


def topp_from_top_logprobs(top: Sequence[tuple[float, int]], *, top_p: float, top_k: int = 0,
                           vocab_size: int | None = None) -> tuple[list[int], bool]:
    """The top-k/top-p sampling set rebuilt from the top-K logprobs a SGLang server returns → (ids, exact).

    ``top`` holds (logprob, id) pairs of the K most likely tokens under softmax(z / T), most likely first (SGLang's
    ``output_top_logprobs`` row). The sampling set (the kit's :func:`~mimo_kit.model.generate.truncate_logits`):

        top-k:  keep the k most likely tokens (k = 0: all), renormalise: p'_i = p_i / Z,  Z = Σ_{i ≤ k} p_i
        top-p:  keep token i (sorted) while the mass before it is below top_p:  Σ_{j < i} p'_j < top_p

    Exact whenever the set ends inside the K returned tokens and Z is known (no top-k, or k ≤ K). With K < k < V the
    normaliser lies in [S_K, min(1, S_K + (k − K)·p_K)], S_K = Σ_{i ≤ K} p_i; a token is decided only where both
    bounds agree. Otherwise the result is the decided prefix (at least the top token) with ``exact = False``: an
    approximation the caller should flag (ask for a larger ``top_logprobs_num``).
    """
    if not top:
        raise ValueError("topp_from_top_logprobs: no top logprobs (the server was asked for top_logprobs_num=0?)")
    ids = [int(t) for _, t in top]
    probs = [math.exp(float(lp)) for lp, _ in top]  # [K] under softmax(z / T), descending
    K = len(top)
    V = vocab_size if vocab_size is not None else math.inf
    k_eff = top_k if 0 < top_k < V else None  # None: no top-k cut
    if k_eff is not None and k_eff <= K:
        probs, ids, K = probs[:k_eff], ids[:k_eff], k_eff
        z_lo = z_hi = sum(probs)
        complete = True  # the whole top-k set is in hand
    elif k_eff is None:
        z_lo = z_hi = 1.0
        complete = K >= V
    else:  # K < k < V: the top-k mass is only bounded
        s_k = sum(probs)
        z_lo, z_hi = s_k, min(1.0, s_k + (k_eff - K) * probs[-1])
        complete = False
    kept: list[int] = []
    before = 0.0  # Σ_{j < i} p_j (un-normalised)
    for i in range(K):
        if i > 0 and before >= top_p * z_hi:  # dropped under every admissible Z: the set ended here
            return kept, True
        if i > 0 and before >= top_p * z_lo:  # kept or dropped depending on the unknown Z
            return kept, False
        kept.append(ids[i])
        before += probs[i]
    if before >= top_p * z_hi:  # the mass of the K tokens reaches top_p: any further token is dropped
        return kept, True
    return kept, complete


def _sampling_params(r: GenerationRequest, seed: int | None) -> dict[str, Any]:
    """SGLang ``sampling_params`` of one request (``sampling/sampling_params.py``: top_k −1 disables it)."""
    sp: dict[str, Any] = {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k if r.top_k > 0 else -1,
                          "max_new_tokens": r.max_new_tokens}
    if r.stop_token_ids:
        sp["stop_token_ids"] = sorted(set(int(t) for t in r.stop_token_ids))
    if seed is not None:  # distinct per request: equal seeds would make a GRPO group's rollouts identical
        sp["sampling_seed"] = zlib.crc32(f"{seed}:{r.request_id}".encode()) & 0x7FFFFFFF
    return sp


def decode_routed_experts(payload: str, rows: int, k: int) -> torch.Tensor:
    """SGLang's ``meta_info["routed_experts"]`` → [rows, layers, k] int32 (base64 of a C-order int32 array)."""
    flat = torch.frombuffer(bytearray(base64.b64decode(payload)), dtype=torch.int32)
    if rows <= 0 or flat.numel() % (rows * k):
        raise SGLangError(f"routed_experts: {flat.numel()} ids do not split into {rows} tokens × layers × k={k}")
    return flat.reshape(rows, -1, k)


def encode_routed_experts(routed: torch.Tensor) -> str:
    """[tokens, layers, k] → base64 of the int32 C-order bytes (the format SGLang's detokenizer sends)."""
    return base64.b64encode(routed.to(torch.int32).contiguous().numpy().tobytes()).decode("ascii")


class SGLangEngine:
    """A :class:`~mimo_kit.infra.engine.RolloutEngine` backed by a SGLang server's native HTTP API (Report §6).

    ``url``: the server (``http://host:30000``). ``top_logprobs_num``: K asked for when candidates are wanted.
    ``vocab_size`` / ``experts_per_token``: the model's vocabulary and MoE top-k (to rebuild top-k sets and unpack
    routed experts); default: the checkpoint's ``config.json`` in ``config_dir`` or the server's ``model_path``,
    when readable here. ``api_key`` / ``admin_api_key``: the server's ``--api-key`` / ``--admin-api-key``
    (default: the environment's ``SGLANG_API_KEY`` / ``SGLANG_ADMIN_API_KEY``, so keys stay out of run configs).
    ``weights_dir``: where :meth:`update_weights` writes checkpoints the server then reads (a folder the server
    sees at the same absolute path: a shared filesystem across machines; default a temporary folder).
    ``weight_sync``: how :meth:`update_weights` sends a version: ``"disk"`` (that folder and
    ``/update_weights_from_disk``) or ``"dist"`` (a torch.distributed group of this client as rank 0 and the
    server, :mod:`mimo_kit.infra.weight_sync`, built on the first update; the server joins it at
    ``sync_address``, the learner's address as the server sees it, over ``sync_backend``).
    """

    def __init__(self, url: str, *, timeout: float = 600.0, seed: int | None = None,
                 top_logprobs_num: int = DEFAULT_TOP_LOGPROBS, experts_per_token: int | None = None,
                 weights_dir: str | Path | None = None, config_dir: str | Path | None = None,
                 vocab_size: int | None = None, weight_sync: str = "disk", sync_address: str = "127.0.0.1",
                 sync_backend: str = "gloo", api_key: str | None = None, admin_api_key: str | None = None):
        if weight_sync not in ("disk", "dist"):
            raise ValueError(f"SGLangEngine weight_sync={weight_sync!r}; expected 'disk' or 'dist'")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.seed = seed
        self.top_logprobs_num = top_logprobs_num
        self.api_key = api_key if api_key is not None else os.environ.get("SGLANG_API_KEY") or None
        self.admin_api_key = (admin_api_key if admin_api_key is not None
                              else os.environ.get("SGLANG_ADMIN_API_KEY") or None)
        info = self.model_info()
        self.model_path = info.get("model_path")
        self.policy_version = _version(info.get("weight_version"))
        self.config_dir = Path(config_dir) if config_dir else (Path(self.model_path) if self.model_path else None)
        facts = checkpoint_facts(self.config_dir)
        self.vocab_size = vocab_size if vocab_size is not None else facts.get("vocab_size")
        self.experts_per_token = experts_per_token or facts.get("num_experts_per_tok")
        self.weight_sync, self.sync_address, self.sync_backend = weight_sync, sync_address, sync_backend
        self._group: Any = None  # the weight-update group, once built (weight_sync="dist")
        self.group_name = f"mimo-kit-{uuid.uuid4().hex[:12]}"  # this client's own group on the server
        self.last_sync_s = 0.0  # wall seconds of the last update_weights
        self._tmp = None if weights_dir or weight_sync == "dist" else tempfile.mkdtemp(prefix="mimo-kit-weights-")
        self.weights_dir = Path(weights_dir or self._tmp) if (weights_dir or self._tmp) else None  # "disk" only

    # ---- HTTP --------------------------------------------------------------------------------------------
    def _headers(self, path: str) -> dict[str, str]:
        """SGLang's bearer token: the admin key on admin routes when one is set, else the API key."""
        key = self.admin_api_key if self.admin_api_key and path in ADMIN_PATHS else self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _call(self, method: str, path: str, payload: Any = None, timeout: float | None = None) -> requests.Response:
        url = self.url + path
        try:
            resp = requests.request(method, url, json=payload, timeout=timeout or self.timeout,
                                    headers=self._headers(path))
        except requests.ConnectionError as e:
            raise SGLangUnreachable(f"SGLang server at {url} is unreachable ({type(e).__name__}); "
                                    "is it running?") from e
        except requests.Timeout as e:
            raise SGLangUnreachable(f"SGLang server at {url} did not answer within {timeout or self.timeout} s") from e
        if resp.status_code in (401, 403):
            which = "--admin-api-key" if path in ADMIN_PATHS and self.admin_api_key else "--api-key"
            raise SGLangError(f"{method} {url} → HTTP {resp.status_code} {_error_message(resp)}: the server wants "
                              f"its {which} as a bearer token; pass api_key=/admin_api_key= or set SGLANG_API_KEY "
                              "/ SGLANG_ADMIN_API_KEY")
        return resp

    def _json(self, method: str, path: str, payload: Any = None, timeout: float | None = None) -> Any:
        resp = self._call(method, path, payload, timeout)
        if resp.status_code != 200:
            kind = SGLangRejected if resp.status_code == 400 else SGLangError
            raise kind(f"{method} {self.url + path} → HTTP {resp.status_code}: {_error_message(resp)}")
        return resp.json()

    def health(self, timeout: float = 5.0) -> bool:
        """``GET /health`` is 200 (SGLang: 503 while starting or unhealthy)."""
        try:
            return self._call("GET", "/health", timeout=timeout).status_code == 200
        except SGLangError:
            return False

    def model_info(self) -> dict[str, Any]:
        """``GET /model_info`` (``model_path``, ``weight_version``, ``model_type``, …); ``/get_model_info`` on a
        server that predates it (404)."""
        t = min(self.timeout, 30.0)
        resp = self._call("GET", "/model_info", timeout=t)
        if resp.status_code == 404:
            return self._json("GET", "/get_model_info", timeout=t)
        if resp.status_code != 200:
            raise SGLangError(f"GET {self.url}/model_info → HTTP {resp.status_code}: {_error_message(resp)}")
        return resp.json()

    def refresh_version(self) -> int:
        """Re-read the server's ``weight_version`` (``GET /model_info``) into :attr:`policy_version`."""
        self.policy_version = _version(self.model_info().get("weight_version"))
        return self.policy_version

    def flush_cache(self) -> None:
        """``POST /flush_cache``: drop the radix (prefix) cache; SGLang refuses (400) while requests run."""
        resp = self._call("POST", "/flush_cache")
        if resp.status_code != 200:
            raise SGLangError(f"POST {self.url}/flush_cache → HTTP {resp.status_code}: {_error_message(resp)}")

    # ---- control -----------------------------------------------------------------------------------------
    def abort(self) -> None:
        """Cut every request in flight (``POST /abort_request`` with ``abort_all``); they return "abort"."""
        self._call("POST", "/abort_request", {"abort_all": True})

    def abort_request(self, rid: str) -> None:
        """Cut one request (``POST /abort_request`` with its ``rid``)."""
        self._call("POST", "/abort_request", {"rid": rid})

    def pause_generation(self, mode: str = "abort") -> None:
        """``POST /pause_generation``: ``abort`` returns the requests in flight, ``retract`` / ``in_place`` hold
        them until :meth:`continue_generation` (partial rollouts across a weight update, Report §4.1)."""
        self._json("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self) -> None:
        self._json("POST", "/continue_generation", {})

    def load_weights(self, model_path: str | Path, version: int, *, abort_all_requests: bool = False) -> None:
        """``POST /update_weights_from_disk``: the server reloads weights from ``model_path`` (a transformers
        ``save_pretrained`` folder it can read) and stamps ``version`` on later requests."""
        out = self._call("POST", "/update_weights_from_disk", {
            "model_path": str(Path(model_path).absolute()), "weight_version": str(int(version)),
            "abort_all_requests": abort_all_requests})
        body = _body(out)
        if out.status_code != 200 or not body.get("success", False):
            raise ValueError(f"update_weights_from_disk ({self.url}, {model_path}): "
                             f"{body.get('message') or _error_message(out)}")
        self.policy_version = int(version)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Send ``state_dict`` as ``version`` the way ``weight_sync`` says; :attr:`last_sync_s` its seconds."""
        if version < self.policy_version:
            raise ValueError(f"update_weights: version {version} is older than the engine's {self.policy_version}")
        t0 = time.perf_counter()
        if self.weight_sync == "dist":
            self._update_over_group(state_dict, version)
        else:
            self._update_through_disk(state_dict, version)
        self.last_sync_s = time.perf_counter() - t0

    def _update_through_disk(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write ``state_dict`` as a checkpoint folder (``model.safetensors`` + the server's config files) and
        load it with :meth:`load_weights`. The folder must be readable by the server (``weights_dir``)."""
        from safetensors.torch import save_file

        folder = self.weights_dir / f"v{int(version)}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        if self.config_dir is not None and self.config_dir.is_dir():
            for f in self.config_dir.iterdir():
                if f.is_file() and f.suffix == ".json" and not f.name.endswith(".index.json"):
                    shutil.copy(f, folder / f.name)
        # clone: tied or shared tensors (embeddings) must be separate buffers for safetensors
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in state_dict.items()},
                  str(folder / "model.safetensors"))
        try:
            self.load_weights(folder, version)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # ---- weight sync over a torch.distributed group (mimo_kit.infra.weight_sync) ------------------------------
    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = "weight_update_group", backend: str = "nccl") -> None:
        """``POST /init_weights_update_group``: the server joins the group (it blocks until every member has)."""
        self._ok("/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend})

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                        shapes: Sequence[Sequence[int]], version: int,
                                        group_name: str = "weight_update_group") -> None:
        """``POST /update_weights_from_distributed``: the server receives the tensors rank 0 broadcasts, in order,
        and stamps ``version`` (it answers once they are loaded); a refused update is a ValueError, as through
        the disk."""
        self._ok("/update_weights_from_distributed", {
            "names": list(names), "dtypes": list(dtypes), "shapes": [list(x) for x in shapes],
            "group_name": group_name, "weight_version": str(int(version)), "flush_cache": True}, error=ValueError)
        self.policy_version = int(version)

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        self._ok("/destroy_weights_update_group", {"group_name": group_name})

    def _ok(self, path: str, payload: dict[str, Any], error: type[Exception] = SGLangError) -> None:
        """POST ``payload``; ``error`` unless the answer is 200 with ``success``."""
        out = self._call("POST", path, payload)
        body = _body(out)
        if out.status_code != 200 or not body.get("success", False):
            raise error(f"POST {self.url + path} → HTTP {out.status_code}: "
                        f"{body.get('message') or _error_message(out)}")

    def _update_over_group(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Rank 0 of a two-member group (this client, the server), built on the first update; each update is the
        server's request and this side's broadcasts at once. A server that refuses is not waited out; one that
        dies mid-broadcast raises :class:`SGLangUnreachable` (a rollout service then takes it out of service)."""
        from mimo_kit.dist import free_port
        from mimo_kit.infra.weight_sync import manifest, send, weight_group

        if self._group is None:  # the server joins while this process does
            port = free_port()
            self._group = self._together(
                lambda: self.init_weights_update_group(self.sync_address, port, 1, 2, self.group_name,
                                                       self.sync_backend),
                lambda refused: weight_group(self.sync_address, port, 0, 2, group_name=self.group_name,
                                             backend=self.sync_backend))
        device = "cuda" if self.sync_backend == "nccl" else "cpu"
        tensors = [v.detach().to(device).contiguous() for v in state_dict.values()]
        m = manifest(dict(zip(state_dict, tensors)))
        try:
            with self._weight_update_session():
                self._together(lambda: self.update_weights_from_distributed(m["names"], m["dtypes"], m["shapes"],
                                                                            version, self.group_name),
                               lambda refused: send(self._group, tensors, abandon=refused))
        except BaseException:
            self._group = None  # a refused or broken broadcast leaves the group unusable: the next update rebuilds it
            with contextlib.suppress(SGLangError):
                self.destroy_weights_update_group(self.group_name)
            raise

    @contextlib.contextmanager
    def _weight_update_session(self):
        """``/begin_weight_update`` … ``/end_weight_update`` around a distributed update (sglang 0.5.23 refuses one
        outside a session); a server without these routes (404) is updated without."""
        resp = self._call("POST", "/begin_weight_update", {"selector": "all"})
        if resp.status_code == 404:
            yield
            return
        body = _body(resp)
        if resp.status_code != 200 or not body.get("success", False):
            raise SGLangError(f"POST {self.url}/begin_weight_update → HTTP {resp.status_code}: "
                              f"{body.get('message') or _error_message(resp)}")
        try:
            yield
        finally:
            self._ok("/end_weight_update", {})

    @staticmethod
    def _together(request: Callable[[], None], local: Callable[[Callable[[], bool]], Any]) -> Any:
        """The server's request and this side of the collective, each in a thread; ``local``'s result once both
        succeed. The first failure is raised at once: the request's as it is, the collective's as
        :class:`SGLangUnreachable`. ``local(refused)`` may poll ``refused()`` to stop early."""
        boxes: dict[str, list] = {"request": [], "local": []}

        def run(key: str, call: Callable[[], Any]) -> None:
            try:
                boxes[key].append((True, call()))
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                boxes[key].append((False, e))

        refused = lambda: bool(boxes["request"]) and not boxes["request"][0][0]  # noqa: E731
        for key, call in (("request", request), ("local", lambda: local(refused))):
            threading.Thread(target=run, args=(key, call), name=f"weight-sync-{key}", daemon=True).start()
        while not (boxes["request"] and boxes["local"]):
            if refused():
                raise boxes["request"][0][1]
            if boxes["local"] and not boxes["local"][0][0]:
                e = boxes["local"][0][1]
                raise SGLangUnreachable(f"weight sync: the collective failed ({type(e).__name__}: {e})") from e
            time.sleep(0.002)
        if not boxes["request"][0][0]:
            raise boxes["request"][0][1]
        if not boxes["local"][0][0]:
            e = boxes["local"][0][1]
            raise SGLangUnreachable(f"weight sync: the collective failed ({type(e).__name__}: {e})") from e
        return boxes["local"][0][1]

    def close(self) -> None:
        if self._group is not None:  # the server lets go of this client's group
            self._group = None
            with contextlib.suppress(SGLangError):
                self.destroy_weights_update_group(self.group_name)
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    # ---- generation --------------------------------------------------------------------------------------
    def generate(self, requests_: Sequence[GenerationRequest], on_step: Callable[[], Any] | None = None,
                 poll_s: float = ON_STEP_POLL_S) -> list[GenerationOutput]:
        """One batched ``POST /generate``; outputs in request order, stamped with the version at dispatch.

        ``on_step``: called every ``poll_s`` seconds while the server decodes (at once again when it returns true:
        it has more work at hand), as the in-process engine calls it between decode steps. It may do other work
        meanwhile (grade finished episodes) and call :meth:`abort`, which cuts the requests in flight: they come
        back with what they generated so far and "abort" (partial rollouts, Report §4.1). The cut lands between the
        server's decode steps at a wall-clock moment, so where it falls is not reproducible run to run (as with
        SGLang)."""
        reqs = list(requests_)
        for i, r in enumerate(reqs):
            if not isinstance(r, GenerationRequest):
                raise TypeError(f"generate: request {i} is a {type(r).__name__}, expected GenerationRequest")
        if not reqs:
            return []
        version = self.policy_version  # stamped at dispatch (docs/design.md lessons)
        want_cands = any(r.return_candidates for r in reqs)
        body: dict[str, Any] = {
            "rid": [r.request_id for r in reqs],
            "input_ids": [list(map(int, r.prompt_ids)) for r in reqs],
            "sampling_params": [_sampling_params(r, self.seed) for r in reqs],
            "return_logprob": True,
            "logprob_start_len": -1,  # −1: logprobs of output tokens only
            "top_logprobs_num": self.top_logprobs_num if want_cands else 0,
            "return_routed_experts": any(r.return_routed_experts for r in reqs),
        }
        try:
            data = self._waiting(lambda: self._json("POST", "/generate", body), on_step, poll_s)
        except SGLangRejected as e:  # one bad request fails SGLang's whole batch: find it, keep the others
            if len(reqs) == 1:
                return [GenerationOutput(reqs[0].request_id, [], [], "error", version, error=str(e))]
            return self._one_by_one(reqs, on_step, poll_s)
        if isinstance(data, dict):  # a batch of one may come back unwrapped
            data = [data]
        if len(data) != len(reqs):
            raise SGLangError(f"POST {self.url}/generate: {len(data)} outputs for {len(reqs)} requests")
        return [self._output(r, d, version) for r, d in zip(reqs, data)]

    @staticmethod
    def _waiting(call: Callable[[], Any], on_step: Callable[[], Any] | None, poll_s: float) -> Any:
        """``call()``; with ``on_step``, on a thread of its own while this thread calls ``on_step`` every
        ``poll_s`` seconds (at once again when it returns true: it has more work at hand)."""
        if on_step is None:
            return call()
        with ThreadPoolExecutor(1, thread_name_prefix="sglang-generate") as ex:
            fut = ex.submit(call)
            while not fut.done():
                if not on_step():
                    futures_wait([fut], timeout=poll_s)
            return fut.result()

    def _one_by_one(self, reqs: list[GenerationRequest], on_step: Callable[[], Any] | None,
                    poll_s: float) -> list[GenerationOutput]:
        """Each request alone, all at once (the server batches them again): a refused one fails only itself."""
        def all_of():
            with ThreadPoolExecutor(min(len(reqs), 32), thread_name_prefix="sglang-one") as ex:
                return [o for out in ex.map(lambda r: self.generate([r]), reqs) for o in out]
        return self._waiting(all_of, on_step, poll_s)

    def _output(self, r: GenerationRequest, d: dict[str, Any], version: int) -> GenerationOutput:
        meta = d.get("meta_info", {})
        lps = meta.get("output_token_logprobs") or []  # [(logprob, id, text)]
        ids = [int(t) for t in d["output_ids"]] if d.get("output_ids") is not None else [int(x[1]) for x in lps]
        logprobs = [float(x[0]) for x in lps]
        if len(logprobs) != len(ids):
            raise SGLangError(f"{self.url}: request {r.request_id!r} has {len(ids)} tokens but {len(logprobs)} "
                              "logprobs (return_logprob ignored?)")
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else reason
        if kind not in ("stop", "length", "abort"):
            raise SGLangError(f"{self.url}: request {r.request_id!r} finished with {reason!r}")
        if kind == "abort" and isinstance(reason, dict) and reason.get("status_code") not in (None, 200):
            return GenerationOutput(r.request_id, [], [], "error", version,  # refused in-band: this request alone
                                    error=f"HTTP {reason.get('status_code')}: {reason.get('message')}")
        candidates = truncated = None
        if r.return_candidates:
            tops = meta.get("output_top_logprobs") or []
            candidates, truncated = [], []
            for j, tok in enumerate(ids):
                top = [(float(x[0]), int(x[1])) for x in tops[j]] if j < len(tops) and tops[j] else []
                if r.temperature == 0:  # greedy: the set is the argmax alone
                    cand, exact = [tok], True
                else:
                    cand, exact = topp_from_top_logprobs(top, top_p=r.top_p, top_k=r.top_k,
                                                         vocab_size=self.vocab_size)
                if tok not in cand:  # the sampled token lies beyond the returned top-K
                    cand, exact = cand + [tok], False
                lp_of = dict((t, lp) for lp, t in top)
                lp_of.setdefault(tok, logprobs[j])
                mass = torch.logsumexp(torch.tensor([lp_of[c] for c in cand if c in lp_of]), 0)
                logprobs[j] = 0.0 if r.temperature == 0 else logprobs[j] - float(mass)  # log π(a | a ∈ C)
                candidates.append(cand)
                truncated.append(not exact)
        routed = None
        if r.return_routed_experts and meta.get("routed_experts") is not None:
            if not self.experts_per_token:
                raise SGLangError("routed experts returned but experts_per_token is unknown: SGLang's /model_info "
                                  "does not carry it; pass experts_per_token= (the model config's "
                                  "num_experts_per_tok) or config_dir= (a folder with the checkpoint's config.json)")
            n_rows = len(r.prompt_ids) + len(ids) - 1  # SGLang: [0, seqlen − 1)
            t = decode_routed_experts(meta["routed_experts"], n_rows, self.experts_per_token)  # [T + n − 1, L, k]
            t = torch.cat([t, torch.full_like(t[:1], -1)])  # the last token was never routed: −1 = not recorded
            routed = t.tolist()
        return GenerationOutput(r.request_id, ids, logprobs, kind, version, routed, candidates,
                                truncated if r.return_candidates else None)


def _version(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0  # SGLang's default weight_version is "default"


def _body(resp: requests.Response) -> dict[str, Any]:
    try:
        out = resp.json()
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _error_message(resp: requests.Response) -> str:
    """SGLang's error bodies: {"error": {"message"}} (``_create_error_response``), {"message"} (validation
    ``ErrorResponse``, weight updates), or plain text."""
    body = _body(resp)
    err = body.get("error")
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    if body.get("message"):
        return str(body["message"])
    return resp.text[:500]
