"""Every constant of the RL math, as named config fields with the kit's default and the reason (Report §4–5).

The report publishes the shape of each mechanism (GRPO, GRS, GAR, length and segment penalties, entropy-adjusted
clipping, prompt-mean aggregation, MOPD²) but few of its constants. docs/design.md "Principles": every unpublished
constant is a :func:`~mimo_kit.config.base.knob` here, and the pure functions of :mod:`mimo_kit.rl` take their
defaults from these dataclasses, so this file is the one place a value lives. ``RLMathConfig().describe()`` prints
them all with their reasons.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from mimo_kit.config.base import Config, ConfigError, knob


@dataclasses.dataclass
class GRPOConfig(Config):
    """GRPO group-normalised advantages (Report §5: the RL algorithm is GRPO)."""

    scale_std: bool = knob(True, "GRPO divides by the group std; Dr. GRPO-style runs switch it off")
    eps: float = knob(1e-4, "TRL's value, so the kit's advantages equal TRL's and plug into its trainer", min=0.0)
    std_correction: int = knob(1, "Bessel-corrected (unbiased) std, as TRL and torch.std compute it", min=0, max=1)

    PRESETS = {"tiny": {}}


@dataclasses.dataclass
class GARConfig(Config):
    """Groupwise advantage redistribution (Report §4.3, GAGAR). The report gives f_i ∈ (0, 1] but no schedule."""

    tier_decay: float = knob(0.7, "each lower quality tier keeps 70% of the tier above: clear but gentle ordering",
                             min=1e-6, max=1.0)
    min_factor: float = knob(0.25, "floor on f_i: a correct but sloppy pass keeps ≥ 1/4 of its weight", min=1e-6,
                             max=1.0)
    max_scale: float = knob(2.0, "practical cap on λ·f_i: the best pass at most doubles its GRPO advantage",
                            min=1.0)
    recenter: bool = knob(True, "practical mode subtracts the group mean again so advantages stay zero-mean")
    min_passed: int = knob(2, "redistribution needs at least two passes to compare; else A is left as is", min=1)

    PRESETS = {"tiny": {}}

    def factor(self, tier: int) -> float:
        """The kit's one quality-factor schedule: f = max(min_factor, tier_decay^t) for tier t (0 = best).

        The report fixes only f_i ∈ (0, 1] and that lower-quality passes are down-weighted; a geometric decay
        keeps each tier a constant fraction of the one above, and the floor keeps a correct pass from being
        erased (it also bounds GAR's λ ≤ 1 / min_factor). Ties share a tier and so a factor.
        """
        if isinstance(tier, bool) or not isinstance(tier, int) or tier < 0:
            raise ValueError(f"GARConfig.factor: tier={tier!r}; expected an integer >= 0 (0 = the best tier)")
        return max(self.min_factor, self.tier_decay ** tier)


@dataclasses.dataclass
class LengthPenaltyConfig(Config):
    """Group-relative length penalty on successes (Report §4.3): −s·min(X, (L_i/L_ref − 1 − δ)⁺) above a gate."""

    scale: float = knob(0.5, "s: the largest penalty s·X = 0.5 keeps any success above any failure (reward 0)",
                        min=0.0)
    tolerance: float = knob(0.2, "δ: successes up to 20% longer than the reference are not penalised", min=0.0)
    cap: float = knob(1.0, "X: the relative excess is capped at 1 (twice the reference + δ)", min=0.0)
    gate: float = knob(0.5, "γ: only groups where at least half succeed have a trustworthy length reference",
                       min=0.0, max=1.0)
    reference: Literal["median", "mean", "min"] = knob("median", "median of successes: robust to one outlier")

    PRESETS = {"tiny": {}}


@dataclasses.dataclass
class SegmentPenaltyConfig(Config):
    """Segment-level behaviour penalty on error tokens (Report §4.3; κ, α_max, β_min are unpublished)."""

    kappa: float = knob(2.0, "κ: error tokens of a failure carry twice the failure's negative advantage", min=1.0)
    alpha_max: float = knob(3.0, "α_max: no error token gets an advantage below −3 (≈3 std of a group)", min=0.0)
    beta_min: float = knob(0.5, "β_min: normal tokens of a failure keep at least half their negative advantage",
                           min=0.0, max=1.0)

    PRESETS = {"tiny": {}}


@dataclasses.dataclass
class ClipConfig(Config):
    """PPO ratio clip with an entropy-adaptive upper bound (Report §5: clip range adjusted with policy entropy)."""

    eps_low: float = knob(0.2, "PPO's standard lower clip 1 − 0.2", min=0.0, max=1.0)
    eps_high: float = knob(0.28, "DAPO's clip-higher start value: room for low-probability tokens to grow",
                           min=0.0)
    entropy_target: float = knob(0.3, "target mean token entropy (nats) when entropy_target_ratio is 0", min=0.0)
    entropy_target_ratio: float = knob(0.8, "target = 0.8 × the entropy of the first RL batch: a fixed target fits "
                                       "one policy only, and holding 80% of the start lets the clip open as entropy "
                                       "collapses (0 = use entropy_target)", min=0.0, max=1.0)
    entropy_gain: float = knob(0.1, "ε_high moves 0.1 per nat of entropy gap per step: slow, stable", min=0.0)
    eps_high_min: float = knob(0.2, "never clip tighter than symmetric PPO", min=0.0)
    eps_high_max: float = knob(0.4, "never let the upper clip exceed 1.4: bounded off-policy drift", min=0.0)
    tis_cap: float = knob(2.0, "truncated IS: train/inference ratios above 2 are truncated (TIS's C)", min=1.0)
    grad_clip: float = knob(1.0, "Report §5: gradient-norm clip 1.0 (published)", min=0.0)

    PRESETS = {"tiny": {}}

    def check(self) -> None:
        if not self.eps_high_min <= self.eps_high <= self.eps_high_max:
            raise ConfigError(f"ClipConfig: eps_high={self.eps_high} outside "
                              f"[eps_high_min={self.eps_high_min}, eps_high_max={self.eps_high_max}]")


@dataclasses.dataclass
class SamplingConfig(Config):
    """Dynamic sampling (Report §4.1): drop groups whose rewards carry no signal."""

    reward_tol: float = knob(1e-6, "rewards closer than this count as equal (float noise is not a signal)",
                             min=0.0)
    confidence: float = knob(0.9, "over-sampling draws enough prompts to fill the batch 90% of the time",
                             min=0.0, max=1.0)

    PRESETS = {"tiny": {}}


@dataclasses.dataclass
class PenaltyRulesConfig(Config):
    """Detectors of the penalty module (Report §6.1). Thresholds are the kit's."""

    tool_tag: str = knob("tool_call", "actions are <tool_call>{json}</tool_call>, the Hermes/Qwen convention")
    max_repeats: int = knob(3, "the 3rd identical consecutive action in a context is a loop, not a retry",
                            min=2)

    PRESETS = {"tiny": {}}


@dataclasses.dataclass
class RLMathConfig(Config):
    """All constants of the RL math in one place (each section is also usable alone)."""

    grpo: GRPOConfig = knob(default_factory=GRPOConfig, why="GRPO advantages (GAR and GRS build on them)")
    gar: GARConfig = knob(default_factory=GARConfig, why="groupwise advantage redistribution")
    length: LengthPenaltyConfig = knob(default_factory=LengthPenaltyConfig, why="group-relative length penalty")
    segment: SegmentPenaltyConfig = knob(default_factory=SegmentPenaltyConfig, why="segment behaviour penalty")
    clip: ClipConfig = knob(default_factory=ClipConfig, why="PPO clip, entropy controller, TIS")
    sampling: SamplingConfig = knob(default_factory=SamplingConfig, why="dynamic sampling")
    rules: PenaltyRulesConfig = knob(default_factory=PenaltyRulesConfig, why="penalty-module detectors")
    loss_agg: Literal["token-mean", "seq-mean", "prompt-mean"] = knob(
        "prompt-mean", "Report §5: the production runs aggregate the loss per prompt (published)")

    PRESETS = {"tiny": {}}


#: Defaults read by the pure functions (one source of truth).
GRPO = GRPOConfig()
GAR = GARConfig()
LENGTH = LengthPenaltyConfig()
SEGMENT = SegmentPenaltyConfig()
CLIP = ClipConfig()
SAMPLING = SamplingConfig()
RULES = PenaltyRulesConfig()
