"""Policy losses: PPO clip, entropy-adaptive clip range, truncated IS, mismatch metrics, KL estimators (Report §5).

PPO-clipped policy loss per token, with r = π_θ(y_t)/π_old(y_t) = exp(logp − old_logp):

    ℓ_t = −min(r·A_t, clip(r, 1 − ε_low, 1 + ε_high)·A_t)

Entropy-adaptive clipping (Report §5: "importance-ratio clip range adjusted with policy entropy"; the controller
is the kit's). With H̄ the batch's mean token entropy and H* the target:

    ε_high ← clip(ε_high + k·(H* − H̄), ε_high_min, ε_high_max)

Entropy below target widens the upper clip (low-probability tokens may grow: DAPO's clip-higher), entropy above
target narrows it. k, H* and the bounds are ``ClipConfig`` fields.

Truncated importance sampling (TIS) is a **kit addition**, not a mechanism of the report: the report closes the
train–inference gap (Report §6.1) with routing replay, top-p candidate replay and QDQ experts; TIS is the
common alternative from the open RL stacks, kept as a switch to compare against. Rollouts come from the inference
engine (MXFP4 experts, different kernels), so π_old as recomputed by the trainer differs from π_rollout. Each
token's loss is weighted by the detached, truncated ratio

    w_t = min(exp(old_logp_t − rollout_logp_t), C)

KL estimators for samples y ~ π_θ against a reference π_ref, with d = log π_ref(y) − log π_θ(y):

    k1 = −d  (unbiased, high variance, can be negative)        k3 = exp(d) − d − 1  (unbiased, ≥ 0, low variance)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mimo_kit.rl.config import CLIP


def _same_shape(name: str, *tensors: torch.Tensor) -> None:
    shapes = [tuple(t.shape) for t in tensors]
    if len(set(shapes)) != 1:
        raise ValueError(f"{name}: tensors must share a shape, got {shapes}")


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                  eps_low: float = CLIP.eps_low, eps_high: float = CLIP.eps_high,
                  mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token PPO-clip loss [N, T] and clip statistics. ``advantages`` is [N] (per sequence) or [N, T].

    Stats (over ``mask`` when given): ``clip_low`` = share of tokens with r < 1 − ε_low and A < 0 (the clip is
    active), ``clip_high`` = share with r > 1 + ε_high and A > 0, ``ratio_mean``.
    """
    _same_shape("ppo_clip_loss: logp / old_logp", logp, old_logp)
    if logp.dim() != 2:
        raise ValueError(f"ppo_clip_loss: logp must be [N, T], got shape {tuple(logp.shape)}")
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    if adv.shape[0] != logp.shape[0] or adv.shape[1] not in (1, logp.shape[1]):
        raise ValueError(f"ppo_clip_loss: advantages {tuple(advantages.shape)} do not fit logp {tuple(logp.shape)}")
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"ppo_clip_loss: clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    ratio = torch.exp(logp - old_logp)
    clipped_ratio = ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = -torch.min(ratio * adv, clipped_ratio * adv)
    with torch.no_grad():
        m = torch.ones_like(ratio, dtype=torch.bool) if mask is None else mask.bool()
        stats = {**clip_shares(ratio, adv, eps_low, eps_high, m),
                 "ratio_mean": float((ratio * m).sum() / m.sum().clamp(min=1))}
    return loss, stats


@torch.no_grad()
def clip_shares(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float,
                mask: torch.Tensor) -> dict[str, float]:
    """The shares of ``mask``'s tokens the PPO clip holds: ``clip_low`` (r < 1 − ε_low with A < 0) and
    ``clip_high`` (r > 1 + ε_high with A > 0). ``ratio`` [N, T], ``adv`` broadcastable to it, ``mask`` [N, T] bool."""
    n = mask.sum().clamp(min=1)
    return {"clip_low": float(((ratio < 1 - eps_low) & (adv < 0) & mask).sum() / n),
            "clip_high": float(((ratio > 1 + eps_high) & (adv > 0) & mask).sum() / n)}


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy H = −Σ_v p_v log p_v of each position's next-token distribution. logits [..., V] → [...]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def entropy_adaptive_eps_high(eps_high: float, entropy: float, *, target: float = CLIP.entropy_target,
                              gain: float = CLIP.entropy_gain, lo: float = CLIP.eps_high_min,
                              hi: float = CLIP.eps_high_max) -> float:
    """One controller step: ε_high ← clip(ε_high + gain·(target − entropy), lo, hi) (kit's controller, Report §5)."""
    if not lo <= hi:
        raise ValueError(f"entropy_adaptive_eps_high: bounds lo={lo} > hi={hi}")
    if not torch.isfinite(torch.tensor(entropy)):
        raise ValueError(f"entropy_adaptive_eps_high: entropy={entropy!r} is not finite")
    return float(min(hi, max(lo, eps_high + gain * (target - entropy))))


