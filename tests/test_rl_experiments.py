"""Chapter 5a's comparisons over seeds (mimo_kit.train.experiments): seeds knob, statistics, a tiny two-seed run."""

import json
import math

import numpy as np
import pytest

from mimo_kit import viz
from mimo_kit.config.base import ConfigError
from mimo_kit.train import experiments as ex

# ---- the seeds knob --------------------------------------------------------------------------------------------


def test_default_seeds_are_enough_for_a_paired_claim():
    from mimo_kit.claims import MIN_PAIRED_SEEDS

    assert len(ex.CompareConfig.preset("tiny").seeds) == MIN_PAIRED_SEEDS


@pytest.mark.parametrize("bad, named", [("[]", "empty"), ("[0, 1, 1]", "seed 1 appears more than once"),
                                        ("[2, -3]", "seed -3"), ("[0.5]", "0.5"), ("4", "4")])
def test_bad_seeds_raise_naming_the_value(bad, named):
    with pytest.raises(ConfigError, match="seeds") as e:
        ex.CompareConfig.preset("tiny").override([f"seeds={bad}"])
    assert named in str(e.value)


# ---- statistics over seeds ---------------------------------------------------------------------------------------


def test_spread_matches_a_hand_computation():
    s = ex.spread([1.0, 2.0, 4.0])
    # mean 7/3; deviations -4/3, -1/3, 5/3; squares sum to 42/9; sample variance 42/9 / 2 = 7/3
    assert s["mean"] == pytest.approx(7 / 3)
    assert s["sd"] == pytest.approx(math.sqrt(7 / 3))
    assert (s["min"], s["max"], s["n"]) == (1.0, 4.0, 3)
    assert ex.spread([0.5]) == {"mean": 0.5, "sd": 0.0, "min": 0.5, "max": 0.5, "n": 1}
    # missing values are left out and not counted
    assert ex.spread([None, 3.0, float("nan"), 5.0]) == {"mean": 4.0, "sd": pytest.approx(math.sqrt(2)),
                                                         "min": 3.0, "max": 5.0, "n": 2}
    assert ex.spread([None])["n"] == 0 and ex.spread([])["mean"] is None


def _history(values, **extra):
    return [{"step": i + 1, "pass_rate": v, "gen_tokens": 10 + i, "trained_tokens": 5, "lag_max": i % 3,
             "load_cv": [v, 2 * v], "expired": i, **extra} for i, v in enumerate(values)]


def test_seed_scalars_by_hand():
    h = _history([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 0.9, 0.7])  # 8 steps; late quarter = steps 7, 8
    run = {"history": h, "sft_eval": {"pass_rate": 0.5, "turns": 3.0}, "rl_eval": {"pass_rate": 0.75}}
    s = ex.seed_scalars(run, 0.25)
    assert s["late_pass_rate"] == pytest.approx((0.9 + 0.7) / 2)
    assert s["late_load_cv"] == pytest.approx((1.5 * 0.9 + 1.5 * 0.7) / 2)  # per-layer lists: layer mean
    assert s["length_growth"] == pytest.approx((16 + 17) / 2 - (10 + 11) / 2)  # late minus early quarter
    assert (s["trained_tokens"], s["lag_max"], s["expired"]) == (40.0, 2.0, 7.0)
    assert (s["heldout_pass_rate_sft"], s["heldout_pass_rate_rl"], s["heldout_turns_sft"]) == (0.5, 0.75, 3.0)
    assert s["heldout_turns_rl"] is None and s["late_needless_rate"] is None  # not measured: null, not NaN


def _result(values_by_arm):
    """A comparison result with one scalar ``x`` per arm and seed."""
    arms = {}
    for arm, vals in values_by_arm.items():
        runs = [{"seed": k, "history": [{"step": 1, "pass_rate": v}], "scalars": {"x": v}} for k, v in
                enumerate(vals)]
        arms[arm] = {"overrides": {}, "runs": runs, "summary": ex.summarise(runs)}
    return {"arms": arms}


