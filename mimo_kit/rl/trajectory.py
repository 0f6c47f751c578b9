"""The trajectory model: Sample ⊃ Sequence ⊃ Context ⊃ Segment, token-in/token-out (Report §6.1).

- **Sample**: one prompt and its rollout group (the unit GRPO normalises over).
- **Sequence**: one agent-loop run of that prompt; it carries the reward and the pass/fail outcome.
- **Context**: one conversation branch of a run (sub-agents and context compression open new ones); one context
  is one token stream, so one row of the training batch.
- **Segment**: one message: a system/user prompt, a model generation, or a tool result.

Only segments the policy generated (``role == "assistant"`` and ``source == "policy"``) enter the loss (Report
§6.1). A generated segment keeps, per token, the rollout logprob and the policy version that produced it (stamped
at dispatch, docs/design.md lessons), and optionally the routed experts (R3) and the top-p candidate set. Training never
re-tokenises: :func:`flatten` lays the stored token ids into padded tensors and :func:`unflatten` rebuilds the
same trajectories from those tensors (docs/design.md: token-in/token-out).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import torch

ROLES = ("system", "user", "assistant", "tool")
SOURCES = ("policy", "teacher", "sft", "env", "human")


class TrajectoryError(ValueError):
    """A malformed trajectory record; the message names the record, the field and the bad value."""


@dataclasses.dataclass
class Segment:
    """One message of a context. Per-token lists have one entry per token id.

    ``errors`` are ``(start, end, kind)`` token ranges (end exclusive) the environment or harness reported while
    running (a malformed action, an unknown tool, unparsable arguments): facts of the run, recorded by the
    rollout driver. ``error_spans`` are the ranges a penalty rule flagged for the segment penalty, and
    ``masked_spans`` the ranges a penalty strategy removed from the loss: decisions of the penalty module.
    """

    role: str
    token_ids: list[int]
    source: str = ""  # "" → "policy" for assistant segments, "env" for tool results, "human" otherwise
    logprobs: list[float] | None = None  # rollout (inference-engine) logprob of each token
    policy_versions: list[int] | None = None  # weights version that produced each token
    routed_experts: list[list[list[int]]] | None = None  # [tokens][layers][k] expert ids chosen at rollout
    topp_candidates: list[list[int]] | None = None  # [tokens][candidates] token ids of the sampling set
    errors: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)
    error_spans: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)
    masked_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    text: str | None = None  # optional decoded text, for rules and reading; never re-tokenised
    offsets: list[int] | None = None  # optional char offset where each token starts in ``text``

    def __post_init__(self) -> None:
        if not self.source:
            self.source = {"assistant": "policy", "tool": "env"}.get(self.role, "human")

    @property
    def trainable(self) -> bool:
        """Report §6.1: only model-generated turns contribute to the loss."""
        return self.role == "assistant" and self.source == "policy"

    def __len__(self) -> int:
        return len(self.token_ids)

    def token_span(self, char_start: int, char_end: int) -> tuple[int, int]:
        """Token range covering characters [char_start, char_end) of ``text``; the whole segment without offsets."""
        if self.offsets is None:
            return (0, len(self.token_ids))
        start = max([i for i, o in enumerate(self.offsets) if o <= char_start], default=0)
        end = max([i + 1 for i, o in enumerate(self.offsets) if o < char_end], default=start + 1)
        return (start, max(end, start + 1))


@dataclasses.dataclass
class Context:
    """One conversation branch: an ordered list of segments, trained as one token stream."""

    segments: list[Segment]
    context_id: str = "main"

    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    def loss_mask(self) -> list[bool]:
        """Per token: does the loss train on it (a policy-generated token outside the penalty's masked spans)."""
        out: list[bool] = []
        for seg in self.segments:
            m = [seg.trainable] * len(seg)
            for a, b in seg.masked_spans:
                m[a:b] = [False] * len(m[a:b])
            out += m
        return out

    def trained_tokens(self) -> int:
        """The loss's targets in this context's row: loss-mask tokens after the first position (Report §6.1)."""
        return sum(self.loss_mask()[1:])


@dataclasses.dataclass
class Sequence:
    """One agent-loop run: its contexts, its reward and outcome."""

    contexts: list[Context]
    sequence_id: str
    reward: float | None = None
    passed: bool | None = None
    finish_reason: str = "stop"  # "stop" | "length" | "aborted" | "infra_error" | ...
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Sample:
    """One prompt and its rollout group."""

    prompt_id: str
    sequences: list[Sequence]
    domain: str = "code"
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    # ---- plain data ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "sample") -> Sample:
        """Build and validate a sample from plain data; raise :class:`TrajectoryError` naming the bad field."""
        d = _mapping(data, where, required=("prompt_id", "sequences"),
                     optional=("domain", "metadata"))
        seqs = _list(d["sequences"], f"{where}.sequences")
        sample = cls(prompt_id=_str(d["prompt_id"], f"{where}.prompt_id"),
                     sequences=[_sequence(s, f"{where}.sequences[{i}]") for i, s in enumerate(seqs)],
                     domain=_str(d.get("domain", "code"), f"{where}.domain"),
                     metadata=dict(_mapping(d.get("metadata", {}), f"{where}.metadata")))
        ids = [s.sequence_id for s in sample.sequences]
        if len(set(ids)) != len(ids):
            raise TrajectoryError(f"{where}.sequences: duplicate sequence_id in {ids!r}")
        return sample

    def validate(self) -> Sample:
        """Check every invariant (same checks as loading from JSONL); returns self."""
        Sample.from_dict(json.loads(json.dumps(self.to_dict())), f"sample {self.prompt_id!r}")
        return self


# ---- validation helpers ---------------------------------------------------------------------------------------
def _mapping(v: Any, where: str, required: tuple[str, ...] = (), optional: tuple[str, ...] | None = None) -> dict:
    if not isinstance(v, dict):
        raise TrajectoryError(f"{where}: expected an object, got {_short(v)}")
    for k in required:
        if k not in v:
            raise TrajectoryError(f"{where}: missing field {k!r}")
    if optional is not None:
        extra = sorted(set(v) - set(required) - set(optional))
        if extra:
            raise TrajectoryError(f"{where}: unknown field(s) {extra!r}; expected {list(required + optional)!r}")
    return v


def _list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise TrajectoryError(f"{where}: expected a list, got {_short(v)}")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise TrajectoryError(f"{where}: expected a string, got {_short(v)}")
    return v


def _int(v: Any, where: str, lo: int | None = None) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or (lo is not None and v < lo):
        raise TrajectoryError(f"{where}: expected an integer{f' >= {lo}' if lo is not None else ''}, got {_short(v)}")
    return v


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _per_token(v: Any, n: int, where: str) -> list:
    items = _list(v, where)
    if len(items) != n:
        raise TrajectoryError(f"{where}: has {len(items)} entries for {n} tokens")
    return items


def _segment(data: Any, where: str) -> Segment:
    fields = [f.name for f in dataclasses.fields(Segment)]
    d = _mapping(data, where, required=("role", "token_ids"), optional=tuple(f for f in fields
                                                                              if f not in ("role", "token_ids")))
    role = _str(d["role"], f"{where}.role")
    if role not in ROLES:
        raise TrajectoryError(f"{where}.role: got {role!r}, expected one of {ROLES}")
    tokens = [_int(t, f"{where}.token_ids[{i}]", 0) for i, t in enumerate(_list(d["token_ids"], f"{where}.token_ids"))]
    n = len(tokens)
    source = _str(d.get("source", ""), f"{where}.source")
    if source and source not in SOURCES:
        raise TrajectoryError(f"{where}.source: got {source!r}, expected one of {SOURCES}")
    seg = Segment(role=role, token_ids=tokens, source=source)
    if d.get("logprobs") is not None:
        lps = _per_token(d["logprobs"], n, f"{where}.logprobs")
        for i, lp in enumerate(lps):
            if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > 1e-6:
                raise TrajectoryError(f"{where}.logprobs[{i}]: got {lp!r}, expected a finite log-probability <= 0")
        seg.logprobs = [float(x) for x in lps]
    if d.get("policy_versions") is not None:
        pv = _per_token(d["policy_versions"], n, f"{where}.policy_versions")
        seg.policy_versions = [_int(v, f"{where}.policy_versions[{i}]", 0) for i, v in enumerate(pv)]
    if seg.trainable and (seg.logprobs is None or seg.policy_versions is None):
        missing = [k for k in ("logprobs", "policy_versions") if getattr(seg, k) is None]
        raise TrajectoryError(f"{where}: a policy-generated segment needs per-token {' and '.join(missing)}")
    if d.get("routed_experts") is not None:
        re = _per_token(d["routed_experts"], n, f"{where}.routed_experts")
        shape = None
        for i, tok in enumerate(re):
            layers = _list(tok, f"{where}.routed_experts[{i}]")
            rows = [[_int(e, f"{where}.routed_experts[{i}][{j}]", 0) for e in _list(layer, f"{where}.routed_experts"
                     f"[{i}][{j}]")] for j, layer in enumerate(layers)]
            s = (len(rows), tuple(len(r) for r in rows))
            if shape is not None and s != shape:
                raise TrajectoryError(f"{where}.routed_experts[{i}]: shape {s[0]} layers × {s[1]} differs from "
                                      f"token 0's {shape[0]} × {shape[1]}")
            shape = s
        seg.routed_experts = re
    if d.get("topp_candidates") is not None:
        cands = _per_token(d["topp_candidates"], n, f"{where}.topp_candidates")
        for i, c in enumerate(cands):
            c = [_int(t, f"{where}.topp_candidates[{i}]", 0) for t in _list(c, f"{where}.topp_candidates[{i}]")]
            if tokens[i] not in c:
                raise TrajectoryError(f"{where}.topp_candidates[{i}]: sampled token {tokens[i]} is not in its "
                                      f"candidate set {_short(c)}")
        seg.topp_candidates = cands
    for key in ("errors", "error_spans", "masked_spans"):
        spans = []
        for i, span in enumerate(_list(d.get(key, []), f"{where}.{key}")):
            span = _list(list(span) if isinstance(span, tuple) else span, f"{where}.{key}[{i}]")
            width = 2 if key == "masked_spans" else 3
            if len(span) != width:
                raise TrajectoryError(f"{where}.{key}[{i}]: got {_short(span)}, expected "
                                      f"{'[start, end, kind]' if width == 3 else '[start, end]'}")
            a, b = _int(span[0], f"{where}.{key}[{i}][0]", 0), _int(span[1], f"{where}.{key}[{i}][1]", 0)
            if not a < b <= n:
                raise TrajectoryError(f"{where}.{key}[{i}]: span [{a}, {b}) outside the segment's {n} tokens")
            spans.append((a, b, _str(span[2], f"{where}.{key}[{i}][2]")) if width == 3 else (a, b))
        setattr(seg, key, spans)
    if d.get("text") is not None:
        seg.text = _str(d["text"], f"{where}.text")
    if d.get("offsets") is not None:
        seg.offsets = [_int(o, f"{where}.offsets[{i}]", 0) for i, o in
                       enumerate(_per_token(d["offsets"], n, f"{where}.offsets"))]
    return seg


def _sequence(data: Any, where: str) -> Sequence:
    d = _mapping(data, where, required=("contexts", "sequence_id"),
                 optional=("reward", "passed", "finish_reason", "metadata"))
    ctxs = []
    for i, c in enumerate(_list(d["contexts"], f"{where}.contexts")):
        cd = _mapping(c, f"{where}.contexts[{i}]", required=("segments",), optional=("context_id",))
        segs = [_segment(s, f"{where}.contexts[{i}].segments[{j}]")
                for j, s in enumerate(_list(cd["segments"], f"{where}.contexts[{i}].segments"))]
        ctxs.append(Context(segments=segs, context_id=_str(cd.get("context_id", "main"),
                                                           f"{where}.contexts[{i}].context_id")))
    reward = d.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))
                               or not math.isfinite(reward)):
        raise TrajectoryError(f"{where}.reward: got {reward!r}, expected a finite number or null")
    passed = d.get("passed")
    if passed is not None and not isinstance(passed, bool):
        raise TrajectoryError(f"{where}.passed: got {passed!r}, expected true, false or null")
    return Sequence(contexts=ctxs, sequence_id=_str(d["sequence_id"], f"{where}.sequence_id"),
                    reward=None if reward is None else float(reward), passed=passed,
                    finish_reason=_str(d.get("finish_reason", "stop"), f"{where}.finish_reason"),
                    metadata=dict(_mapping(d.get("metadata", {}), f"{where}.metadata")))


