"""The repo world: small code tasks a tiny policy fixes by acting through a mini-harness, graded in the sandbox
(Report §4.2, §4.3, §5).

Where the toy world (:mod:`mimo_kit.train.toy.world`) checks a program in Python, here every episode is the real
thing at toy size: a repository task graded by its hidden F2P / P2P tests through :mod:`mimo_kit.envs.code` and
the sandbox, an agent loop of one harness configuration (:mod:`mimo_kit.harness`: prompt, action format, tools,
context manager, limits), token-in/token-out through the rollout driver.

**Tasks.** ``calc/__init__.py`` holds three one-line functions whose names say what they do (``add3``,
``below5``, ``minus``, ...). One of them carries a bug from one of four **bug families**:

============== ============================ ====================================================
family          example (buggy → fixed)       what the policy has to do
============== ============================ ====================================================
op-flip         ``x - 3`` → ``x + 3``          read the operator the name asks for
off-by-one      ``x + 4`` → ``x + 3``          copy the constant from the name
compare-flip    ``x <= 5`` → ``x < 5``         tell ``below`` (strict) from ``atmost``
swap-args       ``b - a`` → ``a - b``          restore the argument order
============== ============================ ====================================================

The instruction is the failing test's message (``test_add3 fails: add3(2) returned -1, expected 5``); the tools
show the code and run commands, never the fix. Grading: the hidden test of the buggy function must pass (F2P) and
the other two keep passing (P2P).

**Harnesses.** The four training configurations of :data:`mimo_kit.harness.config.HARNESSES` that can edit code
(``mini-bash``, ``swe-tools``, ``xml-editor``, ``fenced-editor``) and the three held-out ones (``codex-like``,
``claude-code-like``, ``mini-swe-agent-like``) — Report §4.2's train-on-few, evaluate-on-held-out setting.

**The scripted expert** writes the SFT traces in each harness's own format and tools: look at the file (``view``
or ``cat``), edit (``str_replace`` or ``sed``), optionally check the function with a one-line ``python3 -c`` when
the harness has bash, submit. Three styles (``RepoWorldConfig.expert_mix``): *clean*, *check* (clean + a check
run) and *wrong* (a plausible wrong edit, then submit): the warm start is imperfect on purpose, so groups are
mixed and RL has something to learn.

**Tokenizer.** Byte-level BPE trained with HF ``tokenizers`` on expert traces (cached like the pre-training
tokenizer): harness prompts and JSON tool calls are long in bytes and short in merges, which keeps a context near
300 tokens instead of 1,500 bytes on two cores.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shlex
import shutil
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.envs import code as code_env
from mimo_kit.harness.config import HARNESSES, HarnessConfig, ScriptedPolicy, get_harness
from mimo_kit.harness.episode import ByteTokenizer, HarnessEpisode, PolicyEngine
from mimo_kit.harness.formats import render_call
from mimo_kit.infra import rollout
from mimo_kit.infra.rollout import Outcome, RolloutSettings
from mimo_kit.rl.trajectory import Sample

PACKAGE = "calc"
FILE = f"{PACKAGE}/__init__.py"
FAMILIES = ("op-flip", "off-by-one", "compare-flip", "swap-args")
#: Report §4.2: training harnesses and held-out ones (the repo world uses the ones that can edit files).
TRAIN_HARNESSES = ("mini-bash", "swe-tools", "xml-editor", "fenced-editor")
EVAL_HARNESSES = ("codex-like", "claude-code-like", "mini-swe-agent-like")


@dataclasses.dataclass
class RepoWorldConfig(Config):
    """The repo world's tasks, harnesses, expert and tokenizer (kit choices; the report publishes none)."""

    families: tuple[str, ...] = knob(FAMILIES, "bug families the tasks are drawn from (the module's table)")
    train_harnesses: tuple[str, ...] = knob(TRAIN_HARNESSES, "Report §4.2: RL trains on 4 harness configurations")
    eval_harnesses: tuple[str, ...] = knob(TRAIN_HARNESSES + EVAL_HARNESSES,
                                           "Report §4.2: evaluated on 7, 3 of them held out from training")
    expert_mix: tuple[float, float, float] = knob((0.5, 0.2, 0.3), "clean / check / wrong: the SFT policy passes "
                                                  "about 70%, so most groups of 8 are mixed")
    sft_traces: int = knob(600, "expert traces for SFT, spread over the training harnesses", min=1)
    vocab_size: int = knob(768, "BPE merges over harness text: a context of ~300 tokens instead of ~1,500 bytes",
                           min=300)
    tokenizer_traces: int = knob(120, "expert traces the BPE is trained on (all formats, all tools)", min=8)
    max_action_tokens: int = knob(96, "the longest expert action is ~60 BPE tokens; room for a longer attempt",
                                  min=8)
    max_steps: int = knob(6, "the expert needs 3–4 actions; 6 leaves room for one mistake", min=1)
    max_wall_s: float = knob(3600.0, "a batched rollout's wall clock counts the whole batch, so a tight limit would "
                             "make results depend on machine load; steps and per-command timeouts bound an episode",
                             min=1.0)
    tool_workers: int = knob(2, "threads for tool calls and grading: they wait on sandbox processes", min=1)
    task_dir: str = knob("", "where task folders are written; empty = a cache folder keyed by the task")

    PRESETS = {"tiny": {}, "small": {"sft_traces": 2000}}

    def check(self) -> None:
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise ConfigError(f"RepoWorldConfig.families={list(self.families)!r}: expected a non-empty subset of "
                              f"{list(FAMILIES)}")
        for key in ("train_harnesses", "eval_harnesses"):
            names = getattr(self, key)
            unknown = [h for h in names if h not in HARNESSES]
            if unknown or not names:
                raise ConfigError(f"RepoWorldConfig.{key}={list(names)!r}: unknown {unknown}; known: "
                                  f"{', '.join(HARNESSES)}")
            weak = [h for h in names if not ({"bash", "str_replace"} & set(HARNESSES[h].tools))]
            if weak:
                raise ConfigError(f"RepoWorldConfig.{key}: harnesses {weak} cannot edit files (no bash or "
                                  "str_replace tool), so no code task can be solved in them")
        if len(self.expert_mix) != 3 or min(self.expert_mix) < 0 or sum(self.expert_mix) <= 0:
            raise ConfigError(f"RepoWorldConfig.expert_mix={self.expert_mix!r}: expected 3 weights >= 0 "
                              "(clean, check, wrong) with a positive sum")


