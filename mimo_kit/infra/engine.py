"""Rollout engines: one protocol, an in-process default (Report §6 "Engines", docs/design.md "Infrastructure").

The trainer talks to inference only through :class:`RolloutEngine`:

- ``generate(requests)`` → one :class:`GenerationOutput` per request: generated token ids, the rollout logprob of
  each (log softmax(z/T) before truncation, the quantity TIS and the mismatch metrics need), the finish reason
  (``"stop"`` | ``"length"`` | ``"abort"``), the **policy version stamped at dispatch** (docs/design.md lessons:
  stamping at completion under-counts staleness), and optionally the routed experts of every input position (R3) and the
  top-p candidate set of every generated token (recorded for top-p candidate replay, Report §6.1);
- ``update_weights(state_dict, version)`` loads new policy weights and moves the version;
- ``abort()`` cuts every in-flight request at the next decode step (partial rollout, Report §4.1): the outputs come
  back with ``finish_reason="abort"`` and the tokens so far; :func:`resume_request` builds the continuation, which
  the engine re-prefills under whatever weights it holds then.

:class:`InProcessEngine` wraps the kit decoder or any transformers causal LM (a PEFT-wrapped one too) in this
process; it holds its **own copy** of the weights, so a trainer can move on while rollouts run on older ones,
exactly the gap the staleness bound controls. :class:`~mimo_kit.infra.sglang.SGLangEngine` (a SGLang server, or
``mimo-kit serve``) passes the same contract suite, ``tests/test_engine.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from mimo_kit.infra.prefix_cache import PrefixCache
from mimo_kit.model.decoder import MiMoForCausalLM
from mimo_kit.model.fast_decode import StaticKVCache, decode_step, graph_len
from mimo_kit.model.generate import sample_next

#: "error": the engine refused this one request (a SGLang server's 400 for it alone); no tokens, ``error`` says why
FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclasses.dataclass
class GenerationRequest:
    """One generation: a prompt (token ids, never text: token-in/token-out) and its sampling settings."""

    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    return_routed_experts: bool = False
    return_candidates: bool = False
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id!r}: prompt_ids is empty; a prompt needs at least one token")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_new_tokens={self.max_new_tokens}; expected >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"request {self.request_id!r}: temperature={self.temperature} (>= 0), "
                             f"top_p={self.top_p} (in (0, 1]), top_k={self.top_k} (>= 0) expected")


@dataclasses.dataclass
class GenerationOutput:
    request_id: str
    token_ids: list[int]  # generated ids, the stop token included
    logprobs: list[float]  # per generated token, under softmax(logits / T)
    finish_reason: str  # "stop" | "length" | "abort" | "error"
    policy_version: int  # engine weights version when the request was dispatched
    routed_experts: list[list[list[int]]] | None = None  # [prompt + generated tokens][moe layers][k]
    candidates: list[list[int]] | None = None  # [generated tokens][kept ids] (top-k / top-p sampling set); with
    # candidates, ``logprobs`` are under the renormalised sampling set (see :func:`candidate_logmass`)
    candidates_truncated: list[bool] | None = None  # [generated tokens] True where an engine could only approximate
    # the candidate set (a SGLang server returns top-K logprobs, not the set: :mod:`mimo_kit.infra.sglang`)
    error: str | None = None  # finish_reason "error": the engine's message (the rollout ends as infra_error)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from inference (Report §6): :class:`InProcessEngine`, ``SGLangEngine``."""

    policy_version: int

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]: ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None: ...

    def abort(self) -> None: ...


def resume_request(request: GenerationRequest, partial: GenerationOutput) -> GenerationRequest:
    """The continuation of an aborted request: prompt + tokens so far, the remaining budget (Report §4.1).

    The engine re-prefills the whole prefix under its current weights (the KV cache of the old weights is stale).
    """
    if partial.finish_reason != "abort":
        raise ValueError(f"resume_request: request {request.request_id!r} finished with "
                         f"{partial.finish_reason!r}; only aborted requests resume")
    left = request.max_new_tokens - len(partial.token_ids)
    if left < 1:
        raise ValueError(f"resume_request: request {request.request_id!r} has no token budget left")
    return dataclasses.replace(request, prompt_ids=list(request.prompt_ids) + list(partial.token_ids),
                               max_new_tokens=left)


