"""The penalty pass holds on hostile model text (Report §6.1): the default rules read calls with the harness's
bounded reader, and a rule that raises on one sequence becomes that sequence's findings, never the batch's error."""

import dataclasses
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.harness.formats import FormatError, get_format, loads
from mimo_kit.rl import PenaltyModule, Sample, default_rules, flatten
from mimo_kit.rl.examples import call, toy_sample, toy_sequence
from mimo_kit.rl.model_json import MalformedJSON, read_json
from mimo_kit.rl.penalty_module import UNREADABLE, _spans
from mimo_kit.rl.trajectory import Segment

TOOLS = ("edit", "submit", "read")
OPEN, CLOSE = "<tool_call>", "</tool_call>"

#: What a model may write, in the kit's action format and in each of the harness's (Report §4.2 multi-harness):
#: deep nesting, numbers over Python's int-conversion limit, NUL bytes, lone surrogates.
HOSTILE = {
    "nested-[": OPEN + "[" * 3000 + CLOSE,
    "nested-[-unclosed": OPEN + "[" * 3000,
    "nested-{": OPEN + '{"a": ' * 3000 + CLOSE,
    "nested-arguments": OPEN + '{"name": "edit", "arguments": ' + '{"a": ' * 3000 + "1" + "}" * 3001 + CLOSE,
    "digits": OPEN + "1" * 5000 + CLOSE,
    "digits-in-arguments": OPEN + '{"name": "edit", "arguments": {"n": ' + "9" * 5000 + "}}" + CLOSE,
    "digits-negative-float": OPEN + '{"name": "edit", "arguments": {"n": -' + "9" * 5000 + ".5e99999}}" + CLOSE,
    "fenced-nested": "```tool edit\n" + "[" * 3000 + "\n```",
    "fenced-nested-in-call": OPEN + "```tool edit\n" + "[" * 3000 + "\n```" + CLOSE,
    "openai-nested": '{"tool_calls": ' + "[" * 3000,
    "openai-nested-arguments-in-call": OPEN + '{"tool_calls": [{"function": {"name": "edit", "arguments": "'
    + "[" * 3000 + '"}}]}' + CLOSE,
    "openai-digits-in-call": OPEN + '{"tool_calls": [{"function": {"name": "edit", "arguments": {"a": '
    + "9" * 5000 + "}}}]}" + CLOSE,
    "xml-nested": '<tool name="edit"><arg name="a">' + "[" * 3000 + "</arg></tool>",
    "xml-nested-in-call": OPEN + '<tool name="edit"><arg name="a">' + "{" * 3000 + "</arg></tool>" + CLOSE,
    "nul-raw": OPEN + '{"name": "ed\x00it", "arguments": {}}' + CLOSE,
    "nul-escaped": OPEN + '{"name": "ed\\u0000it", "arguments": {"p": "\\u0000"}}' + CLOSE,
    "surrogate-raw": OPEN + '{"name": "\ud800", "arguments": {"p": "\udfff"}}' + CLOSE + "\ud83d",
    "surrogate-escaped": OPEN + '{"name": "\\ud800", "arguments": {"\\udc00": 1}}' + CLOSE,
    "surrogate-repeated": (OPEN + '{"name": "\\ud800", "arguments": {"\\udc00": [[1]]}}' + CLOSE) * 4,
    "nested-tags": OPEN * 2 + "{}" + CLOSE * 3 + OPEN,
    "unclosed-1MB": OPEN * 90_000,
    "pairs-1MB": (OPEN + CLOSE) * 45_000,
    "calls-1MB": call("read", path="a") * 30_000,
    "text-1MB": "[" * (1 << 20),
}
#: The hostile texts whose (first) tagged call is malformed: the rest hold no call, or a well-formed one.
MALFORMED = {"nested-[", "nested-{", "nested-arguments", "digits", "digits-in-arguments", "fenced-nested-in-call",
             "openai-nested-arguments-in-call", "openai-digits-in-call", "xml-nested-in-call", "nul-raw",
             "nested-tags", "pairs-1MB"}


def _run(seq_id: str, text: str, seed: int = 0):
    return toy_sequence(seq_id, [(call("read", path="a"), "ok"), (text, "error"), (call("submit"), "")], 0.0, False,
                        seed=seed)


def _by_sequence(findings) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in findings:
        out.setdefault(f.sequence_id, []).append(f)
    return out


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n.endswith("1MB") else n
                                  for n in HOSTILE])
