"""The toy agentic world: one-line-bug programs a tiny model learns to fix on a CPU in minutes (Report §4.3, §5).

Why a toy world. The report's effects (GAR keeps passes minimal, binary rewards let needless edits grow, a
trainable router drifts) need an RL loop of hundreds of group rollouts; the sandboxed code tasks of
:mod:`mimo_kit.envs` cost a subprocess per step. Here the "repository" is one tiny program and the world checks it
in Python, deterministically, in microseconds, so the whole SFT → RL pipeline runs on two cores.

**Programs.** ``n_lines`` lines over an accumulator, each ``<op><digit>`` with op ∈ {+, −, ×}: ``+3*2-1`` maps
x ↦ (x + 3)·2 − 1. A task is the reference program with **one line corrupted** (a different digit or op, chosen
so the function changes on the test inputs 0..9).

**Actions** (one per turn, newline-terminated, char-level tokens; the compact action format):

| action | effect | tool output |
|---|---|---|
| ``R`` | run the tests | ``ok``, or ``k:<line>``: the first failing line and what the test expects there |
| ``E<k><op><d>`` | edit line k | ``done`` (``err`` if malformed) |
| ``A<op><d>`` | append a line | ``done`` |
| ``S`` | submit; the episode ends | (none) |

Anything else is a format error (``err``), the penalty module's "unknown tool". Pass = submitted and the program
computes the reference function on inputs 0..9 (semantic check, so ``A+0`` appended still passes).

**The scripted expert** writes the SFT warm-start data in three styles (``expert_mix``):

- *clean*: ``R``, ``E<k><fix>``, ``S`` — minimal and one-shot;
- *needless*: ``R``, ``E<k><fix>``, ``A+0``, ``R``, ``S`` — passes with a needless extra line (the toy's
  "speculative fallback branch") and a re-run; with probability ``retry_prob`` its first edit is wrong and the
  re-run lets it repair the edit;
- *wrong*: ``R``, ``E<k><wrong>``, ``S`` — fails.

Why this shape. Under a binary reward the needless style is *slightly favoured by chance*: it checks and can
retry, so a policy that samples a wrong digit recovers more often in that style (more actions, more chances), and
its needless ``A`` line costs nothing. The rule-based group grader (:class:`~mimo_kit.grading.RuleGroupGrader`)
sees the diff of ``prog.txt`` and ranks the minimal pass above the one with an extra line (minimality axis), so
GAR moves positive advantage to clean passes: the report's GAR ablation in miniature (Report §4.3.2).
"""

from __future__ import annotations

import dataclasses
import difflib
import random
from typing import Any

from mimo_kit.grading.group import GradedTrajectory, GroupWorkspace, RuleGroupGrader
from mimo_kit.infra import rollout
from mimo_kit.infra.rollout import Outcome, RolloutSettings, Turn
from mimo_kit.rl.trajectory import Sample, Segment

PAD = "\x00"
CHARS = PAD + "\n0123456789+-*:RESAfixokdner "
OPS = "+-*"
TEST_INPUTS = range(10)


class ToyTokenizer:
    """Char-level tokenizer of the toy world (or of another char set: the grader's world has its own): id 0 is
    padding, ``\\n`` ends every action (the stop token)."""

    def __init__(self, chars: str = CHARS, name: str = "the toy vocabulary") -> None:
        self.chars, self.name = chars, name
        self.vocab = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)
        self.pad_id, self.stop_id = 0, self.vocab["\n"]

    def encode(self, text: str) -> list[int]:
        bad = sorted({c for c in text if c not in self.vocab or c == PAD})
        if bad:
            raise ValueError(f"ToyTokenizer.encode: characters {bad!r} are not in {self.name} {self.chars[1:]!r}")
        return [self.vocab[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] if 0 < i < len(self.chars) else "?" for i in ids)


TOKENIZER = ToyTokenizer()


# ---- programs and tasks -----------------------------------------------------------------------------------------
def run_program(lines: list[str], x: int) -> int:
    """Apply each ``<op><digit>`` line to the accumulator: ``run_program(["+3", "*2"], 1) == 8``."""
    for ln in lines:
        op, d = ln[0], int(ln[1])
        x = x + d if op == "+" else x - d if op == "-" else x * d
    return x


