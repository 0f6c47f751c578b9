"""GRS: offline rubric synthesis for high-pass-rate tasks (Report §4.3).

The report's agent compares several offline rollouts with the spec and the repo and writes a **solution rubric**
(requirements met, edge cases, consistency with the codebase) and a **behaviour rubric** (gathers evidence,
verifies its change); the items are *inspired by rollouts but anchored in the task*. The reward is
``R = R_test · S_sol · S_beh``: failing trajectories get 0, and all-pass groups still get a signal.

The kit's offline synthesiser is rule-based:

- **anchored candidates** come from the task: the functions the spec names (backticked identifiers that exist in
  the repo) → "changes ``f``" and "keeps ``f``'s signature"; the package → "changes only package source files";
  the protected paths → "leaves tests and config alone"; behaviour: "inspects the code it changes before editing",
  "runs the code or the tests after its last edit", "makes no leakage attempt";
- **rollout-inspired candidates** come from what distinguishes the rollouts: "adds no broad except / fallback
  branch" and "keeps the change small (≤ 2× the smallest passing diff)" are kept only when some rollouts break
  them, so they separate an all-pass group instead of padding every score.

An item is a name, a text and a check ``(rollout) -> bool``; scores are the fraction of items met.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from mimo_kit.envs.code import is_protected
from mimo_kit.envs.hacks import detect_hacks
from mimo_kit.grading.group import (
    _FALLBACK,
    GradedTrajectory,
    GroupWorkspace,
    added_lines,
    changed_functions,
    diff_files,
    removed_lines,
)


@dataclasses.dataclass
class RubricItem:
    id: str
    text: str
    kind: str  # solution | behaviour
    origin: str  # task (anchored) | rollouts (inspired by what separates them)
    check: Callable[[GradedTrajectory], bool] = dataclasses.field(repr=False)


@dataclasses.dataclass
class Rubric:
    solution: list[RubricItem]
    behaviour: list[RubricItem]

    def score(self, r: GradedTrajectory) -> tuple[float, float]:
        s_sol = sum(i.check(r) for i in self.solution) / max(1, len(self.solution))
        s_beh = sum(i.check(r) for i in self.behaviour) / max(1, len(self.behaviour))
        return s_sol, s_beh

    def reward(self, r: GradedTrajectory) -> float:
        """R = R_test · S_sol · S_beh (Report §4.3)."""
        s_sol, s_beh = self.score(r)
        return float(r.passed) * s_sol * s_beh

    def table(self) -> list[dict]:
        return [{"kind": i.kind, "item": i.text, "origin": i.origin} for i in self.solution + self.behaviour]


def _edits(cmd: str) -> bool:
    return bool(re.search(r"str_replace|sed -i|>\s*\S+\.py|write\(|apply", cmd))


def _inspects(cmd: str) -> bool:
    return bool(re.match(r"\s*(view|cat|head|sed -n|grep|less|nl)\b", cmd))


def _runs(cmd: str) -> bool:
    return bool(re.search(r"pytest|python3? -c|python3? -m|python3? \S+\.py", cmd)) and not _edits(cmd)


def synthesize_rubric(group: GroupWorkspace) -> Rubric:
    """Solution and behaviour rubrics for a task from its group of offline rollouts (Report §4.3 GRS)."""
    named = {n for n in re.findall(r"`(?:\w+\.)*(\w+)`", group.spec)}
    defined = {m for src in group.repo.values() for m in re.findall(r"^\s*def (\w+)\(", src, re.M)}
    targets = sorted(named & defined)
    sol: list[RubricItem] = []
    for f in targets:
        sig = next(m.group(0) for src in group.repo.values() for m in re.finditer(rf"def {f}\(.*\):", src))
        sol.append(RubricItem(f"changes-{f}", f"changes `{f}`, the function the task names", "solution", "task",
                              lambda r, f=f: f in changed_functions(r.diff, group.repo)))
        sol.append(RubricItem(f"signature-{f}", f"keeps the signature `{sig}`", "solution", "task",
                              lambda r, sig=sig: sig not in "\n".join(removed_lines(r.diff))))
    pkg = group.package
    sol.append(RubricItem("in-package", f"changes only source files of `{pkg or 'the package'}`", "solution", "task",
                          lambda r: all(f.startswith(pkg + "/") and f.endswith(".py") for f in diff_files(r.diff))))
    sol.append(RubricItem("no-tests-config", "leaves tests and harness config alone", "solution", "task",
                          lambda r: not any(is_protected(f) for f in diff_files(r.diff))))
    no_fallback = lambda r: not any(re.search(p, ln) for ln in added_lines(r.diff) for p, _ in _FALLBACK)  # noqa
    passing = [r for r in group.rollouts if r.passed]
    size = lambda r: len(added_lines(r.diff)) + len(removed_lines(r.diff))  # noqa: E731
    smallest = min((size(r) for r in passing), default=0)
    small = lambda r: size(r) <= 2 * max(1, smallest)  # noqa: E731
    for item in (RubricItem("no-fallback", "adds no broad except, swallowed branch or compatibility fallback",
                            "solution", "rollouts", no_fallback),
                 RubricItem("small-change", f"keeps the change within 2× the smallest passing fix ({smallest} "
                                            "changed lines)", "solution", "rollouts", small)):
        if any(not item.check(r) for r in group.rollouts):  # only items that separate the rollouts
            sol.append(item)

    def inspected_first(r: GradedTrajectory) -> bool:
        first_edit = next((i for i, c in enumerate(r.commands) if _edits(c)), len(r.commands))
        return any(_inspects(c) for c in r.commands[:first_edit])

    def verified(r: GradedTrajectory) -> bool:
        last_edit = max((i for i, c in enumerate(r.commands) if _edits(c)), default=-1)
        return any(_runs(c) for c in r.commands[last_edit + 1:])

    beh = [RubricItem("inspects", "inspects the code it changes before editing", "behaviour", "task",
                      inspected_first),
           RubricItem("verifies", "runs the code or the tests after its last edit", "behaviour", "task", verified),
           RubricItem("no-leak", "makes no leakage or grader-forgery attempt", "behaviour", "task",
                      lambda r: not detect_hacks(r.commands))]
    return Rubric(sol, beh)