def test_the_default_rules_read_hostile_text_without_raising(name):
    seq = _run(name, HOSTILE[name])
    module = PenaltyModule(default_rules(TOOLS))
    for rule, _ in module.bindings:
        rule.detect(seq)  # each rule on its own: no exception to isolate
    out, rep = module.apply([Sample("p", [seq])])
    assert rep.dropped == [] and all(f.sequence_id == name for f in rep.findings)
    assert UNREADABLE not in rep.counts  # the rules read it all: nothing fell back on isolation
    malformed = [f for f in rep.findings if f.rule == "malformed_arguments"]
    assert bool(malformed) == (name in MALFORMED), malformed[:1]
    if name in ("nested-[", "nested-arguments", "digits", "digits-in-arguments", "openai-digits-in-call"):
        assert "cannot be read: " in malformed[0].detail, malformed[0].detail  # RecursionError, ValueError
    assert module.should_stop(seq) is None


@pytest.mark.parametrize("fmt, text", [("fenced", HOSTILE["fenced-nested"]), ("openai", HOSTILE["openai-nested"]),
                                       ("xml", HOSTILE["xml-nested"])])
def test_the_harness_parsers_the_rules_share_fail_as_format_errors(fmt, text):
    """The bounded reader the rules use is the harness's: its parsers turn the same input into a FormatError."""
    try:
        get_format(fmt).parse(text)
    except FormatError:
        pass


def test_the_reproductions_are_malformed_calls_of_their_sequence():
    for body in ("[" * 3000, "1" * 5000):
        seq = toy_sequence("r", [(OPEN + body + CLOSE, "")], 0.0, False)
        _, rep = PenaltyModule(default_rules(TOOLS)).apply([Sample("p", [seq])])
        assert rep.counts == {"malformed_arguments": 1}, rep.counts
    # and a name with a NUL or a lone surrogate is a well-formed call to an unknown tool
    for name in ("nul-escaped", "surrogate-escaped"):
        _, rep = PenaltyModule(default_rules(TOOLS)).apply([Sample("p", [_run(name, HOSTILE[name])])])
        assert rep.counts == {"unknown_tool": 1}, (name, rep.counts)


def _batch(extra=()):
    seqs = [dataclasses.replace(q) for q in toy_sample().sequences]
    seqs += [_run(f"ok-{i}", call("edit", path=f"{i}.py") + call("edt") * (i % 3), seed=i) for i in range(12)]
    seqs += [toy_sequence("loop", [(call("read", path="a"), "x")] * 4, 0.0, False)]
    seqs += list(extra)
    return [Sample("p0", seqs[:8]), Sample("p1", seqs[8:])]


def _marks(samples):
    return {q.sequence_id: [(s.error_spans, s.masked_spans) for c in q.contexts for s in c.segments]
            for sample in samples for q in sample.sequences}


@pytest.mark.parametrize("name", ["nested-[", "digits", "unclosed-1MB", "surrogate-raw", "openai-nested"])
def test_one_hostile_sequence_leaves_the_others_exactly_as_they_were(name):
    module = PenaltyModule(default_rules(TOOLS))
    clean_out, clean = module.apply(_batch())
    out, rep = module.apply(_batch([_run("hostile", HOSTILE[name])]))
    found = _by_sequence(rep.findings)
    assert bool(found.pop("hostile", [])) == (OPEN in HOSTILE[name])
    assert found == _by_sequence(clean.findings) and rep.dropped == clean.dropped == ["infra"]
    marks = _marks(out)
    marks.pop("hostile")
    assert marks == _marks(clean_out)


@dataclasses.dataclass
class Crashing:
    """A rule that raises on sequences whose id says so (an exception the rules did not foresee)."""

    name: str = "crashing"
    infra: bool = False
    error: type = RecursionError

    def detect(self, sequence):
        if "hostile" in sequence.sequence_id:
            raise self.error("maximum recursion depth exceeded")
        return []


@pytest.mark.parametrize("error", [RecursionError, ValueError, MemoryError, KeyError, UnicodeEncodeError])
@pytest.mark.parametrize("infra", [False, True])
def test_a_rule_that_raises_fails_its_sequence_only(error, infra):
    """The exception becomes UNREADABLE findings over the sequence's generated segments, shaped as a format error;
    an infra rule that raises does not drop the sequence (text must not turn a failure into a dropped run)."""
    rule = Crashing(infra=infra, error=(lambda *a: error("utf-8", "x", 0, 1, "x")) if error is UnicodeEncodeError
                    else error)
    module = PenaltyModule(default_rules(TOOLS) + [(rule, "monitor")])
    hostile = _run("hostile", "fine text")
    clean_out, clean = PenaltyModule(default_rules(TOOLS)).apply(_batch())
    out, rep = module.apply(_batch([hostile]))
    unread = [f for f in rep.findings if f.rule == UNREADABLE]
    assert {f.sequence_id for f in unread} == {"hostile"} and "crashing" in unread[0].detail
    segs = [s for c in hostile.contexts for s in c.segments]
    assert [(f.segment, f.span) for f in unread] == [(i, (0, len(s))) for i, s in enumerate(segs) if s.trainable]
    assert rep.counts[UNREADABLE] == 3 and "hostile" not in rep.dropped
    marks = _marks(out)
    assert all(e == [(0, len(s), UNREADABLE)] for (e, _), s in zip(marks.pop("hostile"), segs) if s.trainable)
    assert marks == _marks(clean_out)
    assert flatten(out).error_mask.sum() > flatten(clean_out).error_mask.sum()