def test_agreement_counts_seeds_and_compares_means():
    res = _result({"a": [1.0, 5.0, 2.0], "b": [2.0, 3.0, 4.0]})
    g = ex.agreement(res, "x", "a", "b")
    assert (g.agree, g.n) == (2, 3)  # seeds 0 and 2
    assert (g.mean_lower, g.mean_higher) == (pytest.approx(8 / 3), pytest.approx(3.0))
    assert g.holds and not g.unanimous
    assert "a lower on 2 of 3 seeds" in str(g)
    flipped = ex.agreement(res, "x", "b", "a")
    assert (flipped.agree, flipped.holds) == (1, False)
    assert ex.summary_rows(res, {"x": "x"})["b"] == {"x": "3 ± 1", "seeds": 3}
    assert ex.mean_sd(ex.spread([60000, 62000])) == "61,000 ± 1,414"
    assert ex.mean_sd(ex.spread([None])) == "n/a"


def test_paired_differences_per_seed_and_late_means_from_history():
    res = _result({"a": [1.0, 5.0, 2.0], "b": [2.0, 3.0, 4.0]})
    assert ex.paired(res, "x", "a", "b") == [-1.0, 2.0, -2.0]
    assert ex.paired(res, "", ("a", "x"), ("b", "x")) == [-1.0, 2.0, -2.0]
    rng = np.random.default_rng(0)
    res = {"late_frac": 0.25, "arms": {}}
    for arm in ("a", "b"):  # saved without late_clip_fraction: computed from the history
        runs = [{"seed": k, "scalars": {}, "history": [{"clip_low": float(lo), "clip_high": float(hi)}
                                                       for lo, hi in rng.uniform(0, 0.1, (8, 2))]}
                for k in range(3)]
        res["arms"][arm] = {"runs": runs}
    want = [sum(h["clip_low"] + h["clip_high"] for h in ra["history"][6:]) / 2
            - sum(h["clip_low"] + h["clip_high"] for h in rb["history"][6:]) / 2
            for ra, rb in zip(res["arms"]["a"]["runs"], res["arms"]["b"]["runs"])]
    assert ex.paired(res, "late_clip_fraction", "a", "b") == pytest.approx(want)
    assert ex.step_value({"clip_low": 0.01}, "clip_fraction") is None  # half measured: not measured
    with pytest.raises(ValueError, match="'a' seed 0 has no finite 'late_entropy'"):
        ex.paired(res, "late_entropy", "a", "b")


def test_pairs_are_matched_by_seed_id_and_mismatched_arms_raise():
    """A paired difference is one seed's favoured run minus the same seed's other run, whatever the run order."""
    rng = np.random.default_rng(7)
    seeds = [3, 0, 4, 1, 2]
    values = {arm: {k: float(v) for k, v in zip(seeds, rng.normal(size=5))} for arm in ("a", "b")}
    res = {"name": "c", "late_frac": 0.25, "arms": {
        "a": {"runs": [{"seed": k, "scalars": {"x": values["a"][k]}, "history": []} for k in seeds]},
        "b": {"runs": [{"seed": k, "scalars": {"x": values["b"][k]}, "history": []} for k in sorted(seeds)]}}}
    assert ex.paired(res, "x", "a", "b") == [values["a"][k] - values["b"][k] for k in seeds]
    res["arms"]["b"]["runs"][-1]["seed"] = 9  # seed 4 missing on b, seed 9 only on b
    with pytest.raises(ValueError, match=r"only 'a': \[4\], only 'b': \[9\]"):
        ex.paired(res, "x", "a", "b")
    res["arms"]["b"]["runs"][-1]["seed"] = 0  # seed 0 twice on b
    with pytest.raises(ValueError, match="'b' holds seed 0 twice"):
        ex.paired(res, "x", "a", "b")


def test_seed_band_minmax_and_sd():
    runs = [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [2.0, 5.0, 2.0]]
    mean, lo, hi = viz.seed_band(runs)
    np.testing.assert_allclose(mean, [2.0, 3.0, 2.0])
    np.testing.assert_allclose(lo, [1.0, 2.0, 1.0])
    np.testing.assert_allclose(hi, [3.0, 5.0, 3.0])
    mean, lo, hi = viz.seed_band(runs, band="sd")
    np.testing.assert_allclose(hi - mean, [1.0, math.sqrt(3.0), 1.0])
    with pytest.raises(ValueError, match="band='iqr'"):
        viz.seed_band(runs, band="iqr")


# ---- a tiny comparison over two seeds -------------------------------------------------------------------------------