# ---- tasks ------------------------------------------------------------------------------------------------------
#: function kinds: name pattern, parameters, correct body, test inputs
KINDS = {
    "add": ("add{k}", "x", "x + {k}"),
    "sub": ("sub{k}", "x", "x - {k}"),
    "mul": ("mul{k}", "x", "x * {k}"),
    "below": ("below{k}", "x", "x < {k}"),
    "atmost": ("atmost{k}", "x", "x <= {k}"),
    "minus": ("minus", "a, b", "a - b"),
    "div": ("div", "a, b", "a // b"),
}
#: which families can corrupt which kind
BUGS = {"op-flip": ("add", "sub", "mul"), "off-by-one": ("add", "sub", "mul", "below", "atmost"),
        "compare-flip": ("below", "atmost"), "swap-args": ("minus", "div")}


@dataclasses.dataclass
class Function:
    kind: str
    k: int

    @property
    def name(self) -> str:
        return KINDS[self.kind][0].format(k=self.k)

    @property
    def params(self) -> str:
        return KINDS[self.kind][1]

    @property
    def body(self) -> str:
        return KINDS[self.kind][2].format(k=self.k)

    def call(self, body: str, args: tuple[int, ...]) -> Any:
        env = dict(zip([p.strip() for p in self.params.split(",")], args))
        return eval(body, {}, env)  # noqa: S307 - the kit's own one-line expressions over ints

    def inputs(self) -> list[tuple[int, ...]]:
        if self.params == "x":
            return [(2,), (self.k,), (7,)]
        return [(9, 2), (8, 3), (7, 7)]


