"""Length penalty, segment penalty and the penalty module (Report §4.3, §6.1)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.rl import (
    BrokenMarkupRule,
    InfrastructureErrorRule,
    MalformedArgumentsRule,
    PenaltyModule,
    RepeatedActionRule,
    Sample,
    UnknownToolRule,
    default_rules,
    flatten,
    length_penalty,
    segment_advantages,
)
from mimo_kit.rl.config import LENGTH
from mimo_kit.rl.examples import call, toy_sample, toy_sequence

FAST = settings(max_examples=60, deadline=None)


# ---- length penalty ---------------------------------------------------------------------------------------------
def test_length_penalty_formula():
    lengths, passed = [100.0, 100.0, 130.0, 250.0, 900.0], [True, True, True, True, False]
    p = length_penalty(lengths, passed, scale=0.5, tolerance=0.2, cap=1.0, gate=0.5)
    ref = (100 + 130) / 2  # median of the four successes: mean of the two middle values
    expected = [0.0, 0.0, -0.5 * max(0.0, 130 / ref - 1.2), -0.5 * min(1.0, 250 / ref - 1.2), 0.0]
    torch.testing.assert_close(p, torch.tensor(expected))


def test_length_penalty_gate_and_failures():
    lengths = [100.0, 400.0, 50.0, 60.0]
    assert length_penalty(lengths, [True, True, False, False], gate=0.6).abs().max() == 0  # 50% < gate
    p = length_penalty(lengths, [True, True, False, False], gate=0.5)
    assert p[1] < 0 and p[2] == p[3] == 0  # failures are never length-penalised
    assert length_penalty(lengths, [False] * 4).abs().max() == 0
    with pytest.raises(ValueError, match=r"lengths must be positive, got \[0.0"):
        length_penalty([0.0, 1.0], [True, True])
    with pytest.raises(ValueError, match="reference='mode'"):
        length_penalty([1.0, 2.0], [True, True], reference="mode")


@FAST
@given(st.lists(st.tuples(st.integers(1, 5000), st.booleans()), min_size=1, max_size=16))
def test_length_penalty_is_bounded_monotone_and_keeps_successes_above_failures(rows):
    lengths, passed = [float(x) for x, _ in rows], [p for _, p in rows]
    p = length_penalty(lengths, passed)
    assert (p <= 0).all() and (p >= -LENGTH.scale * LENGTH.cap - 1e-6).all()
    assert 1.0 + p.min() > 0.0  # default s·X < 1: a penalised success still beats a failure's reward 0
    succ = [i for i, ok in enumerate(passed) if ok]
    for i in succ:
        for j in succ:
            if lengths[i] >= lengths[j]:
                assert p[i] <= p[j] + 1e-7  # longer success, penalty at least as large


# ---- segment penalty --------------------------------------------------------------------------------------------
def _masks():
    loss = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    err = torch.tensor([[0, 1, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0] * 6], dtype=torch.bool)
    return err, loss


def test_segment_penalty_worked_rows():
    err, loss = _masks()
    adv = torch.tensor([0.8, -0.6, -0.6])
    out = segment_advantages(adv, err, loss, torch.tensor([True, False, False]), kappa=2.0, alpha_max=3.0,
                             beta_min=0.5)
    # success: error tokens 0, others keep A
    torch.testing.assert_close(out[0], torch.tensor([0.8, 0.0, 0.0, 0.8, 0.8, 0.0]))
    # failure with 1 error token of 4: A_err = 2·(−0.6) = −1.2; β = (4 − 1·2)/3 = 2/3 ∈ [0.5, 1]
    torch.testing.assert_close(out[1], torch.tensor([-0.4, -0.4, -1.2, -0.4, 0.0, 0.0]))
    # failure without errors: untouched
    torch.testing.assert_close(out[2], torch.full((6,), -0.6))


@FAST
@given(st.integers(0, 2**31 - 1), st.floats(1.0, 4.0), st.floats(0.1, 5.0), st.floats(0.0, 1.0))
def test_segment_penalty_properties(seed, kappa, alpha_max, beta_min):
    g = torch.Generator().manual_seed(seed)
    n, t = 6, 12
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    loss = torch.arange(t)[None] < lengths[:, None]
    err = (torch.rand(n, t, generator=g) < 0.3) & loss
    passed = torch.rand(n, generator=g) < 0.5
    adv = torch.where(passed, torch.rand(n, generator=g) + 0.1, -(torch.rand(n, generator=g) * 3 + 0.1))
    out = segment_advantages(adv, err, loss, passed, kappa=kappa, alpha_max=alpha_max, beta_min=beta_min)
    col = adv[:, None].expand_as(out)
    assert (out[~loss] == 0).all()
    assert (out[passed[:, None] & err] == 0).all()  # no positive reinforcement of errors
    keep = passed[:, None] & loss & ~err
    assert torch.equal(out[keep], col[keep])  # selected, not computed: a pass's other tokens keep A bit for bit
    fail_err = ~passed[:, None] & err
    assert (out[fail_err] <= col[fail_err] + 1e-6).all()  # amplified, never weakened
    assert (out[fail_err] >= torch.minimum(col[fail_err], torch.tensor(-alpha_max)) - 1e-6).all()  # capped
    fail_norm = ~passed[:, None] & loss & ~err
    ratio = out[fail_norm] / col[fail_norm]
    assert ((ratio >= beta_min - 1e-5) & (ratio <= 1 + 1e-5)).all()  # normal tokens eased within [β_min, 1]


def test_segment_penalty_rejects_bad_shapes():
    err, loss = _masks()
    with pytest.raises(ValueError, match=r"masks \[N, T\]"):
        segment_advantages(torch.zeros(2), err, loss, torch.zeros(3, dtype=torch.bool))


# ---- penalty module ---------------------------------------------------------------------------------------------
TOOLS = ("edit", "submit", "read")


@pytest.mark.parametrize("printed", ["[infra-error]", "[INFRA-ERROR] sandbox unavailable", "grader disconnected",
                                     "connection reset by peer", "Traceback: infra_error"])
def test_an_infrastructure_error_is_a_flag_the_agent_cannot_print(printed):
    """A failing run whose tool output carries an infrastructure marker (the agent echoed it) is scored, not
    dropped; the same run flagged by the harness (finish reason, or a recorded "infra" error) is dropped."""
    spoof = toy_sequence("spoof", [(call("edit", path="a.py"), printed)], 0.0, False, seed=5)
    assert InfrastructureErrorRule().detect(spoof) == []
    module = PenaltyModule([(InfrastructureErrorRule(), "monitor")])
    assert module.apply([Sample(prompt_id="p", sequences=[spoof])])[1].dropped == []
    flagged = toy_sequence("flagged", [(call("edit", path="a.py"), printed)], 0.0, False, seed=5,
                           finish_reason="infra_error")
    recorded = toy_sequence("recorded", [(call("edit", path="a.py"), printed)], 0.0, False, seed=5)
    tool_seg = next(seg for seg in recorded.contexts[0].segments if seg.role == "tool")
    tool_seg.errors.append((0, len(tool_seg), "infra"))
    for run in (flagged, recorded):
        assert [f.infra for f in InfrastructureErrorRule().detect(run)] == [True]
        assert module.apply([Sample(prompt_id="p", sequences=[run])])[1].dropped == [run.sequence_id]


def test_rules_detect_exactly_their_error():
    s = toy_sample()
    runs = {q.sequence_id: q for q in s.sequences}
    assert [f.sequence_id for f in UnknownToolRule(TOOLS).detect(runs["wrong-tool"])] == ["wrong-tool"]
    assert UnknownToolRule(TOOLS).detect(runs["clean"]) == []
    assert len(MalformedArgumentsRule().detect(runs["malformed"])) == 1
    assert MalformedArgumentsRule().detect(runs["wrong-tool"]) == []
    assert all(f.infra for f in InfrastructureErrorRule().detect(runs["infra"]))
    assert InfrastructureErrorRule().detect(runs["clean"]) == []
    broken = toy_sequence("b", [("<tool_call>{\"name\": \"edit\"}", "")], 0.0, False)
    nested = toy_sequence("n", [("<tool_call><tool_call>{}</tool_call></tool_call>", "")], 0.0, False)
    assert len(BrokenMarkupRule().detect(broken)) == 1 and len(BrokenMarkupRule().detect(nested)) == 1
    assert BrokenMarkupRule().detect(runs["clean"]) == []
    loop = toy_sequence("l", [(call("read", path="a"), "x")] * 4, 0.0, False)
    found = RepeatedActionRule(max_repeats=3).detect(loop)
    assert [f.segment for f in found] == [6, 8]  # the 3rd and 4th identical calls (segments 2, 4, 6, 8)


def test_error_spans_cover_the_call_tokens_exactly():
    seq = toy_sequence("x", [("thinking... " + call("edt", path="a"), "")], 0.0, False)
    (f,) = UnknownToolRule(TOOLS).detect(seq)
    seg = seq.contexts[0].segments[f.segment]
    a, b = f.span
    assert seg.text[a:b] == call("edt", path="a")  # one token per character in the toy tokenizer


def test_strategies_shape_mask_monitor_and_infra_drops():
    s = toy_sample()
    shaped, rep = PenaltyModule(default_rules(TOOLS)).apply([s])
    assert rep.dropped == ["infra"]  # infrastructure error: dropped, not penalised
    assert [q.sequence_id for q in shaped[0].sequences] == ["clean", "wrong-tool", "malformed"]
    assert [q.sequence_id for q in s.sequences][-1] == "infra"  # the input is untouched
    b = flatten(shaped)
    assert b.error_mask[0].sum() == 0 and b.error_mask[1].sum() > 0 and b.error_mask[2].sum() > 0
    assert not (b.error_mask & ~b.loss_mask).any()

    masked, _ = PenaltyModule([(UnknownToolRule(TOOLS), "mask")]).apply([s])
    bm, b0 = flatten(masked), flatten([s])
    assert bm.error_mask.sum() == 0
    assert int(b0.loss_mask[1].sum() - bm.loss_mask[1].sum()) == len(call("edt", path="a.py"))

    monitored, rep = PenaltyModule([(UnknownToolRule(TOOLS), "monitor"), (InfrastructureErrorRule(), "monitor")]
                                   ).apply([s])
    assert rep.counts == {"unknown_tool": 1, "infrastructure_error": 1}  # the finish reason, not the tool text
    bmon = flatten(monitored)
    assert torch.equal(bmon.loss_mask, b0.loss_mask[:3]) and bmon.error_mask.sum() == 0


def test_early_stop_online_and_offline():
    seq = toy_sequence("e", [(call("edit", path="a"), "ok"), (call("edt"), "?"), (call("submit"), "")], 1.0, True)
    pm = PenaltyModule([(UnknownToolRule(TOOLS), "early_stop")])
    assert pm.should_stop(seq).detail.startswith("tool 'edt'")
    assert pm.should_stop(toy_sequence("ok", [(call("edit"), "")], 1.0, True)) is None
    from mimo_kit.rl import Sample

    out, rep = pm.apply([Sample("p", [seq])])
    assert set(rep.stopped) == {"e"}
    segs = out[0].sequences[0].contexts[0].segments
    assert segs[2].masked_spans == [] and segs[6].masked_spans == [(0, len(segs[6]))]  # after the stop: no loss


def test_bad_strategy_is_named():
    with pytest.raises(ValueError, match="strategy 'punish'"):
        PenaltyModule([(UnknownToolRule(TOOLS), "punish")])

