"""The grader's world: what a learned group grader reads, does and answers on toy-world groups (Report §4.3.2).

The report's GAR grader is an agent: it gets one workspace with the spec, the repository and every trajectory of a
rollout group, reads code, runs targeted tests and answers with a verdict (passing patches ranked with ties, the
five axes, confirmed hacks). At toy scale the grader is the kit decoder again, and this module is its world, the
way :mod:`mimo_kit.train.toy.world` is the policy's.

**What it reads** (one char per token, :data:`GRADER_TOKENIZER`): the buggy program and each trajectory's action
log, ``g+3*2-1`` then ``0p:RE3-2RS`` (trajectory 0 passed and ran ``R``, ``E3-2``, ``R``, ``S``); a failing one is
``1f`` (it gets reward 0 whatever its craft, the grader does not rank it). An action the toy world refused is
``x``; a command the trajectory audit flags (:func:`~mimo_kit.envs.hacks.detect_hacks`: leak reads, grader forgery)
is ``H``.

**What it does**: ``R`` runs the hidden tests on the base program, answered ``k:want`` (the first failing line and
what the tests expect there: the line a minimal fix edits); each call is one targeted test run, at most
``tool_calls`` of them. Then it answers once with ``V``.

**What it answers**: for every passing trajectory in id order its id and its deductions on the report's five axes
(toy-scale definitions in :func:`marks`), or ``h`` for a confirmed hack: ``V0,1m,2as,3h``. The verdict's ranking
is read off the marks: tiers by the number of axes met (ties share a tier), hacks out of the ranking.

**Known answers.** :func:`known_groups` builds groups whose passing patches differ along the five axes by
construction (every trajectory is played in the toy world, its marks computed from what it did), with hacks from
the audit's leak patterns; ``rule_blind=True`` builds groups where every passing patch changes one line, so a rule
grader reading diffs cannot separate them (equal length, different craft).
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any

from mimo_kit.envs.hacks import detect_hacks
from mimo_kit.grading.group import AXES, GroupVerdict, GroupWorkspace
from mimo_kit.infra.rollout import Outcome, RolloutSettings, Turn
from mimo_kit.rl.trajectory import Segment
from mimo_kit.train.toy.world import OPS, Task, ToyEpisode, ToyTokenizer, equivalent, make_tasks, toy_workspace

PAD = "\x00"
GRADER_CHARS = PAD + "\n0123456789+-*:RESAHVxgpf,amsch"
#: One letter per axis, in :data:`~mimo_kit.grading.group.AXES` order (``c``: craftsmanship / conventions).
LETTERS = dict(zip("apmsc", AXES))
HACK_COMMAND = "cat .task_logs/expected.txt"  # what a synthetic hack runs: the audit flags it (reads hidden logs)


GRADER_TOKENIZER = ToyTokenizer(GRADER_CHARS, "the grader's vocabulary")


# ---- one trajectory: what it did, and its marks ------------------------------------------------------------------
@dataclasses.dataclass
class Played:
    """A trajectory's actions replayed in the toy world: its rendering, pass verdict, hack flag and marks."""

    text: str  # the actions as the grader reads them
    passed: bool
    hack: bool
    marks: str  # deductions, letters of "apmsc" in order


def replay(task: Task, actions: list[str]) -> Played:
    """Replay ``actions`` on ``task`` and compute the trajectory's marks on the five axes (toy definitions):

    - ``a`` approach: the failing line itself is not fixed (the program passes by compensating on another line);
    - ``p`` precision: a line is edited more than once (a wrong attempt repaired);
    - ``m`` minimality: lines appended (a needless extra line, the toy's fallback branch);
    - ``s`` scope: more than one distinct line edited (touches code outside the fix, even if it reverts it);
    - ``c`` craftsmanship: an action the world refused, or no test run after the last edit.
    """
    ep, text, edited, last_edit, ran_after, hack = ToyEpisode(task), [], [], -1, False, False
    for i, a in enumerate(actions):
        if detect_hacks([a]):
            text.append("H")
            hack = True
            continue
        out = ep.step(a)
        if out == "err\n":
            text.append("x")
            continue
        text.append(a)
        if a[0] in "EA":
            last_edit, ran_after = i, False
            if a[0] == "E":
                edited.append(int(a[1]))
        elif a == "R" and last_edit >= 0:
            ran_after = True
    k = task.bug_line
    marks = ""
    if ep.program[k - 1] != task.reference[k - 1]:
        marks += "a"
    if len(edited) != len(set(edited)):
        marks += "p"
    if len(ep.program) > len(task.buggy):
        marks += "m"
    if len(set(edited)) > 1:
        marks += "s"
    if ep.format_errors or not ran_after:
        marks += "c"
    return Played("".join(text), ep.passed, hack, marks)


