"""The trajectory recorder: Sample ⊃ Sequence ⊃ Context ⊃ Segment as plain JSON (Report §6).

The RL trainer's trajectory model (``mimo_kit.rl``) may not be importable where a harness runs, so the harness
writes a plain, documented schema the trainer can load:

.. code-block:: text

    sample   {"schema": "mimo_kit.trajectory/v1", "prompt_id": str, "sequences": [sequence, ...]}
    sequence {"sequence_id": str, "harness": str, "reward": float, "finish_reason": str, "metrics": {...},
              "contexts": [context, ...]}          # one agent-loop run
    context  {"context_id": str, "parent": str | None, "segments": [segment, ...]}
                                                  # one conversation branch: context management that rewrites
                                                  # what the model sees opens a new one (its segments start with
                                                  # the rewritten history, marked "replayed")
    segment  {"role": "system" | "user" | "assistant" | "tool", "text": str, "generated": bool, "step": int,
              "error": None | {"kind": "format" | "tool" | "infra", "message": str},
              "tool_call": None | {"name": str, "arguments": {...}}, "replayed": bool}

Only ``generated`` segments (model turns) carry loss; ``error`` marks the segments the segment-level behaviour
penalty looks at (Report §4.3), and ``infra`` errors are not the model's fault (Report §6, penalty module).
"""

from __future__ import annotations

import json
from pathlib import Path

SCHEMA = "mimo_kit.trajectory/v1"


class Recorder:
    def __init__(self, prompt_id: str = "prompt-0"):
        self.sample = {"schema": SCHEMA, "prompt_id": prompt_id, "sequences": []}

    def start_sequence(self, sequence_id: str, harness: str) -> dict:
        seq = {"sequence_id": sequence_id, "harness": harness, "reward": None, "finish_reason": None, "metrics": {},
               "contexts": [{"context_id": f"{sequence_id}/ctx-0", "parent": None, "segments": []}]}
        self.sample["sequences"].append(seq)
        return seq

    def add(self, seq: dict, role: str, text: str, *, generated: bool = False, step: int = -1,
            error: dict | None = None, tool_call: dict | None = None) -> None:
        seq["contexts"][-1]["segments"].append({"role": role, "text": text, "generated": generated, "step": step,
                                                "error": error, "tool_call": tool_call, "replayed": False})

    def branch(self, seq: dict, messages: list[dict]) -> None:
        """Open a new Context holding the rewritten history the model will see from now on."""
        parent = seq["contexts"][-1]["context_id"]
        ctx = {"context_id": f"{seq['sequence_id']}/ctx-{len(seq['contexts'])}", "parent": parent,
               "segments": [{"role": m["role"], "text": m["content"], "generated": False, "step": -1, "error": None,
                             "tool_call": None, "replayed": True} for m in messages]}
        seq["contexts"].append(ctx)

    def finish(self, seq: dict, *, reward: float, finish_reason: str, metrics: dict) -> None:
        seq.update(reward=reward, finish_reason=finish_reason, metrics=metrics)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.sample, indent=1))
        return path


def load_sample(path: str | Path) -> dict:
    """Read a recorded sample back; refuses files of another schema by name."""
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    return data


def generated_segments(seq: dict) -> list[dict]:
    """The model's own turns (the only segments that carry loss), across all contexts, without replays."""
    return [s for c in seq["contexts"] for s in c["segments"] if s["generated"] and not s["replayed"]]


def error_segments(seq: dict) -> list[dict]:
    return [s for c in seq["contexts"] for s in c["segments"] if s["error"] and not s["replayed"]]
