"""Grader quality checks: self-agreement on a reordered group, cross-grader agreement, and the fall-back when graders
disagree (Report §4.1, §4.3).

A group grader that learns can be wrong in ways a rule is not: it can favour the trajectory it reads first, or rank
a group differently from a second grader. Before its verdict shapes GAR's advantages it is checked twice:

* **self-agreement**: the same grader grades the group again with its trajectories in other orders; its rankings
  must agree (Kendall τ-b over the passing trajectories both rank, ties allowed) and it must flag the same hacks;
* **cross-grader agreement**: a second grader (the rule grader against a learned one, or two seeds of the learned
  one) grades the same group; the two rankings and hack sets must agree.

Agreement at least :attr:`AgreementConfig.min_tau` on the ranking and :attr:`AgreementConfig.min_hack_jaccard` on the
hack sets keeps the verdict; anything less makes it unusable, and GAR falls back to GRPO's advantages for that group,
as it does for any unusable verdict (:class:`~mimo_kit.grading.group.GroupVerdict`). The measured agreement is kept
on the verdict (``checks``) so a run can log its share of disagreeing groups.
"""

from __future__ import annotations

import dataclasses
import math
import random

from mimo_kit.config.base import Config, knob
from mimo_kit.grading.group import GroupVerdict, GroupWorkspace


def ranking_tau(a: GroupVerdict, b: GroupVerdict) -> float:
    """Kendall τ-b between two verdicts' rankings over the trajectories both rank (a tier is a tie; the first tier
    is the best). 1.0 when both rank fewer than two trajectories or both put every one in one tier (nothing to
    disagree on); 0.0 when one separates what the other ties throughout (τ is undefined there, and it is no
    agreement)."""
    from scipy.stats import kendalltau

    tier_a = {rid: t for t, tier in enumerate(a.ranking) for rid in tier}
    tier_b = {rid: t for t, tier in enumerate(b.ranking) for rid in tier}
    common = sorted(set(tier_a) & set(tier_b))
    if len(common) < 2:
        return 1.0
    xs, ys = [tier_a[r] for r in common], [tier_b[r] for r in common]
    flat_a, flat_b = len(set(xs)) == 1, len(set(ys)) == 1
    if flat_a or flat_b:
        return 1.0 if flat_a and flat_b else 0.0
    tau = kendalltau(xs, ys).statistic  # τ-b: ties in either ranking are accounted for
    return float(tau) if math.isfinite(tau) else 0.0


def hack_jaccard(a: GroupVerdict, b: GroupVerdict) -> float:
    """|hacks_a ∩ hacks_b| / |hacks_a ∪ hacks_b|; 1.0 when neither flags a hack."""
    ha, hb = set(a.hacks), set(b.hacks)
    return 1.0 if not (ha | hb) else len(ha & hb) / len(ha | hb)


@dataclasses.dataclass
class AgreementConfig(Config):
    """When two gradings of one group agree enough to train on; the report publishes no thresholds."""

    min_tau: float = knob(0.5, "Kendall τ-b the two rankings must reach: a majority of the ordered pairs agreeing "
                               "beyond the pairs that disagree", min=-1.0, max=1.0)
    min_hack_jaccard: float = knob(1.0, "overlap of the flagged hacks: a hack gets reward 0, so both gradings "
                                        "must name the same ones", min=0.0, max=1.0)
    reorders: int = knob(2, "extra gradings of the group with its trajectories shuffled (self-agreement); each "
                            "costs one more grading of the group", min=0)
    seed: int = knob(0, "seed of the shuffles")

    PRESETS = {"tiny": {}}


def reordered(group: GroupWorkspace, rng: random.Random) -> GroupWorkspace:
    """The same group with its trajectories in a shuffled order (a different order than the given one when there
    are two or more)."""
    order = list(group.rollouts)
    if len(order) > 1:
        while order == group.rollouts:
            rng.shuffle(order)
    return dataclasses.replace(group, rollouts=order)


def self_agreement(grader, group: GroupWorkspace, verdict: GroupVerdict | None = None,
                   cfg: AgreementConfig | None = None) -> dict[str, float]:
    """The least τ-b and hack overlap between ``verdict`` (graded now when None) and the same grader's verdicts on
    ``cfg.reorders`` shuffled copies of the group; an unusable regrading counts as no agreement."""
    cfg = cfg or AgreementConfig()
    verdict = verdict or grader.grade(group)
    rng = random.Random(cfg.seed)
    tau, jac = 1.0, 1.0
    for _ in range(cfg.reorders):
        other = grader.grade(reordered(group, rng))
        if not other.usable:
            return {"self_tau": 0.0, "self_hack_jaccard": 0.0}
        tau, jac = min(tau, ranking_tau(verdict, other)), min(jac, hack_jaccard(verdict, other))
    return {"self_tau": tau, "self_hack_jaccard": jac}


def cross_agreement(verdict: GroupVerdict, other: GroupVerdict) -> dict[str, float]:
    """τ-b and hack overlap between two graders' verdicts on one group; an unusable one agrees with nothing."""
    if not (verdict.usable and other.usable):
        return {"cross_tau": 0.0, "cross_hack_jaccard": 0.0}
    return {"cross_tau": ranking_tau(verdict, other), "cross_hack_jaccard": hack_jaccard(verdict, other)}


class CheckedGrader:
    """A group grader whose verdicts are kept only when the grader agrees with itself on reordered groups and, when
    a ``second`` grader is given, with that one (Report §4.1: grader quality checks). A verdict that fails either
    check comes back unusable, with the measured agreement in ``checks`` and the reason in ``reasons["*"]``."""

    def __init__(self, grader, second=None, cfg: AgreementConfig | None = None):
        self.grader, self.second, self.cfg = grader, second, cfg or AgreementConfig()
        self.name = f"checked-{grader.name}"

    def grade(self, group: GroupWorkspace) -> GroupVerdict:
        verdict = self.grader.grade(group)
        if not verdict.usable:
            return verdict
        checks = self_agreement(self.grader, group, verdict, self.cfg)
        if self.second is not None:
            checks |= cross_agreement(verdict, self.second.grade(group))
        failed = [f"{k} {v:.2f}" for k, v in checks.items()
                  if v < (self.cfg.min_tau if k.endswith("tau") else self.cfg.min_hack_jaccard)]
        verdict = dataclasses.replace(verdict, checks=checks)
        if failed:
            why = f"graders disagree ({', '.join(failed)}): GAR falls back to GRPO's advantages for this group"
            verdict = dataclasses.replace(verdict, usable=False, reasons={**verdict.reasons, "*": [why]})
        return verdict
