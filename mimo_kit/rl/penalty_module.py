"""The penalty module: rules say *what is an error*, strategies say *what to do about it* (Report §6.1).

A **rule** is a detector over a sequence's segments that returns findings (which segment, which token span, why).
A **strategy** is bound to each rule:

- ``mask``: the flagged tokens leave the loss (no gradient either way);
- ``shape``: the flagged tokens become error spans, which :func:`mimo_kit.rl.penalties.segment_advantages` turns
  into zero advantage in successes and amplified negative advantage in failures (Report §4.3);
- ``monitor``: counted and reported only;
- ``early_stop``: the run would have been stopped right after the flagged action: online the harness asks
  :meth:`PenaltyModule.should_stop`; offline every trainable token after the flagged segment leaves the loss.

Infrastructure errors (sandbox down, grader disconnected) are not the model's fault: a rule marked ``infra``
drops the whole sequence from training, whatever strategy it is bound to (Report §6.1: "infrastructure errors must
not be punished as model errors"). Only the harness or the environment raises that flag (a finish reason, a
recorded error); text in a tool's output never does, since the agent writes it. The kit's action format is
``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` (tag name in ``PenaltyRulesConfig``), read from each
segment's stored ``text``.

The rules read text the model wrote, so they hold on any text (Report §6.1: a penalty pass runs over the whole
batch): tags are found in one forward scan, call bodies are read by the bounded JSON reader the harness's action
formats use too (:func:`mimo_kit.rl.model_json.read_json`: 3,000 nested ``[`` or a 5,000-digit number is a
malformed call, not a ``RecursionError``), and a rule that still raises on a sequence is *isolated*:
:class:`PenaltyModule` turns the exception into findings of :data:`UNREADABLE` on that sequence's generated
segments, bound to the module's ``on_error`` strategy (default ``shape``: output the rules cannot read is a format
error, the model's own, like a malformed call; it never drops the sequence, since text must not turn a failing run
into a dropped one). The other sequences of the batch get exactly the findings they get without it.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import json
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from mimo_kit.rl.config import RULES
from mimo_kit.rl.model_json import MalformedJSON, read_json
from mimo_kit.rl.trajectory import Sample
from mimo_kit.rl.trajectory import Sequence as Run

STRATEGIES = ("mask", "shape", "monitor", "early_stop")
#: The rule name of the findings that stand for a rule which raised on a sequence (see :class:`PenaltyModule`).
UNREADABLE = "unreadable_output"


@dataclasses.dataclass(frozen=True)
class Finding:
    rule: str
    sequence_id: str
    context: int  # index of the context in the sequence
    segment: int  # index of the segment in the context
    span: tuple[int, int]  # token range inside the segment, end exclusive
    detail: str
    infra: bool = False


class Rule(Protocol):
    name: str
    infra: bool

    def detect(self, sequence: Run) -> list[Finding]: ...


def _actions(text: str, tag: str) -> list[tuple[int, int, str]]:
    """(char_start, char_end, body) of each well-formed ``<tag>body</tag>`` in ``text``: the matches of
    ``<tag>(.*?)</tag>`` (DOTALL), found in one forward scan (the lazy regex rescans to the end from every unclosed
    ``<tag>``: quadratic in text full of them)."""
    opening, closing = re.compile(f"<{tag}>"), re.compile(f"</{tag}>")
    out, pos = [], 0
    while (m := opening.search(text, pos)) and (c := closing.search(text, m.end())):
        out.append((m.start(), c.end(), text[m.end():c.start()]))
        pos = c.end()
    return out


def _spans(seg) -> Callable[[int, int], tuple[int, int]]:
    """``seg.token_span`` by bisection where the offsets are sorted (a tokenizer's are): the same spans, in
    O(log n) each, so a segment with thousands of calls stays linear."""
    offsets = seg.offsets
    if offsets is None or any(a > b for a, b in zip(offsets, offsets[1:])):
        return seg.token_span

    def span(char_start: int, char_end: int) -> tuple[int, int]:
        start = max(bisect.bisect_right(offsets, char_start) - 1, 0)
        end = bisect.bisect_left(offsets, char_end) or start + 1
        return (start, max(end, start + 1))

    return span


def _model_segments(sequence: Run) -> Iterable[tuple[int, int, object]]:
    for c, ctx in enumerate(sequence.contexts):
        for s, seg in enumerate(ctx.segments):
            if seg.trainable and seg.text is not None:
                yield c, s, seg


def _parse(body: str) -> tuple[dict | None, str]:
    """The call in a tag's body, read by the bounded reader; (None, why) when it is malformed."""
    try:
        call = read_json(body, "arguments")
    except MalformedJSON as e:
        return None, str(e)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None, "call has no string 'name'"
    if not isinstance(call.get("arguments", {}), dict):
        return None, f"'arguments' is a {type(call['arguments']).__name__}, expected an object"
    return call, ""


@dataclasses.dataclass
class UnknownToolRule:
    """A well-formed call to a tool the harness does not offer."""

    known_tools: tuple[str, ...]
    tag: str = RULES.tool_tag
    name: str = "unknown_tool"
    infra: bool = False

    def detect(self, sequence: Run) -> list[Finding]:
        out = []
        for c, s, seg in _model_segments(sequence):
            span = _spans(seg)
            for a, b, body in _actions(seg.text, self.tag):
                call, _ = _parse(body)
                if call is not None and call["name"] not in self.known_tools:
                    out.append(Finding(self.name, sequence.sequence_id, c, s, span(a, b),
                                       f"tool {call['name'][:200]!r} not in {list(self.known_tools)!r}"))
        return out


@dataclasses.dataclass
class MalformedArgumentsRule:
    """A call whose body is not a JSON object with a string ``name`` and object ``arguments``."""

    tag: str = RULES.tool_tag
    name: str = "malformed_arguments"
    infra: bool = False

    def detect(self, sequence: Run) -> list[Finding]:
        out = []
        for c, s, seg in _model_segments(sequence):
            span = _spans(seg)
            for a, b, body in _actions(seg.text, self.tag):
                call, why = _parse(body)
                if call is None:
                    out.append(Finding(self.name, sequence.sequence_id, c, s, span(a, b), why))
        return out


@dataclasses.dataclass
class BrokenMarkupRule:
    """Unbalanced or nested action tags: the harness cannot parse the turn at all."""

    tag: str = RULES.tool_tag
    name: str = "broken_markup"
    infra: bool = False

    def detect(self, sequence: Run) -> list[Finding]:
        out = []
        for c, s, seg in _model_segments(sequence):
            depth, where = 0, None
            for m in re.finditer(rf"</?{self.tag}>", seg.text):
                closing = m.group(0).startswith("</")
                if (closing and depth == 0) or (not closing and depth == 1):
                    where = m
                    break
                depth += -1 if closing else 1
            if where is None and depth:
                where = deque(re.finditer(rf"<{self.tag}>", seg.text), maxlen=1)[0]  # the last opening tag
            if where is not None:
                out.append(Finding(self.name, sequence.sequence_id, c, s, seg.token_span(where.start(), len(seg.text)),
                                   f"unbalanced <{self.tag}> markup at char {where.start()}"))
        return out


@dataclasses.dataclass
class RepeatedActionRule:
    """The same call (same name and arguments) issued ``max_repeats`` times in a row in one context: a loop."""

    max_repeats: int = RULES.max_repeats
    tag: str = RULES.tool_tag
    name: str = "repeated_action"
    infra: bool = False

    def detect(self, sequence: Run) -> list[Finding]:
        out = []
        for c, ctx in enumerate(sequence.contexts):
            last, run = None, 0
            for s, seg in enumerate(ctx.segments):
                if not (seg.trainable and seg.text is not None):
                    continue
                span = _spans(seg)
                for a, b, body in _actions(seg.text, self.tag):
                    call, _ = _parse(body)
                    key = _key(call, body)
                    run = run + 1 if key == last else 1
                    last = key
                    if run >= self.max_repeats:
                        out.append(Finding(self.name, sequence.sequence_id, c, s, span(a, b),
                                           f"identical action repeated {run} times"))
        return out


def _key(call: dict | None, body: str) -> str:
    """A call's identity: its name and arguments (key order aside), else (malformed, or too deep to write back)
    its text."""
    if call is not None:
        try:
            return json.dumps(call, sort_keys=True)
        except (RecursionError, ValueError):
            pass
    return body.strip()


@dataclasses.dataclass
class InfrastructureErrorRule:
    """A run the harness or the environment flagged as an infrastructure failure: ``finish_reason='infra_error'``
    (a tool or the policy crashed, a pooled actor died), or a recorded error of kind ``"infra"``
    (``Segment.errors``). Flags only, never text: a tool's output is the agent's to shape (``echo '[infra-error]'``),
    and a marker read from it would let a failing rollout be dropped instead of scored 0."""

    name: str = "infrastructure_error"
    infra: bool = True

    def detect(self, sequence: Run) -> list[Finding]:
        out = []
        if sequence.finish_reason == "infra_error":
            out.append(Finding(self.name, sequence.sequence_id, 0, 0, (0, 0), "finish_reason is 'infra_error'", True))
        for c, ctx in enumerate(sequence.contexts):
            for s, seg in enumerate(ctx.segments):
                for a, b, kind in seg.errors:
                    if kind == "infra":
                        out.append(Finding(self.name, sequence.sequence_id, c, s, (a, b),
                                           "the harness recorded an infrastructure error", True))
        return out


@dataclasses.dataclass
class RecordedErrorRule:
    """The errors the environment or harness recorded while the run happened (``Segment.errors``): a malformed
    action, an unknown tool, arguments a tool refused. No re-parsing: the run already knows what failed."""

    kinds: tuple[str, ...] = ()  # only these kinds; () = every recorded error
    name: str = "recorded_error"
    infra: bool = False

    def detect(self, sequence: Run) -> list[Finding]:
        out = []
        for c, ctx in enumerate(sequence.contexts):
            for s, seg in enumerate(ctx.segments):
                if not seg.trainable:
                    continue
                for a, b, kind in seg.errors:
                    if not self.kinds or kind in self.kinds:
                        out.append(Finding(self.name, sequence.sequence_id, c, s, (a, b), kind))
        return out


def default_rules(known_tools: Sequence[str]) -> list[tuple[Rule, str]]:
    """The kit's default bindings: errors shape advantages, loops are masked, infra errors drop the run."""
    return [(UnknownToolRule(tuple(known_tools)), "shape"), (MalformedArgumentsRule(), "shape"),
            (BrokenMarkupRule(), "shape"), (RepeatedActionRule(), "mask"), (InfrastructureErrorRule(), "monitor")]


@dataclasses.dataclass
class PenaltyReport:
    findings: list[Finding]
    dropped: list[str]  # sequence ids removed for infrastructure errors
    stopped: dict[str, Finding]  # sequence id → the finding that stopped it early
    counts: dict[str, int]  # findings per rule

    def table(self) -> list[dict]:
        return [{"rule": r, "findings": n} for r, n in sorted(self.counts.items())]


class PenaltyModule:
    """Rules × strategies (Report §6.1). ``bindings`` pairs each rule with one strategy of ``STRATEGIES``.

    A rule that raises on a sequence fails that sequence only: the exception becomes one :data:`UNREADABLE` finding
    per generated segment of the sequence (the whole segment: the rule could not say where), bound to ``on_error``
    (default ``shape``, a format error of the model's). Such findings never drop a sequence, whatever the raising
    rule's ``infra``; the batch's other sequences get exactly the findings they get without it."""

    def __init__(self, bindings: Sequence[tuple[Rule, str]], on_error: str = "shape"):
        if on_error not in STRATEGIES:
            raise ValueError(f"PenaltyModule: on_error={on_error!r}; expected one of {STRATEGIES}")
        self.on_error = on_error
        for rule, strategy in bindings:
            if strategy not in STRATEGIES:
                raise ValueError(f"PenaltyModule: rule {getattr(rule, 'name', rule)!r} bound to strategy "
                                 f"{strategy!r}; expected one of {STRATEGIES}")
            if not callable(getattr(rule, "detect", None)):
                raise ValueError(f"PenaltyModule: {rule!r} has no detect(sequence) method")
        self.bindings = list(bindings)

    def should_stop(self, sequence: Run) -> Finding | None:
        """Online check after each turn: the first finding of an ``early_stop`` rule, else None."""
        for rule, strategy in self.bindings:
            if strategy == "early_stop":
                found = self._detect(rule, sequence)
                if found:
                    return found[0]
        return None

    def _detect(self, rule: Rule, sequence: Run) -> list[Finding]:
        """``rule.detect(sequence)``; an exception is the sequence's :data:`UNREADABLE` findings, never the batch's."""
        try:
            return list(rule.detect(sequence))
        except Exception as e:  # any failure on the model's text is that sequence's finding
            try:
                why = f"{type(e).__name__}: {str(e)[:120]}"
            except Exception:  # an exception whose message cannot be written
                why = type(e).__name__
            detail = f"rule {getattr(rule, 'name', type(rule).__name__)!r} cannot read this sequence ({why})"
            spans = [Finding(UNREADABLE, sequence.sequence_id, c, s, (0, len(seg)), detail)
                     for c, ctx in enumerate(sequence.contexts) for s, seg in enumerate(ctx.segments)
                     if seg.trainable and len(seg)]
            return spans or [Finding(UNREADABLE, sequence.sequence_id, 0, 0, (0, 0), detail)]

    def _bound(self, rule: Rule, strategy: str, sequence: Run) -> list[tuple[Finding, str]]:
        """The rule's findings on the sequence, each with its strategy (``on_error`` for :data:`UNREADABLE`)."""
        return [(f, self.on_error if f.rule == UNREADABLE else strategy) for f in self._detect(rule, sequence)]

    def apply(self, samples: Sequence[Sample]) -> tuple[list[Sample], PenaltyReport]:
        """Run every rule on every sequence and apply its strategy; returns new samples (inputs untouched)."""
        out, findings, dropped, stopped = [], [], [], {}
        for sample in samples:
            sample = copy.deepcopy(sample)
            keep = []
            for seq in sample.sequences:
                found = [pair for rule, strategy in self.bindings for pair in self._bound(rule, strategy, seq)]
                findings += [f for f, _ in found]
                if any(f.infra or (f.rule != UNREADABLE and getattr(self._rule(f.rule), "infra", False))
                       for f, _ in found):
                    dropped.append(seq.sequence_id)
                    continue
                for f, strategy in found:
                    seg = seq.contexts[f.context].segments[f.segment]
                    if strategy == "mask":
                        seg.masked_spans.append(f.span)
                    elif strategy == "shape":
                        seg.error_spans.append((*f.span, f.rule))
                stops = [f for f, strategy in found if strategy == "early_stop"]
                if stops:
                    first = min(stops, key=lambda f: (f.context, f.segment, f.span))
                    stopped[seq.sequence_id] = first
                    ctx = seq.contexts[first.context]
                    for later in ctx.segments[first.segment + 1:]:
                        if later.trainable and len(later):
                            later.masked_spans.append((0, len(later)))
                    for later_ctx in seq.contexts[first.context + 1:]:
                        for later in later_ctx.segments:
                            if later.trainable and len(later):
                                later.masked_spans.append((0, len(later)))
                keep.append(seq)
            sample.sequences = keep
            out.append(sample)
        counts = dict(Counter(f.rule for f in findings))
        return out, PenaltyReport(findings, dropped, stopped, counts)

    def _rule(self, name: str) -> Rule | None:
        return next((r for r, _ in self.bindings if r.name == name), None)
