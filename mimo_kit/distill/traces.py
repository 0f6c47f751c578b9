"""Agent traces for distillation: one validated chat format, JSON lines, per-domain sets (Report §7).

The report distils MiMo's agent traces of four domains (Code, Cyber, General, Visual) into Qwen3.5-9B, SFT first,
then RL. The kit has no MiMo, so its traces come from its own teachers (below); this module is the format they all
write and the SFT reads, and the teachers. One trace, one JSON object per line::

    {"id": "code-0", "domain": "code", "harness": "swe-tools", "teacher": "scripted expert (...)",
     "messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "<the action as the harness's format spells it>",
                   "tool_calls": [{"name": "view", "arguments": {"path": "calc/__init__.py"}}]},
                  {"role": "tool", "name": "view", "content": "<the observation>"}, ...],
     "meta": {...}}

Rules :func:`validate_trace` enforces (each failure is a :class:`TraceError` naming the line, the field, the value
and what was expected): the six keys and no others; ``domain`` one of :data:`DOMAINS`; ``id``, ``harness`` and
``teacher`` non-empty strings; ``messages`` a non-empty list whose first message is ``system`` or ``user``, with
``system`` only first; every ``content`` a string; ``tool_calls`` only on assistant messages, each a ``name``
string and an ``arguments`` object; every ``tool`` message answers a call of the nearest assistant message before
it (no more tool messages in a row than that message has calls, and a ``name``, if given, matching the call);
at least one assistant message; ``meta`` an object. An assistant message's ``content`` is the action exactly as
the harness's action format spells it (fenced block, OpenAI-style JSON or XML) and ``tool_calls`` is what that
format parses it into, so a student can be trained on the text and a chat template can use the calls.

**Teachers** (:func:`make_traces`; every trace names its teacher in ``teacher``). Each one acts through a real
harness episode (:class:`mimo_kit.harness.HarnessEpisode`: the harness's system prompt and tool list, its action
format, its tools on a sandboxed workspace), and the episode is graded by the environment; ``meta`` keeps the
reward and whether it passed.

- **code**: the repo world's scripted expert (:func:`mimo_kit.train.toy.repo.expert_replies`, clean / check styles)
  in the 4 training harnesses, round robin: view or cat, edit with str_replace or sed, optionally run the
  function, submit; its patch passes the task's hidden F2P / P2P tests.
- **cyber**: the reference solution of :mod:`mimo_kit.envs.cyber` (each target's gold PoC) in mini-bash, swe-tools
  and fenced-editor (writing ``poc.bin`` needs bash): read the source, write the PoC with printf or python3,
  optionally dump it with od, submit.
- **general**: the reference solution of :mod:`mimo_kit.envs.general` (each task's gold actions) in the 5 training
  harnesses, optionally after looking up the orders or the inventory they touch, then submit.
- **visual**: the hidden reference program of :mod:`mimo_kit.envs.visual`'s replication tasks, and a kit-written
  program for the open task (checked by its rubric), in mini-bash, swe-tools and fenced-editor: read LANGUAGE.md
  or not, write ``drawing.txt`` (heredoc or printf), submit.

The cyber, general and visual environments ship 5, 4 and 3 tasks, so their sets are small by construction: every
trace is a distinct (task, harness, variant) combination and :func:`make_traces` returns at most
:func:`available` of them (100, 40 and 48); code tasks are generated, so its sets can be any size.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Report §7: the four domains of the distillation data (Code, Cyber, General, Visual).
DOMAINS = ("code", "cyber", "general", "visual")
ROLES = ("system", "user", "assistant", "tool")
_KEYS = ("id", "domain", "harness", "teacher", "messages", "meta")


class TraceError(ValueError):
    """A trace that does not follow the format; the message names the line, the field and the bad value."""


@dataclasses.dataclass
class Trace:
    """One validated trace (Report §7's unit of distillation data)."""

    id: str
    domain: str
    harness: str
    teacher: str
    messages: list[dict[str, Any]]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _KEYS}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def validate_trace(obj: Any, where: str = "trace") -> Trace:
    """Check ``obj`` against the format and return it as a :class:`Trace` (a deep copy of its messages and meta).
    ``where`` prefixes every error (e.g. ``"traces_code.jsonl line 7"``)."""

    def fail(field: str, value: Any, expected: str) -> TraceError:
        return TraceError(f"{where}: {field}={_short(value)}, expected {expected}")

    if not isinstance(obj, dict):
        raise fail("trace", obj, "a JSON object with keys " + ", ".join(_KEYS))
    missing = [k for k in _KEYS if k not in obj]
    if missing:
        raise TraceError(f"{where}: missing key(s) {missing}; a trace has keys {', '.join(_KEYS)}")
    extra = sorted(set(obj) - set(_KEYS))
    if extra:
        raise TraceError(f"{where}: unknown key(s) {extra}; a trace has keys {', '.join(_KEYS)}")
    if obj["domain"] not in DOMAINS:
        raise fail("domain", obj["domain"], "one of " + ", ".join(DOMAINS))
    for key in ("id", "harness", "teacher"):
        if not isinstance(obj[key], str) or not obj[key].strip():
            raise fail(key, obj[key], "a non-empty string")
    if not isinstance(obj["meta"], dict):
        raise fail("meta", obj["meta"], "a JSON object")
    msgs = obj["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise fail("messages", msgs, "a non-empty list of messages")
    open_calls: list[dict] = []  # calls of the nearest assistant message not yet answered by a tool message
    seen_assistant = False
    for i, m in enumerate(msgs):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise fail(at, m, "an object with 'role' and 'content'")
        role = m.get("role")
        if role not in ROLES:
            raise fail(f"{at}.role", role, "one of " + ", ".join(ROLES))
        allowed = {"role", "content"} | ({"tool_calls"} if role == "assistant" else set()) | \
                  ({"name"} if role == "tool" else set())
        extra = sorted(set(m) - allowed)
        if extra:
            raise TraceError(f"{where}: {at} ({role}) has unknown key(s) {extra}; a {role} message has "
                             f"{', '.join(sorted(allowed))}")
        if not isinstance(m.get("content"), str):
            raise fail(f"{at}.content", m.get("content"), "a string")
        if i == 0 and role not in ("system", "user"):
            raise fail(f"{at}.role", role, "'system' or 'user' for the first message")
        if role == "system" and i != 0:
            raise fail(f"{at}.role", role, "a system message only as the first message")
        if role == "assistant":
            seen_assistant = True
            calls = m.get("tool_calls", [])
            if not isinstance(calls, list):
                raise fail(f"{at}.tool_calls", calls, "a list of {name, arguments}")
            for j, c in enumerate(calls):
                if not isinstance(c, dict) or set(c) != {"name", "arguments"}:
                    raise fail(f"{at}.tool_calls[{j}]", c, "an object with exactly 'name' and 'arguments'")
                if not isinstance(c["name"], str) or not c["name"]:
                    raise fail(f"{at}.tool_calls[{j}].name", c["name"], "a non-empty string")
                if not isinstance(c["arguments"], dict):
                    raise fail(f"{at}.tool_calls[{j}].arguments", c["arguments"], "a JSON object")
            open_calls = list(calls)
        elif role == "tool":
            if not open_calls:
                raise fail(f"{at}.role", role, "a tool message only after an assistant message with a tool call "
                           "it answers (one tool message per call)")
            call = open_calls.pop(0)
            if "name" in m and m["name"] != call["name"]:
                raise fail(f"{at}.name", m["name"], f"{call['name']!r}, the name of the call it answers")
        else:
            open_calls = []
    if not seen_assistant:
        raise fail("messages", [m["role"] for m in msgs], "at least one assistant message")
    return Trace(obj["id"], obj["domain"], obj["harness"], obj["teacher"], json.loads(json.dumps(msgs)),
                 json.loads(json.dumps(obj["meta"])))


def load_traces(path: str | Path) -> list[Trace]:
    """Every trace of a JSONL file, validated; errors name the file and the line number. Blank lines are skipped;
    duplicate ids are an error."""
    path = Path(path)
    out, ids = [], {}
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path.name} line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            t = validate_trace(obj, where)
            if t.id in ids:
                raise TraceError(f"{where}: id={t.id!r} repeats the id of line {ids[t.id]}; expected unique ids")
            ids[t.id] = n
            out.append(t)
    return out


