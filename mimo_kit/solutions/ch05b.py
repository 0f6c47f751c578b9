"""Chapter 5b's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations

import math


def solution(n: int):
    """Reference answers, computed by the kit's own functions (the notebook checks against them)."""
    import torch

    from mimo_kit.rl import opd

    if n == 1:  # the sampled reverse KL k_t of a token the student gives log-prob −1.2 and the teacher −0.5
        k = opd.reverse_kl_per_token(torch.tensor([[-1.2]]), torch.tensor([[-0.5]]), torch.ones(1, 1))
        return float(k)
    if n == 2:  # exact KL(π_s ‖ π_t) for π_s = (0.8, 0.2), π_t = (0.5, 0.5), nats, 3 decimals
        s, t = torch.tensor([math.log(0.8), math.log(0.2)]), torch.tensor([math.log(0.5), math.log(0.5)])
        return float(opd.reverse_kl_exact(s, t))
    if n == 3:  # rows routed to teacher "sft" for domains open, verifiable, open, open with the kit's routes
        from mimo_kit.train.mopd import ROUTES

        return opd.route_teachers(["open", "verifiable", "open", "open"], ROUTES)["sft"]
    raise ValueError(f"chapter 5b has exercises 1-3, not {n!r}")
