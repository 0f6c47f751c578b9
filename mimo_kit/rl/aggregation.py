"""Loss aggregation: token-mean, seq-mean, prompt-mean, exact under micro-batching (Report §5, docs/design.md "RL").

With ℓ_{i,t} the per-token loss, m_{i,t} the loss mask, |o_i| = Σ_t m_{i,t} the trained tokens of row i, N the
rows, g(i) the group (prompt) of row i, G the groups and |o_g| = Σ_{i∈g} |o_i|:

    token-mean:   L = Σ_{i,t} m ℓ / Σ_{i,t} m                       every token of the batch weighs the same
    seq-mean:     L = (1/N) Σ_i (1/|o_i|) Σ_t m ℓ                   every sequence weighs the same
    prompt-mean:  L = (1/G) Σ_g (1/|o_g|) Σ_{i∈g} Σ_t m ℓ           every prompt weighs the same; inside a prompt
                                                                    every token weighs the same (Report §5)

Each is a weighted sum L = Σ_{i,t} w_{i,t} ℓ_{i,t} whose weights depend only on the masks and groups of the
*whole* batch. :func:`token_weights` computes w once; a micro-batch contributes Σ over its rows of w·ℓ, and the
micro-batch losses add up to the full-batch loss exactly, however the batch is split (the lesson from peers'
trackers: normalise by global counts, never by the micro-batch's own).

Why prompt-mean curbs length growth: under seq-mean a long failure spreads its penalty over more tokens (each
token gets 1/|o_i| of it), so growing a failing answer dilutes its penalty; under token-mean prompts with long
rollouts dominate the batch. prompt-mean gives every token of a group the same weight and every group the same
total weight, so neither length nor long-horizon prompts buy influence.
"""

from __future__ import annotations

from typing import Any

import torch

MODES = ("token-mean", "seq-mean", "prompt-mean")


def _check(per_token_loss: torch.Tensor | None, mask: torch.Tensor, group_ids: Any, mode: str) -> tuple:
    m = torch.as_tensor(mask)
    if m.dim() != 2:
        raise ValueError(f"aggregate_loss: mask must be [N, T], got shape {tuple(m.shape)}")
    if per_token_loss is not None and tuple(per_token_loss.shape) != tuple(m.shape):
        raise ValueError(f"aggregate_loss: per_token_loss {tuple(per_token_loss.shape)} and mask {tuple(m.shape)} "
                         "differ in shape")
    if mode not in MODES:
        raise ValueError(f"aggregate_loss: mode={mode!r}; expected one of {MODES}")
    g = torch.as_tensor(group_ids, dtype=torch.long) if group_ids is not None else None
    if mode == "prompt-mean" and g is None:
        raise ValueError("aggregate_loss: prompt-mean needs group_ids [N]")
    if g is not None and (g.dim() != 1 or g.shape[0] != m.shape[0]):
        raise ValueError(f"aggregate_loss: group_ids must be [N={m.shape[0]}], got shape {tuple(g.shape)}")
    return m, g


def token_weights(mask: torch.Tensor, group_ids: Any, mode: str) -> torch.Tensor:
    """Weights w [N, T] with L = Σ w ℓ for the whole batch (see the module docstring for each formula).

    Rows without a trained token get weight 0 and do not count in N (seq-mean) or in G (prompt-mean).
    """
    m, g = _check(None, mask, group_ids, mode)
    mf = m.float()
    row, batch = row_divisors(mf.sum(-1), g, mode)
    return mf / row[:, None] / batch


def row_divisors(n_tok: torch.Tensor, group_ids: Any, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a [N], b)`` with w_{i,t} = m_{i,t} / a_i / b, from the rows' trained-token counts |o_i| alone.

    A rank that holds only some rows of the batch (the learner fetching its own rows' payloads, Report §6) gets its
    weights from the whole batch's counts without the other rows' tokens:

    token-mean: a_i = Σ_j |o_j|, b = 1;  seq-mean: a_i = |o_i|, b = #rows with |o_i| > 0;
    prompt-mean: a_i = |o_g(i)|, b = #groups with |o_g| > 0 (every count clamped to ≥ 1).
    """
    if mode not in MODES:
        raise ValueError(f"aggregate_loss: mode={mode!r}; expected one of {MODES}")
    n_tok = torch.as_tensor(n_tok, dtype=torch.float32)  # [N] |o_i|
    one = torch.ones(())
    if mode == "token-mean":
        return n_tok.sum().clamp(min=1.0).expand_as(n_tok), one
    if mode == "seq-mean":
        return n_tok.clamp(min=1.0), (n_tok > 0).float().sum().clamp(min=1.0)
    if group_ids is None:
        raise ValueError("aggregate_loss: prompt-mean needs group_ids [N]")
    _, inv = torch.unique(torch.as_tensor(group_ids, dtype=torch.long), return_inverse=True)
    per_group = torch.zeros(int(inv.max()) + 1 if inv.numel() else 0).index_add_(0, inv, n_tok)  # [G] |o_g|
    return per_group[inv].clamp(min=1.0), (per_group > 0).float().sum().clamp(min=1.0)


def aggregate_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, group_ids: Any = None,
                   mode: str = "token-mean", *, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Aggregate a per-token loss [N, T] into a scalar (Report §5; formulas in the module docstring).

    Whole batch: ``aggregate_loss(loss, mask, group_ids, mode)``. Micro-batches: compute
    ``w = token_weights(mask, group_ids, mode)`` on the whole batch once and pass ``weights=w[rows]`` with each
    micro-batch's rows; the micro-batch losses then sum to the whole-batch loss (gradient accumulation = sum).
    """
    m, g = _check(per_token_loss, mask, group_ids if weights is None else None,
                  mode if weights is None else "token-mean")
    if weights is None:
        weights = token_weights(m, g, mode)
    elif tuple(weights.shape) != tuple(m.shape):
        raise ValueError(f"aggregate_loss: weights {tuple(weights.shape)} and mask {tuple(m.shape)} differ in shape")
    w = weights.to(per_token_loss.dtype) * m.to(per_token_loss.dtype)
    # masked positions may hold inf/NaN (padding): select, never multiply them
    return torch.where(m.bool(), per_token_loss * w, torch.zeros_like(per_token_loss)).sum()


def group_weight(mask: torch.Tensor, group_ids: Any, mode: str) -> dict[int, float]:
    """Total weight each group (prompt) gets under ``mode``: how much of the batch's gradient it can steer."""
    w = token_weights(mask, group_ids, mode)
    g = torch.as_tensor(group_ids, dtype=torch.long)
    return {int(k): float(w[g == k].sum()) for k in torch.unique(g)}