def dumps_traces(traces: Iterable[Trace | dict]) -> str:
    """Traces as JSONL text (each validated first; one object per line, keys in the format's order)."""
    lines = []
    for i, t in enumerate(traces):
        t = t if isinstance(t, Trace) else validate_trace(t, f"trace {i}")
        validate_trace(t.to_dict(), f"trace {i} ({t.id})")
        lines.append(json.dumps(t.to_dict(), ensure_ascii=False))
    return "".join(line + "\n" for line in lines)


def save_traces(traces: Iterable[Trace | dict], path: str | Path) -> Path:
    """Write traces as JSONL (validated; parent folders made)."""
    path = Path(path)
    text = dumps_traces(traces)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def domain_counts(traces: Iterable[Trace | dict]) -> dict[str, int]:
    """Traces per domain, every domain of :data:`DOMAINS` listed (0 when absent)."""
    c = collections.Counter(t.domain if isinstance(t, Trace) else t["domain"] for t in traces)
    return {d: c.get(d, 0) for d in DOMAINS}


# ---- teachers -----------------------------------------------------------------------------------------------------
TEACHERS = {
    "code": "scripted expert of mimo_kit.train.toy.repo (repo world, {style} style)",
    "cyber": "reference solution of mimo_kit.envs.cyber (the target's gold PoC), scripted read/write/submit",
    "general": "reference solution of mimo_kit.envs.general (the task's gold actions), scripted inspect/act/submit",
    "visual": "reference program of mimo_kit.envs.visual (the task's hidden reference), scripted read/write/submit",
    "visual-open": "kit-written drawing for mimo_kit.envs.visual's open task (checked by its rubric), scripted "
                   "read/write/submit",
}
CODE_HARNESSES = ("mini-bash", "swe-tools", "xml-editor", "fenced-editor")
CYBER_HARNESSES = ("mini-bash", "swe-tools", "fenced-editor")  # writing poc.bin needs bash
GENERAL_HARNESSES = ("mini-bash", "swe-tools", "xml-editor", "fenced-editor", "api-agent")
VISUAL_HARNESSES = ("mini-bash", "swe-tools", "fenced-editor")  # writing drawing.txt needs bash
#: the open visual task has no reference program: this one holds every rubric item (tests/test_envs_visual.py)
OPEN_DRAWINGS = {"open-traffic-light": "canvas 40 100 white\nrect 5 5 30 90 #222222\ncircle 20 22 10 red\n"
                                       "circle 20 50 10 #ffbf00\ncircle 20 78 10 #00c000\n"}


