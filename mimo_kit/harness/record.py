"""Reading a harness episode's trajectory: views over the one schema (Report §6.1).

Harness episodes are recorded by the rollout driver as :class:`~mimo_kit.rl.trajectory.Sample` ⊃ ``Sequence`` ⊃
``Context`` ⊃ ``Segment`` (token ids, rollout logprobs, policy versions, recorded errors), saved with
:func:`mimo_kit.rl.save_jsonl` and read back with :func:`mimo_kit.rl.load_jsonl`; there is no second, text-only
format. These helpers answer the questions a reader asks of one sequence.
"""

from __future__ import annotations

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
