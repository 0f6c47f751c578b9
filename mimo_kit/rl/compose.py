"""The order in which rewards and advantages are shaped, stated once (Report §4.3).

The report gives each signal on its own (GRS, GAR, the group-relative length penalty, the segment penalty) but
not how they stack. The kit composes them in this order, and the trainer calls nothing else:

    1. reward     R_i = R_test,i  (binary)     or  R_i = R_test,i · S_sol,i · S_beh,i  (GRS)
    2. hacks      a hack the group grader confirms → R_i = 0 and failed                  (before any statistic)
    3. length     R_i ← R_i + p_i,  p_i = −s·min(X, (L_i/L_ref − 1 − δ)⁺) on successes    (group-relative)
    4. GRPO       A_i = (R_i − mean_g R) / (std_g R + ε)
    5. GAR        A'_i = λ f_i A_i on the positive passes P⁺ of a mixed group           (practical: capped, re-centred)
    6. segment    per token: error tokens → 0 in successes, κ·A_i (≥ −α_max) in failures, normal tokens β_i·A_i

Why this order:

- **hacks before everything else**: the report sets a confirmed hack's reward to 0 *before* the group statistics;
  a hack is then an ordinary failure, so it is neither a length reference nor a pass GAR could reward.
- **length on the reward, before GRPO**: the penalty is defined on the reward scale (s·X < 1 keeps every success
  above every failure), and GRPO then normalises it with the group's own statistics like any other reward. Added
  after GAR it would be an un-normalised constant on a normalised advantage.
- **GAR after GRPO and the length penalty**: GAR moves the *positive* advantage mass that remains once every reward
  term is in; a pass the length penalty pushed to A ≤ 0 carries none and is left as it is (GAR never raises it).
- **segment last**: it is the only per-token step; it needs each sequence's final advantage and its error spans.

:func:`sequence_advantages` runs steps 1–5 for one group and :func:`token_advantages` runs step 6.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mimo_kit.rl.advantages import GARResult, gar_advantages, grpo_advantages, grs_reward
from mimo_kit.rl.config import RLMathConfig
from mimo_kit.rl.penalties import length_penalty, segment_advantages

#: The stages, in the order they are applied.
STAGES = ("reward", "hacks", "length_penalty", "grpo", "gar", "segment_penalty")


def sequence_advantages(passed: Any, *, rewards: Any = None, rubric: tuple[Any, Any] | None = None,
                        lengths: Any = None, verdict: Any = None, ids: Sequence[str] | None = None,
                        group_id: str | None = None, gar: bool = False,
                        math: RLMathConfig | None = None) -> GARResult:
    """Steps 1–5 for one group of G trajectories (Report §4.3). Returns a :class:`GARResult` ([G] tensors).

    ``passed`` [G]: R_test. ``rewards`` [G]: the reward to start from (default: R_test as 0/1); ``rubric``:
    (S_sol, S_beh) [G] each, switches the reward to GRS. ``lengths`` [G] > 0: switches the length penalty on.
    ``gar``: use the group grader's ``verdict`` (ranking with ties, hack flags) for steps 2 and 5; an unusable
    verdict falls back to GRPO on the unchanged rewards (``fallback`` says why). ``math`` holds every constant.
    """
    m = math or RLMathConfig()
    p = torch.as_tensor(passed).to(torch.bool)
    if p.dim() != 1:
        raise ValueError(f"sequence_advantages: passed must be [G], got shape {tuple(p.shape)}")
    if rubric is not None:  # step 1: GRS
        if rewards is not None:
            raise ValueError("sequence_advantages: give rewards or rubric, not both")
        r = grs_reward(p, *rubric)
    else:
        r = torch.as_tensor(p.float() if rewards is None else rewards, dtype=torch.float32)
    if r.shape != p.shape:
        raise ValueError(f"sequence_advantages: rewards {tuple(r.shape)} and passed {tuple(p.shape)} differ")

    def shape(rew: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:  # step 3, after step 2's reclassification
        if lengths is None:
            return rew
        L = m.length
        return rew + length_penalty(lengths, ok, scale=L.scale, tolerance=L.tolerance, cap=L.cap, gate=L.gate,
                                    reference=L.reference)

    scale_std, eps = m.grpo.scale_std, m.grpo.eps
    if gar:  # steps 2–5
        ids = list(ids) if ids is not None else [str(i) for i in range(p.numel())]
        return gar_advantages(r, p, ids, verdict, group_id, cfg=m.gar, scale_std=scale_std, eps=eps,
                              std_correction=m.grpo.std_correction, shape_rewards=shape)
    r = shape(r, p)  # step 3 (no grader: no hack flags)
    a = grpo_advantages(r, scale_std, eps=eps, std_correction=m.grpo.std_correction)  # step 4
    return GARResult(a, a, r, p, torch.ones_like(r), fallback=None)


def token_advantages(advantages: Any, error_mask: torch.Tensor, loss_mask: torch.Tensor, passed: Any,
                     math: RLMathConfig | None = None) -> torch.Tensor:
    """Step 6: per-token advantages [N, T] from sequence advantages [N] and error spans (Report §4.3)."""
    s = (math or RLMathConfig()).segment
    return segment_advantages(advantages, error_mask, loss_mask, passed, kappa=s.kappa, alpha_max=s.alpha_max,
                              beta_min=s.beta_min)
