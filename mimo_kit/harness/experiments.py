"""Chapter 4b's hack-suite and attack / clean rounds experiments, registered for ``mimo-kit run`` (Report §4.2).

    mimo-kit run hack-suite tasks=[stats-median]   # one task, every strategy, both variants
    mimo-kit run hack-rounds tasks=[stats-median]  # attack, clean what got through, attack again
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


@dataclasses.dataclass
class HackRoundsConfig(Config):
    """Which tasks and strategies the iterative attack / clean rounds use, and how many rounds at most."""

    tasks: tuple[str, ...] = knob((), "code task ids; empty = every shipped task")
    strategies: tuple[str, ...] = knob((), "strategy names, tried in this order; empty = all")
    max_rounds: int = knob(8, "the four leaks close in at most four rounds, the next shows the residual", min=1)

    PRESETS = {"tiny": {}}


@experiment("hack-rounds", HackRoundsConfig, chapter="ch04b")
def run_hack_rounds_experiment(cfg: HackRoundsConfig) -> dict:
    """Attack, clean what got through, attack again (Report §4.2): the bypass share per round."""
    from mimo_kit.envs.code import shipped_tasks
    from mimo_kit.harness.hack_suite import hack_rounds

    rows = hack_rounds(pick(shipped_tasks(), cfg.tasks, "code tasks"), strategies=list(cfg.strategies) or None,
                       max_rounds=cfg.max_rounds)
    return {"summary": rows}