def play_script(env: Any, harness: str, calls: list[tuple[str, dict]], domain: str) -> tuple[list[dict], dict]:
    """Play tool ``calls`` through one harness episode on ``env`` and grade it; returns the trace's messages and
    the outcome (reward, passed, finish, steps, grade). Each call is written in the harness's action format
    (:func:`mimo_kit.harness.render_call`) and parsed back by it, as a model's reply would be."""
    from mimo_kit.harness.episode import ByteTokenizer, HarnessEpisode
    from mimo_kit.harness.formats import render_call
    from mimo_kit.harness.record import chat_messages

    tok = ByteTokenizer()
    ep = HarnessEpisode(env, harness, tok, domain=domain)
    ep.prompt()
    for name, args in calls:
        reply = render_call(ep.cfg.action_format, name, args)
        if ep.act(tok.encode(reply) + [tok.end_id], "stop").done:
            break
    out = ep.outcome()
    try:
        messages = chat_messages(ep)
    except ValueError as e:
        raise TraceError(f"play_script: harness {harness!r}: {e}; the teacher's script is broken") from None
    grade = out.metadata.get("grade", {})
    return messages, {"reward": out.reward, "passed": bool(out.passed), "finish": out.metadata.get("finish"),
                      "steps": out.metadata.get("steps"),
                      "reason": str(grade.get("reason", grade.get("reasons", "")))[:300],
                      **({"diff": grade["diff"]} if grade.get("diff") else {})}


