"""Lossless speculative decoding with a drafter: the block drafter or the MTP module (Report §2, §6).

Each round: the drafter proposes d_1 … d_{B−1} after the anchor (the block drafter in one pass, MTP in B − 1);
the backbone scores [anchor, d_1, …, d_{B−1}] in one forward and so knows p_i, its distribution for the token
after each input.

- **Greedy**: accept the longest prefix with d_{i+1} = argmax p_i, then emit the *bonus* token argmax p_a.
  The output equals plain greedy decoding token for token.
- **Sampling** (temperature T > 0), the speculative-sampling rule: accept d_i with probability
  min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw from the residual (p_i − q_i)⁺ / Σ(p_i − q_i)⁺ and stop;
  when all are accepted draw the bonus from p_{B−1}. Every emitted token is distributed exactly as under plain
  sampling from p, whatever the drafter proposes (q_i may ignore the other drafts: a block drafter drafts all
  positions at once).

- **Truncated sampling** (top-k / top-p, what RL rollouts sample with): the same rule with the truncated target
  p̃_i = softmax(truncate(z_i / T)) in place of p_i, so every token is distributed as under plain truncated sampling
  (:func:`~mimo_kit.model.generate.sample_next`), and each token's candidate set is the support of its p̃_i.

Rejected positions are rolled back from the backbone's cache (its SWA rings keep ``block_size`` spare slots):
the general forward's :class:`~mimo_kit.model.cache.KVCache`, or with ``fast=True`` the preallocated
:class:`~mimo_kit.model.fast_decode.StaticKVCache` that plain decoding's fast path uses
(:func:`~mimo_kit.model.fast_decode.block_logits`). The loop talks to the drafter through :class:`Drafter`
(begin / propose / commit). :func:`speculative_sample` is the loop; :func:`speculative_generate` is its
one-end-token form.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from mimo_kit.model.decoder import CausalLMOutput, MiMoForCausalLM
from mimo_kit.model.fast_decode import StaticKVCache, verify_step
from mimo_kit.model.generate import truncate_logits


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(p − q)⁺ normalised: what a rejection resamples from. [..., V] → [..., V] (p itself where p ≤ q
    everywhere)."""
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)


def verify_greedy(drafts: torch.Tensor, p_logits: torch.Tensor) -> tuple[int, int]:
    """drafts [K], target logits [K + 1, V] → (accepted count a, bonus token argmax p_a)."""
    target = p_logits.argmax(-1)  # [K + 1]
    match = (drafts == target[:-1]).long()
    a = int(match.cumprod(0).sum())
    return a, int(target[a])


def verify_sampling(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                    generator: torch.Generator | None = None) -> tuple[int, int]:
    """drafts [K] drawn from q [K, V]; target probabilities p [K + 1, V] → (accepted count a, next token)."""
    K = drafts.shape[0]
    u = torch.rand(K, generator=generator)
    for i in range(K):
        d = int(drafts[i])
        if u[i] * q[i, d] < p[i, d]:  # u < p/q without dividing by a zero q
            continue
        nxt = torch.multinomial(residual_distribution(p[i], q[i]), 1, generator=generator)
        return i, int(nxt)
    return K, int(torch.multinomial(p[K], 1, generator=generator))