def corrupt(fn: Function, family: str, rng: random.Random) -> str:
    """The buggy body of ``fn`` under ``family``."""
    b = fn.body
    if family == "op-flip":
        a, op, c = b.split(" ")
        return f"{a} {rng.choice([o for o in '+-*' if o != op])} {c}"
    if family == "off-by-one":
        a, op, c = b.split(" ")
        return f"{a} {op} {int(c) + rng.choice([-1, 1])}"
    if family == "compare-flip":
        return b.replace("<=", "<") if "<=" in b else b.replace("<", "<=")
    if family == "swap-args":
        a, op, c = b.split(" ")
        return f"{c} {op} {a}"
    raise ValueError(f"corrupt: family={family!r}; expected one of {FAMILIES}")


@dataclasses.dataclass
class RepoTask:
    """One task: three functions, one with a bug; everything else derives from these fields."""

    task_id: str
    functions: list[Function]
    buggy: int  # index of the buggy function
    family: str
    buggy_body: str

    @property
    def fn(self) -> Function:
        return self.functions[self.buggy]

    def source(self, fixed: bool) -> str:
        out = []
        for i, f in enumerate(self.functions):
            body = f.body if fixed or i != self.buggy else self.buggy_body
            out.append(f"def {f.name}({f.params}):\n    return {body}\n")
        return "\n\n".join(out)

    def failing_input(self) -> tuple[int, ...]:
        f = self.fn
        return next(a for a in f.inputs() if f.call(f.body, a) != f.call(self.buggy_body, a))

    @property
    def instruction(self) -> str:
        a = self.failing_input()
        got, want = self.fn.call(self.buggy_body, a), self.fn.call(self.fn.body, a)
        args = ", ".join(map(str, a))
        return (f"test_{self.fn.name} fails: {self.fn.name}({args}) returned {got}, expected {want}. "
                f"Fix the bug in {FILE}.")

    def hidden_tests(self) -> str:
        lines = [f"from {PACKAGE} import " + ", ".join(f.name for f in self.functions), ""]
        for f in self.functions:
            lines += ["", f"def test_{f.name}():"]
            lines += [f"    assert {f.name}({', '.join(map(str, a))}) == {f.call(f.body, a)!r}" for a in f.inputs()]
        return "\n".join(lines) + "\n"

    def to_code_task(self, root: Path) -> code_env.CodeTask:
        """The task as a code-task folder (``task.json``, ``repo/``, ``hidden_tests/``, ``reference.patch``)."""
        names = [f.name for f in self.functions]
        return code_env.write_task(
            root, task_id=self.task_id, instruction=self.instruction, base={FILE: self.source(fixed=False)},
            fixed={FILE: self.source(fixed=True)}, hidden_tests={"test_calc.py": self.hidden_tests()},
            f2p=[f"test_calc.py::test_{self.fn.name}"],
            p2p=[f"test_calc.py::test_{n}" for n in names if n != self.fn.name], package=PACKAGE,
            source=f"repo-world:{self.family}")


def make_repo_tasks(n: int, seed: int, families: Sequence[str] = FAMILIES, prefix: str = "repo") -> list[RepoTask]:
    """``n`` tasks, families drawn uniformly, deterministic in ``seed``; the bug always fails its test."""
    if n < 0:
        raise ValueError(f"make_repo_tasks: n={n}; expected >= 0")
    rng = random.Random(seed)
    tasks: list[RepoTask] = []
    while len(tasks) < n:
        family = rng.choice(list(families))
        kind = rng.choice(BUGS[family])
        bug = Function(kind, rng.randint(2, 8))
        others: list[Function] = []
        while len(others) < 2:
            f = Function(rng.choice(list(KINDS)), rng.randint(2, 8))
            if f.name not in [g.name for g in others + [bug]] and f.body not in [g.body for g in others + [bug]]:
                others.append(f)
        fns = others[:]
        pos = rng.randrange(3)
        fns.insert(pos, bug)
        body = corrupt(bug, family, rng)
        if body in [g.body for g in fns] or all(bug.call(body, a) == bug.call(bug.body, a) for a in bug.inputs()):
            continue  # the bug would be invisible or ambiguous
        tasks.append(RepoTask(f"{prefix}{seed}-{len(tasks)}", fns, pos, family, body))
    return tasks


