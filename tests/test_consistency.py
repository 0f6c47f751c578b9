"""The consistency dashboard: the same rollouts scored under QDQ × R3 × top-p replay (Report §6.1)."""

import pytest

from mimo_kit.train.consistency import ConsistencyConfig, consistency_rows, label, measure_consistency


def by_label(result) -> dict[str, dict]:
    return {label(r): r for r in result["rows"]}


# a module-scoped fixture trains a policy (over 5 s): the whole module is slow
pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def mxfp4():
    return measure_consistency(ConsistencyConfig(groups=10, sft_steps=40))


@pytest.mark.outcome
def test_every_combination_is_scored_on_the_same_tokens(mxfp4):
    rows = mxfp4["rows"]
    assert len(rows) == 8 and len({(r["qdq"], r["r3"], r["topp_replay"]) for r in rows}) == 8
    assert len({r["tokens"] for r in rows}) == 1 and rows[0]["tokens"] > 100
    assert 1.0 <= mxfp4["mean_candidates"] < 20  # top-p 0.9 of a trained toy policy: a few candidates per token


@pytest.mark.outcome
def test_qdq_with_topp_replay_closes_the_gap_to_rounding(mxfp4):
    """With MXFP4 rollouts the training forward reads the same quantised experts under QDQ, and renormalises over
    the same candidate set under replay: what remains is float rounding."""
    rows = by_label(mxfp4)
    assert rows["QDQ + top-p replay"]["mean_abs_dlogp"] < 1e-5
    assert rows["QDQ + top-p replay"]["mean_abs_dlogp"] < rows["none"]["mean_abs_dlogp"] / 100
    assert rows["top-p replay"]["mean_abs_dlogp"] < rows["none"]["mean_abs_dlogp"]  # replay alone helps
    assert rows["QDQ + top-p replay"]["k3_kl"] < rows["top-p replay"]["k3_kl"]  # QDQ on top of replay helps


@pytest.mark.outcome
def test_r3_leaves_no_token_on_another_expert(mxfp4):
    for r in mxfp4["rows"]:
        if r["r3"]:
            assert r["routing_flips"] == 0.0
        assert 0.0 <= r["routing_flips"] <= 1.0


@pytest.mark.outcome
def test_without_mxfp4_the_engine_and_trainer_agree():
    """Same weights on both sides: with top-p replay every row is at float rounding, QDQ or not."""
    rows = by_label(measure_consistency(ConsistencyConfig(groups=6, sft_steps=20, mxfp4_rollouts=False)))
    assert rows["top-p replay"]["mean_abs_dlogp"] < 1e-5
    assert rows["top-p replay"]["routing_flips"] == 0.0


@pytest.mark.outcome
def test_samples_without_routing_are_refused():
    from mimo_kit.infra.engine import InProcessEngine
    from mimo_kit.train.sft import PolicyConfig, build_policy
    from mimo_kit.train.toy.world import ToyWorld, play

    world = ToyWorld()
    model = build_policy(PolicyConfig(), 0, vocab_size=world.vocab_size)
    samples = play(InProcessEngine(model), world.tasks(2, seed=1, prefix="c"), 2)
    with pytest.raises(ValueError, match="routed experts"):
        consistency_rows(model, samples)