def verify_rows(drafts: torch.Tensor, p_logits: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's verification at once: drafts [N, K], the target's logits and truncated probabilities
    p_logits, p [N, K + 1, V], the drafts' q [N, K, V] (None: greedy) → (accepted counts a [N], next tokens [N]).

    Greedy: :func:`verify_greedy` per row. Sampling: :func:`verify_sampling` per row, its K uniforms drawn for all
    rows together: a_n is the first i with u_i · q_i(d_i) ≥ p_i(d_i) (K if none), and the next token comes from
    the residual (p_a − q_a)⁺ (p_K when every draft was accepted)."""
    N, K = drafts.shape
    if q is None:
        target = p_logits.argmax(-1)  # [N, K + 1]
        a = (drafts == target[:, :-1]).long().cumprod(1).sum(1)
        return a, target.gather(1, a[:, None])[:, 0]
    u = torch.rand(N, K, generator=generator)
    pd = p[:, :K].gather(2, drafts[..., None])[..., 0]  # [N, K]: p_i(d_i)
    qd = q.gather(2, drafts[..., None])[..., 0]
    a = (u * qd < pd).long().cumprod(1).sum(1)  # [N]
    V = p.shape[-1]
    at = a[:, None, None].expand(N, 1, V)
    pa = p.gather(1, at)[:, 0]  # [N, V]
    qa = torch.cat([q, q.new_zeros(N, 1, V)], 1).gather(1, at)[:, 0]  # q_K = 0: the bonus draws from p_K
    return a, torch.multinomial(residual_distribution(pa, qa), 1, generator=generator)[:, 0]


def draw_drafts(q_logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Drafts from q logits [N, k, V]: argmax at T = 0, else one draw from softmax(q / T) each → [N, k], drawn on
    the CPU (the sampling stream is a CPU generator, whatever device the drafter runs on)."""
    if temperature == 0:
        return q_logits.argmax(-1)
    N, k, V = q_logits.shape
    probs = (q_logits.float() / temperature).softmax(-1).view(N * k, V).cpu()
    return torch.multinomial(probs, 1, generator=generator).view(N, k).to(q_logits.device)


@dataclasses.dataclass
class SpecResult:
    tokens: list[int]  # generated tokens (the first is the backbone's own after the prompt)
    accepted: list[int]  # per round: drafts accepted (0 … B − 1); each round emits accepted + 1 tokens
    proposed_by_position: list[int]  # how often each block position 1 … B − 1 was proposed (reached)
    accepted_by_position: list[int]  # … and accepted
    seconds: float
    logprobs: list[float] = dataclasses.field(default_factory=list)  # per token: log softmax(z / T); with
    # candidates, log p̃ (renormalised over the candidate set, as the engine reports it)
    candidates: list[list[int]] | None = None  # per token: the support of the truncated target (when asked)
    finish_reason: str = "length"  # "stop" at a stop token, "abort" when ``should_stop`` said so, else "length"

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per backbone forward: accepted drafts + the bonus token (≥ 1)."""
        return sum(a + 1 for a in self.accepted) / max(1, len(self.accepted))


class Drafter(Protocol):
    """What the verification loop needs of a drafter (the block drafter and the MTP module both fit).

    - ``num_drafts``: k, drafts per round (block size − 1);
    - ``begin(backbone, out, prompt)`` → state, from the backbone's prefill output (hidden states included);
    - ``propose(backbone, state, anchor, pos, temperature, generator)`` → (drafts [k], q logits [k, V]): drafts
      after ``anchor`` at position ``pos``, draft i drawn from softmax(q_i / T) (argmax when T = 0) given the
      drafts before it;
    - ``commit(backbone, state, out, block, accepted, pos)`` → state, after the backbone verified ``block``
      [1, k + 1] (its output ``out``) and kept the anchor and ``accepted`` drafts.
    """

    num_drafts: int

    def begin(self, backbone: MiMoForCausalLM, out, prompt: torch.Tensor) -> Any: ...

    def propose(self, backbone: MiMoForCausalLM, state: Any, anchor: int, pos: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def commit(self, backbone: MiMoForCausalLM, state: Any, out, block: torch.Tensor, accepted: int,
               pos: int) -> Any: ...


def target_distribution(logits: torch.Tensor, temperature: float, top_k: int,
                        top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., V] target logits → (truncated target probabilities p̃ = softmax(truncate(z / T)), log softmax(z / T)),
    both [..., V]; greedy (T = 0) scales by 1."""
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    return truncate_logits(scaled, top_k, top_p).softmax(-1), scaled.log_softmax(-1)


def token_record(tok: int, p_row: torch.Tensor, lsm_row: torch.Tensor, temperature: float,
                 candidates: bool) -> tuple[float, list[int] | None]:
    """What the engine reports for an emitted token, as plain sampling does: its logprob log softmax(z / T), or
    with ``candidates`` log p̃ renormalised over the candidate set and that set (the support of p̃; greedy: the token
    alone, logprob 0)."""
    if not candidates:
        return float(lsm_row[tok]), None
    if temperature == 0:
        return 0.0, [tok]
    return float(p_row[tok].log()), (p_row > 0).nonzero()[:, 0].tolist()


def check_sampling(where: str, temperature: float, top_k: int, top_p: float, max_new_tokens: int, n: int,
                   what: str) -> None:
    """Refuse by name what no decoding loop can honour: sampling settings out of range, no ``what`` (n of them:
    prompt tokens, prompts) or no token to generate."""
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(f"{where}: temperature={temperature} (>= 0), top_p={top_p} (in (0, 1]), top_k={top_k} "
                         "(>= 0) expected")
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"{where}: {n} {what}, max_new_tokens={max_new_tokens}; expected at least 1 of each")