def task_root(task: RepoTask, task_dir: str = "") -> Path:
    """The task's folder (written once; a folder named by the task's content hash is reused)."""
    from mimo_kit.cache import cache_root

    key = hashlib.sha256(json.dumps(dataclasses.asdict(task), sort_keys=True).encode()).hexdigest()[:16]
    return (Path(task_dir) if task_dir else cache_root() / "repo_tasks") / f"{task.task_id}-{key}"


_WRITE = threading.Lock()


def code_task(task: RepoTask, task_dir: str = "") -> code_env.CodeTask:
    root = task_root(task, task_dir)
    with _WRITE:
        if not (root / "task.json").exists():  # written aside, then renamed: a reader never sees half a task
            tmp = root.with_name(f"{root.name}.tmp{os.getpid()}")
            task.to_code_task(tmp)
            try:
                tmp.replace(root)
            except OSError:  # another process wrote the same task first (same content: the name is its hash)
                shutil.rmtree(tmp, ignore_errors=True)
    return code_env.load_task(root)


# ---- the episode ------------------------------------------------------------------------------------------------
class RepoEpisode(HarnessEpisode):
    """A harness episode on a repo task: the sandboxed workspace is made here and removed after grading."""

    def __init__(self, task: RepoTask, harness: HarnessConfig, tokenizer: Any, task_dir: str = "",
                 cache: code_env.GradeCache | None = None):
        from mimo_kit.harness.envs import CodeEnv

        super().__init__(CodeEnv(code_task(task, task_dir), cache=cache), harness, tokenizer, domain="code")
        self.task = task
        self.group_metadata = {**self.group_metadata, "family": task.family, "task": task.task_id}

    def outcome(self) -> Outcome:
        try:
            o = super().outcome()
        finally:
            self.close()
        o.metadata.update(family=self.task.family, format_errors=self.format_errors)
        return o


# ---- the scripted expert ------------------------------------------------------------------------------------------
def _wrong_body(task: RepoTask, rng: random.Random) -> str:
    """A plausible wrong fix: the other operator, a constant one off, or the buggy body kept with a new constant."""
    fn = task.fn
    for _ in range(20):
        body = corrupt(fn, rng.choice([f for f in FAMILIES if fn.kind in BUGS[f]]), rng)
        if body not in (fn.body, task.buggy_body) and any(fn.call(body, a) != fn.call(fn.body, a) for a in fn.inputs()):
            return body
    return task.buggy_body


def _sed(old: str, new: str) -> str:
    esc = lambda s: s.replace("\\", "\\\\").replace("/", "\\/").replace("*", "\\*").replace(".", "\\.")  # noqa: E731
    script = "s/" + esc(old) + "/" + new.replace("/", "\\/") + "/"
    return f"sed -i {shlex.quote(script)} {FILE}"