def _pick(combos: list[tuple], n: int, seed: int) -> list[tuple]:
    import random

    combos = list(combos)
    random.Random(seed).shuffle(combos)
    return combos[:n]


def _code_traces(n: int, seed: int, mix: tuple[float, float, float]) -> list[Trace]:
    import random

    from mimo_kit.harness.config import get_harness
    from mimo_kit.harness.envs import CodeEnv
    from mimo_kit.harness.formats import get_format
    from mimo_kit.train.toy import repo

    rng = random.Random(seed)
    out = []
    for i, task in enumerate(repo.make_repo_tasks(n, seed=seed, prefix="distill")):
        h = get_harness(CODE_HARNESSES[i % len(CODE_HARNESSES)])
        style = rng.choices(("clean", "check", "wrong"), weights=mix)[0]
        fmt = get_format(h.action_format)
        calls = [(c.name, c.arguments) for r in repo.expert_replies(task, h, style, rng) for c in fmt.parse(r)]
        env = CodeEnv(repo.code_task(task))
        try:
            messages, outcome = play_script(env, h.name, calls, "code")
        finally:
            env.close()
        out.append(Trace(f"code-{seed}-{i}", "code", h.name, TEACHERS["code"].format(style=style), messages,
                         {"task": task.task_id, "family": task.family, "style": style, **outcome}))
    return out


def _cyber_combos() -> list[tuple]:
    from mimo_kit.envs.cyber import shipped_targets
    from mimo_kit.harness.config import get_harness

    return [(t.id, h, read, write, check) for t in shipped_targets() for h in CYBER_HARNESSES
            for read in (("cat", "view") if "view" in get_harness(h).tools else ("cat",))
            for write in ("printf", "python3") for check in (False, True)]


def _cyber_traces(n: int, seed: int) -> list[Trace]:
    from mimo_kit.envs.cyber import shipped_targets
    from mimo_kit.harness.envs import CyberEnv

    targets = {t.id: t for t in shipped_targets()}
    out = []
    for i, (tid, h, read, write, check) in enumerate(_pick(_cyber_combos(), n, seed)):
        t = targets[tid]
        calls: list[tuple[str, dict]] = []
        for src in t.sources:
            calls.append(("view", {"path": src}) if read == "view" else ("bash", {"command": f"cat {src}"}))
        if write == "printf":
            octal = "".join(f"\\{b:03o}" for b in t.gold_poc)
            calls.append(("bash", {"command": f"printf '{octal}' > poc.bin"}))
        else:
            cmd = f"python3 -c \"open('poc.bin', 'wb').write(bytes.fromhex('{t.gold_poc.hex()}'))\""
            calls.append(("bash", {"command": cmd}))
        if check:
            calls.append(("bash", {"command": "od -A d -t x1 poc.bin"}))
        calls.append(("submit", {}))
        with CyberEnv(t) as env:
            messages, outcome = play_script(env, h, calls, "cyber")
        out.append(Trace(f"cyber-{seed}-{i}", "cyber", h, TEACHERS["cyber"], messages,
                         {"task": tid, "expected": list(t.expected), "variant": f"{read}/{write}"
                          f"{'/check' if check else ''}", **outcome}))
    return out


def _general_inspect(task: Any) -> list[tuple[str, dict]]:
    """Look-ups a careful agent makes first: the orders the gold actions touch, or the inventory."""
    calls: list[tuple[str, dict]] = []
    for a in task.gold_actions:
        oid = a.get("args", {}).get("order_id")
        if oid is not None and ("get_order", {"order_id": oid}) not in calls:
            calls.append(("get_order", {"order_id": oid}))
        if a["tool"] == "restock" and ("list_inventory", {}) not in calls:
            calls.append(("list_inventory", {}))
    return calls


def _general_combos() -> list[tuple]:
    from mimo_kit.envs.general import shipped_general_tasks

    return [(t.id, h, inspect) for t in shipped_general_tasks() for h in GENERAL_HARNESSES
            for inspect in (False, True)]


