"""Chapter 4a's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations


def solution(n: int):
    from mimo_kit.train.toy.world import run_program

    if n == 1:  # mean tokens per rollout of the report's step: 3.2B train tokens (2.7B–3.7B) over 1,568 × 16
        return round(3.2e9 / (1568 * 16))
    if n == 2:  # the toy program "+3*2-1" on input 4
        return run_program(["+3", "*2", "-1"], 4)
    if n == 3:  # share of groups with signal at the report's group size 16 and pass rate 0.88 (dynamic sampling)
        from mimo_kit.rl import keep_probability

        return keep_probability(0.88, 16)
    if n == 4:  # mean token lag at version 7 of a rollout: 12 tokens generated under version 5, then 28 under 6
        from mimo_kit.infra.partial import version_lag
        from mimo_kit.rl.examples import text_segment
        from mimo_kit.rl.trajectory import Context, Sample, Sequence

        segs = [text_segment("user", "fix"), text_segment("assistant", "a" * 12, version=5),
                text_segment("tool", "ok"), text_segment("assistant", "b" * 28, version=6)]
        sample = Sample("p0", [Sequence([Context(segs)], "r0")])
        return version_lag([sample], 7)["lag_mean"]
    raise ValueError(f"chapter 4a has exercises 1-4, not {n!r}")