def expert_replies(task: RepoTask, harness: HarnessConfig, style: str, rng: random.Random) -> list[str]:
    """The expert's replies in ``harness``'s action format and tools, in ``style`` ∈ {clean, check, wrong}."""
    if style not in ("clean", "check", "wrong"):
        raise ValueError(f"expert_replies: style={style!r}; expected clean, check or wrong")
    fmt, tools = harness.action_format, set(harness.tools)
    can_view, can_edit, bash = "view" in tools, "str_replace" in tools, "bash" in tools
    body = _wrong_body(task, rng) if style == "wrong" else task.fn.body
    old, new = f"return {task.buggy_body}", f"return {body}"
    out = []
    if can_view and (not bash or rng.random() < 0.5):
        out.append(render_call(fmt, "view", {"path": FILE}))
    else:
        out.append(render_call(fmt, "bash", {"command": f"cat {FILE}"}))
    if can_edit and (not bash or rng.random() < 0.5):
        out.append(render_call(fmt, "str_replace", {"path": FILE, "old_str": old, "new_str": new}))
    else:
        out.append(render_call(fmt, "bash", {"command": _sed(old, new)}))
    if style == "check" and bash:
        a = task.failing_input()
        cmd = f"python3 -c 'from {PACKAGE} import {task.fn.name}; print({task.fn.name}({', '.join(map(str, a))}))'"
        out.append(render_call(fmt, "bash", {"command": cmd}))
    out.append(render_call(fmt, "submit", {}))
    return out


def expert_agents(task: RepoTask, harness: str, styles: Sequence[str], seed: int) -> list[tuple[str, ScriptedPolicy]]:
    """The scripted expert as the coding agent of task validation (Report §4.2, :mod:`mimo_kit.harness.task_audit`):
    one attempt per style, each a policy that replies with :func:`expert_replies` in ``harness``'s format."""
    rng = random.Random(seed)
    h = get_harness(harness)
    return [(f"expert-{style}", ScriptedPolicy(expert_replies(task, h, style, rng))) for style in styles]


def expert_samples(tasks: Sequence[RepoTask], harnesses: Sequence[str], seed: int, tokenizer: Any,
                   mix: tuple[float, float, float] = (0.5, 0.2, 0.3), *, grade: bool = False,
                   task_dir: str = "", workers: int = 2) -> list[Sample]:
    """Expert episodes through the rollout driver (one per task, harness by round robin), recorded in the one
    schema. ``grade=False`` skips the sandboxed grading (SFT needs the trajectory, not its verdict)."""
    rng = random.Random(seed)
    groups, engine_map = [], {}
    for i, t in enumerate(tasks):
        h = get_harness(harnesses[i % len(harnesses)])
        style = rng.choices(("clean", "check", "wrong"), weights=mix)[0]
        replies = expert_replies(t, h, style, rng)
        ep = RepoEpisode(t, h, tokenizer, task_dir)
        ep.group_metadata["style"] = style
        gid = f"expert-{t.task_id}-{h.name}"
        groups.append((gid, [ep]))
        engine_map[f"{gid}/0"] = (ScriptedPolicy(replies), ep)
    settings = RolloutSettings(max_turns=16, max_action_tokens=10**9, stop_token_ids=(tokenizer.end_id,),
                               act_workers=workers)  # the expert's replies are whole; its episodes end at submit
    started = rollout.start_groups(groups)
    flat = [r for _, rs in started for r in rs]
    engine = PolicyEngine(engine_map)
    try:
        while rollout.advance(engine, flat, settings):
            pass
        if grade:
            rollout.grade(flat, workers)
    finally:
        for r in flat:
            r.episode.close()
    return [rollout.group_sample(gid, rs) for gid, rs in started]  # group metadata carries the style


# ---- the tokenizer ----------------------------------------------------------------------------------------------
class BPETokenizer:
    """A trained byte-level BPE behind the harness tokenizer interface (``encode``, ``decode``, ``end_id``)."""

    END, PAD = "<|im_end|>", "<|pad|>"

    def __init__(self, tok: Any):
        self.tok = tok
        tok.encode_special_tokens = True  # text that spells "<|im_end|>" stays text: no turn-boundary injection
        self.end_id, self.pad_id = tok.token_to_id(self.END), tok.token_to_id(self.PAD)
        self.vocab_size = tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids if text else []

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode([i for i in ids if i not in (self.end_id, self.pad_id)], skip_special_tokens=True)