def test_a_raising_rule_stops_online_and_the_error_strategy_is_a_knob():
    module = PenaltyModule([(Crashing(), "early_stop")])
    assert module.should_stop(_run("hostile", "x")).rule == UNREADABLE
    assert module.should_stop(_run("fine", "x")) is None
    _, rep = PenaltyModule([(Crashing(), "shape")], on_error="monitor").apply([Sample("p", [_run("hostile", "x")])])
    assert rep.counts == {UNREADABLE: 3}
    out, _ = PenaltyModule([(Crashing(), "shape")], on_error="mask").apply([Sample("p", [_run("hostile", "x")])])
    assert all(s.masked_spans == [(0, len(s))] for c in out[0].sequences[0].contexts for s in c.segments
               if s.trainable)
    with pytest.raises(ValueError, match="on_error='punish'"):
        PenaltyModule([], on_error="punish")


def test_a_sequence_without_generated_text_still_gets_its_finding():
    seq = toy_sequence("hostile", [], 0.0, False)
    _, rep = PenaltyModule([(Crashing(), "shape")]).apply([Sample("p", [seq])])
    assert [(f.rule, f.segment, f.span) for f in rep.findings] == [(UNREADABLE, 0, (0, 0))]


def _cost(text: str, repeats: int = 2) -> float:
    module, best = PenaltyModule(default_rules(TOOLS)), float("inf")
    sample = Sample("p", [toy_sequence("big", [(text, "")], 0.0, False)])
    for _ in range(repeats):
        t = time.perf_counter()
        module.apply([sample])
        best = min(best, time.perf_counter() - t)
    return best


@pytest.mark.slow
@pytest.mark.parametrize("unit", [OPEN, OPEN + CLOSE, call("read", path="a"), OPEN + "[" * 50 + CLOSE])
def test_the_pass_is_linear_in_the_text(unit):
    """4× the text costs about 4× the time (an unclosed tag rescanned, or a span search per call, is 16×)."""
    n = (1 << 15) // len(unit)
    small, large = _cost(unit * n), _cost(unit * 4 * n)
    assert large < 8 * small + 0.05, (unit[:20], small, large)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=30), st.integers(0, 45), st.integers(0, 45))
def test_the_bisected_spans_are_the_segments_own(gaps, a, b):
    offsets, pos = [], 0
    for g in gaps:
        pos += g % 4  # sorted, with repeats
        offsets.append(pos)
    seg = Segment("assistant", list(range(len(offsets))), text="x" * 50, offsets=offsets)
    assert _spans(seg)(a, b) == seg.token_span(a, b)
    unsorted = Segment("assistant", [0, 1, 2], text="x" * 50, offsets=[5, 2, 9])
    assert _spans(unsorted)(a, b) == unsorted.token_span(a, b)


PIECES = st.one_of(st.binary(max_size=40).map(lambda b: b.decode("utf-8", "surrogateescape")),
                   st.binary(max_size=20).map(lambda b: b.decode("latin-1")),
                   st.sampled_from([OPEN, CLOSE, "[" * 1500, "{" * 1500, "9" * 4400, '{"name": "edit", "arguments": ',
                                    '{"name": "', "}", '"', "\\ud800", "\x00", "```tool edit\n", '<tool name="x">']))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(PIECES, max_size=8).map("".join), min_size=1, max_size=4))
def test_random_bytes_in_sequences_never_raise(texts):
    seqs = [_run(f"s{i}", text, seed=i) for i, text in enumerate(texts)]
    module = PenaltyModule(default_rules(TOOLS))
    _, rep = module.apply([Sample("p", seqs)])
    assert UNREADABLE not in rep.counts and rep.dropped == []
    for q in seqs:
        module.should_stop(q)


def _read(reader, error, text):
    try:
        return "ok", repr(reader(text, "arguments"))
    except error as e:
        return "error", str(e)


@settings(max_examples=150, deadline=None)
@given(st.lists(PIECES, max_size=6).map("".join))
def test_the_rules_read_calls_exactly_as_the_harness_does(text):
    """The rules' reader is the harness's (:func:`mimo_kit.rl.model_json.read_json` behind
    :func:`mimo_kit.harness.formats.loads`): the same value, or the same failure with the same message."""
    assert _read(read_json, MalformedJSON, text) == _read(loads, FormatError, text)
    for body in (text, "[" * 3000, "1" * 5000, '{"a": ' * 2000):
        assert _read(read_json, MalformedJSON, body) == _read(loads, FormatError, body)
