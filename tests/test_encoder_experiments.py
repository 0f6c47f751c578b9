"""Chapter 2c's experiments (Report §2.2–2.3) on miniature configs: the bar task's construction, the cost model,
the fixed-window additivity that keeps that variant at chance, the runs, their tables and figures, bad configs."""

import dataclasses

import pytest
import torch

from mimo_kit.config import ConfigError
from mimo_kit.experiments import discover
from mimo_kit.model.encoder_experiments import (
    VARIANTS,
    RVQLevelsConfig,
    ViTWindowsConfig,
    _Classifier,
    attention_pairs,
    bar_images,
    run_rvq_levels,
    run_vit_windows,
    rvq_levels_figure,
    rvq_levels_table,
    vit_windows_figure,
    vit_windows_table,
)
from mimo_kit.model.vision import ViTConfig, band_mask
from mimo_kit.solutions.ch02c import solution

VIT = ViTConfig.preset("tiny", in_channels=1)  # 16 px, patch 2, tiles of 4 patches = 8 px: boundary at 8


# ---- the task -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bar_images_are_balanced_and_each_segment_stays_in_its_tile(seed):
    images, labels = bar_images(64, VIT, seed=seed, noise=0.0)
    assert images.shape == (64, 1, 16, 16) and labels.shape == (64,)
    assert int(labels.sum()) == 32
    for img, y in zip(images[:, 0], labels):
        horizontal = bool((img.sum(1) > 0).sum() <= 2)  # bar pixels on at most two rows
        a = img if horizontal else img.T  # rows: segment rows; columns: along the bar
        left, right = a[:, :8], a[:, 8:]
        rows_l, rows_r = left.sum(1).nonzero().flatten(), right.sum(1).nonzero().flatten()
        assert len(rows_l) == 1 and len(rows_r) == 1  # one segment on each side of the boundary
        assert bool(left[rows_l[0], 7]) and bool(right[rows_r[0], 0])  # both touch the boundary
        assert int(left.sum()) >= 3 and int(right.sum()) >= 3
        assert bool(y) == (int(rows_l[0]) == int(rows_r[0]))
        if not y:
            assert abs(int(rows_l[0]) - int(rows_r[0])) in (2, 3, 4)
    again, labels2 = bar_images(64, VIT, seed=seed, noise=0.0)
    assert torch.equal(again, images) and torch.equal(labels2, labels)
    noisy, _ = bar_images(64, VIT, seed=seed + 10)
    assert not torch.equal(noisy, bar_images(64, VIT, seed=seed + 11)[0])


def test_fixed_windows_are_additive_across_tiles_and_sink_swa_is_not():
    """The reason fixed windows stay at chance: with a mean-pool head the logit of a fixed-window model is a sum of
    per-tile terms, so swapping the right segments between two images leaves the sum of the two logits unchanged.
    Alignment flips under that swap (aligned + aligned ↔ misaligned + misaligned), so no such model separates it."""
    def pair(y_left, y_right):
        img = torch.zeros(1, 1, 16, 16, dtype=torch.double)
        img[0, 0, y_left, 3:8] = 1.0
        img[0, 0, y_right, 8:13] = 1.0
        return img

    for variant, additive in (("fixed_window", True), ("sink_swa", False), ("full", False)):
        torch.manual_seed(0)
        model = _Classifier(dataclasses.replace(VIT, attention=variant)).double().eval()
        with torch.no_grad():
            same = model(pair(4, 4)) + model(pair(11, 11))  # two aligned bars
            swapped = model(pair(4, 11)) + model(pair(11, 4))  # the same segments, misaligned
        assert torch.allclose(same, swapped, atol=1e-9) == additive, variant


def test_attention_pairs_follow_the_config():
    L = VIT.grid ** 2
    band = int(band_mask(L, VIT.window).sum())  # reference: count the allowed pairs of the mask
    sink = attention_pairs(VIT)  # tiny: row, column, row, global
    assert sink["per_layer"] == [band, band, band, L * L] and sink["pairs"] == 3 * band + L * L
    fixed = attention_pairs(dataclasses.replace(VIT, attention="fixed_window"))
    assert fixed["per_layer"] == [L * 16] * 4  # every query sees its 4 × 4 tile
    full = attention_pairs(dataclasses.replace(VIT, attention="full"))
    assert full["pairs"] == full["full_pairs"] == 4 * L * L
    assert full["attention_flops"] == 4 * full["pairs"] * VIT.hidden_size
    assert fixed["pairs"] < sink["pairs"] < full["pairs"]