@dataclasses.dataclass
class EntropyClipController:
    """Stateful wrapper the trainer keeps: feed each batch's mean token entropy, read ``eps_high``."""

    eps_high: float = CLIP.eps_high
    target: float = CLIP.entropy_target
    gain: float = CLIP.entropy_gain
    lo: float = CLIP.eps_high_min
    hi: float = CLIP.eps_high_max
    history: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (entropy, eps_high)
    target_ratio: float = 0.0  # > 0: the target is anchored at ratio × the first entropy fed
    anchored: bool = False

    @classmethod
    def from_config(cls, cfg: Any = None) -> EntropyClipController:
        cfg = cfg or CLIP
        return cls(cfg.eps_high, cfg.entropy_target, cfg.entropy_gain, cfg.eps_high_min, cfg.eps_high_max,
                   target_ratio=getattr(cfg, "entropy_target_ratio", 0.0))

    def update(self, entropy: float) -> float:
        if self.target_ratio > 0 and not self.anchored:
            self.target, self.anchored = self.target_ratio * float(entropy), True
        self.eps_high = entropy_adaptive_eps_high(self.eps_high, entropy, target=self.target, gain=self.gain,
                                                  lo=self.lo, hi=self.hi)
        self.history.append((float(entropy), self.eps_high))
        return self.eps_high


def truncated_is_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float = CLIP.tis_cap) -> torch.Tensor:
    """TIS weights w = min(exp(old_logp − rollout_logp), C), detached. [N, T] → [N, T]."""
    _same_shape("truncated_is_weights", old_logp, rollout_logp)
    if cap < 1:
        raise ValueError(f"truncated_is_weights: cap={cap}; expected >= 1")
    return torch.exp(old_logp - rollout_logp).clamp(max=cap).detach()


def mismatch_metrics(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                     cap: float = CLIP.tis_cap, quantiles: tuple[float, ...] = (0.05, 0.5, 0.95)) -> dict[str, float]:
    """How far the trainer's logprobs are from the rollout engine's on the trained tokens (Report §6.1).

    ``mean_abs_dlogp`` = mean |Δlogp|, ``max_abs_dlogp``, ratio quantiles ``ratio_q05``… of r = exp(Δlogp),
    ``tis_clip_frac`` = share of tokens whose ratio exceeds the TIS cap, and ``k3_kl`` = mean k3 of the gap
    (≈ KL(π_rollout ‖ π_train), since the tokens were sampled by the rollout engine).
    """
    _same_shape("mismatch_metrics", train_logp, rollout_logp, mask)
    m = mask.bool()
    if not m.any():
        raise ValueError("mismatch_metrics: mask selects no token")
    d = (train_logp - rollout_logp)[m].double()
    r = d.exp()
    out = {"mean_abs_dlogp": float(d.abs().mean()), "max_abs_dlogp": float(d.abs().max()),
           "tis_clip_frac": float((r > cap).double().mean()), "k3_kl": float(kl_k3(rollout_logp, train_logp)[m].mean())}
    qs = torch.quantile(r, torch.tensor(quantiles, dtype=torch.float64, device=r.device))
    out.update({f"ratio_q{round(q * 100):02d}": float(v) for q, v in zip(quantiles, qs)})
    return out


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log π_θ(y) − log π_ref(y) per token (samples y ~ π_θ)."""
    _same_shape("kl_k1", logp, ref_logp)
    return logp - ref_logp


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(d) − d − 1 with d = log π_ref(y) − log π_θ(y), per token (samples y ~ π_θ); always ≥ 0."""
    _same_shape("kl_k3", logp, ref_logp)
    d = ref_logp - logp
    return torch.exp(d) - d - 1
