"""Dynamic sampling: keep only groups whose rewards carry a learning signal (Report §4.1).

A group whose rewards are all equal has GRPO advantage 0 everywhere, so it costs a training step's compute and
teaches nothing. Report §4.1 drops all-pass and all-fail groups, *unless* a graded reward (GRS, §4.3) separates
the trajectories: an all-pass group with different rubric scores still has a signal.

    keep(g) ⇔ max_{i∈g} r_i − min_{i∈g} r_i > tol    or    (graded given and max_{i∈g} s_i − min_{i∈g} s_i > tol)

Dropping groups shrinks the batch, so the sampler over-draws. If a prompt's group is kept with probability q
(for binary rewards with per-prompt pass rate p and group size G, q = 1 − p^G − (1 − p)^G), filling B groups
needs ⌈B/q⌉ prompts on average; :func:`prompts_to_draw` with a confidence c returns the smallest n such that
P(Binomial(n, q) ≥ B) ≥ c.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from mimo_kit.rl.config import SAMPLING


@dataclasses.dataclass
class SamplingResult:
    """Which groups and rows survive dynamic sampling."""

    keep_groups: list[int]  # group ids kept, in order of first appearance
    drop_groups: list[int]
    keep_mask: torch.Tensor  # [N] bool over rows

    @property
    def kept_fraction(self) -> float:
        n = len(self.keep_groups) + len(self.drop_groups)
        return len(self.keep_groups) / n if n else 0.0


def dynamic_sampling(rewards: Any, group_ids: Any, graded: Any = None, tol: float = SAMPLING.reward_tol
                     ) -> SamplingResult:
    """Keep the groups with reward variance, or whose ``graded`` reward separates them. Inputs [N] → result."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    g = torch.as_tensor(group_ids, dtype=torch.long)
    if r.dim() != 1 or g.shape != r.shape:
        raise ValueError(f"dynamic_sampling: rewards {tuple(r.shape)} and group_ids {tuple(g.shape)} must be [N]")
    if not torch.isfinite(r).all():
        raise ValueError(f"dynamic_sampling: rewards must be finite, got {r.tolist()}")
    s = None
    if graded is not None:
        s = torch.as_tensor(graded, dtype=torch.float64)
        if s.shape != r.shape or not torch.isfinite(s).all():
            raise ValueError(f"dynamic_sampling: graded must be finite and [N={r.numel()}], got {s.tolist()}")
    order = list(dict.fromkeys(g.tolist()))
    keep, drop = [], []
    for gid in order:
        rows = g == gid
        spread = float(r[rows].max() - r[rows].min())
        graded_spread = float(s[rows].max() - s[rows].min()) if s is not None else 0.0
        (keep if spread > tol or graded_spread > tol else drop).append(gid)
    mask = torch.isin(g, torch.tensor(keep, dtype=torch.long))
    return SamplingResult(keep, drop, mask)


def keep_probability(pass_rate: float, group_size: int) -> float:
    """q = 1 − p^G − (1 − p)^G: chance a binary-reward group of size G is neither all-pass nor all-fail."""
    if not 0.0 <= pass_rate <= 1.0:
        raise ValueError(f"keep_probability: pass_rate={pass_rate}; expected a value in [0, 1]")
    if group_size < 1:
        raise ValueError(f"keep_probability: group_size={group_size}; expected >= 1")
    return 1.0 - pass_rate ** group_size - (1.0 - pass_rate) ** group_size


def _binom_sf(n: int, q: float, b: int) -> float:
    """P(Binomial(n, q) ≥ b), summed in log space (exact enough for n in the tens of thousands)."""
    if b <= 0:
        return 1.0
    if b > n:
        return 0.0
    lq, l1q = math.log(q), math.log1p(-q) if q < 1 else -math.inf
    terms = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq + (n - k) * l1q
             for k in range(b, n + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def prompts_to_draw(batch_groups: int, keep_rate: float, confidence: float | None = SAMPLING.confidence) -> int:
    """Prompts to sample so that ``batch_groups`` groups survive dynamic sampling at ``keep_rate``.

    ``confidence=None``: the mean-based ⌈B/q⌉. Otherwise the smallest n with P(Binomial(n, q) ≥ B) ≥ confidence.
    """
    if batch_groups < 0:
        raise ValueError(f"prompts_to_draw: batch_groups={batch_groups}; expected >= 0")
    if not 0.0 < keep_rate <= 1.0:
        raise ValueError(f"prompts_to_draw: keep_rate={keep_rate}; expected a value in (0, 1]")
    if batch_groups == 0:
        return 0
    n = math.ceil(batch_groups / keep_rate - 1e-9)
    if confidence is None or keep_rate == 1.0:
        return n
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"prompts_to_draw: confidence={confidence}; expected a value in (0, 1)")
    lo, hi = batch_groups, n  # P(…) is increasing in n; no fewer than B prompts can give B groups
    while _binom_sf(hi, keep_rate, batch_groups) < confidence:  # exponential search, then bisection
        lo, hi = hi + 1, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if _binom_sf(mid, keep_rate, batch_groups) >= confidence:
            hi = mid
        else:
            lo = mid + 1
    return hi