#: The smallest comparison that still runs every part: 5 SFT steps, 2 RL steps of 2 prompts × 2 rollouts, 3-turn
#: episodes, no dynamic sampling (an untrained policy would refill for nothing), 4 held-out tasks.
TINY = {"seeds": [0, 1], "base.progress": False, "base.steps": 2, "base.prompts": 2, "base.group_size": 2,
        "base.eval_tasks": 4, "base.eval_samples": 1, "base.max_turns": 3, "base.dynamic_sampling": False,
        "base.sft.steps": 5, "base.sft.tasks": 50, "base.sft.batch_size": 8}


@pytest.mark.slow
@pytest.mark.outcome
@pytest.mark.timeout(120)
def test_tiny_router_freeze_over_two_seeds(tmp_path):
    import torch

    from mimo_kit.rl.trajectory import load_jsonl

    cfg = ex.CompareConfig.preset("tiny").override({**TINY, "out_dir": str(tmp_path)})
    res = ex.router_freeze(cfg)
    json.dumps(res, allow_nan=False)  # the published file is strict JSON
    assert res["seeds"] == [0, 1] and res["late_frac"] == cfg.late_frac
    top = tmp_path / "rl-router-freeze"
    for arm, v in res["arms"].items():
        assert [r["seed"] for r in v["runs"]] == [0, 1]
        for r in v["runs"]:
            assert len(r["history"]) == 2 and r["sft_eval"] is not None and r["rl_eval"] is not None
            ran = json.loads((top / f"seed{r['seed']}" / arm / "summary.json").read_text())
            assert ran["config"]["seed"] == r["seed"]  # the seed replaced base.seed
        for key in ("heldout_pass_rate_sft", "heldout_pass_rate_rl", "late_pass_rate", "late_gen_tokens"):
            assert v["summary"][key] == ex.spread([r["scalars"][key] for r in v["runs"]])
            assert v["summary"][key]["n"] == 2
    for k in (0, 1):
        assert (top / f"seed{k}" / "sft.pt").is_file()
    # each seed trained its own policy, and the two seeds' rollouts differ: compared weight for weight and token for
    # token, which are equal only if the seed changed nothing (a count such as the mean length can coincide by chance)
    sft = [torch.load(top / f"seed{k}" / "sft.pt", weights_only=False)["model"] for k in (0, 1)]
    assert any(not torch.equal(sft[0][name], sft[1][name]) for name in sft[0])
    first = [[q.contexts[0].token_ids() for s in load_jsonl(top / f"seed{k}" / "frozen" / "trajectories" /
                                                            "step00001.jsonl") for q in s.sequences] for k in (0, 1)]
    assert first[0] and first[0] != first[1]
    probe = res["probe"]
    assert [r["seed"] for r in probe["runs"]] == [0, 1]
    assert set(probe["summary"]) == set(ex.PROBE_POLICIES)
    cv = [sum(r["loads"]["trainable"]["cv"]) / len(r["loads"]["trainable"]["cv"]) for r in probe["runs"]]
    assert probe["summary"]["trainable"]["cv"] == ex.spread(cv)
    assert probe["summary"]["sft"]["cv_L1"]["n"] == 2


def test_verdict_says_how_far_a_claim_holds():
    def verdict(a, b):
        return ex.agreement(_result({"a": a, "b": b}), "x", "a", "b").verdict("a below b")

    assert verdict([1.0, 1.0, 1.0], [2.0, 2.0, 2.0]).startswith("a below b: yes, on 3 of 3 seeds")
    assert "on the seed means only, 2 of 3 seeds agree" in verdict([1.0, 1.0, 3.0], [2.0, 2.0, 2.5])
    assert "not shown at this scale, 1 of 3 seeds agree" in verdict([1.0, 3.0, 3.0], [2.0, 2.0, 2.0])


def test_means_and_ranges_feed_whisker_bars():
    stats = {"a": ex.spread([1.0, 3.0]), "b": ex.spread([2.0])}
    means, ranges = ex.means_and_ranges(stats)
    assert means == {"a": 2.0, "b": 2.0} and ranges == {"a": (1.0, 3.0), "b": (2.0, 2.0)}
    ax = viz.bars(means, ranges=ranges)
    assert len(ax.containers) == 2  # the bars and their error bars