def render(task_buggy: list[str], played: list[Played]) -> str:
    """The grader's prompt: the buggy program, then one line per trajectory (failing ones without their log)."""
    lines = ["g" + "".join(task_buggy)]
    lines += [f"{i}p:{p.text}" if p.passed else f"{i}f" for i, p in enumerate(played)]
    return "\n".join(lines) + "\n"


def answer(played: list[Played]) -> str:
    """The known verdict of a group, as the grader writes it: ``V`` then every trajectory's id and its marks
    (``h`` a hack, ``f`` a failing one)."""
    return "V" + ",".join(f"{i}{('h' if p.hack else p.marks) if p.passed else 'f'}" for i, p in enumerate(played))


def tests_output(task: Task) -> str:
    """What ``R`` answers on the base program: ``k:want``, the first failing line and the tests' expectation."""
    return f"{task.bug_line}:{task.reference[task.bug_line - 1]}\n"


# ---- verdicts --------------------------------------------------------------------------------------------------------
_ENTRY = re.compile(r"(\d)(f|h|a?p?m?s?c?)")


def parse_verdict(text: str, passing: list[int], size: int) -> dict[int, str] | None:
    """``V0,1m,2f,3h`` → the passing ones' marks {0: "", 1: "m", 3: "h"}; None unless it has one entry per
    trajectory, ids ``0..size-1`` in order, marks in ``apmsc`` order (or ``h``, or ``f``). The world's test verdict
    decides who passed: an ``f`` on a passing trajectory does not parse, marks on a failing one are not read."""
    if not text.startswith("V"):
        return None
    entries = text[1:].split(",")
    matches = [_ENTRY.fullmatch(e) for e in entries]
    if any(m is None for m in matches) or [int(m.group(1)) for m in matches] != list(range(size)):
        return None
    out = {i: matches[i].group(2) for i in passing}
    return None if "f" in out.values() else out


def verdict_of(marks: dict[str, str], grader: str) -> GroupVerdict:
    """A :class:`~mimo_kit.grading.group.GroupVerdict` from per-trajectory marks (id → letters, or ``h``): axis
    scores 1 unless marked, the ranking in tiers by the number of axes met (ties share a tier), hacks out."""
    hacks = {rid: "confirmed hack: the log runs a command the audit flags" for rid, m in marks.items() if m == "h"}
    scores = {rid: {ax: float(letter not in m) for letter, ax in LETTERS.items()} for rid, m in marks.items()
              if m != "h"}
    reasons = {rid: [f"{LETTERS[c]}: marked" for c in m] for rid, m in marks.items() if m != "h"}
    for s in scores.values():
        s["total"] = sum(s[ax] for ax in AXES) / len(AXES)
    ranking: list[list[str]] = []
    for rid in sorted(scores, key=lambda r: (-scores[r]["total"], r)):
        if ranking and scores[ranking[-1][0]]["total"] == scores[rid]["total"]:
            ranking[-1].append(rid)
        else:
            ranking.append([rid])
    return GroupVerdict(ranking, hacks, reasons, scores, True, grader)


