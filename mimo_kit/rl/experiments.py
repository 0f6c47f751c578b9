"""Chapters 4–5's RL runs, registered for ``mimo-kit run`` (Report §4.1, §4.3, §5).

    mimo-kit run rl --preset tiny                       # SFT warm start + RL on the toy world (resumes)
    mimo-kit run rl --preset tiny advantage=gar         # the same with GAR and the rule-based group grader
"""

from __future__ import annotations

from mimo_kit.experiments import experiment
from mimo_kit.rl.trainer import RLConfig, run_rl


@experiment("rl", RLConfig, chapter="ch04a")
def rl(cfg: RLConfig) -> dict:
    """SFT warm start + RL on the toy agentic world; held-out pass@1 before and after, metrics.jsonl."""
    r = run_rl(cfg)
    return {k: v for k, v in r.items() if k not in ("model", "init_router")}