# ---- JSONL ----------------------------------------------------------------------------------------------------
def save_jsonl(samples: list[Sample], path: str | Path) -> Path:
    """Write one sample per line (validated first, so a file the kit writes always loads)."""
    path = Path(path)
    lines = [json.dumps(s.validate().to_dict(), separators=(",", ":")) for s in samples]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
    return path


def load_jsonl(path: str | Path) -> list[Sample]:
    """Read samples, one JSON object per line; a malformed line raises naming the file, line and field."""
    path = Path(path)
    out = []
    for no, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise TrajectoryError(f"{path.name}:{no}: not valid JSON ({e.msg} at column {e.colno})") from None
        out.append(Sample.from_dict(data, f"{path.name}:{no}"))
    return out


# ---- flattening into training tensors and back ----------------------------------------------------------------
@dataclasses.dataclass
class TrainBatch:
    """Padded training tensors, one row per context, plus the layout that rebuilds the trajectories.

    ``group_ids`` index the sample (prompt) of each row and ``seq_ids`` the sequence across the batch, which is
    what loss aggregation needs (``seq-mean`` / ``prompt-mean``).
    """

    input_ids: torch.Tensor  # [rows, T] long, pad_id where padded
    attention_mask: torch.Tensor  # [rows, T] bool
    loss_mask: torch.Tensor  # [rows, T] bool: policy-generated tokens outside masked spans
    error_mask: torch.Tensor  # [rows, T] bool: tokens inside error spans
    logprobs: torch.Tensor  # [rows, T] float64 rollout logprobs (bit-exact round trip), 0 where none
    policy_version: torch.Tensor  # [rows, T] long, −1 where none
    group_ids: torch.Tensor  # [rows] long: sample index
    seq_ids: torch.Tensor  # [rows] long: sequence index over the batch
    routed_experts: torch.Tensor | None  # [rows, T, layers, k] long, −1 where none
    topp_candidates: torch.Tensor | None  # [rows, T, max_candidates] long, −1 where none
    layout: list[dict[str, Any]]  # everything not in the tensors, per sample

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)  # type: ignore[return-value]


