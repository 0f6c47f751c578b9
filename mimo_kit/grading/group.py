"""Group graders: one shared workspace per rollout group, one verdict interface (Report §4.3, GAR).

The report's online grader sees a whole group at once (spec, repo, every trajectory's patch and test output),
may read code and run tests, allows ties, flags hacks, and compares passing patches on five axes: **approach**,
**precision** (no omissions, no needless fallback branches), **minimality**, **no out-of-scope side effects**,
**craftsmanship** per codebase conventions. A confirmed hack gets reward 0 before group statistics are computed;
an unusable verdict falls back to the original advantages.

- :class:`GroupWorkspace` holds the group; :meth:`GroupWorkspace.write` lays it out on disk as a grader agent
  would browse it (``spec.md``, ``repo/``, ``trajectories/<id>/{diff.patch,test_output.txt,commands.txt}``).
- :class:`GroupVerdict` is the one output: ranking of *passing* trajectories as tiers (ties share a tier), hack
  flags with reasons, per-trajectory reasons and axis scores, and ``usable``.
- :class:`RuleGroupGrader` is the deterministic grader on the five axes (the kit's proxies, listed in
  :func:`axis_scores`); :class:`LLMGroupGrader` asks a rollout engine for the same verdict as JSON and returns an
  unusable verdict when there is no engine or the answer does not parse.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from mimo_kit.config.base import Config, knob
from mimo_kit.envs.code import is_protected
from mimo_kit.envs.hacks import detect_hacks
from mimo_kit.rl.advantages import pass_tiers
from mimo_kit.rl.config import GARConfig

AXES = ("approach", "precision", "minimality", "scope", "conventions")


@dataclasses.dataclass
class GradedTrajectory:
    """One trajectory as the group grader sees it: its patch, its test verdict, the commands it ran (Report §4.3.2).
    Not the rollout in flight (:class:`mimo_kit.infra.rollout.Rollout`): a view of one finished trajectory."""

    id: str
    diff: str
    passed: bool  # R_test: the hidden tests' verdict
    commands: list[str] = dataclasses.field(default_factory=list)
    test_output: str = ""


@dataclasses.dataclass
class GroupWorkspace:
    spec: str
    repo: dict[str, str]  # path → text of the base repository
    rollouts: list[GradedTrajectory]
    package: str = ""

    def write(self, dest: str | Path) -> Path:
        dest = Path(dest)
        (dest / "trajectories").mkdir(parents=True, exist_ok=True)
        (dest / "spec.md").write_text(self.spec + "\n")
        for rel, text in self.repo.items():
            (dest / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / "repo" / rel).write_text(text)
        for r in self.rollouts:
            d = dest / "trajectories" / r.id
            d.mkdir(parents=True, exist_ok=True)
            (d / "diff.patch").write_text(r.diff)
            (d / "test_output.txt").write_text(r.test_output)
            (d / "commands.txt").write_text("\n".join(r.commands))
            (d / "result.json").write_text(json.dumps({"passed": r.passed}))
        return dest


@dataclasses.dataclass
class GroupVerdict:
    ranking: list[list[str]]  # tiers of passing, non-hack trajectories, best first
    hacks: dict[str, str]  # id → reason (reward 0 before group statistics)
    reasons: dict[str, list[str]]
    scores: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    usable: bool = True
    grader: str = "rule"
    checks: dict[str, float] = dataclasses.field(default_factory=dict)  # agreement measured (grading.agreement)

    def tier_of(self, rid: str) -> int | None:
        return next((i for i, tier in enumerate(self.ranking) if rid in tier), None)


def tier_factors(verdict: GroupVerdict, cfg: GARConfig | None = None) -> dict[str, float]:
    """Quality factors f_i ∈ (0, 1] for GAR from the verdict's tiers (ties share one; an empty tier is skipped),
    read by the trainer's own :func:`~mimo_kit.rl.advantages.pass_tiers` on the one schedule
    :meth:`mimo_kit.rl.config.GARConfig.factor`: the grader and the trainer's GAR step cannot disagree."""
    cfg = cfg or GARConfig()
    ranked = [rid for tier in verdict.ranking for rid in tier]
    return {rid: cfg.factor(t) for rid, t in pass_tiers(verdict.ranking, ranked, [True] * len(ranked)).items()}


@dataclasses.dataclass
class GraderConfig(Config):
    """Weights and thresholds of the rule-based group grader; the report publishes none of them."""

    weights: tuple[float, ...] = knob((1.0, 1.0, 1.0, 1.0, 0.5), "approach, precision, minimality, scope, "
                                      "conventions; style counts half: it is the weakest signal")
    tie_tolerance: float = knob(0.05, "totals closer than this share a tier (the report allows ties)", min=0.0)
    max_line: int = knob(100, "added lines longer than this break the toy repos' convention", min=40)

    PRESETS = {"tiny": {}}

    def check(self) -> None:
        if len(self.weights) != len(AXES):
            from mimo_kit.config.base import ConfigError

            raise ConfigError(f"GraderConfig.weights: got {len(self.weights)} values, expected {len(AXES)} "
                              f"({', '.join(AXES)})")


