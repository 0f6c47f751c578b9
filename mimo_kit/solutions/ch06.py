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
    if n == 4:  # top-k 3 then top-p 0.75 over SGLang's top-5 (probabilities 0.5, 0.2, 0.15, 0.1, 0.05)
        top = [(math.log(0.5), 7), (math.log(0.2), 3), (math.log(0.15), 11), (math.log(0.1), 4), (math.log(0.05), 8)]
        ids, exact = topp_from_top_logprobs(top, top_p=0.75, top_k=3)
        assert exact
        return sorted(ids)
    if n == 5:  # k3 of id 2 in exercise 3's top-p 0.9 set: rollout log-prob renormalised over the set, trainer full
        import torch

        from mimo_kit.rl.losses import kl_k3

        probs = {5: 0.6, 2: 0.25, 9: 0.1, 1: 0.05}
        kept = topp_from_top_logprobs([(math.log(q), i) for i, q in probs.items()], top_p=0.9)[0]
        train = torch.tensor(math.log(probs[2]), dtype=torch.float64)
        rollout = train - math.log(sum(probs[i] for i in kept))
        return float(kl_k3(rollout, train))  # samples from the rollout engine: KL(π_rollout ‖ π_train)
    raise ValueError(f"chapter 6 has exercises 1-5, not {n!r}")
