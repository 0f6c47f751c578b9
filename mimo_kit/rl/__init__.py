"""The RL math of chapters 4–5 as pure functions over tensors and plain data (Report §4.1, §4.3, §5, §6.1).

| file | idea |
|---|---|
| ``trajectory`` | Sample ⊃ Sequence ⊃ Context ⊃ Segment, JSONL with a schema check, token-in/token-out flattening |
| ``advantages`` | GRPO advantages, GRS reward, GAR redistribution and the grader-verdict step |
| ``penalties`` | group-relative length penalty, segment-level behaviour penalty |
| ``penalty_module`` | rules (detectors) × strategies (mask / shape / monitor / early stop), infra errors dropped |
| ``losses`` | PPO clip, entropy-adaptive ε_high, truncated IS, mismatch metrics, KL k1/k3 |
| ``aggregation`` | token-mean / seq-mean / prompt-mean, exact under micro-batching |
| ``sampling`` | dynamic sampling and over-sampling |
| ``compose`` | the advantage pipeline: GRPO or GAR, then length penalty, then segment penalty, per token |
| ``opd`` | MOPD²: reverse-KL distillation, teacher routing, prefix-conditioned contexts |
| ``config`` | every unpublished constant as a named field with its reason |
| ``examples`` | chapter 4c's worked trajectory groups (integer tokens, no tokenizer) |

This package imports nothing of the kit outside ``rl`` and ``config`` (``tests/test_layers.py``): the run that uses
it (trainer, worlds, SFT, MOPD² end to end, experiments) is :mod:`mimo_kit.train`.

>>> from mimo_kit.rl import grpo_advantages, gar_redistribute, grs_reward, aggregate_loss
"""

from mimo_kit.rl.advantages import (
    GARResult,
    VerdictError,
    gar_advantages,
    gar_redistribute,
    gar_step,
    grpo_advantages,
    grs_reward,
    pass_tiers,
    quality_factors,
)
from mimo_kit.rl.aggregation import MODES, aggregate_loss, group_weight, token_weights
from mimo_kit.rl.compose import STAGES, sequence_advantages, token_advantages
from mimo_kit.rl.config import (
    ClipConfig,
    GARConfig,
    GRPOConfig,
    LengthPenaltyConfig,
    PenaltyRulesConfig,
    RLMathConfig,
    SamplingConfig,
    SegmentPenaltyConfig,
)
from mimo_kit.rl.losses import (
    EntropyClipController,
    entropy_adaptive_eps_high,
    kl_k1,
    kl_k3,
    mismatch_metrics,
    ppo_clip_loss,
    token_entropy,
    truncated_is_weights,
)
from mimo_kit.rl.opd import (
    opd_batch_loss,
    opd_loss,
    prefix_conditioned_context,
    reverse_kl_exact,
    reverse_kl_per_token,
    route_teachers,
    teacher_logprobs,
)
from mimo_kit.rl.penalties import length_penalty, segment_advantages
from mimo_kit.rl.penalty_module import (
    BrokenMarkupRule,
    Finding,
    InfrastructureErrorRule,
    MalformedArgumentsRule,
    PenaltyModule,
    PenaltyReport,
    RecordedErrorRule,
    RepeatedActionRule,
    UnknownToolRule,
    default_rules,
)
from mimo_kit.rl.sampling import SamplingResult, dynamic_sampling, keep_probability, prompts_to_draw
from mimo_kit.rl.trajectory import (
    Context,
    Sample,
    Segment,
    Sequence,
    TrainBatch,
    TrajectoryError,
    flatten,
    load_jsonl,
    save_jsonl,
    unflatten,
)

__all__ = [
    "BrokenMarkupRule", "ClipConfig", "Context", "EntropyClipController", "Finding", "GARConfig",
    "GARResult", "GRPOConfig", "InfrastructureErrorRule", "LengthPenaltyConfig", "MODES", "MalformedArgumentsRule",
    "PenaltyModule", "PenaltyReport", "PenaltyRulesConfig", "RLMathConfig", "RecordedErrorRule",
    "RepeatedActionRule", "STAGES", "Sample", "SamplingConfig", "SamplingResult", "Segment", "SegmentPenaltyConfig",
    "Sequence", "TrainBatch", "TrajectoryError", "UnknownToolRule", "VerdictError", "aggregate_loss",
    "default_rules", "dynamic_sampling", "entropy_adaptive_eps_high", "flatten", "gar_advantages",
    "gar_redistribute", "gar_step", "group_weight", "grpo_advantages", "grs_reward", "keep_probability", "kl_k1",
    "kl_k3", "length_penalty", "load_jsonl", "mismatch_metrics", "opd_batch_loss", "opd_loss", "ppo_clip_loss",
    "pass_tiers", "prefix_conditioned_context", "prompts_to_draw", "quality_factors", "reverse_kl_exact",
    "reverse_kl_per_token",
    "route_teachers", "save_jsonl", "segment_advantages", "sequence_advantages", "teacher_logprobs",
    "token_advantages", "token_entropy", "token_weights", "truncated_is_weights", "unflatten",
]