def equivalent(a: list[str], b: list[str]) -> bool:
    return all(run_program(a, x) == run_program(b, x) for x in TEST_INPUTS)


@dataclasses.dataclass
class Task:
    task_id: str
    reference: list[str]  # the correct program
    buggy: list[str]  # one line corrupted
    bug_line: int  # 1-based

    @property
    def prompt(self) -> str:
        return "fix " + "".join(self.buggy) + "\n"


def make_tasks(n: int, seed: int, n_lines: int = 3, prefix: str = "t") -> list[Task]:
    """``n`` tasks with one semantically visible bug each, deterministic in ``seed``."""
    if n < 0 or not 1 <= n_lines <= 9:
        raise ValueError(f"make_tasks: n={n} (>= 0), n_lines={n_lines} (1..9) expected")
    rng = random.Random(seed)
    tasks: list[Task] = []
    while len(tasks) < n:
        ref = [rng.choice(OPS) + str(rng.randint(1, 9)) for _ in range(n_lines)]
        k = rng.randrange(n_lines)
        bad = ref[k]
        while bad == ref[k]:
            bad = (rng.choice(OPS) + ref[k][1]) if rng.random() < 0.5 else ref[k][0] + str(rng.randint(1, 9))
        buggy = ref[:k] + [bad] + ref[k + 1:]
        if not equivalent(ref, buggy):
            tasks.append(Task(f"{prefix}{seed}-{len(tasks)}", ref, buggy, k + 1))
    return tasks


# ---- the environment ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ToyEpisode:
    """One agent-loop run on a task: the program as edited so far and the action log.

    It speaks the rollout driver's :class:`~mimo_kit.infra.rollout.Episode` protocol: :meth:`prompt`,
    :meth:`act` (one action's token ids → the tool output) and :meth:`outcome` (the world's own check).
    """

    task: Task
    program: list[str] = dataclasses.field(default_factory=list)
    actions: list[str] = dataclasses.field(default_factory=list)
    submitted: bool = False
    format_errors: int = 0

    def __post_init__(self) -> None:
        self.program = list(self.task.buggy)

    def step(self, action: str) -> str:
        """Apply one action (without its newline); return the tool output (with its newline, '' after ``S``)."""
        self.actions.append(action)
        a = action
        if a == "S":
            self.submitted = True
            return ""
        if a == "R":
            if equivalent(self.program, self.task.reference):
                return "ok\n"
            for k, (got, want) in enumerate(zip(self.program, self.task.reference)):
                if got != want:
                    return f"{k + 1}:{want}\n"
            return "no\n"
        if len(a) == 4 and a[0] == "E" and a[1].isdigit() and a[2] in OPS and a[3].isdigit():
            k = int(a[1])
            if 1 <= k <= len(self.program):
                self.program[k - 1] = a[2:]
                return "done\n"
        if len(a) == 3 and a[0] == "A" and a[1] in OPS and a[2].isdigit() and len(self.program) < 9:
            self.program.append(a[1:])
            return "done\n"
        self.format_errors += 1
        return "err\n"

    @property
    def passed(self) -> bool:
        return self.submitted and equivalent(self.program, self.task.reference)

    @property
    def verified(self) -> bool:
        """Ran the tests after its last edit (the behaviour rubric of GRS: the agent checks its change)."""
        edits = [i for i, a in enumerate(self.actions) if a[:1] in ("E", "A")]
        return bool(edits) and "R" in self.actions[edits[-1] + 1:]

    @property
    def needless_edits(self) -> int:
        """Edited or added lines beyond the one bug line (what a minimal fix would not touch)."""
        changed = {i for i, (a, b) in enumerate(zip(self.program, self.task.buggy)) if a != b}
        return len(changed - {self.task.bug_line - 1}) + max(0, len(self.program) - len(self.task.buggy))

    # ---- the driver's Episode protocol ---------------------------------------------------------------------------
    domain = "toy-code"

    @property
    def group_metadata(self) -> dict[str, Any]:
        return {"task": dataclasses.asdict(self.task)}

    def prompt(self) -> list[Segment]:
        return [Segment("user", TOKENIZER.encode(self.task.prompt), text=self.task.prompt)]

    def act(self, action: list[int], finish_reason: str) -> Turn:
        """Apply one generated action; no newline within the budget is a malformed action (an error span)."""
        text = TOKENIZER.decode(action)
        obs = self.step(text[:-1] if finish_reason == "stop" else text)
        observation = Segment("tool", TOKENIZER.encode(obs), text=obs) if obs else None
        return Turn(observation, done=self.submitted, error="malformed_action" if obs == "err\n" else None,
                    action_text=text)

    def outcome(self) -> Outcome:
        return Outcome(float(self.passed), self.passed,
                       {"actions": list(self.actions), "needless_edits": self.needless_edits,
                        "verified": self.verified, "format_errors": self.format_errors, "diff": self.diff()})

    def diff(self) -> str:
        """Unified diff of ``prog.txt`` (one line per program line), as the group grader reads patches."""
        body = difflib.unified_diff([ln + "\n" for ln in self.task.buggy], [ln + "\n" for ln in self.program],
                                    "a/prog.txt", "b/prog.txt", n=0)
        text = "".join(body)
        return f"diff --git a/prog.txt b/prog.txt\n{text}" if text else ""


