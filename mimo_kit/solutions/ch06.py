"""Chapter 6's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations

import math


def solution(n: int):
    """Reference answers, computed by the kit's own functions (the notebook checks against them)."""
    from mimo_kit.infra import mixer
    from mimo_kit.infra.sglang import topp_from_top_logprobs

    if n == 1:  # budgets (1 + p_i)·B_i/r_i of two sources: B = (8, 8), r = (0.5, 0.25), t = (1, 4), ρ = 0.25
        return [float(b) for b in mixer.budgets([8, 8], [0.5, 0.25], [1.0, 4.0], 0.25)]
    if n == 2:  # w_i at α = 0.5 for B = 10 targets, A = 4 accepted, r = 0.5
        return float(mixer.scheduling_weights([10], [4], [0.5], alpha=0.5)[0])
    if n == 3:  # the top-p 0.9 set from SGLang's top-4 logprobs (probabilities 0.6, 0.25, 0.1, 0.05)
        top = [(math.log(0.6), 5), (math.log(0.25), 2), (math.log(0.1), 9), (math.log(0.05), 1)]
        return sorted(topp_from_top_logprobs(top, top_p=0.9)[0])
    raise ValueError(f"chapter 6 has exercises 1-3, not {n!r}")