def flatten(samples: list[Sample], pad_id: int = 0) -> TrainBatch:
    """Lay each context's stored token ids into a padded row; no tokenizer involved (token-in/token-out)."""
    rows: list[Context] = []
    seq_index: dict[tuple[int, str], int] = {}
    for g, sample in enumerate(samples):
        if not isinstance(sample, Sample):
            raise TrajectoryError(f"flatten: item {g} is a {type(sample).__name__}, expected a Sample")
        for sequence in sample.sequences:
            seq_index[(g, sequence.sequence_id)] = len(seq_index)
            rows += sequence.contexts
    n_rows, width = len(rows), max([len(c.token_ids()) for c in rows], default=0)
    input_ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros(n_rows, width, dtype=torch.bool)
    loss_mask, error_mask = torch.zeros_like(attention), torch.zeros_like(attention)
    logprobs = torch.zeros(n_rows, width, dtype=torch.float64)
    version = torch.full((n_rows, width), -1, dtype=torch.long)
    all_segs = [s for c in rows for s in c.segments]
    re_shape = next(((len(s.routed_experts[0]), len(s.routed_experts[0][0])) for s in all_segs
                     if s.routed_experts), None)
    routed = torch.full((n_rows, width, *re_shape), -1, dtype=torch.long) if re_shape else None
    k_max = max([len(c) for s in all_segs if s.topp_candidates for c in s.topp_candidates], default=0)
    cands = torch.full((n_rows, width, k_max), -1, dtype=torch.long) if k_max else None
    group_ids, seq_ids = torch.zeros(n_rows, dtype=torch.long), torch.zeros(n_rows, dtype=torch.long)

    r = 0
    for g, sample in enumerate(samples):
        for sequence in sample.sequences:
            for ctx in sequence.contexts:
                group_ids[r], seq_ids[r] = g, seq_index[(g, sequence.sequence_id)]
                m = ctx.loss_mask()
                loss_mask[r, :len(m)] = torch.tensor(m, dtype=torch.bool)
                pos = 0
                for seg in ctx.segments:
                    n = len(seg)
                    sl = slice(pos, pos + n)
                    input_ids[r, sl] = torch.tensor(seg.token_ids, dtype=torch.long)
                    attention[r, sl] = True
                    if seg.logprobs is not None:
                        logprobs[r, sl] = torch.tensor(seg.logprobs, dtype=torch.float64)
                    if seg.policy_versions is not None:
                        version[r, sl] = torch.tensor(seg.policy_versions, dtype=torch.long)
                    for a, b, _ in seg.error_spans:
                        error_mask[r, pos + a: pos + b] = True
                    if seg.routed_experts is not None:
                        if re_shape is None or (len(seg.routed_experts[0]), len(seg.routed_experts[0][0])) != re_shape:
                            raise TrajectoryError(f"flatten: routed_experts shape differs across segments "
                                                  f"(sample {sample.prompt_id!r})")
                        routed[r, sl] = torch.tensor(seg.routed_experts, dtype=torch.long)
                    if seg.topp_candidates is not None:
                        for i, c in enumerate(seg.topp_candidates):
                            cands[r, pos + i, : len(c)] = torch.tensor(c, dtype=torch.long)
                    pos += n
                r += 1
    layout = [_layout(s) for s in samples]
    return TrainBatch(input_ids, attention, loss_mask, error_mask, logprobs, version, group_ids, seq_ids,
                      routed, cands, layout)