# ---- the runs -------------------------------------------------------------------------------------------------
def test_vit_windows_runs_on_a_miniature_config():
    cfg = ViTWindowsConfig.preset("mini")
    res = run_vit_windows(cfg)
    assert res["seeds"] == [0, 1, 2] and res["variants"] == list(VARIANTS)
    for v in VARIANTS:
        assert len(res["runs"][v]) == 3 and [r["seed"] for r in res["runs"][v]] == [0, 1, 2]
        for r in res["runs"][v]:
            assert 0.0 <= r["test_accuracy"] <= 1.0 and 0.0 <= r["train_accuracy"] <= 1.0
            assert len(r["loss"]) == cfg.steps and r["seconds_per_step"] > 0
            assert [s for s, _ in r["accuracy_curve"]] == [2, 4]
        s = res["summary"][v]["test_accuracy"]
        assert s["values"] == [r["test_accuracy"] for r in res["runs"][v]] and s["min"] <= s["mean"] <= s["max"]
    assert 0 <= res["sink_ge_fixed"]["agree"] <= 3
    table = vit_windows_table(res)
    assert "fixed windows" in table and "seed 2" in table and table.count("\n| ") >= 7
    axes = vit_windows_figure(res)
    assert len(axes[0].get_lines()) >= 3
    import matplotlib.pyplot as plt

    plt.close(axes[0].figure)


def test_the_same_seed_gives_the_same_run():
    cfg = ViTWindowsConfig.preset("mini", seeds=1, variants=["fixed_window"])
    a, b = run_vit_windows(cfg), run_vit_windows(cfg)
    assert a["runs"]["fixed_window"][0]["loss"] == b["runs"]["fixed_window"][0]["loss"]


def test_rvq_levels_runs_on_a_miniature_config():
    cfg = RVQLevelsConfig.preset("mini")
    res = run_rvq_levels(cfg)
    assert res["seeds"] == [0, 1, 2] and res["levels"] == [0, 1, 2, 3, 4]
    for name in ("fit", "held out"):
        assert len(res["curves"][name]) == 3
        for curve in res["curves"][name]:  # 0 levels: x̂ = 0, so the error is Σ‖x‖² / Σ‖x − x̄‖² >= 1
            assert len(curve) == 5 and curve[0] >= 1.0 - 1e-5
            if name == "fit":  # the features are normalised with the fit data's mean: x̄ = 0 there
                assert abs(curve[0] - 1.0) < 1e-4
    for curve in res["curves"]["fit"]:
        assert all(a >= b - 1e-6 for a, b in zip(curve, curve[1:])), curve  # never worse on the fit data
    assert res["rates"]["tokens_per_s"] == 25 * 4
    assert "| 4 |" in rvq_levels_table(res)
    ax = rvq_levels_figure(res)
    assert ax.get_yscale() == "log" and len(ax.get_lines()) == 2
    import matplotlib.pyplot as plt

    plt.close(ax.figure)


def test_both_experiments_are_registered_and_publish_to_data_model():
    exps = discover()
    for name, stem in (("vit-windows", "encoders_vit_windows"), ("rvq-levels", "encoders_rvq_levels")):
        assert exps[name].chapter == "ch02c"
        assert [p.dest for p in exps[name].publishes] == [f"model/{stem}_{{preset}}.{ext}"
                                                          for ext in ("json", "md", "png")]


# ---- bad input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, match", [
    (dict(variants=["full", "full"]), "variants"),
    (dict(variants=["tiles"]), "variants"),
    (dict(n_train=30), "n_train: 30"),
    (dict(seeds=0), "seeds"),
    ({"vit.in_channels": 3}, "in_channels: 3"),
    ({"vit.tile": 8}, "vit.tile: 8"),
])
def test_bad_vit_windows_configs_name_the_field(overrides, match):
    with pytest.raises(ConfigError, match=match):
        ViTWindowsConfig.preset("mini", **overrides)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="n=6"):
        bar_images(6, VIT, seed=0)
    with pytest.raises(ValueError, match="offsets"):
        bar_images(8, VIT, seed=0, offsets=(0,))
    with pytest.raises(ConfigError, match="fit_clips: 1"):
        RVQLevelsConfig.preset("mini", fit_clips=1, seconds=0.2)
    with pytest.raises(ValueError, match="exercises 1–5, not 6"):
        solution(6)