# ---- the scripted expert ------------------------------------------------------------------------------------------
def expert_actions(task: Task, style: str, rng: random.Random, retry_prob: float = 0.3) -> list[str]:
    """The expert's actions in ``style`` ∈ {clean, needless, wrong} (see the module docstring)."""
    k, fix = task.bug_line, task.reference[task.bug_line - 1]
    wrong = fix
    while wrong == fix:
        wrong = fix[0] + str(rng.randint(1, 9))
    if style == "clean":
        return ["R", f"E{k}{fix}", "S"]
    if style == "needless":
        extra = rng.choice(["A+0", "A-0", "A*1"])
        if rng.random() < retry_prob:
            return ["R", f"E{k}{wrong}", extra, "R", f"E{k}{fix}", "R", "S"]
        return ["R", f"E{k}{fix}", extra, "R", "S"]
    if style == "wrong":
        return ["R", f"E{k}{wrong}", "S"]
    raise ValueError(f"expert_actions: style={style!r}; expected clean, needless or wrong")


def expert_dataset(tasks: list[Task], seed: int, mix: tuple[float, float, float] = (0.5, 0.25, 0.25),
                   retry_prob: float = 0.3) -> list[tuple[list[int], list[bool], dict[str, Any]]]:
    """SFT examples: (token ids, loss mask over assistant tokens, info) per task, style drawn from ``mix``."""
    rng = random.Random(seed)
    out = []
    for t in tasks:
        style = rng.choices(("clean", "needless", "wrong"), weights=mix)[0]
        ep = ToyEpisode(t)
        ids, mask = TOKENIZER.encode(t.prompt), [False] * len(t.prompt)
        for a in expert_actions(t, style, rng, retry_prob):
            a_ids = TOKENIZER.encode(a + "\n")
            ids += a_ids
            mask += [True] * len(a_ids)
            obs = TOKENIZER.encode(ep.step(a))
            ids += obs
            mask += [False] * len(obs)
        out.append((ids, mask, {"style": style, "passed": ep.passed, "needless": ep.needless_edits}))
    return out


# ---- the world as an episode of the rollout driver (token-in/token-out) -------------------------------------------
def rollout_settings(temperature: float = 1.0, max_turns: int = 8, max_action_tokens: int = 5, *, top_p: float = 1.0,
                     return_routed_experts: bool = False, return_candidates: bool = False) -> RolloutSettings:
    """The driver's settings for toy episodes: an action is at most ``max_action_tokens`` and ends at newline."""
    return RolloutSettings(max_turns=max_turns, max_action_tokens=max_action_tokens,
                           stop_token_ids=(TOKENIZER.stop_id,), temperature=temperature, top_p=top_p,
                           return_routed_experts=return_routed_experts, return_candidates=return_candidates)


def episodes(task: Task, group_size: int) -> tuple[str, list[ToyEpisode]]:
    """One group for the driver: ``group_size`` fresh episodes of ``task``."""
    return task.task_id, [ToyEpisode(task) for _ in range(group_size)]


