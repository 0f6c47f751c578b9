"""Worked examples of chapter 4c: toy trajectory groups, and the reference answers to the chapter's exercises.

Tokens here are plain integers (no tokenizer): a toy agent turn is ``<tool_call>{json}</tool_call>`` text, one
token per character, so error spans found in the text map back to exact tokens through ``offsets``.
"""

from __future__ import annotations

import json
import random

from mimo_kit.rl.trajectory import Context, Sample, Segment, Sequence


def text_segment(role: str, text: str, version: int = 0, seed: int = 0) -> Segment:
    """A segment whose tokens are the characters of ``text`` (token id = code point), with toy logprobs."""
    rng = random.Random(seed)
    tokens = [min(ord(ch), 50_000) for ch in text]
    seg = Segment(role=role, token_ids=tokens, text=text, offsets=list(range(len(text))))
    if seg.trainable:
        seg.logprobs = [-round(rng.uniform(0.01, 2.0), 4) for _ in tokens]
        seg.policy_versions = [version] * len(tokens)
    return seg


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def toy_sequence(seq_id: str, turns: list[tuple[str, str]], reward: float, passed: bool, seed: int = 0,
                 finish_reason: str = "stop") -> Sequence:
    """A one-context run from ``(assistant text, tool text)`` turns after a fixed system + user prompt."""
    segs = [text_segment("system", "sys", seed=seed), text_segment("user", "fix bug", seed=seed)]
    for k, (act, obs) in enumerate(turns):
        segs.append(text_segment("assistant", act, seed=seed * 100 + k))
        if obs:
            segs.append(text_segment("tool", obs, seed=seed))
    return Sequence(contexts=[Context(segs)], sequence_id=seq_id, reward=reward, passed=passed,
                    finish_reason=finish_reason)


def toy_sample(prompt_id: str = "p0") -> Sample:
    """A group of four runs: a clean pass, a pass with a wrong tool name, a failure with malformed arguments, and a
    run the sandbox killed (infrastructure error)."""
    good = call("edit", path="a.py", diff="+x")
    return Sample(prompt_id=prompt_id, sequences=[
        toy_sequence("clean", [(good, "ok"), (call("submit"), "")], 1.0, True, seed=1),
        toy_sequence("wrong-tool", [(call("edt", path="a.py"), "no such tool"), (good, "ok"), (call("submit"), "")],
                     1.0, True, seed=2),
        toy_sequence("malformed", [("<tool_call>{name: edit, path=a.py}</tool_call>", "parse error"),
                                   (call("submit"), "")], 0.0, False, seed=3),
        toy_sequence("infra", [(good, "[infra-error] sandbox unavailable")], 0.0, False, seed=4,
                     finish_reason="infra_error"),
    ])


#: The chapter's worked GAR group: eight rollouts, five pass; the grader ranks b best, a and d tied, c, then e;
#: h is a confirmed hack (it passed by reading the fixed file).
WORKED_GROUP = {
    "ids": ["a", "b", "c", "d", "e", "f", "g", "h"],
    "rewards": [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0],
    "passed": [True, True, True, True, True, False, False, True],
    "verdict": {"group_id": "task-17", "ranking": [["b"], ["a", "d"], ["c"], ["e"]], "hacks": ["h"]},
}
