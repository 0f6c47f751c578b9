"""Chapter 5a's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations


def solution(n: int):
    from mimo_kit.train.toy.world import ToyEpisode, make_tasks

    if n == 1:  # needless edits of an episode that fixes the bug and appends "A*1"
        return 1
    if n == 2:  # tool output of "R" on the first task of seed 0 (its first failing line and the expected content)
        return ToyEpisode(make_tasks(1, 0)[0]).step("R").strip()
    if n == 3:  # the fewest of 8 seeds that must point the report's way for the sign test to give p <= 0.05
        from mimo_kit.claims import judge_paired

        return next(k for k in range(9) if judge_paired([1.0] * k + [-1.0] * (8 - k)).p_sign <= 0.05)
    if n == 4:  # the lower end of the 95% t interval of the per-seed differences 0.01, 0.08, 0.02, 0.01, 0.03
        from mimo_kit.claims import judge_paired

        return judge_paired([0.01, 0.08, 0.02, 0.01, 0.03]).low
    if n == 5:  # [load CV, cold share] of one MoE layer whose 8 experts got 40, 30, 10, 2, 0, 20, 50, 8 tokens
        import torch

        from mimo_kit.model.moe import load_metrics

        m = load_metrics(torch.tensor([[40, 30, 10, 2, 0, 20, 50, 8]]))
        return [float(m["cv"][0]), float(m["cold_share"][0])]
    raise ValueError(f"chapter 5a has exercises 1-5, not {n!r}")
