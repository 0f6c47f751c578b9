"""Dynamic sampling and over-sampling (Report §4.1)."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.rl import dynamic_sampling, grpo_advantages, keep_probability, prompts_to_draw

FAST = settings(max_examples=60, deadline=None)


@st.composite
def batches(draw):
    """Groups of random size; each group all-equal, binary-mixed, or all-pass with or without a graded spread."""
    rewards, graded, gids, expect = [], [], [], []
    for g in range(draw(st.integers(1, 8))):
        size = draw(st.integers(1, 6))
        kind = draw(st.sampled_from(["equal", "mixed", "graded", "graded-equal"]))
        if kind == "mixed" and size == 1:
            kind = "equal"
        value = draw(st.sampled_from([0.0, 1.0]))
        r = [value] * size if kind != "mixed" else [1.0] + [0.0] * (size - 1)
        s = ([draw(st.floats(0, 1)) for _ in range(size)] if kind == "graded" else [0.5] * size)
        rewards += r
        graded += s
        gids += [g * 7] * size  # ids need not be 0..G-1
        has_signal = kind == "mixed" or (kind == "graded" and max(s) - min(s) > 1e-6)
        expect.append((g * 7, has_signal))
    return rewards, graded, gids, expect


@FAST
@given(batches())
def test_keeps_exactly_the_groups_with_signal(batch):
    rewards, graded, gids, expect = batch
    res = dynamic_sampling(rewards, gids, graded)
    assert res.keep_groups == [g for g, ok in expect if ok]
    assert res.drop_groups == [g for g, ok in expect if not ok]
    assert res.kept_fraction == pytest.approx(sum(ok for _, ok in expect) / len(expect))
    g = torch.tensor(gids)
    assert torch.equal(res.keep_mask, torch.isin(g, torch.tensor(res.keep_groups, dtype=torch.long)))
    r = torch.tensor(rewards)
    for gid in res.drop_groups:  # a dropped group has zero GRPO advantage: nothing was lost
        assert grpo_advantages(r[g == gid]).abs().max() == 0  # equal 0/1 rewards: an exact mean, exactly 0


def test_without_graded_rewards_all_pass_groups_are_dropped():
    res = dynamic_sampling([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 1, 1, 2, 2])
    assert res.keep_groups == [1] and res.kept_fraction == pytest.approx(1 / 3)
    res = dynamic_sampling([1.0, 1.0, 0.0, 1.0], [0, 0, 1, 1], graded=[0.9, 0.6, 0.0, 0.8])
    assert res.keep_groups == [0, 1]
    with pytest.raises(ValueError, match="finite"):
        dynamic_sampling([1.0, float("nan")], [0, 0])
    with pytest.raises(ValueError, match="must be \\[N\\]"):
        dynamic_sampling([1.0, 0.0], [0])


def test_keep_probability_matches_simulation():
    rng = random.Random(0)
    p, g, trials = 0.8, 8, 20_000
    kept = sum(0 < sum(rng.random() < p for _ in range(g)) < g for _ in range(trials))
    assert kept / trials == pytest.approx(keep_probability(p, g), abs=0.01)
    assert keep_probability(0.0, 8) == 0 and keep_probability(1.0, 8) == 0


@pytest.mark.parametrize(("batch", "rate", "conf"), [(64, 0.5, 0.9), (128, 0.25, 0.99), (16, 0.9, 0.5)])
def test_prompts_to_draw_is_the_smallest_n_that_fills_the_batch(batch, rate, conf):
    from mimo_kit.rl.sampling import _binom_sf

    n = prompts_to_draw(batch, rate, confidence=conf)
    assert _binom_sf(n, rate, batch) >= conf > _binom_sf(n - 1, rate, batch)
    rng = random.Random(1)
    filled = sum(sum(rng.random() < rate for _ in range(n)) >= batch for _ in range(2000)) / 2000
    assert filled >= conf - 0.04  # simulated: the batch fills at least as often as promised


def test_prompts_to_draw_mean_mode_and_errors():
    assert prompts_to_draw(100, 0.5, confidence=None) == 200
    assert prompts_to_draw(100, 1.0) == 100
    assert prompts_to_draw(0, 0.3) == 0
    with pytest.raises(ValueError, match="keep_rate=0"):
        prompts_to_draw(10, 0.0)
