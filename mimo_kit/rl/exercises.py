"""Checkable answers to the exercises of chapters 4a and 5a (``mimo_kit.exercises`` checks answers against them)."""

from __future__ import annotations

from mimo_kit.rl.toy.world import ToyEpisode, make_tasks, run_program

_SOLUTIONS = {
    # ch04a 1: rollouts per step of the report (1,568 prompts × 16) divided by the toy step's (16 × 8)
    1: 1568 * 16 // (16 * 8),
    # ch04a 2: the toy program "+3*2-1" on input 4
    2: run_program(["+3", "*2", "-1"], 4),
    # ch05a 1: needless edits of an episode that fixes the bug and appends "A*1"
    3: 1,
    # ch05a 2: tool output of "R" on the first task of seed 0 (its first failing line and the expected content)
    4: ToyEpisode(make_tasks(1, 0)[0]).step("R").strip(),
}


def solution(n: int):
    if n not in _SOLUTIONS:
        raise ValueError(f"solution: no exercise {n}; known: {sorted(_SOLUTIONS)}")
    return _SOLUTIONS[n]
