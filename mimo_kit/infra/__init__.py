"""Infrastructure of chapter 6: rollout engines and partial rollouts (Report §4.1, §6).

| file | idea |
|---|---|
| ``engine`` | the rollout-engine protocol, the in-process engine, abort/resume, teacher-forced logprobs |
| ``partial`` | the partial-rollout buffer: version stamps, batch cut, resume after re-prefill, staleness expiry |
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