# ---- diff analysis ------------------------------------------------------------------------------------------------
def diff_files(diff: str) -> list[str]:
    return sorted(set(re.findall(r"^diff --git a/(\S+) b/", diff, re.M)))


def added_lines(diff: str) -> list[str]:
    return [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]


def removed_lines(diff: str) -> list[str]:
    return [ln[1:] for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]


def changed_functions(diff: str, repo: dict[str, str]) -> set[str]:
    """Names of the functions whose lines a diff touches: each removed line by its line number in the old file, each
    added line by the old line it follows (a line added right after a ``def`` block's last line belongs to it)."""
    out: set[str] = set()
    for block in re.split(r"^diff --git ", diff, flags=re.M)[1:]:
        path = block.split()[0][2:]
        src = repo.get(path)
        if src is None or not path.endswith(".py"):
            continue
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        spans = [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        touched: set[int] = set()
        for hunk in re.split(r"^(?=@@ )", block, flags=re.M)[1:]:
            m = re.match(r"@@ -(\d+)(?:,(\d+))?", hunk)
            if m is None:
                continue
            line = int(m.group(1)) - (1 if m.group(2) == "0" else 0)  # an empty old range names the line before
            for text in hunk.splitlines()[1:]:
                if text.startswith("-"):
                    touched.add(line)
                    line += 1
                elif text.startswith("+"):
                    touched.add(max(line - 1, 1))
                elif text.startswith(" ") or text == "":
                    line += 1
        out |= {name for a, b, name in spans if any(a <= ln <= b for ln in touched)}
    return out


_FALLBACK = [(r"except\s*(Exception|BaseException)?\s*:", "broad or bare except"),
             (r"^\s*pass\s*$", "a swallowed branch (pass)"), (r"hasattr\(|getattr\([^)]*,\s*None\)", "a compat probe"),
             (r"^\s*if\s+isinstance\(", "a type-dispatch fallback"), (r"try\s*:", "a new try block")]


def _modal(values) -> list[frozenset]:
    """The most common values, all of them when several are equally common (so no order of the group decides)."""
    counts = Counter(values)
    top = max(counts.values(), default=0)
    return [v for v, c in counts.items() if c == top]


def axis_scores(r: GradedTrajectory, group: GroupWorkspace, passing: list[GradedTrajectory],
                cfg: GraderConfig) -> tuple[dict, list]:
    """The five axes for one passing rollout, each in [0, 1], with the reasons for every deduction.

    approach: changes the functions most passing rollouts change (the group's modal approach; when several
    approaches are equally common, each of them is modal);
    precision: −0.25 per added fallback construct (broad except, pass, hasattr probe, isinstance branch, try);
    minimality: smallest passing diff size / this diff size (changed lines);
    scope: −0.5 per file outside the group's modal file set (the files every equally common set shares), −1 for
    tests/config (protected paths);
    conventions: −0.2 per added line that is too long, has a tab, trailing spaces or a debugging print.
    """
    reasons = []
    funcs = {p.id: frozenset(changed_functions(p.diff, group.repo)) for p in passing}
    modal = _modal(funcs.values())  # never the first one read: the verdict must not depend on the group's order
    approach = 1.0 if funcs.get(r.id) in modal else 0.5
    if approach < 1:
        reasons.append(f"approach: changes {sorted(funcs.get(r.id, ()))}, most passing rollouts change "
                       f"{' or '.join(str(sorted(m)) for m in sorted(modal, key=sorted))}")
    added = added_lines(r.diff)
    hits = [why for line in added for pat, why in _FALLBACK if re.search(pat, line)]
    precision = max(0.0, 1 - 0.25 * len(hits))
    if hits:
        reasons.append(f"precision: adds {', '.join(sorted(set(hits)))}")
    size = lambda d: len(added_lines(d)) + len(removed_lines(d))  # noqa: E731
    smallest = min(size(p.diff) for p in passing) if passing else size(r.diff)
    minimality = smallest / size(r.diff) if size(r.diff) else 1.0
    if minimality < 1:
        reasons.append(f"minimality: {size(r.diff)} changed lines, the smallest passing fix has {smallest}")
    files = set(diff_files(r.diff))
    tied = _modal(frozenset(diff_files(p.diff)) for p in passing)
    modal_files = frozenset.intersection(*tied) if tied else frozenset()
    outside = sorted(files - set(modal_files))
    protected = [f for f in files if is_protected(f)]
    scope = max(0.0, 1 - 0.5 * len([f for f in outside if f not in protected]) - 1.0 * len(protected))
    if outside:
        reasons.append(f"scope: touches {outside} outside the fix" + (f" incl. tests/config {protected}"
                                                                      if protected else ""))
    bad = [ln for ln in added if len(ln) > cfg.max_line or "\t" in ln or ln != ln.rstrip()
           or re.match(r"\s*print\(", ln)]
    conventions = max(0.0, 1 - 0.2 * len(bad))
    if bad:
        reasons.append(f"conventions: {len(bad)} added lines break the style (length, tabs, trailing spaces, print)")
    return dict(zip(AXES, (approach, precision, minimality, scope, conventions))), reasons


class RuleGroupGrader:
    """Deterministic group grader on the report's five axes (Report §4.3); hacks from the trajectory audit."""

    name = "rule"

    def __init__(self, cfg: GraderConfig | None = None):
        self.cfg = cfg or GraderConfig()

    def grade(self, group: GroupWorkspace) -> GroupVerdict:
        hacks: dict[str, str] = {}
        for r in group.rollouts:
            flags = detect_hacks(r.commands)
            protected = [f for f in diff_files(r.diff) if is_protected(f)]
            if flags:
                hacks[r.id] = "; ".join(sorted({f.reason for f in flags}))
            elif protected:
                hacks[r.id] = f"edits tests or harness config {protected}"
        passing = [r for r in group.rollouts if r.passed and r.id not in hacks]
        scores, reasons, totals = {}, {}, {}
        w = self.cfg.weights
        for r in passing:
            s, why = axis_scores(r, group, passing, self.cfg)
            scores[r.id], reasons[r.id] = s, why
            totals[r.id] = sum(wi * s[a] for wi, a in zip(w, AXES)) / sum(w)
        for r in group.rollouts:
            if r.id in hacks:
                reasons[r.id] = [f"hack: {hacks[r.id]}"]
            elif not r.passed:
                reasons[r.id] = ["fails the hidden tests"]
        ranking: list[list[str]] = []
        for rid in sorted(totals, key=lambda k: (-totals[k], k)):
            if ranking and totals[ranking[-1][0]] - totals[rid] <= self.cfg.tie_tolerance:
                ranking[-1].append(rid)
            else:
                ranking.append([rid])
        for rid, t in totals.items():
            scores[rid]["total"] = round(t, 4)
        return GroupVerdict(ranking, hacks, reasons, scores, True, self.name)


class LLMGroupGrader:
    """The agentic grader's interface, backed by any ``generate(prompt) -> str`` (a rollout engine).

    The prompt lists the spec and each trajectory's diff, test verdict and commands; the reply must be JSON
    ``{"ranking": [[ids...], ...], "hacks": {id: reason}, "reasons": {id: [..]}}``. Without an engine, or when
    the reply does not parse or names unknown / failing ids, the verdict is ``usable=False`` (Report §4.3: fall
    back to the original advantages).
    """

    name = "llm"

    def __init__(self, generate: Callable[[str], str] | None = None):
        self.generate = generate

    def prompt(self, group: GroupWorkspace) -> str:
        parts = [f"# Spec\n{group.spec}\n", "# Trajectories"]
        for r in group.rollouts:
            parts.append(f"## {r.id} (tests {'pass' if r.passed else 'fail'})\n```diff\n{r.diff}```\n"
                         f"commands: {r.commands}")
        parts.append("Rank the passing trajectories on approach, precision, minimality, scope and conventions "
                     "(ties allowed), flag hacks. Reply with JSON {\"ranking\": [[ids]], \"hacks\": {}, "
                     "\"reasons\": {}}.")
        return "\n".join(parts)

    def grade(self, group: GroupWorkspace) -> GroupVerdict:
        if self.generate is None:
            return GroupVerdict([], {}, {}, usable=False, grader=self.name)
        try:
            data = json.loads(self.generate(self.prompt(group)))
            ranking = [list(map(str, tier)) for tier in data["ranking"]]
            hacks = {str(k): str(v) for k, v in data.get("hacks", {}).items()}
            reasons = {str(k): list(v) for k, v in data.get("reasons", {}).items()}
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            return GroupVerdict([], {}, {}, usable=False, grader=self.name)
        passing = {r.id for r in group.rollouts if r.passed}
        ranked = [rid for tier in ranking for rid in tier]
        if len(ranked) != len(set(ranked)) or not set(ranked) <= passing or set(hacks) - {r.id for r in
                                                                                       group.rollouts}:
            return GroupVerdict([], {}, {}, usable=False, grader=self.name)
        return GroupVerdict(ranking, hacks, reasons, {}, True, self.name)
