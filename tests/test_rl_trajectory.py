"""The trajectory model: token-in/token-out flattening, JSONL with a schema check (Report §6.1)."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.rl import Context, Sample, Segment, Sequence, TrajectoryError, flatten, load_jsonl, save_jsonl, unflatten
from mimo_kit.rl.examples import toy_sample

FAST = settings(max_examples=40, deadline=None)
LAYERS, K = 2, 2


@st.composite
def segments(draw):
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    n = draw(st.integers(1, 6))
    tokens = draw(st.lists(st.integers(0, 999), min_size=n, max_size=n))
    seg = Segment(role=role, token_ids=tokens)
    if role == "assistant":
        seg.source = draw(st.sampled_from(["policy", "policy", "teacher"]))
        seg.logprobs = [float(torch.tensor(-x, dtype=torch.float32)) for x in
                        draw(st.lists(st.floats(0, 5, width=32), min_size=n, max_size=n))]
        seg.policy_versions = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
        seg.routed_experts = [[[draw(st.integers(0, 7)) for _ in range(K)] for _ in range(LAYERS)] for _ in range(n)]
        seg.topp_candidates = [sorted({t, *draw(st.lists(st.integers(0, 999), max_size=3))}) for t in tokens]
        if draw(st.booleans()):
            a = draw(st.integers(0, n - 1))
            seg.error_spans = [(a, draw(st.integers(a + 1, n)), "unknown_tool")]
        if draw(st.booleans()):
            seg.masked_spans = [(0, 1)]
    return seg


@st.composite
def samples(draw):
    out = []
    for g in range(draw(st.integers(1, 3))):
        seqs = []
        for s in range(draw(st.integers(1, 3))):
            ctxs = [Context(draw(st.lists(segments(), min_size=1, max_size=4)), f"c{c}")
                    for c in range(draw(st.integers(1, 2)))]
            seqs.append(Sequence(ctxs, f"s{s}", reward=draw(st.sampled_from([0.0, 1.0, None])),
                                 passed=draw(st.sampled_from([True, False, None]))))
        out.append(Sample(f"p{g}", seqs))
    return out


@FAST
@given(samples())
def test_flatten_then_unflatten_is_the_identity(batch):
    b = flatten(batch)
    assert unflatten(b) == batch


@FAST
@given(samples())
def test_loss_mask_covers_exactly_policy_generated_tokens(batch):
    b = flatten(batch)
    r = 0
    for g, sample in enumerate(batch):
        for seq in sample.sequences:
            for ctx in seq.contexts:
                expect = []
                for seg in ctx.segments:
                    m = [seg.trainable] * len(seg)
                    for a, e in seg.masked_spans:
                        m[a:e] = [False] * (e - a)
                    expect += m
                assert b.loss_mask[r, : len(expect)].tolist() == expect
                assert not b.loss_mask[r, len(expect):].any()
                assert b.input_ids[r, : len(expect)].tolist() == ctx.token_ids()  # token-in/token-out
                assert b.group_ids[r] == g
                r += 1
    assert b.policy_version[b.loss_mask].min() >= 0 if b.loss_mask.any() else True


def test_jsonl_round_trip(tmp_path):
    batch = [toy_sample("p0"), toy_sample("p1")]
    path = save_jsonl(batch, tmp_path / "traces.jsonl")
    assert load_jsonl(path) == batch
    assert len(path.read_text().splitlines()) == 2


def _good() -> dict:
    return json.loads(json.dumps(toy_sample().to_dict()))


def _bad_records():
    def edit(fn):
        d = _good()
        fn(d)
        return d

    seg = lambda d: d["sequences"][0]["contexts"][0]["segments"][2]  # noqa: E731  (an assistant segment)
    return {
        "missing prompt_id": (edit(lambda d: d.pop("prompt_id")), "missing field 'prompt_id'"),
        "unknown field": (edit(lambda d: d.update(promt="x")), r"unknown field\(s\) \['promt'\]"),
        "bad role": (edit(lambda d: seg(d).update(role="robot")), r"segments\[2\].role: got 'robot'"),
        "negative token": (edit(lambda d: seg(d)["token_ids"].__setitem__(0, -3)), r"token_ids\[0\].*got -3"),
        "short logprobs": (edit(lambda d: seg(d)["logprobs"].pop()), "logprobs: has .* entries for .* tokens"),
        "positive logprob": (edit(lambda d: seg(d)["logprobs"].__setitem__(1, 0.5)), r"logprobs\[1\]: got 0.5"),
        "NaN logprob": (edit(lambda d: seg(d)["logprobs"].__setitem__(1, float("nan"))), r"logprobs\[1\]: got nan"),
        "no versions": (edit(lambda d: seg(d).update(policy_versions=None)), "needs per-token policy_versions"),
        "span outside": (edit(lambda d: seg(d).update(error_spans=[[3, 999, "x"]])), r"span \[3, 999\) outside"),
        "span shape": (edit(lambda d: seg(d).update(error_spans=[[1, 2]])), r"expected \[start, end, kind\]"),
        "bad reward": (edit(lambda d: d["sequences"][0].update(reward="high")), "reward: got 'high'"),
        "bad passed": (edit(lambda d: d["sequences"][0].update(passed=1)), "passed: got 1"),
        "dup sequence": (edit(lambda d: d["sequences"].append(d["sequences"][0])), "duplicate sequence_id"),
        "candidate set": (edit(lambda d: seg(d).update(topp_candidates=[[1]] * len(seg(d)["token_ids"]))),
                          "sampled token .* is not in its candidate set"),
        "routing shape": (edit(lambda d: seg(d).update(routed_experts=[[[1, 2]]] + [[[1, 2], [3, 4]]] * (
            len(seg(d)["token_ids"]) - 1))), r"routed_experts\[1\]: shape 2 layers"),
    }


@pytest.mark.parametrize("case", list(_bad_records()))
def test_malformed_records_are_rejected_with_the_field_named(tmp_path, case):
    record, msg = _bad_records()[case]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_good()) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(TrajectoryError, match=msg) as err:
        load_jsonl(path)
    assert str(err.value).startswith("bad.jsonl:2")


def test_broken_json_names_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_good()) + "\n{not json\n")
    with pytest.raises(TrajectoryError, match=r"t.jsonl:2: not valid JSON"):
        load_jsonl(path)


def test_flatten_layout_and_payload_tensors():
    s = toy_sample()
    s.sequences[0].contexts[0].segments[2].routed_experts = [[[1, 2], [3, 4]]] * len(s.sequences[0].contexts[0]
                                                                                    .segments[2])
    b = flatten([s], pad_id=-1)
    assert b.shape[0] == 4 and b.routed_experts.shape[2:] == (2, 2)
    assert (b.input_ids[~b.attention_mask] == -1).all()
    assert (b.routed_experts[0][b.routed_experts[0, :, 0, 0] >= 0] == torch.tensor([[1, 2], [3, 4]])).all()
    assert unflatten(b) == [s]
    with pytest.raises(TrajectoryError, match="item 0 is a dict"):
        flatten([s.to_dict()])


def test_shipped_traces_load_and_match_their_generator():
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "data" / "traces" / "toy_groups.jsonl"
    assert load_jsonl(path) == [toy_sample("p0"), toy_sample("p1")]
