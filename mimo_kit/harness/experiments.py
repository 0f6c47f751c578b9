"""Chapter 4b's hack-suite experiment, registered for ``mimo-kit run`` (Report §4.2, reward hacking).

    mimo-kit run hack-suite tasks=[stats-median]   # one task, every strategy, both variants
"""

from __future__ import annotations

import dataclasses

from mimo_kit.config.base import Config, knob
from mimo_kit.envs.experiments import pick
from mimo_kit.experiments import experiment


@dataclasses.dataclass
class HackSuiteConfig(Config):
    """Which tasks and strategies the hack agent attacks; both environment variants by default."""

    tasks: tuple[str, ...] = knob((), "code task ids; empty = every shipped task")
    strategies: tuple[str, ...] = knob((), "strategy names; empty = all")
    general: bool = knob(True, "also attack the general tasks with the general strategies")

    PRESETS = {"tiny": {}}


@experiment("hack-suite", HackSuiteConfig, chapter="ch04b")
def run_hack_suite_experiment(cfg: HackSuiteConfig) -> dict:
    """Every hack × every task, uncleaned vs cleaned: bypass shares before and after the trajectory audit."""
    from mimo_kit.envs.code import shipped_tasks
    from mimo_kit.envs.general import shipped_general_tasks
    from mimo_kit.envs.hack_strategies import GENERAL_STRATEGIES
    from mimo_kit.harness.hack_suite import bypass_table, run_general_strategy, run_hack_suite

    results = run_hack_suite(pick(shipped_tasks(), cfg.tasks, "code tasks"), strategies=list(cfg.strategies) or None)
    if cfg.general:
        results += [run_general_strategy(t, s, cleaned=c) for c in (False, True) for t in shipped_general_tasks()
                    for s in GENERAL_STRATEGIES]
    cells = [{"task": r.task, "strategy": r.strategy, "family": r.family,
              "environment": "cleaned" if r.cleaned else "uncleaned", "reward": r.reward, "audited": r.audited}
             for r in results]
    return {"summary": bypass_table(results), "cells": cells}