def _general_traces(n: int, seed: int) -> list[Trace]:
    from mimo_kit.envs.general import shipped_general_tasks
    from mimo_kit.harness.envs import GeneralEnv

    tasks = {t.id: t for t in shipped_general_tasks()}
    out = []
    for i, (tid, h, inspect) in enumerate(_pick(_general_combos(), n, seed)):
        t = tasks[tid]
        calls = (_general_inspect(t) if inspect else []) + [(a["tool"], dict(a.get("args", {})))
                                                            for a in t.gold_actions] + [("submit", {})]
        with GeneralEnv(t) as env:
            messages, outcome = play_script(env, h, calls, "general")
        out.append(Trace(f"general-{seed}-{i}", "general", h, TEACHERS["general"], messages,
                         {"task": tid, "variant": "inspect/act" if inspect else "act", **outcome}))
    return out


def _visual_combos() -> list[tuple]:
    from mimo_kit.envs.visual import shipped_visual_tasks
    from mimo_kit.harness.config import get_harness

    return [(t.id, h, read, write) for t in shipped_visual_tasks() if t.kind == "replicate" or t.id in OPEN_DRAWINGS
            for h in VISUAL_HARNESSES
            for read in (("none", "cat", "view") if "view" in get_harness(h).tools else ("none", "cat"))
            for write in ("heredoc", "printf")]


def _visual_traces(n: int, seed: int) -> list[Trace]:
    import shlex

    from mimo_kit.envs.visual import shipped_visual_tasks
    from mimo_kit.harness.envs import VisualEnv

    tasks = {t.id: t for t in shipped_visual_tasks()}
    out = []
    for i, (tid, h, read, write) in enumerate(_pick(_visual_combos(), n, seed)):
        t = tasks[tid]
        program = t.reference if t.kind == "replicate" else OPEN_DRAWINGS[tid]
        program = program if program.endswith("\n") else program + "\n"
        calls: list[tuple[str, dict]] = []
        if read != "none":
            calls.append(("view", {"path": "LANGUAGE.md"}) if read == "view" else
                         ("bash", {"command": "cat LANGUAGE.md"}))
        if write == "heredoc":
            calls.append(("bash", {"command": "cat > drawing.txt <<'EOF'\n" + program + "EOF"}))
        else:
            calls.append(("bash", {"command": "printf '%s\\n' " + " ".join(shlex.quote(line) for line in
                                                                             program.splitlines()) + " > drawing.txt"}))
        calls.append(("submit", {}))
        with VisualEnv(t) as env:
            messages, outcome = play_script(env, h, calls, "visual")
        out.append(Trace(f"visual-{seed}-{i}", "visual", h, TEACHERS["visual" if t.kind == "replicate" else
                                                                      "visual-open"], messages,
                         {"task": tid, "kind": t.kind, "variant": f"{read}/{write}", **outcome}))
    return out


def available(domain: str) -> int | None:
    """How many distinct traces a domain's teacher can make (``None``: unbounded, code tasks are generated)."""
    combos = {"cyber": _cyber_combos, "general": _general_combos, "visual": _visual_combos}
    if domain == "code":
        return None
    if domain not in combos:
        raise ValueError(f"available: domain={domain!r}; expected one of {', '.join(DOMAINS)}")
    return len(combos[domain]())


def make_traces(domain: str, n: int, seed: int = 0, *,
                code_mix: tuple[float, float, float] = (0.7, 0.3, 0.0)) -> list[Trace]:
    """``n`` traces of ``domain`` from its teacher (the module's table), deterministic in ``seed``, each validated.
    Cyber, general and visual give at most :func:`available` traces (distinct task × harness × variant).
    ``code_mix``: weights of the repo expert's clean / check / wrong styles (wrong edits fail their tests)."""
    if domain not in DOMAINS:
        raise ValueError(f"make_traces: domain={domain!r}; expected one of {', '.join(DOMAINS)}")
    if n < 0:
        raise ValueError(f"make_traces: n={n}; expected >= 0")
    if domain == "code":
        traces = _code_traces(n, seed, code_mix)
    else:
        traces = {"cyber": _cyber_traces, "general": _general_traces, "visual": _visual_traces}[domain](n, seed)
    return [validate_trace(t.to_dict(), f"{domain} trace {t.id}") for t in traces]
