"""The toy agentic world of chapters 4a and 5a: one-line-bug programs a tiny policy learns to fix on a CPU.

:mod:`mimo_kit.train.toy.world` holds the tasks, the char-level tokenizer, the scripted expert and
:class:`~mimo_kit.train.toy.world.ToyEpisode`, which speaks the rollout driver's Episode protocol
(:mod:`mimo_kit.infra.rollout`). The RL maths (:mod:`mimo_kit.rl`) and the infrastructure (:mod:`mimo_kit.infra`)
import nothing from here; the trainer and the experiments do.

:mod:`mimo_kit.train.toy.repo` is the second world: small repository tasks in several bug families, graded by hidden
F2P / P2P tests in the sandbox, which a tiny policy fixes by acting through the mini-harness configurations.
"""

from mimo_kit.train.toy.world import (
    CHARS,
    OPS,
    TOKENIZER,
    Task,
    ToyEpisode,
    ToyTokenizer,
    ToyWorld,
    episodes,
    equivalent,
    expert_actions,
    expert_dataset,
    grade_group,
    make_tasks,
    play,
    rollout_settings,
    run_program,
)

__all__ = ["CHARS", "OPS", "TOKENIZER", "Task", "ToyEpisode", "ToyTokenizer", "ToyWorld", "episodes", "equivalent",
           "expert_actions", "expert_dataset", "grade_group", "make_tasks", "play", "rollout_settings", "run_program"]
