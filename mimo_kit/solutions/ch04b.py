"""Chapter 4b's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations


def solution(n: int):
    """Reference answers to chapter 4b's exercises, computed by the kit (the notebook checks against them)."""
    if n == 1:
        from mimo_kit.envs.code import shipped_tasks
        from mimo_kit.harness.hack_suite import run_hack_suite

        results = run_hack_suite(shipped_tasks(), strategies=["git-history"], variants=(False,))
        return sum(r.reward > 0 for r in results)
    if n == 2:
        from mimo_kit.envs.cyber import run_poc, shipped_targets

        target = next(t for t in shipped_targets() if t.id == "packet-decoy")
        return run_poc(target, target.decoy_poc, fixed=False).report
    if n == 3:
        from mimo_kit.envs.code import shipped_tasks
        from mimo_kit.grading import synthesize_rubric
        from mimo_kit.grading.demo import demo_group

        group = demo_group(next(t for t in shipped_tasks() if t.id == "stats-median"))
        rubric = synthesize_rubric(group)
        return float(rubric.reward(next(r for r in group.rollouts if r.id == "sprawl")))
    if n == 4:  # the rubric items (ids) that the `sprawl` rollout fails, sorted
        from mimo_kit.envs.code import shipped_tasks
        from mimo_kit.grading import synthesize_rubric
        from mimo_kit.grading.demo import demo_group

        group = demo_group(next(t for t in shipped_tasks() if t.id == "stats-median"))
        rubric = synthesize_rubric(group)
        sprawl = next(r for r in group.rollouts if r.id == "sprawl")
        return sorted(i.id for i in rubric.solution + rubric.behaviour if not i.check(sprawl))
    if n == 5:  # the GRS reward R of the `swallow` rollout of the stats-median demo group
        from mimo_kit.envs.code import shipped_tasks
        from mimo_kit.grading import synthesize_rubric
        from mimo_kit.grading.demo import demo_group

        group = demo_group(next(t for t in shipped_tasks() if t.id == "stats-median"))
        rubric = synthesize_rubric(group)
        return float(rubric.reward(next(r for r in group.rollouts if r.id == "swallow")))
    if n == 6:  # pixel similarity to replicate-house of its reference program without the grass rectangle
        from mimo_kit.envs import visual

        house = next(t for t in visual.shipped_visual_tasks() if t.id == "replicate-house")
        return visual.grade_drawing(house, house.reference.replace("rect 0 48 64 16 #228b22\n", "")).score
    raise ValueError(f"chapter 4b has exercises 1-6, not {n!r}")
