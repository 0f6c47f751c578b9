"""Chapter 4a's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations


def solution(n: int):
    from mimo_kit.train.toy.world import run_program

    if n == 1:  # rollouts per step of the report (1,568 prompts × 16) divided by the toy step's (16 × 8)
        return 1568 * 16 // (16 * 8)
    if n == 2:  # the toy program "+3*2-1" on input 4
        return run_program(["+3", "*2", "-1"], 4)
    raise ValueError(f"chapter 4a has exercises 1-2, not {n!r}")
