"""Visual outputs compared within their group (Report §4.1: visual tasks are graded per output, then compared within
the group of one request).

Each output of a group is first graded on its own (:func:`mimo_kit.envs.visual.grade_drawing`: pixel similarity to
the hidden reference for replication, the share of rubric items for open-ended design). The group's passing outputs
are then ranked against each other by that score, best first; outputs whose scores differ by at most
:attr:`VisualGroupConfig.tie_tolerance` share a tier. The result is the one verdict GAR reads
(:class:`~mimo_kit.grading.group.GroupVerdict`), so a group of replications that all pass still gets a graded
signal: the closer copy earns more of the group's advantage.

At toy scale an open-ended task's passes all meet every rubric item, so they tie: the kit has no judge of
aesthetics to separate them (the report's LLM judging), and GAR then gives them equal factors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from mimo_kit.config.base import Config, knob
from mimo_kit.envs.visual import VisualGrade
from mimo_kit.grading.group import GroupVerdict


@dataclasses.dataclass
class VisualGroupConfig(Config):
    """How a group's visual outputs are compared; the report publishes no threshold."""

    tie_tolerance: float = knob(0.005, "scores this close share a tier: on the 64 × 48 canvases one row of pixels "
                                       "fully off moves the similarity by ~2%, so 0.5% is below one row's change",
                                min=0.0)

    PRESETS = {"tiny": {}}


def compare_group(grades: Sequence[VisualGrade], ids: Sequence[str],
                  cfg: VisualGroupConfig | None = None) -> GroupVerdict:
    """The group's verdict from its outputs' own grades (``grades[i]`` is output ``ids[i]``'s): passing outputs in
    tiers by score (best first, ties within the tolerance, the same tiers in any order of the group); a failing
    output is not ranked; every output's reason says its score."""
    cfg = cfg or VisualGroupConfig()
    if len(grades) != len(ids) or len(set(ids)) != len(ids):
        raise ValueError(f"compare_group: {len(grades)} grades for {len(ids)} ids, ids must be distinct: {list(ids)}")
    score = {rid: g.score for rid, g in zip(ids, grades) if g.passed}
    ranking: list[list[str]] = []
    for rid in sorted(score, key=lambda k: (-score[k], k)):
        if ranking and score[ranking[-1][0]] - score[rid] <= cfg.tie_tolerance:
            ranking[-1].append(rid)
        else:
            ranking.append([rid])
    reasons = {rid: [f"score {g.score:.4f}" + ("" if g.passed else f", fails: {g.reason}")]
               for rid, g in zip(ids, grades)}
    scores = {rid: {"score": g.score} for rid, g in zip(ids, grades)}
    return GroupVerdict(ranking, {}, reasons, scores, True, "visual-group")
