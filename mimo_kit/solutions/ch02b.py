"""Chapter 2b's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations

import torch


def solution(n: int):
    from mimo_kit.speculative.decode import expected_accepted_length, residual_distribution

    if n == 1:
        return expected_accepted_length(0.8, 8)  # (1 − 0.8⁸) / (1 − 0.8) = 4.1611…
    if n == 2:
        return residual_distribution(torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])).tolist()
    if n == 3:
        return expected_accepted_length(0.8, 8) / (0.3 + 1.2)  # tokens per round ÷ cost per round = 2.774…
    if n == 4:
        from mimo_kit.speculative.decode import verify_greedy

        # block 6: drafts d_1..d_5 = [12, 7, 7, 30, 4]; the backbone's argmax at its 6 positions [12, 7, 7, 9, 4, 15]
        drafts = torch.tensor([12, 7, 7, 30, 4])
        logits = torch.nn.functional.one_hot(torch.tensor([12, 7, 7, 9, 4, 15]), 32).float()
        accepted, bonus = verify_greedy(drafts, logits)  # (3, 9)
        return drafts[:accepted].tolist() + [bonus]  # [12, 7, 7, 9]
    if n == 5:
        # break-even α of block 6 when a round costs 0.25 (drafter) + 1.35 (verification) decode steps:
        # (1 − α⁶) / (1 − α) = 1.6, bisected on the kit's E[a + 1] (increasing in α) → 0.37679…
        cost, lo, hi = 0.25 + 1.35, 0.0, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if expected_accepted_length(mid, 6) < cost else (lo, mid)
        return (lo + hi) / 2
    raise ValueError(f"chapter 2.4 has exercises 1-5, not {n!r}")


def hints(n: int) -> dict:
    """Answers a student reaches by another road, and what to say to them (the checker still says ✗)."""
    if n == 4:
        return {(12, 7, 7, 30): "that keeps the drafter's 4th token; after the first mismatch the round emits the "
                                "backbone's own token there (the bonus), not the draft"}
    if n == 5:
        return {0.375: "that is 1 / (1 − α) = 1.6, an endless block; a block of 6 stops after 5 drafts, so it needs a "
                       "slightly larger α: solve (1 − α⁶) / (1 − α) = 1.6"}
    return {}
