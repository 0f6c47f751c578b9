"""Reading a harness episode's trajectory: views over the one schema (Report §6.1).

Harness episodes are recorded by the rollout driver as :class:`~mimo_kit.rl.trajectory.Sample` ⊃ ``Sequence`` ⊃
``Context`` ⊃ ``Segment`` (token ids, rollout logprobs, policy versions, recorded errors), saved with
:func:`mimo_kit.rl.save_jsonl` and read back with :func:`mimo_kit.rl.load_jsonl`: the one recording schema. The
distillation traces (``data/distill/traces_*.jsonl``, read by TRL's SFT) are an export of a played episode to chat
messages, made only by :func:`chat_messages`. These helpers answer the questions a reader asks of one episode.
"""

from __future__ import annotations

from typing import Any

from mimo_kit.rl.trajectory import Segment, Sequence


def generated_segments(seq: Sequence) -> list[Segment]:
    """The model's own turns (the only segments that carry loss), across all contexts; replayed history is not."""
    return [s for c in seq.contexts for s in c.segments if s.trainable]


def error_segments(seq: Sequence) -> list[dict]:
    """Each error the run recorded: its kind, the action that caused it and the feedback the model got next."""
    out = []
    for c in seq.contexts:
        for i, s in enumerate(c.segments):
            if not s.trainable:
                continue
            nxt = c.segments[i + 1].text if i + 1 < len(c.segments) else None
            out += [{"kind": kind, "action": s.text, "feedback": nxt} for _, _, kind in s.errors]
    if seq.finish_reason == "infra_error":
        out.append({"kind": "infra", "action": None, "feedback": seq.metadata.get("infra_error")})
    return out


def chat_messages(ep: Any) -> list[dict]:
    """A played harness episode as chat messages (the distillation traces' export view, Report §7): system and
    user turns as they are; each assistant turn with the tool calls its harness parses from it
    (``tool_calls``: name, arguments; none when the reply does not parse); each tool turn named after the call it
    answers. Raises ValueError when the harness answered an action that made no tool call."""
    from mimo_kit.harness.formats import FormatError

    messages: list[dict] = []
    pending: list[str] = []
    for m in ep.messages:
        if m["role"] == "assistant":
            try:
                parsed = ep.fmt.parse(m["content"])
            except FormatError:
                parsed = []
            messages.append({"role": "assistant", "content": m["content"],
                             "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in parsed]})
            pending = [c.name for c in parsed]
        elif m["role"] == "tool":
            if not pending:
                raise ValueError(f"the harness answered an action that made no tool call "
                                 f"({messages[-1]['content'][:60]!r})")
            messages.append({"role": "tool", "name": pending.pop(0), "content": m["content"]})
        else:
            messages.append({"role": m["role"], "content": m["content"]})
    return messages
