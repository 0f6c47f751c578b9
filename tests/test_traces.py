"""The distillation trace format and the teachers' trace sets (Report §7)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.distill.traces import (
    DOMAINS,
    Trace,
    TraceError,
    available,
    domain_counts,
    load_traces,
    make_traces,
    save_traces,
    validate_trace,
)
from mimo_kit.results import DATA_DIR


def good() -> dict:
    return {"id": "t0", "domain": "code", "harness": "swe-tools", "teacher": "a test",
            "messages": [{"role": "system", "content": "be careful"},
                         {"role": "user", "content": "fix it"},
                         {"role": "assistant", "content": "```bash\ncat a.py\n```",
                          "tool_calls": [{"name": "bash", "arguments": {"command": "cat a.py"}}]},
                         {"role": "tool", "name": "bash", "content": "x = 1"},
                         {"role": "assistant", "content": "done"}],
            "meta": {"passed": True}}


def test_a_good_trace_validates_and_round_trips(tmp_path):
    t = validate_trace(good())
    assert isinstance(t, Trace) and t.domain == "code" and t.to_dict() == good()
    path = save_traces([t, {**good(), "id": "t1", "domain": "visual"}], tmp_path / "x" / "t.jsonl")
    back = load_traces(path)
    assert [b.id for b in back] == ["t0", "t1"] and back[0] == t
    assert domain_counts(back) == {"code": 1, "cyber": 0, "general": 0, "visual": 1}


def _set(obj: dict, path: tuple, value) -> dict:
    obj = copy.deepcopy(obj)
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is _DEL:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


_DEL = object()
BAD = [
    (("domain",), "music", r"domain='music', expected one of code, cyber, general, visual"),
    (("id",), "", r"id='', expected a non-empty string"),
    (("teacher",), 3, r"teacher=3, expected a non-empty string"),
    (("messages",), [], r"messages=\[\], expected a non-empty list"),
    (("meta",), [], r"meta=\[\], expected a JSON object"),
    (("harness",), _DEL, r"missing key\(s\) \['harness'\]"),
    (("extra",), 1, r"unknown key\(s\) \['extra'\]"),
    (("messages", 0, "role"), "assistant", r"messages\[0\].role='assistant', expected 'system' or 'user'"),
    (("messages", 1, "role"), "system", r"messages\[1\].role='system', expected a system message only as the first"),
    (("messages", 1, "role"), "robot", r"messages\[1\].role='robot', expected one of system, user, assistant"),
    (("messages", 1, "content"), None, r"messages\[1\].content=None, expected a string"),
    (("messages", 2, "tool_calls"), [], r"messages\[3\].role='tool', expected a tool message only after an "
                                        r"assistant message with a tool call"),
    (("messages", 2, "tool_calls", 0, "arguments"), "cat", r"tool_calls\[0\].arguments='cat', expected a JSON obj"),
    (("messages", 2, "tool_calls", 0), {"name": "bash"}, r"tool_calls\[0\]=.*expected an object with exactly"),
    (("messages", 3, "name"), "view", r"messages\[3\].name='view', expected 'bash', the name of the call"),
    (("messages", 1, "tool_calls"), [], r"messages\[1\] \(user\) has unknown key\(s\) \['tool_calls'\]"),
]


@pytest.mark.parametrize("path,value,msg", BAD, ids=[m[:30] for _, _, m in BAD])
def test_each_kind_of_bad_trace_names_its_field(path, value, msg):
    with pytest.raises(TraceError, match=msg):
        validate_trace(_set(good(), path, value), "f.jsonl line 3")
    with pytest.raises(TraceError, match="f.jsonl line 3: "):
        validate_trace(_set(good(), path, value), "f.jsonl line 3")


def test_structural_errors():
    no_assistant = {**good(), "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(TraceError, match=r"expected at least one assistant message"):
        validate_trace(no_assistant)
    two_tools = _set(good(), ("messages",), good()["messages"][:4] + [{"role": "tool", "content": "again"}])
    with pytest.raises(TraceError, match=r"messages\[4\].role='tool', expected a tool message only after"):
        validate_trace(two_tools)
    with pytest.raises(TraceError, match="expected a JSON object with keys"):
        validate_trace([1, 2])


def test_load_names_the_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(good()) + "\n\n{not json\n")
    with pytest.raises(TraceError, match=r"t.jsonl line 3: not valid JSON"):
        load_traces(p)
    p.write_text(json.dumps(good()) + "\n" + json.dumps({**good(), "domain": "audio"}) + "\n")
    with pytest.raises(TraceError, match=r"t.jsonl line 2: domain='audio'"):
        load_traces(p)
    p.write_text(json.dumps(good()) + "\n" + json.dumps(good()) + "\n")
    with pytest.raises(TraceError, match=r"line 2: id='t0' repeats the id of line 1"):
        load_traces(p)


text = st.text(max_size=20)
call = st.fixed_dictionaries({"name": st.text(min_size=1, max_size=8),
                              "arguments": st.dictionaries(st.text(max_size=5), text, max_size=2)})


@st.composite
def traces(draw):
    msgs = [{"role": draw(st.sampled_from(["system", "user"])), "content": draw(text)}]
    for _ in range(draw(st.integers(1, 4))):
        calls = draw(st.lists(call, max_size=3))
        msgs.append({"role": "assistant", "content": draw(text), "tool_calls": calls})
        for c in calls[:draw(st.integers(0, len(calls)))]:
            msgs.append({"role": "tool", "name": c["name"], "content": draw(text)})
        if draw(st.booleans()):
            msgs.append({"role": "user", "content": draw(text)})
    return {"id": draw(st.text(min_size=1, max_size=8).filter(str.strip)), "domain": draw(st.sampled_from(DOMAINS)),
            "harness": "h", "teacher": "t", "messages": msgs, "meta": {}}


@pytest.mark.slow  # 60 examples: ~1 s idle, over 5 s on a loaded machine
@settings(max_examples=60, deadline=None)
@given(traces())
def test_well_formed_traces_always_validate_and_round_trip(obj):
    assert validate_trace(obj).to_dict() == obj
    assert validate_trace(json.loads(json.dumps(obj))).to_dict() == obj


@pytest.mark.slow
@pytest.mark.parametrize("domain", DOMAINS)
def test_teachers_make_valid_passing_traces(domain):
    ts = make_traces(domain, 2, seed=3)
    assert len(ts) == 2 and len({t.id for t in ts}) == 2
    for t in ts:
        assert t.domain == domain and t.meta["passed"] and t.meta["reward"] == 1.0, t.meta
        assert t.messages[0]["role"] == "system" and t.messages[1]["role"] == "user"
        assert t.messages[-2]["tool_calls"] == [{"name": "submit", "arguments": {}}]
        assert domain in t.teacher or "mimo_kit.envs" in t.teacher or "repo world" in t.teacher
    assert [t.to_dict() for t in make_traces(domain, 2, seed=3)] == [t.to_dict() for t in ts]  # deterministic


def test_code_traces_carry_the_passing_patch_and_structured_calls():
    ts = make_traces("code", 4, seed=1)
    assert {t.harness for t in ts} == {"mini-bash", "swe-tools", "xml-editor", "fenced-editor"}
    for t in ts:
        assert t.meta["diff"].startswith("diff") or "calc/__init__.py" in t.meta["diff"]
        assert "clean" in t.teacher or "check" in t.teacher
        edits = [c for m in t.messages for c in m.get("tool_calls", []) if c["name"] in ("str_replace", "bash")]
        assert edits


def test_small_domains_say_how_many_distinct_traces_they_have():
    assert available("code") is None
    assert available("general") == 40 and len(make_traces("general", 1000, 0)) == 40
    with pytest.raises(ValueError, match="domain='audio'"):
        make_traces("audio", 1)


def test_shipped_trace_sets_validate():
    files = sorted((DATA_DIR / "distill").glob("traces_*.jsonl"))
    assert [f.stem.removeprefix("traces_") for f in files] == sorted(DOMAINS)
    total = 0
    for f in files:
        ts = load_traces(f)
        total += f.stat().st_size
        domain = f.stem.removeprefix("traces_")
        assert ts and domain_counts(ts)[domain] == len(ts)
        assert all(t.meta["passed"] for t in ts)
    assert total < 2_500_000
