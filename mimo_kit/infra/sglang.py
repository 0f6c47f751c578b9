"""SGLang as a rollout engine: a client of a running server's native HTTP API (Report §6 "Engines").

The report's rollouts run on SGLang; the kit's trainer talks to any engine through
:class:`~mimo_kit.infra.engine.RolloutEngine`. :class:`SGLangEngine` implements that protocol over SGLang's native
endpoints, so the same trainer drives a real SGLang server on a GPU node or ``mimo-kit serve`` (the kit's
:class:`~mimo_kit.infra.engine.InProcessEngine` behind the same endpoints, :mod:`mimo_kit.infra.serve`).

Endpoints and fields used, as sglang 0.5.23 (PyPI, 2026-10-30) defines them (files under ``python/sglang/srt/``;
``tests/fixtures/sglang/`` holds request/response pairs transcribed from them, replayed by ``tests/test_sglang.py``):

- ``generate`` → ``POST /generate`` with ``rid``, ``input_ids``, ``sampling_params`` {``temperature``, ``top_p``,
  ``top_k``, ``max_new_tokens``, ``stop_token_ids``, ``sampling_seed``}, ``return_logprob``, ``logprob_start_len``,
  ``top_logprobs_num``, ``return_sampling_mask`` (one flag per request), ``return_routed_experts``
  (``managers/io_struct.py`` ``GenerateReqInput``; ``sampling/sampling_params.py`` ``SamplingParams``: top_k −1
  disables, temperature 0 is greedy);
- its answer, a list in request order: ``output_ids`` and ``meta_info`` with ``output_token_logprobs``
  [[logprob, id, text]], ``output_top_logprobs`` [[[logprob, id, text]]], ``output_token_sampling_mask`` [[id]]
  (one row per output token: the ids the sampler could draw, most likely first) with
  ``output_token_sampling_logprobs`` [logprob of the drawn token within that set] (``sampling/sampling_mask.py``
  ``SamplingMaskChunk.to_lists``, the sampler's ``layers/sampler.py``), ``finish_reason`` {``type``: stop |
  length | abort} (``managers/schedule_batch.py`` ``FINISH_*.to_json``), ``routed_experts`` (base64 of int32
  (tokens − 1, layers, k): ``state_capturer/routed_experts.py``), ``weight_version``
  (``managers/tokenizer_manager.py`` ``_handle_batch_output``);
- **a rejected request**: SGLang validates a batch as a whole, and one bad request (a prompt past the context, a
  token outside the vocabulary) fails the call with 400 {``error``: {``message``}}. The client then sends each
  request of that batch alone, so only the bad one fails: it comes back with ``finish_reason="error"`` and the
  server's message, and its rollout ends as ``infra_error`` (dropped, not scored);
- server layout → ``GET /server_info`` (``/get_server_info`` before it): the resolved server arguments, among
  them ``tp_size``, ``dp_size`` and ``pp_size`` (``utils/common.py`` ``build_server_info``), which size a weight
  group;
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
- over a group → ``POST /init_weights_update_group`` {``master_address``, ``master_port``, ``rank_offset``,
  ``world_size``, ``group_name``, ``backend``}, then per version ``/begin_weight_update``,
  ``/update_weights_from_distributed`` {``names``, ``dtypes``, ``shapes``, ``group_name``, ``weight_version``,
  ``flush_cache``}, ``/end_weight_update`` (0.5.23 refuses a distributed update outside such a session; a server
  without the session routes answers 404 and is updated without one); ``/destroy_weights_update_group``
  {``group_name``} lets a group go. A server's TP ranks join at ``rank_offset + tp_rank``; a server under data
  parallelism refuses the whole path (``managers/tokenizer_control_mixin.py``: "data-parallel replicas are not
  supported for update weights from distributed");
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
- **top-p candidate sets** (Report §6.1): 0.5.23 returns each token's sampling set itself when asked
  (``return_sampling_mask``): the exact set, and the drawn token's logprob within it, log π(a | a ∈ C), the kit's
  convention with candidates. The server aborts a request whose set outgrows its ``--sampling-mask-max-tokens``
  (4096 by default), so the client asks only where the set is bounded by it (greedy, a top-k within it, a
  vocabulary within it, or a top-p cut). Where a server returns no sets (an older SGLang ignores the flag), or a
  request is not asked, :func:`topp_from_top_logprobs` rebuilds the set from the top-``top_logprobs_num``
  logprobs (exact when it fits, flagged when not: :attr:`GenerationOutput.candidates_truncated`).
- **routed experts** (R3): SGLang covers prompt + generated − 1 positions (the last token is never fed back); the
  client appends one row of −1 ("not recorded", which the trainer's replay fills from its own router) so the rows
  line up with the kit's [prompt + generated] layout. The server must run with ``--enable-return-routed-experts``.
- **weights**: the engine holds its own copy by construction (it is another process). Through the disk,
  ``update_weights`` writes the state dict as ``model.safetensors`` next to the server's ``config.json`` in a folder
  per version and loads it with ``/update_weights_from_disk``; the server then serves from that folder (its
  ``model_path``), so a version's folder is deleted only once the next version is adopted. Over a group
  (:mod:`mimo_kit.infra.weight_sync`) the group's world is the learner plus the server's TP ranks, and with
  :class:`WeightBroadcast` several servers share one group, one broadcast per tensor feeding them all. Either way
  floating-point weights travel in ``sync_dtype`` (the learner's compute dtype: bf16 on GPUs), never widened. A
  trainer that already saved a checkpoint calls :meth:`SGLangEngine.load_weights`.
- **timeouts**: a request the server does not answer within ``timeout`` seconds is sent again, up to ``tries``
  times with a doubling pause between (a ``/generate`` again under fresh request ids, its timed-out requests
  aborted first); after the last the engine is gone (:class:`SGLangUnreachable`). The calls of a group collective
  are not repeated: their peer is waiting inside the collective.
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
#: seconds a server may take to answer one request before it is sent again: a ``/generate`` of a whole batch on a
#: large model, or a weight load from disk, takes minutes
REQUEST_TIMEOUT_S = 600.0
#: times a timed-out request is sent before the server counts as gone (a pause in a busy server's event loop, a
#: network hiccup, passes; a dead server costs tries × timeout)
REQUEST_TRIES = 3
#: pause before the first repeat of a timed-out request, doubled before each further one
RETRY_BACKOFF_S = 1.0
#: SGLang's default ``--sampling-mask-max-tokens`` (``arg_groups/fields/exec_.py``): a request whose sampling set
#: outgrows it is aborted by the server, so sets are asked for only where they stay within it
SAMPLING_MASK_MAX_TOKENS = 4096
#: how long a broken collective waits for a member's request to fail, so the member that broke it is the one named
#: (a dead server's connection resets within moments; a broadcast that fails with no request failing blames all)
BLAME_GRACE_S = 2.0
#: seconds a clean-up call after a failed update may take (a session's end, a group's destroy): a server still
#: inside the broken collective answers late or never, and the learner must not wait for it
CLEANUP_TIMEOUT_S = 10.0


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

    With both cuts set, sglang 0.5.23 samples from another set: it applies top-k and top-p to the raw distribution
    at once (``layers/sampler.py``: the top-p mass is not renormalised after the top-k cut; flashinfer's
    ``filter_apply_order="joint"``), so its set can be larger; :class:`SGLangEngine` flags such a rebuild and asks
    the server for its own sets instead (``return_sampling_mask``).
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

    ``url``: the server (``http://host:30000``). ``top_logprobs_num``: K asked for when candidates are wanted and
    the server returns no sampling sets. ``vocab_size`` / ``experts_per_token``: the model's vocabulary and MoE
    top-k (to rebuild top-k sets and unpack routed experts); default: the checkpoint's ``config.json`` in
    ``config_dir`` or the server's ``model_path``, when readable here. ``api_key`` / ``admin_api_key``: the
    server's ``--api-key`` / ``--admin-api-key`` (default: the environment's ``SGLANG_API_KEY`` /
    ``SGLANG_ADMIN_API_KEY``, so keys stay out of run configs). ``timeout`` / ``tries``: seconds one request may
    take, and how often a timed-out one is sent (module docstring). ``sampling_mask_max_tokens``: the server's
    ``--sampling-mask-max-tokens``.

    ``weights_dir``: where :meth:`update_weights` writes checkpoints the server then reads (a folder the server
    sees at the same absolute path: a shared filesystem across machines; default a temporary folder).
    ``weight_sync``: how :meth:`update_weights` sends a version: ``"disk"`` (that folder and
    ``/update_weights_from_disk``) or ``"dist"`` (a torch.distributed group of this client as rank 0 and the
    server's TP ranks, :mod:`mimo_kit.infra.weight_sync`, built on the first update; the server joins it at
    ``sync_address``, the learner's address as the server sees it, over ``sync_backend``; several engines share
    one group through :class:`WeightBroadcast`). ``tp_size``: the server's tensor-parallel size, read from its
    ``/server_info`` when not given. ``sync_dtype``: the dtype floating-point weights travel in (the learner's
    compute dtype; ``None``: as given). ``group_timeout_s``: how long this side waits for the group to form or a
    broadcast to pass (default :data:`~mimo_kit.infra.weight_sync.GROUP_TIMEOUT_S`).
    """

    def __init__(self, url: str, *, timeout: float = REQUEST_TIMEOUT_S, tries: int = REQUEST_TRIES,
                 seed: int | None = None, top_logprobs_num: int = DEFAULT_TOP_LOGPROBS,
                 experts_per_token: int | None = None, weights_dir: str | Path | None = None,
                 config_dir: str | Path | None = None, vocab_size: int | None = None, weight_sync: str = "disk",
                 sync_address: str = "127.0.0.1", sync_backend: str = "gloo", sync_dtype: torch.dtype | None = None,
                 tp_size: int | None = None, group_timeout_s: float | None = None,
                 sampling_mask_max_tokens: int = SAMPLING_MASK_MAX_TOKENS, api_key: str | None = None,
                 admin_api_key: str | None = None):
        from mimo_kit.infra.weight_sync import BACKENDS, GROUP_TIMEOUT_S

        if weight_sync not in ("disk", "dist"):
            raise ValueError(f"SGLangEngine weight_sync={weight_sync!r}; expected 'disk' or 'dist'")
        if sync_backend not in BACKENDS:
            raise ValueError(f"SGLangEngine sync_backend={sync_backend!r}; expected one of {BACKENDS}")
        if not (isinstance(timeout, (int, float)) and timeout > 0) or not (isinstance(tries, int) and tries >= 1):
            raise ValueError(f"SGLangEngine timeout={timeout!r} (seconds > 0) and tries={tries!r} (an int >= 1) "
                             "expected")
        if tp_size is not None and not (isinstance(tp_size, int) and tp_size >= 1):
            raise ValueError(f"SGLangEngine tp_size={tp_size!r}; expected the server's tensor-parallel size (>= 1)")
        if group_timeout_s is not None and not (isinstance(group_timeout_s, (int, float)) and group_timeout_s > 0):
            raise ValueError(f"SGLangEngine group_timeout_s={group_timeout_s!r}; expected seconds > 0 or None")
        if sync_dtype is not None and not (isinstance(sync_dtype, torch.dtype) and sync_dtype.is_floating_point):
            raise ValueError(f"SGLangEngine sync_dtype={sync_dtype!r}; expected a floating torch dtype (e.g. "
                             "torch.bfloat16) or None")
        if not (isinstance(sampling_mask_max_tokens, int) and sampling_mask_max_tokens >= 1):
            raise ValueError(f"SGLangEngine sampling_mask_max_tokens={sampling_mask_max_tokens!r}; expected the "
                             "server's --sampling-mask-max-tokens (>= 1)")
        self.url = url.rstrip("/")
        self.timeout, self.tries = float(timeout), tries
        self.seed = seed
        self.top_logprobs_num = top_logprobs_num
        self.sampling_mask_max_tokens = sampling_mask_max_tokens
        self.sampling_masks: bool | None = None  # whether the server returns sampling sets (unknown until it answers)
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
        self.sync_dtype = sync_dtype
        self.group_timeout_s = GROUP_TIMEOUT_S if group_timeout_s is None else float(group_timeout_s)
        self.tp_size = self.group_ranks(tp_size) if weight_sync == "dist" else tp_size
        self.broadcast: WeightBroadcast | None = None  # the weight group this engine is a member of (dist)
        self.last_sync_s = 0.0  # wall seconds of the last update_weights
        self._tmp = None if weights_dir or weight_sync == "dist" else tempfile.mkdtemp(prefix="mimo-kit-weights-")
        self.weights_dir = Path(weights_dir or self._tmp) if (weights_dir or self._tmp) else None  # "disk" only
        self._adopted: Path | None = None  # the folder the server serves from (disk): kept until the next version

    # ---- HTTP --------------------------------------------------------------------------------------------
    def _headers(self, path: str) -> dict[str, str]:
        """SGLang's bearer token: the admin key on admin routes when one is set, else the API key."""
        key = self.admin_api_key if self.admin_api_key and path in ADMIN_PATHS else self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _call(self, method: str, path: str, payload: Any = None, timeout: float | None = None,
              tries: int | None = None) -> requests.Response:
        """One request; a timed-out one is sent again (``tries``, default the engine's) after a doubling pause, a
        ``/generate`` under fresh request ids once its timed-out ones are aborted. A refused connection, or the
        last timeout, is :class:`SGLangUnreachable`."""
        url, wait = self.url + path, timeout or self.timeout
        tries = self.tries if tries is None else tries
        for attempt in range(tries):
            try:
                resp = requests.request(method, url, json=payload, timeout=wait, headers=self._headers(path))
                break
            except requests.ConnectionError as e:
                raise SGLangUnreachable(f"SGLang server at {url} is unreachable ({type(e).__name__}); "
                                        "is it running?") from e
            except requests.Timeout as e:
                if attempt == tries - 1:
                    raise SGLangUnreachable(f"SGLang server at {url} did not answer within {wait} s "
                                            f"({tries} tries)") from e
                if path == "/generate":
                    payload = self._regenerated(payload, attempt + 1)
                time.sleep(RETRY_BACKOFF_S * 2 ** attempt)
        if resp.status_code in (401, 403):
            which = "--admin-api-key" if path in ADMIN_PATHS and self.admin_api_key else "--api-key"
            raise SGLangError(f"{method} {url} → HTTP {resp.status_code} {_error_message(resp)}: the server wants "
                              f"its {which} as a bearer token; pass api_key=/admin_api_key= or set SGLANG_API_KEY "
                              "/ SGLANG_ADMIN_API_KEY")
        return resp

    def _regenerated(self, payload: dict[str, Any], attempt: int) -> dict[str, Any]:
        """A timed-out ``/generate`` body to send again: its requests aborted on the server (best effort: it may
        be gone) and renamed ``<rid>~retry<attempt>``, so the server never sees a request id twice (outputs are
        matched to requests by position, not by id)."""
        rids = [r.rpartition("~retry")[0] or r for r in payload["rid"]]
        for rid in payload["rid"]:
            with contextlib.suppress(requests.RequestException):
                requests.post(self.url + "/abort_request", json={"rid": rid}, timeout=min(self.timeout, 10.0),
                              headers=self._headers("/abort_request"))
        return {**payload, "rid": [f"{rid}~retry{attempt}" for rid in rids]}

    def _json(self, method: str, path: str, payload: Any = None, timeout: float | None = None) -> Any:
        resp = self._call(method, path, payload, timeout)
        if resp.status_code != 200:
            kind = SGLangRejected if resp.status_code == 400 else SGLangError
            raise kind(f"{method} {self.url + path} → HTTP {resp.status_code}: {_error_message(resp)}")
        return resp.json()

    def health(self, timeout: float = 5.0) -> bool:
        """``GET /health`` is 200 (SGLang: 503 while starting or unhealthy)."""
        try:
            return self._call("GET", "/health", timeout=timeout, tries=1).status_code == 200
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

    def server_info(self) -> dict[str, Any]:
        """``GET /server_info`` (the resolved server arguments: ``tp_size``, ``dp_size``, ``pp_size``, …);
        ``/get_server_info`` on a server that predates it; ``{}`` when neither route exists."""
        t = min(self.timeout, 30.0)
        for path in ("/server_info", "/get_server_info"):
            resp = self._call("GET", path, timeout=t)
            if resp.status_code == 200:
                body = _body(resp)
                return body
            if resp.status_code != 404:
                raise SGLangError(f"GET {self.url}{path} → HTTP {resp.status_code}: {_error_message(resp)}")
        return {}

    def group_ranks(self, tp_size: int | None = None) -> int:
        """How many ranks the server puts into a weight group: its tensor-parallel size (``tp_size`` when given,
        else its ``/server_info``'s). A ValueError for a server SGLang will not update over a group: one under
        data parallelism (``dp_size`` > 1: "data-parallel replicas are not supported for update weights from
        distributed", ``managers/tokenizer_control_mixin.py``) or pipeline parallelism (``pp_size`` > 1: its ranks
        are ``rank_offset + tp_rank`` on every stage, ``model_runner_components/weight_updater.py``, so stages
        would claim the same ranks)."""
        info = self.server_info()
        dp, pp = info.get("dp_size") or 1, info.get("pp_size") or 1
        if dp != 1:
            raise ValueError(f"SGLang server at {self.url} runs with dp_size={dp}: SGLang refuses weight updates "
                             "over a torch.distributed group under data parallelism ('data-parallel replicas are "
                             "not supported for update weights from distributed'); use weight_sync='disk'")
        if pp != 1:
            raise ValueError(f"SGLang server at {self.url} runs with pp_size={pp}: its ranks in a weight group are "
                             "rank_offset + tp_rank on every pipeline stage, so the stages would collide; use "
                             "weight_sync='disk'")
        tp = tp_size if tp_size is not None else info.get("tp_size")
        if not isinstance(tp, int) or tp < 1:
            raise SGLangError(f"SGLang server at {self.url}: no tensor-parallel size in /server_info (got "
                              f"{info.get('tp_size')!r}); pass tp_size= (the server's --tp-size)")
        return tp

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
            if self.broadcast is None:  # a group of its own: this client and the server
                WeightBroadcast([self])
            self.broadcast.update(self, state_dict, version)
        else:
            self._update_through_disk(state_dict, version)
        self.last_sync_s = time.perf_counter() - t0

    def _update_through_disk(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write ``state_dict`` as a checkpoint folder (``model.safetensors`` + the server's config files) and
        load it with :meth:`load_weights`. The folder must be readable by the server (``weights_dir``). Once the
        server adopts it, it serves from it (its ``model_path``): the previous version's folder goes then, this
        one with the next version (or a refused load)."""
        from safetensors.torch import save_file

        from mimo_kit.infra.weight_sync import wire_tensors

        folder = self.weights_dir / f"v{int(version)}"
        if folder == self._adopted:  # the same version again: beside the folder the server serves from
            folder = self.weights_dir / f"v{int(version)}-{uuid.uuid4().hex[:8]}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        if self.config_dir is not None and self.config_dir.is_dir():
            for f in self.config_dir.iterdir():
                if f.is_file() and f.suffix == ".json" and not f.name.endswith(".index.json"):
                    shutil.copy(f, folder / f.name)
        # clone: tied or shared tensors (embeddings) must be separate buffers for safetensors
        save_file({k: v.clone() for k, v in wire_tensors(state_dict, "cpu", self.sync_dtype).items()},
                  str(folder / "model.safetensors"))
        try:
            self.load_weights(folder, version)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)  # not adopted: the server still serves the previous folder
            raise
        previous, self._adopted = self._adopted, folder
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    # ---- weight sync over a torch.distributed group (mimo_kit.infra.weight_sync) ------------------------------
    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = "weight_update_group", backend: str = "nccl") -> None:
        """``POST /init_weights_update_group``: the server's TP ranks join the group at ``rank_offset + tp_rank``
        (it answers once every member has joined). Not repeated on a timeout: the learner is inside the
        rendezvous."""
        self._ok("/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend})

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                        shapes: Sequence[Sequence[int]], version: int,
                                        group_name: str = "weight_update_group") -> None:
        """``POST /update_weights_from_distributed``: the server receives the tensors rank 0 broadcasts, in order,
        and stamps ``version`` (it answers once they are loaded); a refused update is a ValueError, as through
        the disk. Not repeated on a timeout: the broadcasts are under way."""
        self._ok("/update_weights_from_distributed", {
            "names": list(names), "dtypes": list(dtypes), "shapes": [list(x) for x in shapes],
            "group_name": group_name, "weight_version": str(int(version)), "flush_cache": True}, error=ValueError)
        self.policy_version = int(version)

    def destroy_weights_update_group(self, group_name: str = "weight_update_group",
                                     timeout: float | None = None) -> None:
        self._ok("/destroy_weights_update_group", {"group_name": group_name}, timeout=timeout)

    def _ok(self, path: str, payload: dict[str, Any], error: type[Exception] = SGLangError,
            timeout: float | None = None) -> None:
        """POST ``payload`` once; ``error`` unless the answer is 200 with ``success``."""
        out = self._call("POST", path, payload, timeout=timeout, tries=1)
        body = _body(out)
        if out.status_code != 200 or not body.get("success", False):
            raise error(f"POST {self.url + path} → HTTP {out.status_code}: "
                        f"{body.get('message') or _error_message(out)}")

    def _begin_weight_update(self) -> bool:
        """``POST /begin_weight_update`` (sglang 0.5.23 refuses a distributed update outside such a session):
        whether a session opened (False: a server without the route, 404, is updated without one). A session
        left open by a failed update is ended first."""
        resp = self._call("POST", "/begin_weight_update", {"selector": "all"}, tries=1)
        if resp.status_code == 404:
            return False
        body = _body(resp)
        if resp.status_code == 400 and "already open" in str(body.get("message")):
            self._end_weight_update()
            resp = self._call("POST", "/begin_weight_update", {"selector": "all"}, tries=1)
            body = _body(resp)
        if resp.status_code != 200 or not body.get("success", False):
            raise SGLangError(f"POST {self.url}/begin_weight_update → HTTP {resp.status_code}: "
                              f"{body.get('message') or _error_message(resp)}")
        return True

    def _end_weight_update(self, timeout: float | None = None) -> None:
        self._ok("/end_weight_update", {}, timeout=timeout)

    @contextlib.contextmanager
    def _weight_update_session(self):
        """``/begin_weight_update`` … ``/end_weight_update`` around a distributed update."""
        if not self._begin_weight_update():
            yield
            return
        try:
            yield
        finally:
            self._end_weight_update()

    def close(self) -> None:
        if self.broadcast is not None:  # the server lets go of the group
            self.broadcast.leave(self)
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
        masks = [self.asks_sampling_mask(r) for r in reqs]
        # top logprobs rebuild the sets a server does not return (an older SGLang ignores return_sampling_mask)
        want_tops = any(r.return_candidates and not (m and self.sampling_masks) for r, m in zip(reqs, masks))
        body: dict[str, Any] = {
            "rid": [r.request_id for r in reqs],
            "input_ids": [list(map(int, r.prompt_ids)) for r in reqs],
            "sampling_params": [_sampling_params(r, self.seed) for r in reqs],
            "return_logprob": True,
            "logprob_start_len": -1,  # −1: logprobs of output tokens only
            "top_logprobs_num": self.top_logprobs_num if want_tops else 0,
            "return_routed_experts": any(r.return_routed_experts for r in reqs),
        }
        if any(masks):
            body["return_sampling_mask"] = masks
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
        return [self._output(r, d, version, m) for r, d, m in zip(reqs, data, masks)]

    def asks_sampling_mask(self, r: GenerationRequest) -> bool:
        """Whether ``r`` asks the server for its exact sampling sets (``return_sampling_mask``): it wants candidates
        and its set stays within the server's ``--sampling-mask-max-tokens`` (a larger one aborts the request):
        greedy, a top-k within the limit, a vocabulary within it, or a top-p cut (a nucleus, thousands of tokens
        below the limit for a trained policy); without any cut the set is the whole vocabulary."""
        if not r.return_candidates:
            return False
        limit = self.sampling_mask_max_tokens
        return (r.temperature == 0 or 0 < r.top_k <= limit or r.top_p < 1.0
                or (self.vocab_size is not None and self.vocab_size <= limit))

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

    def _output(self, r: GenerationRequest, d: dict[str, Any], version: int, asked_mask: bool = False
                ) -> GenerationOutput:
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
        if r.return_candidates and asked_mask and meta.get("output_token_sampling_mask") is not None:
            candidates, logprobs = self._sampling_sets(r, meta, ids)
            truncated = [False] * len(ids)  # the server's own sets: exact
        elif r.return_candidates:
            if asked_mask and self.sampling_masks and ids:
                raise SGLangError(f"{self.url}: request {r.request_id!r} asked return_sampling_mask and got no "
                                  "output_token_sampling_mask, though the server returned them before")
            if asked_mask and ids:
                self.sampling_masks = False  # a server that ignores the flag: rebuild from top logprobs from now on
            tops = meta.get("output_top_logprobs") or []
            candidates, truncated = [], []
            for j, tok in enumerate(ids):
                top = [(float(x[0]), int(x[1])) for x in tops[j]] if j < len(tops) and tops[j] else []
                if r.temperature == 0:  # greedy: the set is the argmax alone
                    cand, exact = [tok], True
                else:
                    cand, exact = topp_from_top_logprobs(top, top_p=r.top_p, top_k=r.top_k,
                                                         vocab_size=self.vocab_size)
                    # SGLang applies both cuts to the raw distribution at once (layers/sampler.py: "joint"), the
                    # rebuild renormalises after the top-k cut: under both the two sets may differ
                    exact = exact and not (0 < r.top_k < (self.vocab_size or math.inf) and r.top_p < 1.0)
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

    def _sampling_sets(self, r: GenerationRequest, meta: dict[str, Any],
                       ids: list[int]) -> tuple[list[list[int]], list[float]]:
        """The server's sampling sets (``output_token_sampling_mask``: one list of ids per output token, most
        likely first) and the drawn tokens' logprobs within them (``output_token_sampling_logprobs``, selected mode:
        log(p_a / Σ_{c ∈ C} p_c), the sampler's ``selected_logprobs``; 0 under greedy) → (candidates, logprobs)."""
        sets, within = meta["output_token_sampling_mask"], meta.get("output_token_sampling_logprobs")
        if not (isinstance(sets, list) and isinstance(within, list) and len(sets) == len(within) == len(ids)):
            raise SGLangError(f"{self.url}: request {r.request_id!r} has {len(ids)} tokens but sampling sets "
                              f"{_length(sets)} and sampling logprobs {_length(within)}")
        candidates, logprobs = [], []
        for j, (tok, row, lp) in enumerate(zip(ids, sets, within)):
            cand = [int(t) for t in row]
            if tok not in cand or isinstance(lp, list):
                raise SGLangError(f"{self.url}: request {r.request_id!r} token {j} ({tok}) has sampling set {cand[:8]} "
                                  f"and logprob {lp!r}: expected the drawn token in its set and one logprob "
                                  "(sampling_logprobs_mode 'selected')")
            candidates.append(cand)
            logprobs.append(float(lp))
        self.sampling_masks = True
        return candidates, logprobs



class WeightBroadcast:
    """One weight-update group for one or more SGLang servers (Report §6): this process as rank 0, then each
    server's TP ranks, server s at ``rank_offset`` 1 + Σ_{s' < s} T_s' in a world of 1 + Σ T_s, so one broadcast
    per tensor feeds every server (SGLang's ``/init_weights_update_group`` takes the world size and each server's
    offset, so its protocol allows a shared group). An engine with ``weight_sync="dist"`` and no broadcast gets one
    of its own, so a server that dies fails only its own sync; ``WeightBroadcast(engines)`` puts several servers
    into one group and sends each version once.

    Each version goes out on the first member's ``update_weights`` of that version; the other members' calls find
    it sent. The group is formed on the first version (each member's tensor-parallel size from its
    ``/server_info``). A member whose request fails (refused: ValueError; gone: :class:`SGLangUnreachable`) leaves
    the group, which is formed again without it, and the version goes out again to the others; that member's own
    ``update_weights`` raises its error (so a rollout service takes it out of service). A collective that breaks
    with no request failing fails every member (:class:`SGLangUnreachable`)."""

    def __init__(self, engines: Sequence[SGLangEngine]):
        engines = list(engines)
        if not engines:
            raise ValueError("WeightBroadcast: expected at least one SGLangEngine")
        for e in engines:
            if not isinstance(e, SGLangEngine) or e.weight_sync != "dist":
                raise ValueError(f"WeightBroadcast: {e!r} is not an SGLangEngine with weight_sync='dist'")
            if e.broadcast is not None:
                raise ValueError(f"WeightBroadcast: the engine of {e.url} is in a weight group already")
        setting = {(e.sync_address, e.sync_backend, e.sync_dtype) for e in engines}
        if len(setting) > 1:
            raise ValueError(f"WeightBroadcast: the engines disagree on (sync_address, sync_backend, sync_dtype): "
                             f"{sorted(map(str, setting))}; one group has one of each")
        self.address, self.backend, self.dtype = setting.pop()
        self.timeout_s = max(e.group_timeout_s for e in engines)
        self.members = engines
        self.gone: dict[int, BaseException] = {}  # id(member) → why it is gone (unreachable: never sent to again)
        self.failed: dict[int, BaseException] = {}  # id(member) → why the last version did not reach it
        self.untold: set[int] = set()  # id(member) of those not yet told the last version's outcome
        self.group: Any = None  # this side's WeightGroup, once formed
        self.in_group: list[SGLangEngine] = []  # the members it was formed with
        self.group_name = ""
        self.version: int | None = None  # the last version sent
        self.broadcasts = 0  # tensors broadcast so far: one per tensor per version, whatever the member count
        for e in engines:
            e.broadcast = self

    def update(self, engine: SGLangEngine, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """``engine``'s update to ``version``: the whole group's, sent unless it went out already and ``engine``
        has not heard its outcome yet; the error that kept it from ``engine``, if one did. A member that asks
        again (after a refusal) has the version sent again; one that is gone is never sent to again."""
        if id(engine) in self.gone:
            raise self.gone[id(engine)]
        if self.version != version or id(engine) not in self.untold:
            self._send(state_dict, version)
        self.untold.discard(id(engine))
        if id(engine) in self.failed:
            raise self.failed[id(engine)]

    def leave(self, engine: SGLangEngine) -> None:
        """``engine`` leaves (its client closes): the group goes (the others form a new one on the next update)."""
        if engine in self.members:
            self.members.remove(engine)
            engine.broadcast = None
            self._drop_group()

    def _send(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self.failed = {}
        live = [e for e in self.members if id(e) not in self.gone]
        while live:
            failed = self._send_once(live, state_dict, version)
            if not failed:
                for e in live:
                    e.policy_version = int(version)
                break
            self._drop_group()
            for e, exc in failed.items():
                self.failed[id(e)] = exc
                if isinstance(exc, OSError):  # unreachable: out of the group for good
                    self.gone[id(e)] = exc
            live = [e for e in live if e not in failed]
        self.version = version
        self.untold = {id(e) for e in self.members}

    def _send_once(self, live: list[SGLangEngine], state_dict: Mapping[str, torch.Tensor],
                   version: int) -> dict[SGLangEngine, BaseException]:
        """One try: form the group if its members changed, then the sessions, the requests and the broadcasts.
        The members that failed, and why (empty: every member has the version)."""
        from mimo_kit.dist import free_port
        from mimo_kit.infra.weight_sync import manifest, send, weight_group, wire_tensors

        if self.group is None or self.in_group != live:
            self._drop_group()
            offsets = [1 + sum(e.tp_size for e in live[:i]) for i in range(len(live))]
            world, port = 1 + sum(e.tp_size for e in live), free_port()
            name = f"mimo-kit-{uuid.uuid4().hex[:12]}"
            calls = {e: (lambda e=e, off=off: e.init_weights_update_group(self.address, port, off, world, name,
                                                                          self.backend))
                     for e, off in zip(live, offsets)}
            failed, group = _together(calls, lambda refused: weight_group(self.address, port, 0, world,
                                                                         group_name=name, backend=self.backend,
                                                                         timeout_s=self.timeout_s))
            if failed:
                if group is not None:
                    group.abandon()
                return failed
            self.group, self.in_group, self.group_name = group, list(live), name
        tensors = wire_tensors(state_dict, "cuda" if self.backend == "nccl" else "cpu", self.dtype)
        m = manifest(tensors)
        failed, sessions = {}, []
        for e in live:
            try:
                if e._begin_weight_update():
                    sessions.append(e)
            except (SGLangError, OSError) as exc:
                failed[e] = exc
        if not failed:
            calls = {e: (lambda e=e: e.update_weights_from_distributed(m["names"], m["dtypes"], m["shapes"], version,
                                                                       self.group_name)) for e in live}
            failed, _ = _together(calls, lambda refused: send(self.group, list(tensors.values()), abandon=refused))
            if failed:
                self._drop_group(pending=True)  # this side lets go first, then each server lets go of its side
            else:
                self.broadcasts += len(tensors)
        for e in sessions:
            try:
                e._end_weight_update(CLEANUP_TIMEOUT_S if failed else None)
            except (SGLangError, OSError) as exc:
                if not failed:  # after a failure the end is clean-up only: a member is not blamed for it
                    failed[e] = exc
        return failed

    def _drop_group(self, pending: bool = False) -> None:
        """This side's group goes (shut down, or with a broadcast ``pending`` after a failure only abandoned), then
        each server's (best effort: a server that is gone holds nothing)."""
        if self.group is None:
            return
        group, self.group = self.group, None
        if pending:
            group.abandon()
        else:
            with contextlib.suppress(RuntimeError, ValueError):
                group.destroy()
        for e in self.in_group:
            if e in self.members and id(e) not in self.gone:
                with contextlib.suppress(SGLangError, OSError):
                    e.destroy_weights_update_group(self.group_name, timeout=CLEANUP_TIMEOUT_S)
        self.in_group = []


def _together(requests_: Mapping[Any, Callable[[], Any]],
              local: Callable[[Callable[[], bool]], Any]) -> tuple[dict[Any, BaseException], Any]:
    """Each member's request and this side of the collective, each in a thread of its own → (the members whose
    request failed → their error, ``local``'s result or None). ``local(refused)`` may poll ``refused()``, true once
    any request has failed, to stop early. Returns once every thread is done, or at the first failed request (the
    collective cannot complete; the requests still waiting are left to fail when the caller drops the group). A
    failed ``local`` with no failed request within :data:`BLAME_GRACE_S` fails every member as
    :class:`SGLangUnreachable`."""
    results: dict[Any, tuple[bool, Any]] = {}
    mine: list[tuple[bool, Any]] = []

    def run(key: Any, call: Callable[[], Any], box: Any) -> None:
        try:
            out = (True, call())
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            out = (False, e)
        if box is None:
            mine.append(out)
        else:
            box[key] = out

    refused = lambda: any(not ok for ok, _ in list(results.values()))  # noqa: E731
    for key, call in requests_.items():
        threading.Thread(target=run, args=(key, call, results), name="weight-sync-request", daemon=True).start()
    threading.Thread(target=run, args=(None, lambda: local(refused), None), name="weight-sync-local",
                     daemon=True).start()
    broke_at = None
    while True:
        failed = {k: e for k, (ok, e) in list(results.items()) if not ok}
        if failed:
            return failed, (mine[0][1] if mine and mine[0][0] else None)
        if mine and mine[0][0] and len(results) == len(requests_):
            return {}, mine[0][1]
        if mine and not mine[0][0]:
            broke_at = broke_at or time.monotonic()
            if time.monotonic() - broke_at > BLAME_GRACE_S or len(results) == len(requests_):
                e = mine[0][1]
                err = SGLangUnreachable(f"weight sync: the collective failed ({type(e).__name__}: {e})")
                err.__cause__ = e
                return {k: err for k in requests_}, None
        time.sleep(0.002)


def _length(x: Any) -> str:
    return f"{len(x)} long" if isinstance(x, list) else f"of type {type(x).__name__}"


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