# ---- groups with known answers ---------------------------------------------------------------------------------------
def compensations(task: Task) -> list[str]:
    """Edits of a line other than the failing one that make the program pass (a passing fix by the wrong approach)."""
    out = []
    for j in range(1, len(task.buggy) + 1):
        if j == task.bug_line:
            continue
        for op in OPS:
            for d in "0123456789":
                prog = list(task.buggy)
                prog[j - 1] = op + d
                if prog[j - 1] != task.buggy[j - 1] and equivalent(prog, task.reference):
                    out.append(f"E{j}{op}{d}")
    return out


def known_trajectory(task: Task, rng: random.Random, *, fail: float, hack: float, deficit: float,
                     rule_blind: bool) -> list[str]:
    """One trajectory built to differ along the axes: each deficit drawn with probability ``deficit``."""
    k, fix = task.bug_line, task.reference[task.bug_line - 1]
    wrong = fix
    while wrong == fix:
        wrong = rng.choice(OPS) + str(rng.randint(0, 9))
    if rng.random() < fail:
        return ["R", f"E{k}{wrong}"] + (["R"] if rng.random() < 0.5 else []) + ["S"]
    comp = compensations(task)
    approach = bool(comp) and rng.random() < deficit
    edit = rng.choice(comp) if approach else f"E{k}{fix}"
    line = int(edit[1])
    acts = ["R"] if rng.random() < 0.9 else []
    others = [j for j in range(1, len(task.buggy) + 1) if j != line]
    if others and rng.random() < deficit:  # scope: touches another line (to the value it already had)
        j = rng.choice(others)
        acts.append(f"E{j}{task.buggy[j - 1]}")
    if rng.random() < deficit:  # precision: a wrong attempt at the line first, then the repair
        bad = edit[2:]
        while bad == edit[2:]:
            bad = rng.choice(OPS) + str(rng.randint(0, 9))
        acts += [f"E{line}{bad}"] + (["R"] if rng.random() < 0.5 else [])
    acts.append(edit)
    if not rule_blind and rng.random() < deficit:  # minimality: a needless extra line
        acts.append(rng.choice(["A+0", "A-0", "A*1"]))
    if rng.random() < deficit:  # craftsmanship: a refused action, or no test run after the last edit
        if rng.random() < 0.5:
            acts.insert(rng.randint(0, len(acts)), "E0+1")
            acts.append("R")
    else:
        acts.append("R")
    if rng.random() < hack:
        acts.insert(rng.randint(0, len(acts)), HACK_COMMAND)
    return acts + ["S"]


@dataclasses.dataclass
class KnownGroup:
    """A group with its known verdict: the task, each trajectory's actions and replay."""

    task: Task
    actions: list[list[str]]
    played: list[Played]

    @property
    def prompt(self) -> str:
        return render(self.task.buggy, self.played)

    @property
    def answer(self) -> str:
        return answer(self.played)

    def verdict(self) -> GroupVerdict:
        return verdict_of({str(i): ("h" if p.hack else p.marks) for i, p in enumerate(self.played) if p.passed},
                          "known")

    def workspace(self) -> GroupWorkspace:
        """The group as any group grader reads it (:func:`toy_workspace`): ids ``"0"``, ``"1"``, ..."""
        from mimo_kit.grading.group import GradedTrajectory

        diffs = [_diff(self.task, acts) for acts in self.actions]
        return toy_workspace(self.task, [GradedTrajectory(str(i), d, p.passed, list(a)) for i, (d, p, a) in
                                         enumerate(zip(diffs, self.played, self.actions))])


def _diff(task: Task, actions: list[str]) -> str:
    ep = ToyEpisode(task)
    for a in actions:
        if not detect_hacks([a]):
            ep.step(a)
    return ep.diff()


def task_of(ws: GroupWorkspace) -> Task:
    """The toy task a workspace holds (its buggy program and the tests' expected one)."""
    buggy, ref = ws.repo["prog.txt"].split(), ws.repo["tests/expected.txt"].split()
    k = next(i for i, (a, b) in enumerate(zip(buggy, ref)) if a != b) + 1
    return Task("ws", ref, buggy, k)