def candidate_logmass(logits: torch.Tensor, kept: torch.Tensor, temperature: float) -> torch.Tensor:
    """log Σ_{c ∈ kept} softmax(z / T)_c per row: logits [B, V], kept [B, V] bool → [B] (0 when all are kept).

    Top-p candidate replay (Report §6.1) trains on log π(a | a ∈ C) = log π(a) − log π(C): the probability the
    token was really sampled with. With ``return_candidates`` the engine reports that logprob, so the PPO ratio
    compares the same quantity on both sides.
    """
    lsm = (logits.float() / (temperature if temperature > 0 else 1.0)).log_softmax(-1)  # greedy: kept = argmax
    return lsm.masked_fill(~kept, float("-inf")).logsumexp(-1)


class InProcessEngine:
    """The embedded engine: the kit decoder or a transformers causal LM, batched decode with a KV cache.

    Requests with the same sampling settings share one batch (a GRPO group is one batch: its rollouts share the
    prompt, prefilled once). The kit decoder decodes rows of different prompt lengths together on
    :mod:`mimo_kit.model.fast_decode`; requests that capture routing (R3) and transformers models keep the general
    forward, batched by equal prompt length. ``seed`` fixes the sampling stream; :meth:`rng_state` /
    :meth:`set_rng_state` carry it across a checkpoint so a resumed run draws the same tokens.

    ``prefix_cache_bytes`` > 0 keeps each finished request's KV in a :class:`~mimo_kit.infra.prefix_cache.
    PrefixCache` of that many bytes, parked in host memory, and prefills a later prompt that extends a stored one
    over its suffix only (Report §6; kit decoder, fast path). Off by default: a run resumed from a checkpoint
    starts with an empty store, and a prefill over a stored prefix rounds differently from a whole one (~1e-7 in
    the logits), so bit-exact resume holds with it off. :attr:`prefill_tokens` counts the tokens prefilled and
    :attr:`kv_peak_bytes` the most KV a decode batch held (each row's tokens until the batch ends: every position in
    a GA layer, the window in an SWA ring, as a paged engine's token pool would hold them); the store's own peak is
    ``prefix_cache.peak_nbytes``.

    ``drafter`` (the block drafter or MTP; :meth:`set_drafter` swaps in a refreshed one) decodes speculatively on
    the static cache of the fast path, lossless under the request's temperature, top-k and top-p: the same
    distribution of tokens, other draws of the sampling stream. A group's requests draft and verify together, one
    proposal and one verification (:func:`~mimo_kit.model.fast_decode.block_logits`) per round for every row
    (:func:`~mimo_kit.speculative.rows.speculative_sample_rows`), over the prefix store's hits when it has one; a
    drafter with only the one-sequence protocol (:class:`~mimo_kit.speculative.decode.Drafter`) decodes each request
    alone (:func:`~mimo_kit.speculative.decode.speculative_sample`). Requests that capture routing (R3) decode
    plainly.
    :attr:`spec` counts rounds, drafts proposed and accepted (reset it to log a step's acceptance).

    ``compiled`` runs the fast path's decode steps and speculative verifications as compiled graphs
    (:func:`~mimo_kit.model.fast_decode.compiled_step`; on CUDA, CUDA graphs: a step is one launch). A plain
    batch's cache is bucketed so that batches share graphs: its rows rounded up to a power of two (pad rows decode
    pad tokens, their logits dropped), its length up to a multiple of ``GRAPH_LEN_BUCKET``. Each new shape
    compiles once (seconds to a minute): worth it for long generations on a GPU.
    """

    def __init__(self, model: torch.nn.Module, *, seed: int = 0, copy_weights: bool = True, pad_id: int = 0,
                 prefix_cache_bytes: int = 0, drafter: Any = None, compiled: bool = False):
        self.model = copy.deepcopy(model) if copy_weights else model
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.is_kit = isinstance(self.model, MiMoForCausalLM)
        self.device = next(self.model.parameters()).device  # forwards run here; sampling on the CPU (below)
        self.pad_id = pad_id
        self.policy_version = 0
        self.generator = torch.Generator().manual_seed(seed)
        self._abort = threading.Event()
        self._on_step: Callable[[], None] | None = None
        self.tokens_generated = 0  # decode steps × live rows since construction (progress, for callers)
        self.prefill_tokens = 0  # prompt tokens run through the model (a prefix-cache hit spares its prefix)
        self.kv_peak_bytes = 0  # the most KV a decode batch held (StaticKVCache.held_bytes of its rows)
        self.prefix_cache = (PrefixCache(prefix_cache_bytes, park="cpu")
                             if prefix_cache_bytes > 0 and self.is_kit else None)
        self.compiled = compiled and self.is_kit  # decode steps and verifications as compiled graphs
        self.drafter = None
        self.spec = SpecCounts()
        if drafter is not None:
            self.set_drafter(drafter)

    def set_drafter(self, drafter: Any) -> None:
        """Decode speculatively with ``drafter`` from now on (None: plain decoding); the kit decoder only."""
        if drafter is not None and not self.is_kit:
            raise ValueError("set_drafter: speculative decoding needs the kit decoder (its cache rolls back)")
        self.drafter = drafter

    # ---- weights and control ----------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy ``state_dict`` into the engine's weights and stamp ``version`` on later dispatches."""
        if version < self.policy_version:
            raise ValueError(f"update_weights: version {version} is older than the engine's {self.policy_version}")
        missing, unexpected = self.model.load_state_dict(dict(state_dict), strict=False)
        if unexpected or [k for k in missing if not k.endswith("inv_freq")]:
            raise ValueError(f"update_weights: state dict does not fit the engine's model (missing "
                             f"{list(missing)[:5]}, unexpected {list(unexpected)[:5]})")
        self.policy_version = int(version)
        if self.prefix_cache is not None:  # the stored KV is the old weights'
            self.prefix_cache.clear()

    def abort(self) -> None:
        """Cut all in-flight requests at the next decode step (callable from another thread)."""
        self._abort.set()

    def rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def seed(self, seed: int) -> None:
        """Restart the sampling stream from ``seed`` (evaluation's fixed draw)."""
        self.generator.manual_seed(seed)

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    # ---- forward passes ---------------------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, cache: Any, prefixes: list | None = None) -> tuple[torch.Tensor, Any]:
        """ids [B, L] continuing ``cache`` → (last-position logits [B, V] in fp32 on the CPU, cache).

        The model runs on its device; the next token is sampled on the CPU with the engine's CPU generator, so a
        seed draws the same tokens on every device (one [B, V] copy per step).

        On a :class:`StaticKVCache` (the kit's fast path) the first call prefills ``ids``, a list of prompts of
        any lengths (``prefixes``: a stored KV per row, or None); later calls decode ids [B, 1]."""
        if isinstance(cache, StaticKVCache):
            B, extra = len(ids), cache.batch - len(ids)  # compiled: rows past B pad the batch to its bucket
            if cache.span == 0:
                prompts = [*ids, *[[self.pad_id]] * extra]
                if prefixes is not None:
                    prefixes = [*prefixes, *[None] * extra]
                logits = cache.prefill(self.model, prompts, prefixes)[:B].float().cpu()
                shared = any(list(q) == [self.pad_id] and (prefixes is None or prefixes[i] is None)
                             for i, q in enumerate(ids))  # a real prompt the pad rows' forward is shared with
                self.prefill_tokens += cache.prefilled - (extra > 0 and not shared)  # the pad rows: one forward
                return logits, cache
            step = ids[:, 0].to(self.device)
            if extra:
                step = torch.cat([step, step.new_full((extra,), self.pad_id)])
            return decode_step(self.model, step, cache, compiled=self.compiled)[:B].float().cpu(), cache
        ids = ids.to(self.device)
        if self.is_kit:
            if cache.seq_len == 0:
                self.prefill_tokens += ids.numel()
            return self.model(ids, cache, logits_to_keep=1).logits[:, -1].float().cpu(), cache
        if cache is None:
            self.prefill_tokens += ids.numel()
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
        return out.logits[:, -1].float().cpu(), out.past_key_values

    def _cache_batch(self, batch: int) -> int:
        """A decode batch's cache rows: compiled, the next power of two (each cache shape is a graph of its own;
        the rows past ``batch`` decode pad tokens, and their logits are dropped), else ``batch``."""
        return 1 << (batch - 1).bit_length() if self.compiled else batch

    def _cache_len(self, length: int) -> int:
        """A decode batch's cache length: compiled, rounded up to a graph bucket (:func:`graph_len`)."""
        return graph_len(self.model.config, length) if self.compiled else length

    def _new_cache(self) -> Any:
        return self.model.new_cache() if self.is_kit else None

    # ---- generation -------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, requests: Sequence[GenerationRequest], *,
                 on_step: Callable[[], None] | None = None) -> list[GenerationOutput]:
        """Generate every request; outputs in request order. Abort flags are cleared on entry.

        ``on_step`` is called after every decode step (of every batch); it may call
        :meth:`abort`, which cuts the requests still running at that step (and those not started yet) at a
        deterministic point, so a partial rollout that aborts from here resumes reproducibly.
        """
        self._abort.clear()
        self._on_step = on_step
        version = self.policy_version  # stamped at dispatch
        out: dict[int, GenerationOutput] = {}
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            if not isinstance(r, GenerationRequest):
                raise TypeError(f"generate: request {i} is a {type(r).__name__}, expected GenerationRequest")
            ragged = self.is_kit and not r.return_routed_experts  # fast path: rows of any prompt length
            key = (None if ragged else len(r.prompt_ids), r.max_new_tokens, r.temperature, r.top_p, r.top_k,
                   tuple(r.stop_token_ids), r.return_routed_experts, r.return_candidates)
            groups.setdefault(key, []).append(i)
        from mimo_kit.speculative.rows import batched

        if self.drafter is not None and not batched(self.drafter):  # a drafter of one sequence at a time
            for i, r in enumerate(requests):
                if not r.return_routed_experts:
                    out[i] = self._generate_speculative(r, version)
            groups = {k: [i for i in idx if i not in out] for k, idx in groups.items()}
            groups = {k: idx for k, idx in groups.items() if idx}
        for key, idx in groups.items():
            if self._abort.is_set():  # cut before it started: no tokens, resumable like any aborted request
                for i in idx:
                    out[i] = GenerationOutput(requests[i].request_id, [], [], "abort", version,
                                              None, [] if requests[i].return_candidates else None)
                continue
            speculative = self.drafter is not None and key[0] is None  # the fast path's groups (no routing)
            run = self._generate_speculative_rows if speculative else self._generate_batch
            for i, o in zip(idx, run([requests[i] for i in idx], version)):
                out[i] = o
        self._on_step = None
        return [out[i] for i in range(len(requests))]

    def _generate_speculative(self, r: GenerationRequest, version: int) -> GenerationOutput:
        """One request through the drafter and the backbone (lossless speculative sampling)."""
        from mimo_kit.speculative.decode import speculative_sample

        if self._abort.is_set():
            return GenerationOutput(r.request_id, [], [], "abort", version, None, [] if r.return_candidates else None)

        def should_stop() -> bool:
            if self._on_step is not None:
                self._on_step()
            return self._abort.is_set()

        res = speculative_sample(self.model, self.drafter, list(r.prompt_ids), r.max_new_tokens,
                                 temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                                 stop_token_ids=tuple(r.stop_token_ids), generator=self.generator,
                                 return_candidates=r.return_candidates, should_stop=should_stop, fast=True,
                                 compiled=self.compiled)
        self.prefill_tokens += len(r.prompt_ids)
        self.tokens_generated += len(res.tokens)
        self.spec.add(res)
        return GenerationOutput(r.request_id, res.tokens, res.logprobs, res.finish_reason, version, None,
                                res.candidates)

    def _generate_speculative_rows(self, reqs: list[GenerationRequest], version: int) -> list[GenerationOutput]:
        """A group of requests decoded speculatively together: one drafter call and one verification per round for
        every row (:func:`~mimo_kit.speculative.rows.speculative_sample_rows`), suffix-only prefill over the
        prefix store's hits."""
        from mimo_kit.speculative.rows import speculative_sample_rows

        r0, store = reqs[0], self.prefix_cache

        def should_stop() -> bool:
            if self._on_step is not None:
                self._on_step()
            return self._abort.is_set()

        def on_end(b: int, tokens: list[int], cache: StaticKVCache) -> None:  # a finished row's KV: prompt + fed
            store.insert(list(reqs[b].prompt_ids) + tokens[:-1], cache.export_row(b))

        res = speculative_sample_rows(
            self.model, self.drafter, [r.prompt_ids for r in reqs], r0.max_new_tokens, temperature=r0.temperature,
            top_k=r0.top_k, top_p=r0.top_p, stop_token_ids=tuple(r0.stop_token_ids), generator=self.generator,
            return_candidates=r0.return_candidates, should_stop=should_stop,
            prefixes=None if store is None else [store.lookup(r.prompt_ids) for r in reqs],
            on_end=None if store is None else on_end, compiled=self.compiled)
        self.prefill_tokens += res.prefilled
        self.kv_peak_bytes = max(self.kv_peak_bytes, res.held_bytes)
        outs = []
        for r, o in zip(reqs, res.results):
            self.tokens_generated += len(o.tokens)
            self.spec.add(o)
            outs.append(GenerationOutput(r.request_id, o.tokens, o.logprobs, o.finish_reason, version, None,
                                         o.candidates))
        return outs

    def _generate_batch(self, reqs: list[GenerationRequest], version: int) -> list[GenerationOutput]:
        r0 = reqs[0]
        want_routing = r0.return_routed_experts
        if want_routing and not self.is_kit:
            raise ValueError("generate: return_routed_experts needs the kit decoder (routing capture)")
        B = len(reqs)
        fast = self.is_kit and not want_routing  # rows of different prompt lengths on a StaticKVCache
        ids = None if fast else torch.tensor([r.prompt_ids for r in reqs], dtype=torch.long)  # [B, T]
        stops = torch.tensor(sorted(set(r0.stop_token_ids)), dtype=torch.long)
        tokens: list[list[int]] = [[] for _ in range(B)]
        logps: list[list[float]] = [[] for _ in range(B)]
        cands: list[list[list[int]]] = [[] for _ in range(B)]
        reasons = ["length"] * B
        done = torch.zeros(B, dtype=torch.bool)
        captures: list[torch.Tensor] = []  # per forward: [layers, B·L, k]
        ctx = self.model.capture_routing() if want_routing else _null()
        with ctx as record:
            if fast:
                length = max(len(r.prompt_ids) for r in reqs) + r0.max_new_tokens
                cache = StaticKVCache(self.model.config, self._cache_batch(B), self._cache_len(length),
                                      dtype=next(self.model.parameters()).dtype, device=self.device)
                store = self.prefix_cache
                prefixes = None if store is None else [store.lookup(r.prompt_ids) for r in reqs]
                logits, cache = self._forward([r.prompt_ids for r in reqs], cache, prefixes)
            else:
                logits, cache = self._forward(ids, self._new_cache())
            for _step in range(r0.max_new_tokens):
                tok, logp, kept = sample_next(logits, temperature=r0.temperature, top_k=r0.top_k, top_p=r0.top_p,
                                              generator=self.generator)
                if r0.return_candidates:  # the sampling distribution's logprob: renormalised over the kept set
                    logp = logp - candidate_logmass(logits, kept, r0.temperature)
                was_done = done.clone()
                for b in (~was_done).nonzero()[:, 0].tolist():
                    tokens[b].append(int(tok[b]))
                    logps[b].append(float(logp[b]))
                    if r0.return_candidates:
                        cands[b].append(kept[b].nonzero()[:, 0].tolist())
                self.tokens_generated += int((~was_done).sum())
                if stops.numel():
                    hit = torch.isin(tok, stops) & ~was_done
                    for b in hit.nonzero()[:, 0].tolist():
                        reasons[b] = "stop"
                    done |= hit
                done |= torch.tensor([len(t) >= r0.max_new_tokens for t in tokens])
                if self._on_step is not None:
                    self._on_step()
                if self._abort.is_set():
                    for b in (~done).nonzero()[:, 0].tolist():
                        reasons[b] = "abort"
                    done[:] = True
                if fast and self.prefix_cache is not None:  # a finished row's KV: prompt + tokens fed so far
                    for b in (done & ~was_done).nonzero()[:, 0].tolist():
                        self.prefix_cache.insert(list(reqs[b].prompt_ids) + tokens[b][:-1], cache.export_row(b))
                # feed this step's tokens (rows finished earlier get pad): R3 needs the routing of every input
                # position, the last sampled token included, so with routing one extra forward follows the end
                feed = torch.where(was_done, torch.full_like(tok, self.pad_id), tok)
                if bool(done.all()) and not want_routing:
                    break
                logits, cache = self._forward(feed[:, None], cache)
                if bool(done.all()):
                    break
        if fast:  # every row holds its KV until the batch ends (rows that stopped were fed pads)
            held = sum(cache.held_bytes(n) for n in cache.lengths[:B].tolist())
            self.kv_peak_bytes = max(self.kv_peak_bytes, held)
        if want_routing:
            captures = record.indices  # [layers, B·T + steps·B, k]
        outs = []
        T = ids.shape[1] if ids is not None else 0
        for b, r in enumerate(reqs):
            routed = None
            if want_routing:
                n = len(tokens[b])
                prompt_part = captures[:, b * T:(b + 1) * T]  # [layers, T, k]
                gen_pos = [B * T + s * B + b for s in range(n)]
                gen_part = captures[:, gen_pos]  # [layers, n, k]
                routed = torch.cat([prompt_part, gen_part], 1).permute(1, 0, 2).tolist()
            outs.append(GenerationOutput(r.request_id, tokens[b], logps[b], reasons[b], version, routed,
                                         cands[b] if r0.return_candidates else None))
        return outs


