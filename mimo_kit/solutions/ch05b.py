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
    if n == 4:  # exact reverse KL to the bimodal teacher (0.49, 0.49, 0.02) of students A = (.98, .01, .01) and
        # B = (.34, .33, .33), nats, 3 decimals
        t = torch.tensor([0.49, 0.49, 0.02]).log()  # log-probs are logits: log_softmax leaves them as they are
        students = ([0.98, 0.01, 0.01], [0.34, 0.33, 0.33])
        return [float(opd.reverse_kl_exact(torch.tensor(s).log(), t)) for s in students]
    if n == 5:  # the OPD loss, prompt-mean: rows 0 and 1 answer prompt 0, row 2 prompt 1 (student, teacher log-probs)
        student = torch.tensor([[-0.2, -1.5, 0, 0], [-0.6, -0.9, -0.3, -0.2], [-0.1, -0.4, -0.05, 0]])
        teacher = torch.tensor([[-0.3, -0.4, 0, 0], [-0.2, -0.5, -0.3, -0.4], [-0.6, -0.2, -0.3, 0]])
        mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
        loss, _ = opd.opd_batch_loss(student, teacher, mask, torch.tensor([0, 0, 1]), "prompt-mean")
        return float(loss)
    raise ValueError(f"chapter 5b has exercises 1-5, not {n!r}")
