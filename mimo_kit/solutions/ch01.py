"""Chapter 1's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations

from mimo_kit.model import MiMoConfig


def solution(n: int):
    """Reference answers to the chapter's exercises, computed by the kit (the notebook checks against them)."""
    from mimo_kit.launch import shell_command

    if n == 1:
        layers = [0] + list(range(3, 48, 4))
        return MiMoConfig.preset("flash", global_layers=layers).layer_types.count("sliding_attention")
    if n == 2:
        rollouts = 4096 * 8
        return (rollouts, round(3.7e9 / rollouts))
    if n == 3:
        from mimo_kit.intro.experiments import ScaleKnobsConfig

        return shell_command("scale-knobs", ScaleKnobsConfig.preset("tiny", names=("pro",)))
    if n == 4:  # Pro under FSDP on 32 nodes x 8 GPUs, bf16 recipe, AdamW: weights + gradients + optimiser state, GiB
        from mimo_kit.infra.plan import PlanConfig, plan_memory

        plan = plan_memory(PlanConfig.preset("pro", nodes=32, gpus_per_node=8, fsdp=True))
        return (plan.weights + plan.gradients + plan.optimizer) / 2**30
    if n == 5:  # Pro / Flash: total parameters and active parameters, from count_parameters
        from mimo_kit.model import count_parameters

        flash, pro = count_parameters(MiMoConfig.preset("flash")), count_parameters(MiMoConfig.preset("pro"))
        return [pro["total"] / flash["total"], pro["active"] / flash["active"]]
    raise ValueError(f"chapter 1 has exercises 1-5, not {n!r}")
