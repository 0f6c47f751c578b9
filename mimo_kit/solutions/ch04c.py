"""Chapter 4c's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations


def solution(n: int):
    """Reference answers to the chapter's exercises, computed by the kit (the notebook checks against them)."""
    import torch

    from mimo_kit.rl import (
        ClipConfig,
        EntropyClipController,
        aggregate_loss,
        gar_redistribute,
        grpo_advantages,
        grs_reward,
        keep_probability,
        length_penalty,
        prompts_to_draw,
        segment_advantages,
    )

    if n == 1:  # uncapped GAR on rewards [1, 1, 0, 0] with f = [1, 0.5]: the two passes' new advantages
        a = grpo_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]))
        out = gar_redistribute(a, torch.tensor([True, True, False, False]), torch.tensor([1.0, 0.5, 1.0, 1.0]))
        return [float(x) for x in out[:2]]
    if n == 2:  # GRS: all four pass; S_sol = [.9, .4, 1, .6], S_beh = [.9, 1, .4, .6]: which trajectory ranks last?
        r = grs_reward(torch.ones(4, dtype=torch.bool), torch.tensor([0.9, 0.4, 1, 0.6]),
                       torch.tensor([0.9, 1, 0.4, 0.6]))
        return int(torch.argmin(r))
    if n == 3:  # length penalty of a success 2.5× the median success length, default constants
        return float(length_penalty([100.0, 100.0, 250.0, 80.0], [True, True, True, False])[2])
    if n == 4:  # prompt-mean loss of a batch: group 0 has rows of 2 and 6 tokens (loss 1 each), group 1 one row
        mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
        loss = torch.tensor([[1.0] * 6, [1.0] * 6, [4.0] * 6])
        return float(aggregate_loss(loss, mask, torch.tensor([0, 0, 1]), "prompt-mean"))
    if n == 5:  # prompts to draw for 64 kept groups at pass rate 0.9, group size 8, 90% confidence
        return prompts_to_draw(64, keep_probability(0.9, 8), confidence=0.9)
    if n == 6:  # segment penalty of a failure, A_i = −1.8, 24 trained tokens of which 3 are error tokens, defaults
        err = torch.zeros(1, 24, dtype=torch.bool)
        err[0, :3] = True
        tok = segment_advantages(torch.tensor([-1.8]), err, torch.ones(1, 24, dtype=torch.bool), torch.tensor([False]))
        return [float(tok[0, 0]), float(tok[0, -1])]  # [an error token, a normal token]
    if n == 7:  # ε_high after batches of mean entropy 2.5, 2.35, 1.55, 1.3 nats, the default ClipConfig
        ctl = EntropyClipController.from_config(ClipConfig())
        return [ctl.update(h) for h in (2.5, 2.35, 1.55, 1.3)][-1]
    if n == 8:  # the learned grader's verdict V0c,1ms,2f,3h,4,5pc: the ids in GAR's last tier
        from mimo_kit.train.toy.grader_world import parse_verdict, verdict_of

        marks = parse_verdict("V0c,1ms,2f,3h,4,5pc", [0, 1, 3, 4, 5], 6)
        return sorted(int(r) for r in verdict_of({str(i): m for i, m in marks.items()}, "learned").ranking[-1])
    if n == 9:  # Kendall τ-b between the tiers [[a], [b, c], [d]] and [[a, b], [c], [d]]
        from mimo_kit.grading import GroupVerdict, ranking_tau

        return ranking_tau(GroupVerdict([["a"], ["b", "c"], ["d"]], {}, {}), GroupVerdict([["a", "b"], ["c"], ["d"]],
                                                                                         {}, {}))
    raise ValueError(f"chapter 4c has exercises 1-9, not {n!r}")


def alternatives(n: int) -> list:
    """Other exact answers the chapter's text allows: exercise 1 worked with the textbook GRPO (no ε in the std)."""
    if n == 1:
        import torch

        from mimo_kit.rl import gar_redistribute, grpo_advantages

        a = grpo_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), eps=0.0)
        out = gar_redistribute(a, torch.tensor([True, True, False, False]), torch.tensor([1.0, 0.5, 1.0, 1.0]))
        return [[float(x) for x in out[:2]]]
    return []


def hints(n: int) -> dict:
    """Answers a student reaches by another road, and what to say to them (the checker still says ✗)."""
    if n == 5:
        import math

        from mimo_kit.rl import keep_probability

        B, q = 64, float(keep_probability(0.9, 8))
        z = 1.2815515655446004  # the 90% one-sided normal quantile
        normal = next(m for m in range(B, 10 * B) if m * q - z * math.sqrt(m * q * (1 - q)) >= B)
        return {normal: "that is the normal approximation of the binomial tail; the exercise asks the exact tail, "
                        "the smallest n with P(Binomial(n, q) ≥ 64) ≥ 0.9 (`prompts_to_draw`)",
                math.ceil(B / q): "that is B / q, the mean only: with it about half the batches come up short; the "
                                  "exercise asks for 90% confidence"}
    return {}
