"""Advantages: GRPO, graded rewards (GRS) and groupwise advantage redistribution (GAR) (Report §4.3, §5).

GRPO (Report §5) normalises each reward within its rollout group:

    A_i = (r_i − mean_g r) / (std_g r + ε)          (std scaling switchable; ε = ``AdvantageConfig.eps``)

GRS (Report §4.3, offline rubric synthesis) makes all-pass groups informative:

    R_i = R_test,i · S_sol,i · S_beh,i               R_test ∈ {0, 1}, rubric scores S ∈ [0, 1]

GAR (Report §4.3, GAGAR) moves positive advantage mass from sloppy passes to better ones, keeping the total:

    P = {i : passed_i},  λ = Σ_P A_i / Σ_P f_i A_i,  A'_i = λ f_i A_i (i ∈ P),  A'_i = A_i (i ∉ P)
    ⇒ Σ_P A'_i = Σ_P A_i, failures untouched.

Practical mode caps the magnification λ f_i at ``max_scale`` and subtracts the group mean again. The quality
factors f_i ∈ (0, 1] come from the grader's ranking with ties (:func:`quality_factors`; the tier schedule is the
kit's, ``GARConfig``). :func:`gar_advantages` is the whole online step: confirmed hacks are set to reward 0 and
counted as failures *before* the group statistics, and an unusable verdict falls back to the GRPO advantages.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mimo_kit.rl.config import ADV, GAR


def _vector(x: Any, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D tensor [G], got shape {tuple(t.shape)}")
    return t.to(dtype) if dtype != torch.bool else t


def grpo_advantages(rewards: torch.Tensor | Sequence[float], scale_std: bool = ADV.scale_std, *,
                    eps: float = ADV.eps, std_correction: int = ADV.std_correction) -> torch.Tensor:
    """GRPO group-normalised advantages (Report §5). ``rewards`` [G] → [G], or [groups, G] → [groups, G].

    A_i = (r_i − mean_g r) / (std_g r + ε) with ``scale_std``; A_i = r_i − mean_g r without.
    A group of equal rewards gets A = 0 (no signal); one rollout alone has std 0 and A = 0.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if r.dim() not in (1, 2) or r.shape[-1] == 0:
        raise ValueError(f"grpo_advantages: rewards must be [G] or [groups, G] with G >= 1, got {tuple(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError(f"grpo_advantages: rewards must be finite, got {r.tolist()}")
    centred = r - r.mean(-1, keepdim=True)
    if not scale_std:
        return centred
    g = r.shape[-1]
    std = r.std(-1, correction=std_correction, keepdim=True) if g > std_correction else torch.zeros_like(centred)
    return centred / (std + eps)


def grs_reward(test_passed: Any, s_sol: Any, s_beh: Any) -> torch.Tensor:
    """GRS reward R = R_test · S_sol · S_beh, elementwise (Report §4.3). All inputs [G]; returns float [G].

    ``test_passed`` is bool or 0/1; the rubric scores must lie in [0, 1]. A failing trajectory gets 0 whatever
    its rubric scores; an all-pass group still gets a spread from the rubrics.
    """
    t = torch.as_tensor(test_passed)
    sol, beh = torch.as_tensor(s_sol, dtype=torch.float32), torch.as_tensor(s_beh, dtype=torch.float32)
    if not (t.shape == sol.shape == beh.shape):
        raise ValueError(f"grs_reward: shapes differ: test_passed {tuple(t.shape)}, s_sol {tuple(sol.shape)}, "
                         f"s_beh {tuple(beh.shape)}")
    if t.dtype != torch.bool:
        bad = t[(t != 0) & (t != 1)]
        if bad.numel():
            raise ValueError(f"grs_reward: test_passed must be 0/1 or bool, got {bad.tolist()}")
    for name, s in (("s_sol", sol), ("s_beh", beh)):
        bad = s[~((s >= 0) & (s <= 1))]  # also catches NaN
        if bad.numel():
            raise ValueError(f"grs_reward: {name} must lie in [0, 1], got {bad.tolist()}")
    return t.to(torch.float32) * sol * beh


def gar_redistribute(advantages: Any, passed: Any, quality: Any, max_scale: float | None = None,
                     recenter: bool = False) -> torch.Tensor:
    """Redistribute the passes' advantage by quality (Report §4.3). All inputs [G]; returns A' [G].

    Uncapped (``max_scale=None``, ``recenter=False``), with P the passes:

        λ = Σ_P A_i / Σ_P f_i A_i,   A'_i = λ f_i A_i on P,   A'_i = A_i off P   ⇒   Σ_P A'_i = Σ_P A_i

    Practical mode: the scale is capped, s_i = min(λ f_i, max_scale), and with ``recenter`` the group mean is
    subtracted again, A' ← A' − mean(A'). Groups where redistribution is undefined (no pass,
    Σ_P A_i ≤ 0 or Σ_P f_i A_i ≤ 0, e.g. passes that sit below the group mean) are returned unchanged.
    ``quality`` f_i must lie in (0, 1] on the passes (failures' entries are ignored).
    """
    a = _vector(advantages, "gar_redistribute: advantages")
    p = _vector(passed, "gar_redistribute: passed", torch.bool).to(torch.bool)
    f = _vector(quality, "gar_redistribute: quality")
    if not (a.shape == p.shape == f.shape):
        raise ValueError(f"gar_redistribute: shapes differ: advantages {tuple(a.shape)}, passed {tuple(p.shape)}, "
                         f"quality {tuple(f.shape)}")
    if not torch.isfinite(a).all():
        raise ValueError(f"gar_redistribute: advantages must be finite, got {a.tolist()}")
    fp = f[p]
    bad = fp[~((fp > 0) & (fp <= 1))]
    if bad.numel():
        raise ValueError(f"gar_redistribute: quality of passes must lie in (0, 1], got {bad.tolist()}")
    if max_scale is not None and not max_scale >= 1.0:
        raise ValueError(f"gar_redistribute: max_scale={max_scale}; expected >= 1 (or None for uncapped)")
    ap = a[p].double()
    total, weighted = ap.sum(), (fp.double() * ap).sum()
    if p.sum() == 0 or total <= 0 or weighted <= 0:
        out = a.clone()
    else:
        lam = total / weighted
        scale = lam * fp.double()
        if max_scale is not None:
            scale = scale.clamp(max=max_scale)
        out = a.clone()
        out[p] = (scale * ap).to(a.dtype)
    if recenter:
        out = out - out.mean()
    return out


# ---- the grader's verdict → quality factors → GAR advantages ---------------------------------------------------
@dataclasses.dataclass
class GARResult:
    """What :func:`gar_advantages` did: the advantages and why (for logging and notebooks)."""

    advantages: torch.Tensor  # [G] final advantages
    grpo: torch.Tensor  # [G] GRPO advantages after hack reclassification (== original when fallback)
    rewards: torch.Tensor  # [G] effective rewards (hacks → 0)
    passed: torch.Tensor  # [G] effective outcomes (hacks → failed)
    quality: torch.Tensor  # [G] f_i (1 for failures)
    fallback: str | None  # why the verdict was unusable, or None


class VerdictError(ValueError):
    """A grader verdict the kit cannot use; :func:`gar_advantages` catches it and falls back."""


def _get(verdict: Any, key: str, default: Any = None) -> Any:
    return verdict.get(key, default) if isinstance(verdict, Mapping) else getattr(verdict, key, default)


def quality_factors(ranking: Any, ids: Sequence[str], passed: Any, tier_decay: float = GAR.tier_decay,
                    min_factor: float = GAR.min_factor) -> torch.Tensor:
    """Quality factors f_i ∈ (0, 1] of the passes from the grader's ranking with ties (Report §4.3).

    ``ranking`` is either tiers, best first (``[["b"], ["a", "d"], ["c"]]``: a and d tie), or a mapping
    id → score (higher is better; equal scores tie). Passes are ranked densely among themselves; the t-th tier
    (t = 0 for the best) gets f = max(min_factor, tier_decay^t). Failures get f = 1 (unused by GAR).
    Raises :class:`VerdictError` when a pass is missing, an id is unknown or repeated, or a score is not finite.
    """
    ids = list(ids)
    p = torch.as_tensor(passed, dtype=torch.bool)
    if len(ids) != p.numel():
        raise VerdictError(f"{len(ids)} ids for {p.numel()} outcomes")
    known = set(ids)
    if len(known) != len(ids):
        raise VerdictError(f"duplicate trajectory ids {ids!r}")
    if isinstance(ranking, Mapping):
        scores = {}
        for k, v in ranking.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise VerdictError(f"score of {k!r} is {v!r}, expected a finite number")
            scores[k] = float(v)
        tiers = [[k for k in scores if scores[k] == s] for s in sorted(set(scores.values()), reverse=True)]
    elif isinstance(ranking, (list, tuple)):
        tiers = []
        for t in ranking:
            if isinstance(t, str) or not isinstance(t, (list, tuple, set, frozenset)):
                raise VerdictError(f"ranking tier {t!r} is not a list of ids")
            tiers.append(list(t))
    else:
        raise VerdictError(f"ranking {ranking!r} is neither a list of tiers nor a mapping of scores")
    seen: set[str] = set()
    for t in tiers:
        for k in t:
            if k not in known:
                raise VerdictError(f"ranking names unknown trajectory {k!r}; this group has {sorted(known)!r}")
            if k in seen:
                raise VerdictError(f"ranking lists trajectory {k!r} twice")
            seen.add(k)
    missing = [k for k, ok in zip(ids, p.tolist()) if ok and k not in seen]
    if missing:
        raise VerdictError(f"ranking misses passing trajectories {missing!r}")
    pass_ids = {k for k, ok in zip(ids, p.tolist()) if ok}
    f = torch.ones(len(ids))
    tier = 0
    for t in tiers:
        members = [k for k in t if k in pass_ids]
        if not members:
            continue
        for k in members:
            f[ids.index(k)] = max(min_factor, tier_decay ** tier)
        tier += 1
    return f


def gar_advantages(rewards: Any, passed: Any, ids: Sequence[str], verdict: Any, group_id: str | None = None, *,
                   cfg: Any = None, scale_std: bool = ADV.scale_std, practical: bool = True) -> GARResult:
    """The online GAR step for one group (Report §4.3). ``rewards``/``passed`` [G], ``ids`` G trajectory ids.

    ``verdict`` is the group grader's output, a mapping or object with ``ranking`` (tiers or scores, see
    :func:`quality_factors`), ``hacks`` (ids of confirmed hacks) and optionally ``group_id``:

    1. confirmed hacks → reward 0 and failed, *before* statistics;  2. A = GRPO(rewards);
    3. f_i from the ranking;  4. A' = gar_redistribute(A, passed, f) (practical: capped and re-centred).

    An unusable verdict (None, wrong group, unknown/missing/repeated ids, non-finite scores) returns the GRPO
    advantages of the original rewards unchanged, with ``fallback`` saying why.
    """
    cfg = cfg or GAR
    r = _vector(rewards, "gar_advantages: rewards")
    p = _vector(passed, "gar_advantages: passed", torch.bool).to(torch.bool)
    if r.shape != p.shape or len(ids) != r.numel():
        raise ValueError(f"gar_advantages: rewards {tuple(r.shape)}, passed {tuple(p.shape)} and {len(ids)} ids "
                         "must have the same length")
    base = grpo_advantages(r, scale_std)
    ones = torch.ones_like(r)
    try:
        if verdict is None:
            raise VerdictError("no verdict")
        vg = _get(verdict, "group_id")
        if group_id is not None and vg is not None and vg != group_id:
            raise VerdictError(f"verdict is for group {vg!r}, not {group_id!r}")
        hacks = list(_get(verdict, "hacks", []) or [])
        unknown = [h for h in hacks if h not in set(ids)]
        if unknown:
            raise VerdictError(f"hack flags name unknown trajectories {unknown!r}")
        hack = torch.tensor([k in set(hacks) for k in ids], dtype=torch.bool)
        r_eff = torch.where(hack, torch.zeros_like(r), r)
        p_eff = p & ~hack
        f = quality_factors(_get(verdict, "ranking"), ids, p_eff, cfg.tier_decay, cfg.min_factor)
    except VerdictError as e:
        return GARResult(base, base, r, p, ones, fallback=str(e))
    a = grpo_advantages(r_eff, scale_std)
    if int(p_eff.sum()) < cfg.min_passed:
        out = a
    else:
        out = gar_redistribute(a, p_eff, f, max_scale=cfg.max_scale if practical else None,
                               recenter=cfg.recenter and practical)
    return GARResult(out, a, r_eff, p_eff, f, fallback=None)
