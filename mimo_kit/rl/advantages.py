"""Advantages: GRPO, graded rewards (GRS) and groupwise advantage redistribution (GAR) (Report §4.3, §5).

GRPO (Report §5) normalises each reward within its rollout group:

    A_i = (r_i − mean_g r) / (std_g r + ε)          (std scaling switchable; ε = ``GRPOConfig.eps``)

GRS (Report §4.3, offline rubric synthesis) makes all-pass groups informative:

    R_i = R_test,i · S_sol,i · S_beh,i               R_test ∈ {0, 1}, rubric scores S ∈ [0, 1]

GAR (Report §4.3, GAGAR) acts on mixed-outcome groups and moves positive advantage mass from sloppy passes to
better ones, keeping the total. With P⁺ the passes whose advantage is positive:

    λ = Σ_P⁺ A_i / Σ_P⁺ f_i A_i,  A'_i = λ f_i A_i (i ∈ P⁺),  A'_i = A_i (i ∉ P⁺)
    ⇒ Σ_P⁺ A'_i = Σ_P⁺ A_i; failures and passes with A_i ≤ 0 untouched; 1 ≤ λ ≤ 1 / min f.

Practical mode caps the magnification λ f_i at ``max_scale`` and subtracts the group mean again. The quality
factors f_i ∈ (0, 1] come from the grader's ranking with ties (:func:`quality_factors`) on the kit's one tier
schedule, :meth:`GARConfig.factor <mimo_kit.rl.config.GARConfig.factor>`. :func:`gar_advantages` is the whole
online step: confirmed hacks are set to reward 0 and counted as failures *before* the group statistics, and an
unusable verdict falls back to the GRPO advantages. The order in which GRS, hacks, the length penalty, GRPO, GAR
and the segment penalty compose is stated once, in :mod:`mimo_kit.rl.compose`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from mimo_kit.rl.config import GAR, GRPO


def _vector(x: Any, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D tensor [G], got shape {tuple(t.shape)}")
    return t.to(dtype) if dtype != torch.bool else t


def grpo_advantages(rewards: torch.Tensor | Sequence[float], scale_std: bool = GRPO.scale_std, *,
                    eps: float = GRPO.eps, std_correction: int = GRPO.std_correction) -> torch.Tensor:
    """GRPO group-normalised advantages (Report §5). ``rewards`` [G] → [G], or [groups, G] → [groups, G].

    A_i = (r_i − mean_g r) / (std_g r + ε) with ``scale_std``; A_i = r_i − mean_g r without.
    A group of equal rewards gets A = 0 (no signal); one rollout alone has std 0 and A = 0.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if r.dim() not in (1, 2) or r.shape[-1] == 0:
        raise ValueError(f"grpo_advantages: rewards must be [G] or [groups, G] with G >= 1, got {tuple(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError(f"grpo_advantages: rewards must be finite, got {r.tolist()}")
    same = (r == r[..., :1]).all(-1, keepdim=True)  # an all-equal group: exactly 0, not the mean's rounding
    centred = (r - r.mean(-1, keepdim=True)).masked_fill(same, 0.0)
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
    """Redistribute the passes' positive advantage by quality (Report §4.3). All inputs [G]; returns A' [G].

    GAR acts on mixed-outcome groups only, and only on the passes whose advantage is positive,
    P⁺ = {i : passed_i, A_i > 0}. Uncapped (``max_scale=None``, ``recenter=False``):

        λ = Σ_P⁺ A_i / Σ_P⁺ f_i A_i,   A'_i = λ f_i A_i on P⁺,   A'_i = A_i elsewhere   ⇒   Σ_P⁺ A'_i = Σ_P⁺ A_i

    f_i ∈ (0, 1] down-weights the lower-quality passes; the common λ gives the removed positive mass back, so the
    best tier gains and the lowest tier of P⁺ loses. Because every A_i on P⁺ is positive, Σ_P⁺ f_i A_i ≥
    min f · Σ_P⁺ A_i, so 1 ≤ λ ≤ 1 / min_P⁺ f_i: λ stays bounded however small the sums are.

    Passes with A_i ≤ 0 (a shaped reward, e.g. the length penalty, can put a pass below the group mean) carry no
    positive mass to move and are left as they are, like the failures. All-pass and all-fail groups, and groups
    without a positive pass, are returned unchanged.

    Practical mode: the scale is capped, s_i = min(λ f_i, max_scale), and with ``recenter`` the group mean is
    subtracted again, A' ← A' − mean(A') (one common shift for the whole group, applied only when GAR acted).
    ``quality`` f_i must lie in (0, 1] on the passes (failures' entries are ignored).
    """
    return gar_step(advantages, passed, quality, max_scale=max_scale, recenter=recenter)[0]


def gar_step(advantages: Any, passed: Any, quality: Any, max_scale: float | None = None,
             recenter: bool = False) -> tuple[torch.Tensor, float | None]:
    """:func:`gar_redistribute` that also returns λ (``None`` when GAR left the group as it was)."""
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
    pos = p & (a > 0)  # P⁺: the passes that carry positive advantage mass
    mixed = bool(p.any()) and not bool(p.all())
    if not mixed or not bool(pos.any()):
        return a.clone(), None
    ap, fq = a[pos].double(), f[pos].double()
    lam = ap.sum() / (fq * ap).sum()  # ∈ [1, 1/min f]: every term is positive
    scale = lam * fq
    if max_scale is not None:
        scale = scale.clamp(max=max_scale)
    out = a.clone()
    out[pos] = (scale * ap).to(a.dtype)
    if recenter:
        out = out - out.mean()
    return out, float(lam)


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
    lam: float | None = None  # GAR's λ, or None when GAR left the group as it was


class VerdictError(ValueError):
    """A grader verdict the kit cannot use; :func:`gar_advantages` catches it and falls back."""


def _get(verdict: Any, key: str, default: Any = None) -> Any:
    return verdict.get(key, default) if isinstance(verdict, Mapping) else getattr(verdict, key, default)


def pass_tiers(ranking: Any, ids: Sequence[str], passed: Any) -> dict[str, int]:
    """Tier t of every pass (t = 0 for the best) from the grader's ranking with ties (Report §4.3): the one reading
    of a verdict, for the trainer's quality factors and the grader's alike.

    ``ranking`` is either tiers, best first (``[["b"], ["a", "d"], ["c"]]``: a and d tie), or a mapping
    id → score (higher is better; equal scores tie). Passes are ranked densely among themselves: a tier holding no
    pass is skipped. Raises :class:`VerdictError` when a pass is missing, an id is unknown or repeated, or a score
    is not finite.
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
    non_empty = [[k for k in t if k in pass_ids] for t in tiers]
    return {k: tier for tier, members in enumerate(m for m in non_empty if m) for k in members}


def quality_factors(ranking: Any, ids: Sequence[str], passed: Any, tier_decay: float = GAR.tier_decay,
                    min_factor: float = GAR.min_factor) -> torch.Tensor:
    """Quality factors f_i ∈ (0, 1] of the passes from the grader's ranking with ties (Report §4.3).

    The t-th tier of passes (:func:`pass_tiers`, t = 0 for the best) gets f = max(min_factor, tier_decay^t)
    (:meth:`GARConfig.factor`). Failures get f = 1 (unused by GAR). Raises :class:`VerdictError` on a verdict
    :func:`pass_tiers` refuses.
    """
    schedule = dataclasses.replace(GAR, tier_decay=tier_decay, min_factor=min_factor)
    ids = list(ids)
    f = torch.ones(len(ids))
    for k, tier in pass_tiers(ranking, ids, passed).items():
        f[ids.index(k)] = schedule.factor(tier)
    return f


def gar_advantages(rewards: Any, passed: Any, ids: Sequence[str], verdict: Any, group_id: str | None = None, *,
                   cfg: Any = None, scale_std: bool = GRPO.scale_std, eps: float = GRPO.eps,
                   std_correction: int = GRPO.std_correction, practical: bool = True,
                   shape_rewards: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> GARResult:
    """The online GAR step for one group (Report §4.3). ``rewards``/``passed`` [G], ``ids`` G trajectory ids.

    ``verdict`` is the group grader's output, a mapping or object with ``ranking`` (tiers or scores, see
    :func:`quality_factors`), ``hacks`` (ids of confirmed hacks) and optionally ``group_id``:

    1. confirmed hacks → reward 0 and failed, *before* statistics;  2. ``shape_rewards(r, passed)`` if given
    (the length penalty, :mod:`mimo_kit.rl.compose`);  3. A = GRPO(rewards) with ``scale_std``, ``eps`` and
    ``std_correction`` as :func:`grpo_advantages` takes them;  4. f_i from the ranking;
    5. A' = gar_redistribute(A, passed, f) on mixed groups (practical: capped and re-centred).

    An unusable verdict (None, one its grader marks ``usable=False``, wrong group, unknown/missing/repeated ids,
    non-finite scores) returns the GRPO advantages of the original (shaped) rewards unchanged, with ``fallback``
    saying why.
    """
    cfg = cfg or GAR
    r = _vector(rewards, "gar_advantages: rewards")
    p = _vector(passed, "gar_advantages: passed", torch.bool).to(torch.bool)
    if r.shape != p.shape or len(ids) != r.numel():
        raise ValueError(f"gar_advantages: rewards {tuple(r.shape)}, passed {tuple(p.shape)} and {len(ids)} ids "
                         "must have the same length")

    def shaped(rew: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
        return rew if shape_rewards is None else torch.as_tensor(shape_rewards(rew, ok), dtype=torch.float32)

    ones = torch.ones_like(r)
    try:
        if verdict is None:
            raise VerdictError("no verdict")
        if _get(verdict, "usable", True) is False:  # the grader said so itself (no engine, or graders disagree)
            reasons = _get(verdict, "reasons", {}) or {}
            raise VerdictError("; ".join(reasons.get("*", [])) or "the grader marked its verdict unusable")
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
        r0 = shaped(r, p)
        base = grpo_advantages(r0, scale_std, eps=eps, std_correction=std_correction)
        return GARResult(base, base, r0, p, ones, fallback=str(e))
    r_eff = shaped(r_eff, p_eff)
    a = grpo_advantages(r_eff, scale_std, eps=eps, std_correction=std_correction)
    if int(p_eff.sum()) < cfg.min_passed:
        out, lam = a, None
    else:
        out, lam = gar_step(a, p_eff, f, max_scale=cfg.max_scale if practical else None,
                            recenter=cfg.recenter and practical)
    return GARResult(out, a, r_eff, p_eff, f, fallback=None, lam=lam)