def _layout(sample: Sample) -> dict[str, Any]:
    """The sample without its per-token payloads (those live in the tensors)."""
    payload = ("token_ids", "logprobs", "policy_versions", "routed_experts", "topp_candidates")
    d = sample.to_dict()
    for seq in d["sequences"]:
        for ctx in seq["contexts"]:
            for seg in ctx["segments"]:
                seg["n_tokens"] = len(seg["token_ids"])
                seg["has"] = [k for k in payload[1:] if seg[k] is not None]
                for k in payload:
                    del seg[k]
    return d


def unflatten(batch: TrainBatch) -> list[Sample]:
    """Rebuild the samples from the tensors and the layout: the inverse of :func:`flatten`."""
    out, r = [], 0
    for lay in batch.layout:
        d = json.loads(json.dumps(lay))
        for seq in d["sequences"]:
            for ctx in seq["contexts"]:
                pos = 0
                for seg in ctx["segments"]:
                    n, has = seg.pop("n_tokens"), seg.pop("has")
                    sl = slice(pos, pos + n)
                    seg["token_ids"] = batch.input_ids[r, sl].tolist()
                    seg["logprobs"] = batch.logprobs[r, sl].tolist() if "logprobs" in has else None
                    seg["policy_versions"] = batch.policy_version[r, sl].tolist() if "policy_versions" in has else None
                    seg["routed_experts"] = (batch.routed_experts[r, sl].tolist()
                                             if "routed_experts" in has else None)
                    seg["topp_candidates"] = ([[t for t in c if t >= 0] for c in batch.topp_candidates[r, sl].tolist()]
                                              if "topp_candidates" in has else None)
                    pos += n
                r += 1
        out.append(Sample.from_dict(d, f"unflatten sample {d['prompt_id']!r}"))
    return out
