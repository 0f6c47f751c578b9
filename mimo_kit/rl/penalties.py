"""Group-relative length penalty and segment-level behaviour penalty (Report §4.3).

**Length penalty.** The reference is the length of the group's own successes (median by default), so a problem
that needs long solutions is not punished for it. A success i of length L_i gets

    p_i = −s · min(X, (L_i / L_ref − 1 − δ)⁺)        if the group success rate ≥ γ, else 0

added to its reward before the group statistics. Failures are never length-penalised (their reward is already
the lowest). s, δ, X, γ are unpublished: ``LengthPenaltyConfig``. With s·X < 1 a long success still beats any
failure.

**Segment penalty.** Tokens inside error spans (unknown tool, malformed arguments, broken markup) get, for
sequence advantage A_i:

    success (A_i ≥ 0, passed):  error tokens A_t = 0               (no positive reinforcement of the error)
    failure:                    error tokens A_t = min(A_i, max(κ·A_i, −α_max))   (amplified, bounded)
                                normal tokens A_t = β_i · A_i,  β_i = clip((n − n_err·A_err/A_i) / n_norm, β_min, 1)

β_i is the kit's choice: it pays for the extra penalty on error tokens by easing the normal tokens, keeping the
sequence's total negative mass n·A_i where it can, and never easing below β_min (Report: "normal tokens are
reweighted to ease excessive negative pressure"). κ, α_max, β_min: ``SegmentPenaltyConfig``.
"""

from __future__ import annotations

from typing import Any

import torch

from mimo_kit.rl.config import LENGTH, SEGMENT


def length_penalty(lengths: Any, passed: Any, *, scale: float = LENGTH.scale, tolerance: float = LENGTH.tolerance,
                   cap: float = LENGTH.cap, gate: float = LENGTH.gate,
                   reference: str = LENGTH.reference) -> torch.Tensor:
    """Per-trajectory penalty (≤ 0) for one group (Report §4.3). ``lengths`` [G] > 0, ``passed`` [G] → [G]."""
    L = torch.as_tensor(lengths, dtype=torch.float64)
    p = torch.as_tensor(passed).to(torch.bool)
    if L.dim() != 1 or L.shape != p.shape:
        raise ValueError(f"length_penalty: lengths {tuple(L.shape)} and passed {tuple(p.shape)} must both be [G]")
    if not (L > 0).all():
        raise ValueError(f"length_penalty: lengths must be positive, got {L.tolist()}")
    out = torch.zeros_like(L)
    if p.sum() == 0 or p.double().mean() < gate:
        return out.float()
    ls = L[p]
    ref = {"median": lambda x: x.median(), "mean": lambda x: x.mean(), "min": lambda x: x.min()}
    if reference not in ref:
        raise ValueError(f"length_penalty: reference={reference!r}; expected one of {list(ref)}")
    # torch.median returns the lower middle value for an even count; average the two middles instead
    l_ref = ls.sort().values[(len(ls) - 1) // 2: len(ls) // 2 + 1].mean() if reference == "median" else ref[
        reference](ls)
    excess = (L / l_ref - 1 - tolerance).clamp(min=0).clamp(max=cap)
    out[p] = -scale * excess[p]
    return out.float()


def segment_advantages(advantages: Any, error_mask: torch.Tensor, loss_mask: torch.Tensor, passed: Any, *,
                       kappa: float = SEGMENT.kappa, alpha_max: float = SEGMENT.alpha_max,
                       beta_min: float = SEGMENT.beta_min) -> torch.Tensor:
    """Token-level advantages with the segment penalty (Report §4.3). Returns [N, T] (0 outside ``loss_mask``).

    ``advantages`` [N] per sequence, ``error_mask`` / ``loss_mask`` [N, T] bool, ``passed`` [N] bool.
    """
    a = torch.as_tensor(advantages, dtype=torch.float32)
    err, lm = torch.as_tensor(error_mask).bool(), torch.as_tensor(loss_mask).bool()
    p = torch.as_tensor(passed).bool()
    if a.dim() != 1 or err.dim() != 2 or err.shape != lm.shape or err.shape[0] != a.shape[0] or p.shape != a.shape:
        raise ValueError(f"segment_advantages: expected advantages [N], masks [N, T], passed [N]; got "
                         f"{tuple(a.shape)}, error {tuple(err.shape)}, loss {tuple(lm.shape)}, passed {tuple(p.shape)}")
    err = err & lm
    col = a[:, None].expand_as(lm)  # [N, T]
    n_err = err.sum(-1).float()  # [N]
    n_tok = lm.sum(-1).float()
    n_norm = n_tok - n_err
    # failures: amplified error tokens, bounded below by −α_max, never weaker than A_i
    a_err = torch.minimum(a, torch.maximum(kappa * a, torch.full_like(a, -alpha_max)))  # [N]
    ratio = torch.where(a < 0, a_err / a.clamp(max=-1e-12), torch.ones_like(a))  # A_err / A_i ≥ 1
    beta = torch.where(n_norm > 0, (n_tok - n_err * ratio) / n_norm.clamp(min=1), torch.ones_like(a))
    beta = beta.clamp(beta_min, 1.0)
    fail = (~p) & (a < 0)
    tok_fail = torch.where(err, a_err[:, None].expand_as(col), beta[:, None] * col)
    tok_pass = torch.where(err & (a >= 0)[:, None], torch.zeros_like(col), col)
    out = torch.where(fail[:, None], tok_fail, tok_pass)
    return torch.where(lm, out, torch.zeros_like(out))
