"""Speculative decoding of a batch of rows on the static cache: what a rollout engine runs (Report §2, §6).

:func:`~mimo_kit.speculative.decode.speculative_sample` decodes one sequence; a rollout engine decodes every live
sequence at once. Here a round is three batched calls, whatever the number of rows N:

1. the drafter proposes k drafts for every row (``propose_rows``: the block drafter in one pass, MTP in k);
2. the backbone verifies every row's block [anchor, d_1 … d_k] in one :func:`~mimo_kit.model.fast_decode.
   block_logits` call on a :class:`~mimo_kit.model.fast_decode.StaticKVCache`;
3. each row accepts its own a_n drafts by the one-sequence rules, all rows at once (:func:`~mimo_kit.speculative.
   decode.verify_rows`), :meth:`StaticKVCache.rollback` drops each row's k − a_n rejected keys and the drafter
   takes in each row's a_n + 1 kept positions (``observe``).

Rows advance by different amounts per round. A row that has ended keeps verifying a block that is rolled back
whole, so the batch keeps its shape (as plain decoding feeds pads to rows that stopped). Every row's tokens follow
its truncated target exactly, as in the one-sequence loop; the random draws come from one stream in another order,
so the tokens are other draws of the same law.

A drafter fits this loop through three methods (:class:`~mimo_kit.speculative.drafter.BlockDrafter` and
:class:`~mimo_kit.speculative.mtp.MTPDrafter` have them):

- ``rows_state(rows, device)`` → a state holding every row's drafter context;
- ``observe(backbone, state, rows, out, tokens, start, count, fresh)``: the backbone ran ``tokens`` [n, T] of
  ``rows`` [n] at positions start … start + T − 1 (``out``: its hidden states) and keeps the first ``count`` [n];
  ``fresh``: the rows were just prefilled;
- ``propose_rows(backbone, state, anchors, pos, temperature, generator)`` → drafts [N, k], q logits [N, k, V].
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from mimo_kit.model.cache import KVCache
from mimo_kit.model.decoder import MiMoForCausalLM
from mimo_kit.model.fast_decode import StaticKVCache, graph_len, verify_step
from mimo_kit.speculative.decode import (
    SpecResult,
    check_sampling,
    target_distribution,
    token_record,
    verify_rows,
)


def batched(drafter: Any) -> bool:
    """Whether ``drafter`` has the batched methods this loop needs (the module docstring)."""
    return all(callable(getattr(drafter, m, None)) for m in ("rows_state", "observe", "propose_rows"))


@dataclasses.dataclass
class RowsResult:
    results: list[SpecResult]  # per row, in prompt order
    prefilled: int  # prompt tokens run through the backbone (identical prompts once; a prefix's tokens spared)
    held_bytes: int  # KV the rows held at their ends (StaticKVCache.held_bytes), as plain decoding counts it


@torch.no_grad()
def speculative_sample_rows(backbone: MiMoForCausalLM, drafter: Any, prompts: Sequence[Sequence[int]],
                            max_new_tokens: int, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                            stop_token_ids: tuple[int, ...] = (), generator: torch.Generator | None = None,
                            return_candidates: bool = False, should_stop: Callable[[], bool] | None = None,
                            prefixes: Sequence[KVCache | None] | None = None,
                            on_end: Callable[[int, list[int], StaticKVCache], None] | None = None,
                            compiled: bool = False) -> RowsResult:
    """Up to ``max_new_tokens`` after each prompt, each row ending at its first stop token; per row what
    :func:`~mimo_kit.speculative.decode.speculative_sample` returns for one.

    ``prefixes[b]``: a stored KV of prompt b's first tokens (a prefix cache's hit), so only its suffix is prefilled
    and the drafter's context starts at the suffix. ``should_stop`` is asked after every round; True ends the rows
    still running ("abort"). ``on_end(b, tokens, cache)`` is called as row b ends with its tokens, its row of
    ``cache`` holding the prompt and every token but the last (what a prefix cache stores). ``compiled`` verifies
    through the compiled block step (:func:`~mimo_kit.model.fast_decode.verify_step`: CUDA graphs on CUDA)."""
    check_sampling("speculative_sample_rows", temperature, top_k, top_p, max_new_tokens, len(prompts), "prompts")
    if prefixes is not None and len(prefixes) != len(prompts):
        raise ValueError(f"speculative_sample_rows: {len(prefixes)} prefixes for {len(prompts)} prompts")
    t0 = time.perf_counter()
    N, K = len(prompts), drafter.num_drafts
    B = K + 1  # the verification block: anchor + k drafts
    device = next(backbone.parameters()).device
    stops = set(stop_token_ids)
    # every kept token plus one block past the last; the slack lets a row drop a whole block (rows that ended)
    length = max(len(p) for p in prompts) + max_new_tokens + B
    cache = StaticKVCache(backbone.config, N, graph_len(backbone.config, length) if compiled else length,
                          dtype=next(backbone.parameters()).dtype, device=device, slack=B)
    state = drafter.rows_state(N, device)

    # ---- prefill: identical prompts once, equal lengths batched (StaticKVCache.prefill); the drafter reads the states
    def on_forward(rows: list[list[int]], out, start: int) -> None:
        seq = torch.tensor([j for j, r in enumerate(rows) for _ in r], device=device)  # each row's sequence
        idx = [b for r in rows for b in r]
        T = out.last_hidden_state.shape[1]
        ids = torch.tensor([list(prompts[b])[start:] for b in idx], device=device)  # [n, T]
        seen = SimpleNamespace(hidden_states=[h[seq] for h in out.hidden_states],
                               last_hidden_state=out.last_hidden_state[seq])
        n = len(idx)
        drafter.observe(backbone, state, torch.tensor(idx, device=device), seen, ids,
                        torch.full((n,), start, device=device), torch.full((n,), T, device=device), fresh=True)

    first_logits = cache.prefill(backbone, prompts, prefixes, on_forward=on_forward).float().cpu()  # [N, V]
    prefilled = cache.prefilled

    tokens: list[list[int]] = [[] for _ in range(N)]
    logprobs: list[list[float]] = [[] for _ in range(N)]
    cands: list[list[list[int] | None]] = [[] for _ in range(N)]
    accepted: list[list[int]] = [[] for _ in range(N)]
    proposed_at, accepted_at = [[0] * K for _ in range(N)], [[0] * K for _ in range(N)]
    reasons: list[str | None] = [None] * N

    def keep(b: int, tok: int, p_row: torch.Tensor, lsm_row: torch.Tensor) -> None:
        tokens[b].append(tok)
        logprob, cand = token_record(tok, p_row, lsm_row, temperature, return_candidates)
        logprobs[b].append(logprob)
        cands[b].append(cand)

    def end(b: int, reason: str, extra: int = 0) -> None:
        """Row b ends: its last ``extra`` kept keys (tokens cut after a stop or past the budget) leave the cache."""
        reasons[b] = reason
        if extra:
            cache.rollback([extra if r == b else 0 for r in range(N)])
        if on_end is not None:
            on_end(b, tokens[b], cache)

    p0, lsm0 = target_distribution(first_logits, temperature, top_k, top_p)  # [N, V]
    first = first_logits.argmax(-1) if temperature == 0 else torch.multinomial(p0, 1, generator=generator)[:, 0]
    for b in range(N):
        keep(b, int(first[b]), p0[b], lsm0[b])
        if int(first[b]) in stops:
            end(b, "stop")
        elif max_new_tokens == 1:
            end(b, "length")
    anchors = first.clone()  # [N]: each row's last token, not yet in its cache
    pos = torch.tensor([len(p) for p in prompts])  # [N]: the anchors' positions
    while any(r is None for r in reasons):
        drafts, q_logits = drafter.propose_rows(backbone, state, anchors.to(device), pos.to(device), temperature,
                                                generator)
        drafts, q_logits = drafts.cpu(), q_logits.float().cpu()  # [N, k], [N, k, V]
        block = torch.cat([anchors[:, None], drafts], 1)  # [N, B]
        logits, hidden, last = verify_step(backbone, block.to(device), cache, compiled=compiled)
        logits = logits.float().cpu()  # [N, B, V]: logits[n, i] predicts the token after block[n, i]
        p, lsm = target_distribution(logits, temperature, top_k, top_p)
        q = (q_logits / temperature).softmax(-1) if temperature > 0 else None
        a, nxt = verify_rows(drafts, logits, p, q, generator)
        a = a.masked_fill(torch.tensor([r is not None for r in reasons]), -1)  # −1: ended, its block dropped
        nxt = nxt.tolist()
        cache.rollback(B - 1 - a)  # a live row keeps its anchor and a drafts; an ended one nothing
        drafter.observe(backbone, state, torch.arange(N, device=device), SimpleNamespace(
            hidden_states=hidden, last_hidden_state=last), block.to(device), pos.to(device), (a + 1).to(device))
        for b in range(N):
            if reasons[b] is not None:
                continue
            ab = int(a[b])
            for i in range(min(ab + 1, K)):
                proposed_at[b][i] += 1
                accepted_at[b][i] += int(i < ab)
            accepted[b].append(ab)
            emitted = [*drafts[b, :ab].tolist(), nxt[b]]
            hit = next((i + 1 for i, t in enumerate(emitted) if t in stops), None)  # up to the first stop token
            n_keep = min(max_new_tokens - len(tokens[b]), hit or len(emitted))  # … within the budget
            for i, tok in enumerate(emitted[:n_keep]):
                keep(b, int(tok), p[b, i], lsm[b, i])
            anchors[b], pos[b] = nxt[b], pos[b] + ab + 1
            if hit is not None and hit <= n_keep:
                end(b, "stop", len(emitted) - n_keep)
            elif len(tokens[b]) >= max_new_tokens:
                end(b, "length", len(emitted) - n_keep)
        if should_stop is not None and any(r is None for r in reasons) and should_stop():
            for b in range(N):
                if reasons[b] is None:
                    end(b, "abort")
    seconds = time.perf_counter() - t0
    results = [SpecResult(tokens[b], accepted[b], proposed_at[b], accepted_at[b], seconds, logprobs[b],
                          cands[b] if return_candidates else None, reasons[b]) for b in range(N)]
    held = sum(cache.held_bytes(int(n)) for n in cache.lengths.tolist())
    return RowsResult(results, prefilled, held)
