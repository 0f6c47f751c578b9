"""Infrastructure of chapter 6: rollout engines, partial rollouts and the memory planner (Report §3, §4.1, §6).

| file | idea |
|---|---|
| ``engine`` | the rollout-engine protocol, the in-process engine, abort/resume, teacher-forced logprobs |
| ``sglang`` | ``SGLangEngine``: the same protocol over a SGLang server's native HTTP API; top-p sets from top-k |
| ``serve`` | ``mimo-kit serve``: the in-process engine behind SGLang's native endpoints (127.0.0.1 by default) |
| ``partial`` | the partial-rollout buffer: version stamps, batch cut, resume after re-prefill, staleness expiry |
| ``plan`` | the memory planner: bytes per GPU of a training step by item, FSDP or LoRA: does it fit? |
| ``measure`` | the planner's ground truth: a real CPU training step and the bytes of its tensors |
"""

from mimo_kit.infra.engine import (
    FINISH_REASONS,
    GenerationOutput,
    GenerationRequest,
    InProcessEngine,
    RolloutEngine,
    resume_request,
    teacher_forced_logprobs,
)

__all__ = ["FINISH_REASONS", "GenerationOutput", "GenerationRequest", "InProcessEngine", "RolloutEngine",
           "resume_request", "teacher_forced_logprobs"]