def train_bpe(texts: list[str], vocab_size: int, path: Path) -> BPETokenizer:
    """Byte-level BPE over ``texts`` (:func:`~mimo_kit.pretrain.tokenizer.fit_bpe`), saved to ``path``; special
    tokens: end of turn, pad."""
    from mimo_kit.pretrain.tokenizer import fit_bpe

    # harness text is mostly code and tool output: merges cross word boundaries (no regex split), capped at 24
    tok = fit_bpe(texts, vocab_size, [BPETokenizer.END, BPETokenizer.PAD], use_regex=False, max_token_length=24)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return BPETokenizer(tok)


def sample_texts(samples: Sequence[Sample]) -> list[str]:
    """Every segment's text of ``samples`` with the end-of-turn marker removed: what the BPE is trained on."""
    return [seg.text.replace("<END>", "") for s in samples for q in s.sequences for c in q.contexts
            for seg in c.segments if seg.text]


def load_world_tokenizer(cfg: RepoWorldConfig) -> BPETokenizer:
    """The world's BPE: trained once on byte-level expert traces of every harness, cached by its settings."""
    from tokenizers import Tokenizer

    from mimo_kit.cache import cache_root

    key = hashlib.sha256(json.dumps([cfg.vocab_size, cfg.tokenizer_traces, sorted(set(cfg.families)),
                                     sorted(set(cfg.train_harnesses) | set(cfg.eval_harnesses)), 1]).encode())
    path = cache_root() / "repo_world" / f"bpe-{key.hexdigest()[:16]}.json"
    if path.exists():
        return BPETokenizer(Tokenizer.from_file(str(path)))
    harnesses = list(dict.fromkeys(cfg.train_harnesses + cfg.eval_harnesses))
    tasks = make_repo_tasks(cfg.tokenizer_traces, seed=90_000, families=cfg.families, prefix="bpe")
    samples = expert_samples(tasks, harnesses, 90_000, ByteTokenizer(), cfg.expert_mix, task_dir=cfg.task_dir,
                             workers=cfg.tool_workers)
    return train_bpe(sample_texts(samples), cfg.vocab_size, path)


# ---- the world as the trainer sees it ---------------------------------------------------------------------------
def capped_harness(name: str, max_steps: int = 0, max_wall_s: float = 0.0):
    """Harness ``name`` with its step limit capped at ``max_steps`` and its wall clock set to ``max_wall_s`` (0:
    the harness's own): the repo world's limits, the same in the trainer and in a pool host."""
    h = get_harness(name)
    if max_steps:
        h = dataclasses.replace(h, max_steps=min(h.max_steps, max_steps))
    if max_wall_s:
        h = dataclasses.replace(h, max_wall_s=max_wall_s)
    return h