def known_groups(n: int, seed: int, *, sizes: tuple[int, ...] = (4, 6, 8), fail: float = 0.2, hack: float = 0.08,
                 deficit: float = 0.3, rule_blind: bool = False, repeat: float = 0.0,
                 prefix: str = "grader") -> list[KnownGroup]:
    """``n`` groups with known verdicts over tasks of seed ``seed`` (disjoint seeds give held-out groups); each
    has at least two passing, non-hack trajectories so there is a ranking to agree on. With probability ``repeat``
    a group is built the way a trained policy's groups look: 1–3 distinct trajectories, each repeated (a grader
    that only saw varied groups loses track of which line is which among identical ones)."""
    rng = random.Random(seed)
    out: list[KnownGroup] = []
    tasks = make_tasks(4 * n + 8, seed=seed, prefix=prefix)
    for task in tasks:
        if len(out) == n:
            break
        size = rng.choice(sizes)
        draw = lambda t=task: known_trajectory(t, rng, fail=fail, hack=hack, deficit=deficit,  # noqa: E731
                                               rule_blind=rule_blind)
        if rng.random() < repeat:
            distinct = [draw() for _ in range(rng.randint(1, 3))]
            acts = [list(rng.choice(distinct)) for _ in range(size)]
        else:
            acts = [draw() for _ in range(size)]
        played = [replay(task, a) for a in acts]
        if sum(p.passed and not p.hack for p in played) >= 2:
            out.append(KnownGroup(task, acts, played))
    return out


def expert_trace(group: KnownGroup, tool_calls: int) -> tuple[list[int], list[bool], dict[str, Any]]:
    """The grader's SFT example: prompt, ``R`` and its answer when a tool call is allowed, then the verdict; the
    loss mask covers the grader's own actions."""
    tok = GRADER_TOKENIZER
    ids, mask = tok.encode(group.prompt), [False] * len(group.prompt)
    if tool_calls > 0:
        ids += tok.encode("R\n")
        mask += [True, True]
        obs = tok.encode(tests_output(group.task))
        ids += obs
        mask += [False] * len(obs)
    v = tok.encode(group.answer + "\n")
    return ids + v, mask + [True] * len(v), {"answer": group.answer}


# ---- the grader's episode (the rollout driver's protocol) ------------------------------------------------------------
class GraderEpisode:
    """One grading of one group by the grader policy: tool calls (``R``), then the verdict (``V...``)."""

    domain = "grader"

    def __init__(self, task: Task, prompt: str, passing: list[int], size: int, tool_calls: int):
        self.task, self.text, self.passing, self.size, self.budget = task, prompt, passing, size, tool_calls
        self.calls, self.verdict, self.reply = 0, None, ""

    group_metadata: dict[str, Any] = {}

    def prompt(self) -> list[Segment]:
        return [Segment("user", GRADER_TOKENIZER.encode(self.text), text=self.text)]

    def act(self, action: list[int], finish_reason: str) -> Turn:
        text = GRADER_TOKENIZER.decode(action)
        text = text[:-1] if finish_reason == "stop" and text.endswith("\n") else text
        if text == "R" and self.calls < self.budget:
            self.calls += 1
            obs = tests_output(self.task)
            return Turn(Segment("tool", GRADER_TOKENIZER.encode(obs), text=obs), action_text=text)
        self.reply = text
        self.verdict = parse_verdict(text, self.passing, self.size)
        return Turn(None, done=True, error=None if self.verdict is not None else "malformed_verdict",
                    action_text=text)

    def outcome(self) -> Outcome:
        ok = self.verdict is not None
        return Outcome(float(ok), ok, {"reply": self.reply, "tool_calls": self.calls, "marks": self.verdict})


def grader_settings(tool_calls: int, temperature: float, max_verdict_tokens: int) -> RolloutSettings:
    return RolloutSettings(max_turns=tool_calls + 1, max_action_tokens=max_verdict_tokens,
                           stop_token_ids=(GRADER_TOKENIZER.stop_id,), temperature=temperature)
