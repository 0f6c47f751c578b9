"""Continuous batching with KV parking: the decode batch keeps running while episodes wait on their tools
(Report §6: an episode's KV moves to pinned host memory while it waits on a tool).

The turn-synchronous driver (:func:`~mimo_kit.infra.rollout.play`) decodes every live episode's action in one
batch, then runs every tool, then the next turn: while the slowest action decodes, finished episodes hold their
KV and wait; while the slowest tool runs, the engine idles. :class:`ContinuousEngine` plays the same episodes
the way an agentic rollout engine does:

.. code-block:: text

    loop:  admit ready episodes into free rows  (prefill the new suffix over the episode's parked KV)
           one decode step for every decoding row (each row samples from its own stream)
           a row whose action ended: export its KV → host (parked), free the row, run the tool in a thread
           a tool that returned: the observation is appended, the episode is ready again

``park=False`` is the engine without parking: a waiting episode keeps its row (and the KV in it) until its
observation arrives; the row then continues where it stopped. Either way only the new suffix is prefilled.

**Samples do not depend on the schedule.** Which episodes share a decode step depends on how long tools take;
so each request draws from its own generator, seeded from the engine's stream (one draw per :meth:`play`), the
request id and the prompt length. Parking or not, more rows or fewer, fast tools or slow: the same tokens, up to
float rounding of the batch they were decoded in (a decode step's rows do not mix; the grouped expert product may
round differently, ~1e-7). :attr:`kv_peak_bytes` is the most KV the decode batch really held at once (each
occupied row's tokens: every position in a GA layer, the window in an SWA ring: a paged engine's token pool), and
:attr:`parked_peak_bytes` the most parked in host memory (pinned on CUDA).

The kit decoder's fast path only: routing capture (R3) and partial rollouts (abort) stay with the
turn-synchronous driver and are refused by name.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import torch

from mimo_kit.infra.engine import InProcessEngine, candidate_logmass
from mimo_kit.infra.rollout import (
    Rollout,
    RolloutSettings,
    act_one,
    apply_turn,
    context_full,
    grade,
    group_sample,
    start_groups,
)
from mimo_kit.infra.timeline import span
from mimo_kit.model.cache import KVCache
from mimo_kit.model.fast_decode import StaticKVCache, decode_step
from mimo_kit.model.generate import sample_next


@dataclasses.dataclass
class _Row:
    """An episode decoding in a row of the batch: its request's stream and what it has sampled so far."""

    rollout: Rollout
    prompt: list[int]
    generator: torch.Generator
    logits: torch.Tensor  # [V]: the next token's logits
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    candidates: list[list[int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Kept:
    """The KV of an episode between turns: the tokens it holds and where (a parked copy, or a held row)."""

    tokens: list[int]
    kv: KVCache | None = None  # parked: on host memory
    row: int | None = None  # not parked: the row keeps it


def request_seed(base: int, request_id: str, prompt_len: int) -> int:
    """A request's sampling seed: a stable hash of the play's base draw, the request id and the prompt length (the
    turn), so a request draws the same tokens whichever requests share its decode steps."""
    h = hashlib.blake2b(f"{base}/{request_id}/{prompt_len}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


class ContinuousEngine(InProcessEngine):
    """An :class:`InProcessEngine` (same weights, versions, ``generate`` and checkpointed stream) whose
    :meth:`play` runs episodes with continuous batching and KV parking (the module docstring).

    ``rows``: the decode batch's rows (episodes decoding at once; more wait to be admitted). ``max_len``: positions
    a row holds (None: the settings' ``max_context``, else the model's ``max_position_embeddings``). ``park``:
    park a waiting episode's KV in host memory and free its row (False: the row keeps it). ``tool_workers``: threads
    running episodes' tools (None: the settings' ``act_workers``)."""

    def __init__(self, model: torch.nn.Module, *, rows: int, park: bool = True, max_len: int | None = None,
                 tool_workers: int | None = None, **kwargs: Any):
        super().__init__(model, **kwargs)
        if not self.is_kit:
            raise ValueError("ContinuousEngine: continuous batching runs on the kit decoder's fast path; "
                             f"got a {type(self.model).__name__}")
        if rows < 1:
            raise ValueError(f"ContinuousEngine: rows={rows}; expected >= 1")
        if tool_workers is not None and tool_workers < 1:
            raise ValueError(f"ContinuousEngine: tool_workers={tool_workers}; expected >= 1 or None")
        self.rows, self.park, self.max_len, self.tool_workers = int(rows), bool(park), max_len, tool_workers
        self.parked_peak_bytes = 0  # the most KV parked in host memory at once
        self.rows_peak = 0  # the most rows occupied at once (decoding, or holding a waiting episode's KV)
        self.admissions = 0  # requests admitted into a row (one per action)
        self._shared: dict[tuple[int, ...], KVCache] = {}  # during a play: whole prompts' KV but the last token

    # ---- playing episodes -------------------------------------------------------------------------------------
    @torch.no_grad()
    def play(self, groups: Sequence[tuple[str, Sequence[Any]]], settings: RolloutSettings, *,
             grade_workers: int = 1, rebuild: Callable[[str], Sequence[Any]] | None = None) -> list:
        """Every episode of every group to its end; one Sample per group, in the order given (what
        :func:`~mimo_kit.infra.rollout.play` returns for the same groups). ``rebuild`` is taken for the driver's
        signature and not used: one in-process engine has no engine failure to re-play a group around."""
        if settings.return_routed_experts:
            raise ValueError("ContinuousEngine.play: routing capture (R3) runs on the general forward; use the "
                             "turn-synchronous driver (an InProcessEngine) for R3 rollouts")
        started = start_groups(groups)
        flat = [r for _, rs in started for r in rs]
        base = int(torch.randint(0, 2**62, (1,), generator=self.generator))  # one draw per play: resumable
        with span("generate"):
            try:
                self._run(flat, settings, base)
            finally:
                self._shared = {}
        grade(flat, grade_workers)
        return [group_sample(gid, rs) for gid, rs in started]

    def _run(self, rollouts: list[Rollout], settings: RolloutSettings, base: int) -> None:
        max_len = self.max_len or settings.max_context or self.model.config.max_position_embeddings
        cache = StaticKVCache(self.model.config, self.rows, max_len, dtype=next(self.model.parameters()).dtype,
                              device=self.device)
        stops = set(settings.stop_token_ids)
        version = self.policy_version
        ready = collections.deque(rollouts)  # episodes with a next action to generate, in admission order
        decoding: dict[int, _Row] = {}  # row → episode decoding there
        kept: dict[int, _Kept] = {}  # id(rollout) → its KV between turns
        free = list(range(self.rows - 1, -1, -1))
        tools: dict[Future, tuple[Rollout, list, list, list, list | None, str]] = {}
        workers = self.tool_workers or settings.act_workers
        with ThreadPoolExecutor(max(1, workers), thread_name_prefix="tools") as pool:
            while ready or decoding or tools:
                # tools that returned: their observations appended, their episodes ready again (or ended)
                done = [f for f in tools if f.done()]
                if not done and not decoding and not ready:
                    done = list(wait(tools, return_when=FIRST_COMPLETED).done)
                for f in sorted(done, key=lambda f: tools[f][0].request_id):
                    r, ids, lps, versions, cands, _ = tools.pop(f)
                    apply_turn(r, f.result(), ids, lps, versions, cands, None, settings)
                    if r.live:
                        ready.append(r)
                    else:
                        self._release(kept.pop(id(r), None), free, cache)
                # admissions: ready episodes into rows (a held row first; else a free one, when there is one)
                waiting = collections.deque()
                while ready:
                    r = ready.popleft()
                    k = kept.get(id(r))
                    if context_full(r, settings, max_len):  # the driver's rule: as at max_turns
                        r.finish = "length"
                        self._release(kept.pop(id(r), None), free, cache)
                        continue
                    if (k is None or k.row is None) and not free:
                        waiting.append(r)
                        continue
                    self._admit(r, r.token_ids(), kept.pop(id(r), None), free, cache, decoding, base)
                ready = waiting
                self._measure(cache, decoding, kept)
                if not decoding:
                    continue
                feed, ended = self._sample(decoding, settings, stops)
                for b in ended:  # the action is whole: its KV parked (or held), its tool started
                    row = decoding.pop(b)
                    kept[id(row.rollout)] = self._keep(row, b, cache, free)
                    reason = "stop" if row.tokens[-1] in stops else "length"
                    tools[pool.submit(act_one, row.rollout, list(row.tokens), reason)] = (
                        row.rollout, list(row.tokens), row.logprobs, [version] * len(row.tokens),
                        row.candidates if settings.return_candidates else None, reason)
                if decoding:
                    self._decode(decoding, feed, cache)

    def _sample(self, decoding: dict[int, _Row], settings: RolloutSettings,
                stops: set[int]) -> tuple[torch.Tensor, list[int]]:
        """Every decoding row's next token from its own stream → (the tokens to feed [rows], rows whose action
        ended: a stop token, or ``max_action_tokens``)."""
        feed = torch.full((self.rows,), self.pad_id, dtype=torch.long)
        ended = []
        for b, row in decoding.items():
            tok, logp, kept_set = sample_next(row.logits[None], temperature=settings.temperature,
                                              top_k=settings.top_k, top_p=settings.top_p, generator=row.generator)
            if settings.return_candidates:  # the sampling distribution's logprob: renormalised over the kept set
                logp = logp - candidate_logmass(row.logits[None], kept_set, settings.temperature)
                row.candidates.append(kept_set[0].nonzero()[:, 0].tolist())
            t = int(tok[0])
            row.tokens.append(t)
            row.logprobs.append(float(logp[0]))
            feed[b] = t
            if t in stops or len(row.tokens) >= settings.max_action_tokens:
                ended.append(b)
        self.tokens_generated += len(decoding)
        return feed, ended

    def _keep(self, row: _Row, b: int, cache: StaticKVCache, free: list[int]) -> _Kept:
        """Row ``b``'s KV once its action ended (prompt + tokens fed; the last sampled token never was): parked in
        host memory and the row freed, or left in the row."""
        held = row.prompt + row.tokens[:-1]
        if not self.park:
            return _Kept(held, row=b)
        kv = cache.export_row(b).to("cpu", pin=self._pin)
        cache.lengths[b] = 0
        free.append(b)
        return _Kept(held, kv=kv)

    def _decode(self, decoding: dict[int, _Row], feed: torch.Tensor, cache: StaticKVCache) -> None:
        """One decode step of the whole batch; the rows not decoding are fed a pad and keep their lengths."""
        live = list(decoding)
        idle = [b for b in range(self.rows) if b not in decoding]
        before = cache.lengths.clone()
        cache.span = int(cache.lengths[live].max())
        logits = decode_step(self.model, feed.to(self.device), cache).float().cpu()  # [rows, V]
        if idle:
            cache.lengths[idle] = before[idle]
        for b in live:
            decoding[b].logits = logits[b]

    @property
    def _pin(self) -> bool:
        return self.device.type == "cuda"

    def _admit(self, r: Rollout, prompt: list[int], k: _Kept | None, free: list[int], cache: StaticKVCache,
               decoding: dict[int, _Row], base: int) -> None:
        """Row for ``r``'s next action: its kept KV continued over the new suffix (a whole prefill on a first turn,
        or when the context was rewritten and the kept tokens are no longer its prefix)."""
        extends = k is not None and 0 < len(k.tokens) < len(prompt) and prompt[:len(k.tokens)] == k.tokens
        if k is not None and k.row is not None:
            b = k.row
            prefix = cache.export_row(b) if extends else None
        else:
            b = free.pop()
            prefix = k.kv if extends else None
        if prefix is None and len(prompt) > 1:  # a whole prompt: a GRPO group's episodes share its first turn's
            head = tuple(prompt[:-1])
            prefix = self._shared.get(head)
            if prefix is None:
                prefix = KVCache(self.model.config)
                self.model(torch.tensor([head], device=self.device), prefix, logits_to_keep=1)
                self.prefill_tokens += len(head)
                self._shared[head] = prefix = prefix.to("cpu", pin=self._pin) if self.park else prefix
        logits = cache.fill_row(self.model, b, prompt, prefix)
        self.prefill_tokens += cache.prefilled
        self.admissions += 1
        g = torch.Generator().manual_seed(request_seed(base, r.request_id, len(prompt)))
        decoding[b] = _Row(r, prompt, g, logits.float().cpu())

    @staticmethod
    def _release(k: _Kept | None, free: list[int], cache: StaticKVCache) -> None:
        """An ended episode's KV: its held row back to the free list (a parked copy is simply dropped)."""
        if k is not None and k.row is not None:
            cache.lengths[k.row] = 0
            free.append(k.row)

    def _measure(self, cache: StaticKVCache, decoding: dict[int, _Row], kept: dict[int, _Kept]) -> None:
        rows = list(decoding) + [k.row for k in kept.values() if k.row is not None]
        lengths = cache.lengths.tolist()
        held = sum(cache.held_bytes(lengths[b]) for b in rows)
        parked = sum(k.kv.nbytes() for k in kept.values() if k.kv is not None)
        shared = sum(kv.nbytes() for kv in self._shared.values())  # parked with the episodes, else on the device
        parked, held = (parked + shared, held) if self.park else (parked, held + shared)
        self.kv_peak_bytes = max(self.kv_peak_bytes, held)
        self.parked_peak_bytes = max(self.parked_peak_bytes, parked)
        self.rows_peak = max(self.rows_peak, len(rows))
