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


def solution(n: int):
    """Reference answers to the chapter's exercises, computed by the kit (the notebook checks against them)."""
    import torch

    from mimo_kit.rl import (
        aggregate_loss,
        gar_redistribute,
        grpo_advantages,
        grs_reward,
        keep_probability,
        length_penalty,
        prompts_to_draw,
    )

    if n == 1:  # uncapped GAR on rewards [1, 1, 0, 0] with f = [1, 0.5]: the two passes' new advantages
        a = grpo_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]))
        out = gar_redistribute(a, torch.tensor([True, True, False, False]), torch.tensor([1.0, 0.5, 1.0, 1.0]))
        return [round(float(x), 4) for x in out[:2]]
    if n == 2:  # GRS: all four pass; S_sol = [1, .8, .9, .5], S_beh = [1, 1, .5, 1]: which trajectory ranks last?
        r = grs_reward(torch.ones(4, dtype=torch.bool), torch.tensor([1, 0.8, 0.9, 0.5]),
                       torch.tensor([1, 1, 0.5, 1.0]))
        return int(torch.argmin(r))
    if n == 3:  # length penalty of a success 2.5× the median success length, default constants
        return round(float(length_penalty([100.0, 100.0, 250.0, 80.0], [True, True, True, False])[2]), 4)
    if n == 4:  # prompt-mean loss of a batch: group 0 has rows of 2 and 6 tokens (loss 1 each), group 1 one row
        mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
        loss = torch.tensor([[1.0] * 6, [1.0] * 6, [4.0] * 6])
        return round(float(aggregate_loss(loss, mask, torch.tensor([0, 0, 1]), "prompt-mean")), 4)
    if n == 5:  # prompts to draw for 64 kept groups at pass rate 0.9, group size 8, 90% confidence
        return prompts_to_draw(64, keep_probability(0.9, 8), confidence=0.9)
    raise ValueError(f"chapter 4c has exercises 1-5, not {n!r}")