def play(engine: Any, tasks: list[Task], group_size: int, *, temperature: float = 1.0, max_turns: int = 8,
         max_action_tokens: int = 5, top_p: float = 1.0, return_routed_experts: bool = False,
         return_candidates: bool = False) -> list[Sample]:
    """Run ``group_size`` episodes per task through ``engine`` with the rollout driver; one Sample per task.

    Every context keeps the engine's exact token ids and logprobs (never re-tokenised), the policy version of each
    generated token, and the episode's outcome in ``Sequence.metadata``.
    """
    settings = rollout_settings(temperature, max_turns, max_action_tokens, top_p=top_p,
                                return_routed_experts=return_routed_experts, return_candidates=return_candidates)
    return rollout.play(engine, [episodes(t, group_size) for t in tasks], settings)


def toy_workspace(task: Task, rollouts: list[GradedTrajectory]) -> GroupWorkspace:
    """A toy group's shared workspace (Report §4.3): the spec, ``prog.txt`` and the hidden tests' expected program
    (what a grader's test run compares against)."""
    return GroupWorkspace(spec="fix the failing line of prog.txt",
                          repo={"prog.txt": "\n".join(task.buggy) + "\n",
                                "tests/expected.txt": "\n".join(task.reference) + "\n"}, rollouts=rollouts)


def workspace(sample: Sample) -> GroupWorkspace:
    """The shared workspace of one played group: every trajectory's patch, test verdict and actions."""
    task = Task(**sample.metadata["task"])
    return toy_workspace(task, [GradedTrajectory(s.sequence_id, s.metadata["diff"], bool(s.passed),
                                                 list(s.metadata["actions"])) for s in sample.sequences])


def grade_group(sample: Sample, grader: RuleGroupGrader | None = None):
    """A group grader's verdict on one group (Report §4.3), the rule-based one by default: passes ranked on the
    five axes."""
    return (grader or RuleGroupGrader()).grade(workspace(sample))


# ---- the world as the trainer sees it ---------------------------------------------------------------------------
class ToyWorld:
    """The trainer's view of the toy world (the same small interface as :class:`mimo_kit.train.toy.repo.RepoWorld`):
    tasks, groups of episodes, rollout settings, SFT data, held-out groups, the group grader and the rubric."""

    name = "toy"
    vocab_size = TOKENIZER.vocab_size
    pad_id = TOKENIZER.pad_id
    grade_workers = 1

    def __init__(self, max_turns: int = 8):
        self.max_turns = max_turns
        self.group_grader = None  # GAR's grader when the run sets one (the learned grader); None: the rule one

    def tasks(self, n: int, seed: int, prefix: str) -> list[Task]:
        return make_tasks(n, seed, prefix=prefix)

    def episodes(self, task: Task, group_size: int) -> tuple[str, list[ToyEpisode]]:
        return episodes(task, group_size)

    def rollout_settings(self, temperature: float, top_p: float, routed: bool, candidates: bool) -> RolloutSettings:
        return rollout_settings(temperature, self.max_turns, top_p=top_p, return_routed_experts=routed,
                                return_candidates=candidates)

    def sft_data(self, n: int, seed: int, mix: tuple[float, float, float] = (0.5, 0.25, 0.25),
                 retry_prob: float = 0.3) -> list[tuple[list[int], list[bool], dict[str, Any]]]:
        return expert_dataset(make_tasks(n, seed=10_000 + seed, prefix="sft"), seed, mix, retry_prob)

    def eval_groups(self, n: int, seed: int, samples: int) -> list[tuple[str, list[ToyEpisode]]]:
        return [episodes(t, samples) for t in make_tasks(n, seed=50_000 + seed, prefix="heldout")]

    def grade_group(self, sample: Sample, grader=None):
        return grade_group(sample, grader or self.group_grader)

    def grade_groups(self, samples: list[Sample], grader) -> list:
        """Verdicts on several groups at once: a grader with ``grade_many`` (the learned one) batches them."""
        wss = [workspace(s) for s in samples]
        return grader.grade_many(wss) if hasattr(grader, "grade_many") else [grader.grade(w) for w in wss]

    @staticmethod
    def rubric(seq) -> tuple[float, float]:
        """GRS rubric scores of one episode (the kit's toy rubric): S_sol = 1/(1 + needless edits), S_beh = 1 if it
        ran the tests after its last edit, else 0.5."""
        return 1.0 / (1 + seq.metadata["needless_edits"]), 1.0 if seq.metadata.get("verified") else 0.5