@torch.no_grad()
def speculative_generate(backbone: MiMoForCausalLM, drafter: Drafter, prompt: torch.Tensor,
                         max_new_tokens: int, *, temperature: float = 0.0, eos_token_id: int | None = None,
                         generator: torch.Generator | None = None, fast: bool = False) -> SpecResult:
    """Generate up to ``max_new_tokens`` after ``prompt`` [1, T] (one sequence) with any :class:`Drafter`
    (``fast``: on the static cache, see :func:`speculative_sample`)."""
    if prompt.dim() != 2 or prompt.shape[0] != 1:
        raise ValueError(f"speculative_generate: prompt must be [1, T], got {tuple(prompt.shape)}")
    return speculative_sample(backbone, drafter, prompt[0].tolist(), max_new_tokens, temperature=temperature,
                              stop_token_ids=() if eos_token_id is None else (eos_token_id,), generator=generator,
                              fast=fast)


@torch.no_grad()
def speculative_sample(backbone: MiMoForCausalLM, drafter: Drafter, prompt_ids: list[int], max_new_tokens: int, *,
                       temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                       stop_token_ids: tuple[int, ...] = (), generator: torch.Generator | None = None,
                       return_candidates: bool = False, should_stop: Callable[[], bool] | None = None,
                       fast: bool = False, compiled: bool = False) -> SpecResult:
    """Up to ``max_new_tokens`` after ``prompt_ids``, ending at the first of ``stop_token_ids``: the tokens, each
    one's logprob and (``return_candidates``) its candidate set, and the drafts' acceptance. ``should_stop`` is
    asked after every verification round; True cuts the generation there (``finish_reason`` "abort").

    ``fast`` verifies on a :class:`~mimo_kit.model.fast_decode.StaticKVCache` (the kit decoder's fast decode
    path, :func:`~mimo_kit.model.fast_decode.block_logits`) instead of the general forward: the same logits up
    to float rounding, fewer small operations per round (the general forward, which raises by name, when a block
    could run past ``max_position_embeddings``). ``compiled`` (with ``fast``) verifies through the compiled block
    step (:func:`~mimo_kit.model.fast_decode.verify_step`: CUDA graphs on CUDA)."""
    check_sampling("speculative_sample", temperature, top_k, top_p, max_new_tokens, len(prompt_ids), "prompt tokens")
    stops = set(stop_token_ids)
    K = drafter.num_drafts
    B = K + 1
    t0 = time.perf_counter()
    prompt = torch.tensor([prompt_ids], dtype=torch.long, device=next(backbone.parameters()).device)
    room = len(prompt_ids) + max_new_tokens + B  # every kept token plus one block of drafts past the last
    if fast and room <= backbone.config.max_position_embeddings:
        static = StaticKVCache(backbone.config, 1, room, dtype=next(backbone.parameters()).dtype,
                               device=prompt.device, slack=B)
        out = static.fill_row(backbone, 0, prompt_ids, output_hidden_states=True)

        def verify(block: torch.Tensor) -> CausalLMOutput:
            logits, hidden, last = verify_step(backbone, block, static, compiled=compiled)
            return CausalLMOutput(logits, None, hidden, last)

        def rollback(n: int) -> None:
            static.rollback([n])
    else:
        cache = backbone.new_cache(slack=B)
        out = backbone(prompt, cache, output_hidden_states=True, logits_to_keep=1)

        def verify(block: torch.Tensor) -> CausalLMOutput:
            return backbone(block, cache, output_hidden_states=True)

        rollback = cache.rollback
    state = drafter.begin(backbone, out, prompt)

    def target(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return target_distribution(logits, temperature, top_k, top_p)

    def keep(tok: int, p_row: torch.Tensor, lsm_row: torch.Tensor) -> None:
        tokens.append(tok)
        logprob, cand = token_record(tok, p_row, lsm_row, temperature, cands is not None)
        logprobs.append(logprob)
        if cands is not None:
            cands.append(cand)

    tokens: list[int] = []
    logprobs: list[float] = []
    cands: list[list[int]] | None = [] if return_candidates else None
    p0, lsm0 = target(out.logits[0, -1:])
    first = int(out.logits[0, -1].argmax()) if temperature == 0 else int(torch.multinomial(p0[0], 1,
                                                                                          generator=generator))
    keep(first, p0[0], lsm0[0])
    anchor, pos = first, len(prompt_ids)
    accepted: list[int] = []
    proposed_at, accepted_at = [0] * K, [0] * K
    while len(tokens) < max_new_tokens and anchor not in stops:
        drafts, q_logits = drafter.propose(backbone, state, anchor, pos, temperature, generator)  # [K], [K, V]
        block = torch.cat([torch.tensor([anchor]), drafts.cpu()])[None].to(prompt.device)  # [1, B]
        out = verify(block)
        p_logits = out.logits[0].float().cpu()  # [B, V]: p_i predicts the token after block[i]
        p, lsm = target(p_logits)
        if temperature == 0:
            a, nxt = verify_greedy(drafts.cpu(), p_logits)
        else:
            a, nxt = verify_sampling(drafts.cpu(), (q_logits.float().cpu() / temperature).softmax(-1), p, generator)
        rollback(B - 1 - a)  # keep the anchor and the a accepted drafts
        state = drafter.commit(backbone, state, out, block, a, pos)
        for i in range(min(a + 1, K)):
            proposed_at[i] += 1
            accepted_at[i] += int(i < a)
        accepted.append(a)
        emitted = [*drafts[:a].tolist(), nxt]
        for i, tok in enumerate(emitted):
            keep(int(tok), p[i], lsm[i])
        anchor, pos = nxt, pos + a + 1
        if stops.intersection(emitted):
            break
        if should_stop is not None and should_stop() and len(tokens) < max_new_tokens:
            return SpecResult(tokens, accepted, proposed_at, accepted_at, time.perf_counter() - t0, logprobs,
                              cands, "abort")
    end = next((i + 1 for i, t in enumerate(tokens) if t in stops), None)
    n = min(max_new_tokens, end or len(tokens))
    return SpecResult(tokens[:n], accepted, proposed_at, accepted_at, time.perf_counter() - t0, logprobs[:n],
                      None if cands is None else cands[:n], "stop" if end is not None and end <= n else "length")


def expected_accepted_length(alpha: float, block_size: int) -> float:
    """Tokens per round when each of the B − 1 drafts is accepted independently with probability α:
    E = Σ_{i=0}^{B−1} α^i = (1 − α^B) / (1 − α)  (accepted drafts plus the bonus token)."""
    if not 0 <= alpha <= 1 or block_size < 2:
        raise ValueError(f"expected_accepted_length: alpha={alpha} in [0, 1], block_size={block_size} >= 2 expected")
    return float(block_size) if alpha == 1 else (1 - alpha**block_size) / (1 - alpha)
