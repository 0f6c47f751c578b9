"""The one order in which rewards and advantages compose (mimo_kit.rl.compose, Report §4.3)."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.rl import (
    STAGES,
    RLMathConfig,
    gar_redistribute,
    grpo_advantages,
    grs_reward,
    length_penalty,
    quality_factors,
    segment_advantages,
    sequence_advantages,
    token_advantages,
)

FAST = settings(max_examples=40, deadline=None)


def test_the_stages_are_stated_in_order():
    assert STAGES == ("reward", "hacks", "length_penalty", "grpo", "gar", "segment_penalty")


@FAST
@given(st.data())
def test_without_a_grader_the_length_penalty_sits_on_the_reward_before_grpo(data):
    g = data.draw(st.integers(2, 10))
    passed = data.draw(st.lists(st.booleans(), min_size=g, max_size=g))
    lengths = data.draw(st.lists(st.integers(1, 60), min_size=g, max_size=g))
    res = sequence_advantages(passed, lengths=lengths)
    r = torch.tensor(passed, dtype=torch.float32) + length_penalty(lengths, passed)
    torch.testing.assert_close(res.rewards, r)
    torch.testing.assert_close(res.advantages, grpo_advantages(r))
    # s·X < 1: every success keeps a higher reward, and so a higher advantage, than every failure
    p = torch.tensor(passed)
    if p.any() and (~p).any():
        assert res.advantages[p].min() > res.advantages[~p].max()


def test_grs_rubric_is_the_reward():
    sol, beh = [1.0, 0.5, 0.8, 0.3], [1.0, 1.0, 0.5, 1.0]
    res = sequence_advantages([True, True, True, False], rubric=(sol, beh))
    r = grs_reward([True, True, True, False], sol, beh)
    torch.testing.assert_close(res.rewards, r)
    torch.testing.assert_close(res.advantages, grpo_advantages(r))
    with pytest.raises(ValueError, match="rewards or rubric"):
        sequence_advantages([True], rewards=[1.0], rubric=([1.0], [1.0]))


def test_hacks_are_failures_before_the_length_reference_and_the_statistics():
    """A long pass flagged as a hack: reward 0, not part of the successes' median length, not ranked by GAR."""
    ids, passed = ["a", "b", "c", "hack", "f"], [True, True, True, True, False]
    lengths = [10, 10, 20, 200, 30]
    verdict = {"ranking": [["a", "b"], ["c"]], "hacks": ["hack"]}
    m = RLMathConfig()
    res = sequence_advantages(passed, lengths=lengths, gar=True, verdict=verdict, ids=ids, math=m)
    assert res.fallback is None and not res.passed[3] and res.rewards[3] == 0
    p_eff = [True, True, True, False, False]
    r = torch.tensor([1.0, 1, 1, 0, 0]) + length_penalty(lengths, p_eff)  # median of successes 10, not 15
    torch.testing.assert_close(res.rewards, r)
    a = grpo_advantages(r)
    torch.testing.assert_close(res.grpo, a)
    f = quality_factors(verdict["ranking"], ids, p_eff, m.gar.tier_decay, m.gar.min_factor)
    torch.testing.assert_close(res.advantages, gar_redistribute(a, p_eff, f, m.gar.max_scale, m.gar.recenter))


def test_an_unusable_verdict_falls_back_to_grpo_on_the_shaped_rewards():
    passed, lengths = [True, True, False], [5, 9, 7]
    res = sequence_advantages(passed, lengths=lengths, gar=True, verdict=None, ids=["a", "b", "c"])
    assert res.fallback == "no verdict"
    torch.testing.assert_close(res.advantages, sequence_advantages(passed, lengths=lengths).advantages)


def test_constants_come_from_the_math_config():
    passed, lengths = [True, True, True, False], [10, 10, 30, 10]
    strict = RLMathConfig().override({"length.scale": 0.9, "length.tolerance": 0.0})
    a = sequence_advantages(passed, lengths=lengths).rewards
    b = sequence_advantages(passed, lengths=lengths, math=strict).rewards
    assert b[2] < a[2] < 1.0
    torch.testing.assert_close(b[2], torch.tensor(1.0 - 0.9 * 1.0))  # (30/10 − 1 − 0)⁺ capped at X = 1


def test_segment_penalty_is_the_last_stage_on_the_final_advantages():
    rng = random.Random(0)
    adv = sequence_advantages([True, False, True, False]).advantages
    loss = torch.ones(4, 12, dtype=torch.bool)
    err = torch.tensor([[rng.random() < 0.3 for _ in range(12)] for _ in range(4)])
    m = RLMathConfig().override({"segment.kappa": 3.0})
    out = token_advantages(adv, err, loss, [True, False, True, False], m)
    ref = segment_advantages(adv, err, loss, [True, False, True, False], kappa=3.0)
    torch.testing.assert_close(out, ref)


@FAST
@given(st.data())
def test_gar_honours_grpo_eps_and_std_correction(data):
    """GRPO's ε and std correction reach the GAR path too: its pre-redistribution advantages (and a fallback's)
    are GRPO's with the same constants, for every group and verdict."""
    g = data.draw(st.integers(2, 8))
    passed = data.draw(st.lists(st.booleans(), min_size=g, max_size=g))
    eps, corr = data.draw(st.sampled_from([0.5, 1e-4, 2.0])), data.draw(st.integers(0, 1))
    m = RLMathConfig().override({"grpo.eps": eps, "grpo.std_correction": corr})
    ids = [f"t{i}" for i in range(g)]
    ranking = [[i] for i, ok in zip(ids, passed) if ok]
    verdict = data.draw(st.sampled_from([{"ranking": ranking, "hacks": []}, None]))
    res = sequence_advantages(passed, gar=True, verdict=verdict, ids=ids, math=m)
    want = grpo_advantages(torch.tensor(passed, dtype=torch.float32), eps=eps, std_correction=corr)
    torch.testing.assert_close(res.grpo, want)
    if verdict is None or sum(passed) in (0, g):  # no redistribution: the GRPO advantages themselves
        torch.testing.assert_close(res.advantages, want)
