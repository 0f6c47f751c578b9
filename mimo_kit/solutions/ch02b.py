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
    raise ValueError(f"chapter 2.4 has exercises 1-3, not {n!r}")