class RepoWorld:
    """The trainer's view of the repo world: tasks, episodes, rollout settings, SFT data, held-out evaluation."""

    name = "repo"

    def __init__(self, cfg: RepoWorldConfig, tokenizer: Any = None):
        """``tokenizer``: the policy's own (a distilled student's chat template, :mod:`mimo_kit.train.student`);
        default: the world's BPE, trained on the expert's traces and cached."""
        cfg.check()
        self.cfg = cfg
        self.tokenizer = tokenizer if tokenizer is not None else load_world_tokenizer(cfg)
        self.vocab_size = self.tokenizer.vocab_size
        self.pad_id = self.tokenizer.pad_id
        self.grades = code_env.GradeCache()  # identical patches of a task are graded once

    def tasks(self, n: int, seed: int, prefix: str) -> list[RepoTask]:
        return make_repo_tasks(n, seed, self.cfg.families, prefix)

    def episodes(self, task: RepoTask, group_size: int, harness: str | None = None) -> tuple[str, list[Any]]:
        """One group: ``group_size`` episodes of ``task`` in one harness (by default a training harness fixed by a
        hash of the task id: a uniform spread over the harnesses that a resumed run reproduces)."""
        harness = harness or self.train_harness(task)
        h = capped_harness(harness, self.cfg.max_steps, self.cfg.max_wall_s)
        return f"{task.task_id}@{harness}", [RepoEpisode(task, h, self.tokenizer, self.cfg.task_dir, self.grades)
                                             for _ in range(group_size)]

    def train_harness(self, task: RepoTask) -> str:
        """The training harness of a task, fixed by a hash of its id (uniform, and the same after a resume)."""
        return self.cfg.train_harnesses[zlib.crc32(task.task_id.encode()) % len(self.cfg.train_harnesses)]

    def rollout_settings(self, temperature: float, top_p: float, routed: bool, candidates: bool) -> RolloutSettings:
        return RolloutSettings(max_turns=self.cfg.max_steps, max_action_tokens=self.cfg.max_action_tokens,
                               stop_token_ids=(self.tokenizer.end_id,), temperature=temperature, top_p=top_p,
                               return_routed_experts=routed, return_candidates=candidates,
                               act_workers=self.cfg.tool_workers)

    def sft_data(self, n: int, seed: int) -> list[tuple[list[int], list[bool], dict]]:
        """(token ids, loss mask, info) of ``n`` expert traces over the training harnesses."""
        from mimo_kit.rl.trajectory import flatten

        tasks = self.tasks(n, seed=10_000 + seed, prefix="sft")
        samples = expert_samples(tasks, self.cfg.train_harnesses, seed, self.tokenizer, self.cfg.expert_mix,
                                 task_dir=self.cfg.task_dir, workers=self.cfg.tool_workers)
        out = []
        for s in samples:
            b = flatten([s], pad_id=self.pad_id)
            for row in range(b.input_ids.shape[0]):
                n_tok = int(b.attention_mask[row].sum())
                out.append((b.input_ids[row, :n_tok].tolist(), b.loss_mask[row, :n_tok].tolist(),
                            {"style": s.metadata["style"]}))
        return out

    def eval_groups(self, n: int, seed: int, samples: int, harnesses: Sequence[str] | None = None):
        """Held-out tasks (a disjoint seed), every task in every evaluation harness (Report §4.2's table)."""
        tasks = self.tasks(n, seed=50_000 + seed, prefix="heldout")
        return [self.episodes(t, samples, harness=h) for t in tasks for h in (harnesses or self.cfg.eval_harnesses)]

    @property
    def grade_workers(self) -> int:
        return self.cfg.tool_workers

    def grade_group(self, sample: Sample, grader=None):
        """The rule-based group grader (or ``grader``) on the group's patches and commands (Report §4.3)."""
        from mimo_kit.grading.group import GradedTrajectory, GroupWorkspace, RuleGroupGrader

        ws = GroupWorkspace(spec=sample.metadata.get("instruction", ""), repo={},
                            rollouts=[GradedTrajectory(q.sequence_id, q.metadata.get("grade", {}).get("diff", ""),
                                              bool(q.passed), list(q.metadata.get("commands", [])))
                                      for q in sample.sequences])
        return (grader or RuleGroupGrader()).grade(ws)

    @staticmethod
    def rubric(seq) -> tuple[float, float]:
        """GRS rubric of one episode (the kit's): S_sol = 1/(1 + changed lines beyond one), S_beh = 1 when the episode
        ran its change (every file it changed was imported after its last change: an effect the environment reads
        from the episode's files, ``grade["checked"]``, not the words of its commands), else 0.5."""
        grade = seq.metadata.get("grade", {})
        changed = int(grade.get("changed_lines", 0))
        return 1.0 / (1 + max(0, changed // 2 - 1)), 1.0 if grade.get("checked") is True else 0.5


def harness_table(samples: Sequence[Sample]) -> dict[str, dict[str, float]]:
    """pass@1 and mean turns per harness of evaluated groups."""
    rows: dict[str, list] = {}
    for s in samples:
        h = s.metadata.get("harness", "?")
        rows.setdefault(h, []).extend(s.sequences)
    return {h: {"pass@1": sum(bool(q.passed) for q in qs) / len(qs), "n": len(qs),
                "turns": sum(q.metadata.get("turns", 0) for q in qs) / len(qs)} for h, qs in sorted(rows.items())}