@dataclasses.dataclass
class SpecCounts:
    """Speculative decoding's work since the last reset: verification rounds, drafts proposed and accepted.
    ``accepted_length`` = tokens per backbone forward (accepted drafts + 1 per round); ``a + b`` sums two engines'."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0

    def add(self, res: Any) -> None:
        self.rounds += len(res.accepted)
        self.proposed += sum(res.proposed_by_position)
        self.accepted += sum(res.accepted)

    def __add__(self, other: SpecCounts) -> SpecCounts:
        return SpecCounts(self.rounds + other.rounds, self.proposed + other.proposed, self.accepted + other.accepted)

    @property
    def accepted_length(self) -> float:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def acceptance(self) -> float:
        """Accepted drafts per draft proposed (a draft after a rejection is not proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def teacher_forced_logprobs(model: torch.nn.Module, prompt_ids: list[int], token_ids: list[int],
                            temperature: float = 1.0, routed_experts: torch.Tensor | None = None) -> torch.Tensor:
    """log p(token_ids | prompt) under ``model`` in one forward (the trainer's view). → [len(token_ids)].

    ``routed_experts`` [layers, prompt + generated − 1 tokens, k] replays the rollout's routing (R3).
    """
    ids = torch.tensor([list(prompt_ids) + list(token_ids)[:-1]], dtype=torch.long,
                       device=next(model.parameters()).device)
    with torch.no_grad():
        if routed_experts is not None:
            with model.replay_routing(routed_experts):
                logits = model(ids).logits
        elif isinstance(model, MiMoForCausalLM):
            logits = model(ids).logits
        else:
            logits = model(input_ids=ids).logits
    logits = logits[0, len(prompt_ids) - 1:].float().cpu()
    logits = logits / temperature if temperature > 0 else logits
    return logits.log_softmax(-1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0]
