"""Task validation as the report runs it: a coding agent tries each code task 4 times, an audit agent reads it all
(Report §4.2, supervision accuracy).

Supervision is accurate when spec and tests agree: a **false positive** is spec-violating code that passes, a
**false negative** spec-satisfying code that fails. The stability check (:func:`mimo_kit.envs.code.validate_task`:
the reference patch flips F2P and keeps P2P, over 8 reruns) cannot see either: the reference passes a test that
also passes a special case, and a test that rejects an equivalent fix still accepts the reference. So each task
is also *attempted*: :func:`attempt_task` runs a coding agent (any harness policy, ``messages → reply``) ``attempts``
times in the task's sandboxed environment through the mini-harness, and :func:`audit_task` reads spec, hidden
tests, reference patch, each submitted patch, its test results and its whole trajectory and reports findings:

- **false negative**: an attempt that makes the reference's change (the same lines added and removed, whitespace
  aside) and fails the tests;
- **false positive**: an attempt that passes while leaving every function the reference changes untouched, or
  while adding literals the tests expect that the reference never writes (special-casing the tested inputs; 0 and
  ±1 aside, too common to tell);
- **leak**: an attempt whose tests passed but whose trajectory the audit flags (a hack got through the
  environment: reward 0 in training, but the environment needs cleaning);
- **unsolved**: no attempt passed (too hard for the agent, or a spec the tests do not follow: for review).

A task is kept when the stability check passes and the audit finds nothing; otherwise it goes to review with the
findings. The audit agent here is rule-based: it reads the same artefacts a model-based auditor would.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

from mimo_kit.envs import code as code_env
from mimo_kit.grading.group import added_lines, changed_functions, diff_files, removed_lines

Policy = Callable[[list[dict]], str]
ATTEMPTS = 4  # Report §4.2: a coding agent tries each task 4 times
TRIVIAL = {"0", "1", "-1"}  # literals too common to tell a special case from ordinary code


@dataclasses.dataclass
class Attempt:
    """One try of the coding agent: what it submitted, what the tests said, what it did."""

    agent: str
    passed: bool  # the hidden tests' verdict (before the trajectory audit)
    reward: float  # after the trajectory audit (0 for a flagged hack)
    patch: str
    test_output: str
    trajectory: list[str]  # every reply of the agent, in order
    hack_flags: list[str]


@dataclasses.dataclass
class TaskAudit:
    task_id: str
    solved: int  # attempts that passed with reward (not hacks)
    attempts: int
    findings: list[str]  # "<kind>: <what>" for false negatives, false positives, leaks, unsolved
    stable: bool | None = None  # the 8-rerun stability check, when run

    @property
    def keep(self) -> bool:
        return not self.findings and self.stable is not False

    @property
    def kinds(self) -> list[str]:
        return sorted({f.split(":", 1)[0] for f in self.findings})


def attempt_task(task: code_env.CodeTask, agents: Sequence[tuple[str, Policy]], harness: str = "swe-tools",
                 cfg: code_env.CodeEnvConfig | None = None) -> list[Attempt]:
    """Each ``(name, policy)`` of ``agents`` tries ``task`` once in a fresh sandboxed workspace through ``harness``;
    the graded episode, its patch and its trajectory come back as :class:`Attempt` s."""
    from mimo_kit.harness.envs import CodeEnv
    from mimo_kit.harness.episode import run_episode

    out = []
    for i, (name, policy) in enumerate(agents):
        with CodeEnv(task, cfg=cfg) as env:
            sample = run_episode(policy, env, harness, sequence_id=f"{task.id}-attempt{i}")
            patch = code_env.workspace_diff(task, env.workspace.root)
        seq = sample.sequences[0]
        g = seq.metadata.get("grade") or {}
        replies = [seg.text or "" for c in seq.contexts for seg in c.segments if seg.trainable]
        out.append(Attempt(name, bool(g.get("tests_passed")), float(g.get("reward", 0.0)), patch,
                           str(g.get("test_output", "")), replies,
                           list(g.get("hack_flags", []))))
    return out


def _norm(lines: list[str]) -> list[str]:
    return sorted(re.sub(r"\s+", "", ln) for ln in lines if ln.strip())


def _files(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in sorted(root.rglob("*.py"))}


def expected_literals(task: code_env.CodeTask) -> set[str]:
    """Number literals the hidden tests expect (right of ``==``) and the spec names as expected values."""
    tests = "\n".join(_files(task.hidden_tests).values())
    found = set(re.findall(r"==\s*\(?(-?\d+(?:\.\d+)?)", tests))
    found |= set(re.findall(r"expected\s+(-?\d+(?:\.\d+)?)", task.instruction))
    return found


def audit_task(task: code_env.CodeTask, attempts: Sequence[Attempt], stable: bool | None = None) -> TaskAudit:
    """The audit agent's reading of one task and its attempts (module docstring: the four kinds of finding)."""
    ref = task.reference_patch
    base = _files(task.repo)
    ref_funcs = changed_functions(ref, base)
    ref_files = set(diff_files(ref))
    ref_change = (_norm(added_lines(ref)), _norm(removed_lines(ref)))
    ref_literals = set(re.findall(r"-?\d+(?:\.\d+)?", "\n".join(added_lines(ref))))
    wanted = expected_literals(task)
    findings: list[str] = []
    for i, a in enumerate(attempts):
        who = f"attempt {i + 1} ({a.agent})"
        same_change = (_norm(added_lines(a.patch)), _norm(removed_lines(a.patch))) == ref_change
        if same_change and not a.passed:
            findings.append(f"false negative: {who} makes the reference's change and fails the tests")
        if a.passed and a.hack_flags:
            findings.append(f"leak: {who} passed the tests by a hack the audit flags ({'; '.join(a.hack_flags)})")
            continue
        if not a.passed or same_change:
            continue
        funcs, files = changed_functions(a.patch, base), set(diff_files(a.patch))
        if (ref_funcs and not funcs & ref_funcs) or not files & ref_files:
            findings.append(f"false positive: {who} passes without changing {sorted(ref_funcs or ref_files)}, what "
                            f"the reference changes (it changes {sorted(funcs or files)})")
        added = set(re.findall(r"-?\d+(?:\.\d+)?", "\n".join(added_lines(a.patch))))
        kept = set(re.findall(r"-?\d+(?:\.\d+)?", "\n".join(removed_lines(a.patch))))  # literals it moved
        special = sorted((added & wanted) - ref_literals - kept - TRIVIAL)
        if special:
            findings.append(f"false positive: {who} passes with literals the tests expect {special} that the "
                            "reference never writes (special-cased inputs)")
    solved = sum(a.passed and a.reward > 0 for a in attempts)
    if attempts and not solved:
        findings.append(f"unsolved: no attempt of {len(attempts)} passed (too hard for the agent, or a spec the "
                        "tests do not follow)")
    return TaskAudit(task.id, solved, len(attempts), findings, stable)


def validate_with_agents(task: code_env.CodeTask, agents: Sequence[tuple[str, Policy]], harness: str = "swe-tools",
                         cfg: code_env.CodeEnvConfig | None = None, stability: bool = True) -> TaskAudit:
    """Report §4.2's task validation: the stability check (``cfg.reruns`` reruns) and the agent's attempts read by
    the audit agent."""
    stable = code_env.validate_task(task, cfg).ok if stability else None
    return audit_task(task, attempt_task(task, agents, harness, cfg), stable)


def audit_rows(audits: Sequence[TaskAudit]) -> list[dict[str, Any]]:
    """One row per task: solved of attempted, stable, the verdict and the findings."""
    return [{"task": a.task_id, "solved": f"{a.solved}/{a.attempts}", "stable": a.stable,
             "verdict": "keep" if a.keep else "review", "findings": a.findings} for a in audits]
