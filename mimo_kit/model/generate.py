"""Sampling with the KV cache: greedy, temperature, top-k and top-p, returning what RL needs per token.

Per generated token the kit keeps (docs/design.md "token-in/token-out", Report §6):
- the token id and its **logprob** under the sampling distribution before truncation, log softmax(z / T);
- optionally the **top-p candidate set**: the token ids that survived top-k/top-p truncation, recorded so that
  training can renormalise over exactly that set (top-p candidate replay; the loss that uses it is planned);
- the finish reason (``"stop"`` at an end token, ``"length"`` at ``max_new_tokens``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from mimo_kit.model.decoder import MiMoForCausalLM


@dataclasses.dataclass
class Generation:
    tokens: torch.Tensor  # [B, N] generated ids (after the stop token: pad_id)
    logprobs: torch.Tensor  # [B, N] log p(token) under softmax(logits / T); 0 after the stop token
    finish_reasons: list[str]  # per row: "stop" | "length"
    lengths: list[int]  # generated tokens per row, the stop token included
    candidates: list[list[torch.Tensor]] | None = None  # per row, per token: ids kept by top-k / top-p


def truncate_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Mask (to −inf) every logit outside the top-k and outside the smallest set of mass ≥ top_p.  [B, V]"""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [B, V] → (tokens [B], logprobs [B], kept-candidate mask [B, V]). temperature 0 = greedy."""
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(f"sampling: temperature={temperature} (>= 0), top_p={top_p} (in (0, 1]), "
                         f"top_k={top_k} (>= 0) expected")
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(-1)
        logp = logits.log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
        kept = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, tokens[:, None], True)
        return tokens, logp, kept
    scaled = logits / temperature
    truncated = truncate_logits(scaled, top_k, top_p)
    tokens = torch.multinomial(truncated.softmax(-1), 1, generator=generator)[:, 0]
    logp = scaled.log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
    return tokens, logp, torch.isfinite(truncated)


@torch.no_grad()
def generate(model: MiMoForCausalLM, input_ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, eos_token_id: int | None = None, pad_id: int = 0,
             return_candidates: bool = False, generator: torch.Generator | None = None) -> Generation:
    """Prefill ``input_ids`` [B, T] once, then decode token by token with the cache."""
    cache = model.new_cache()
    logits = model(input_ids, cache, logits_to_keep=1).logits[:, -1]
    return sampling_loop(logits, lambda tok: model(tok[:, None], cache).logits[:, -1], max_new_tokens,
                         temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id, pad_id=pad_id,
                         return_candidates=return_candidates, generator=generator)


def sampling_loop(logits: torch.Tensor, step: Callable[[torch.Tensor], torch.Tensor], max_new_tokens: int, *,
                  temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, eos_token_id: int | None = None,
                  pad_id: int = 0, return_candidates: bool = False,
                  generator: torch.Generator | None = None) -> Generation:
    """Sample from the prefill's last logits [B, V], then ``step(tokens [B]) → logits [B, V]`` per new token.

    Rows that stopped are fed ``pad_id`` and record logprob 0."""
    B = logits.shape[0]
    tokens, logps = [], []
    cands: list[list[torch.Tensor]] = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool, device=logits.device)
    lengths = [max_new_tokens] * B
    reasons = ["length"] * B
    for i in range(max_new_tokens):
        tok, logp, kept = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                      generator=generator)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        tokens.append(tok)
        logps.append(torch.where(done, torch.zeros_like(logp), logp))
        if return_candidates:
            for b in range(B):
                if not done[b]:
                    cands[b].append(kept[b].nonzero()[:, 0])
        if eos_token_id is not None:
            for b in (tok == eos_token_id).logical_and(~done).nonzero()[:, 0].tolist():
                lengths[b], reasons[b] = i + 1, "stop"
            done |= tok == eos_token_id
        if bool(done.all()) or i == max_new_tokens - 1:
            break
        logits = step(tok)
    return Generation(torch.stack(tokens, 1), torch.stack(logps, 1), reasons, lengths,
                      cands if return_candidates else None)
