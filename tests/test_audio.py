"""The audio path (Report §2.3): token-rate arithmetic, log-mel frames, RVQ, the patch encoder."""

import math

import matplotlib.pyplot as plt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.config import ConfigError
from mimo_kit.model.audio import (
    AudioConfig,
    AudioPatchEncoder,
    AudioTokenizer,
    ResidualVQ,
    log_mel,
    mel_filterbank,
    plot_error_curve,
    rvq_error_curve,
    synthetic_audio,
    token_rates,
)

CFG = AudioConfig.preset("tiny")


def encoder(**kw) -> AudioPatchEncoder:
    torch.manual_seed(0)
    return AudioPatchEncoder(AudioConfig.preset("tiny", **kw)).eval()


def codes(B: int, T: int, seed: int = 0, cfg: AudioConfig = CFG) -> torch.Tensor:
    return torch.randint(0, cfg.codebook_size, (B, T, cfg.levels), generator=torch.Generator().manual_seed(seed))


# ---- rates ----------------------------------------------------------------------------------------------------
def test_token_rates_are_the_reports_figures():
    r = token_rates()  # Report §2.3: 25 Hz × 20 levels; 4 frames per patch
    assert r["tokens_per_s"] == 500 and r["positions_per_s"] == 6.25 and r["ms_per_position"] == 160
    assert r["tokens_per_position"] == 80
    assert token_rates(50.0, 8, 2)["positions_per_s"] == 25 and token_rates(50.0, 8, 2)["tokens_per_s"] == 400
    with pytest.raises(ValueError, match="levels=0"):
        token_rates(25.0, 0, 4)


# ---- features -------------------------------------------------------------------------------------------------
def test_log_mel_frames_at_25_hz_and_a_tone_lands_in_its_mel_bin():
    t = torch.arange(16000) / 16000
    tones = torch.stack([torch.sin(2 * math.pi * f * t) for f in (200.0, 1000.0, 4000.0)])
    feats = log_mel(tones, CFG)
    assert feats.shape == (3, 25, CFG.n_mels)  # 1 s at 25 Hz
    fb = mel_filterbank(CFG.n_fft // 2 + 1, CFG.n_mels, 16000)
    assert (fb >= 0).all() and fb.shape == (513, CFG.n_mels)
    for i, f in enumerate((200.0, 1000.0, 4000.0)):
        fbin = round(f / 16000 * CFG.n_fft)
        assert int(feats[i, 5:20].mean(0).argmax()) in set(fb[fbin].nonzero().flatten().tolist())
    with pytest.raises(ValueError, match="samples >= 640"):
        log_mel(torch.zeros(1, 100), CFG)


# ---- RVQ ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_rvq_error_falls_with_levels_on_synthetic_audio(seed):
    fit, held = synthetic_audio(8, 4.0, seed=2 * seed), synthetic_audio(4, 4.0, seed=2 * seed + 1)
    tok = AudioTokenizer(CFG).fit(fit, seed=seed)
    for wave, bound in ((fit, 0.01), (held, 0.15)):  # stated fractions of the feature variance at 20 levels
        curve = rvq_error_curve(tok, wave)
        assert len(curve) == CFG.levels + 1
        assert all(a >= b for a, b in zip(curve, curve[1:])), curve  # non-increasing in levels
        assert curve[-1] < bound, curve
        assert curve[1] < 0.75 * curve[0]
    c = tok.encode(held)
    assert c.shape == (4, 100, CFG.levels) and c.dtype == torch.long
    assert int(c.min()) >= 0 and int(c.max()) < CFG.codebook_size


@settings(max_examples=20, deadline=None)
@given(levels=st.integers(1, 5), K=st.integers(1, 9), D=st.integers(1, 6), seed=st.integers(0, 1000))
def test_rvq_picks_the_nearest_codeword_of_each_residual(levels, K, D, seed):
    g = torch.Generator().manual_seed(seed)
    rvq = ResidualVQ(D, levels, K)
    rvq.codebooks.copy_(torch.randn(levels, K, D, generator=g))
    x = torch.randn(3, 5, D, generator=g, dtype=torch.float)
    got = rvq.encode(x)
    r = x
    for level in range(levels):
        dist = ((r[..., None, :] - rvq.codebooks[level]) ** 2).sum(-1)  # [3, 5, K] by brute force
        assert torch.allclose(dist.gather(-1, got[..., level:level + 1]), dist.min(-1, keepdim=True).values,
                              atol=1e-5)
        r = r - rvq.codebooks[level][got[..., level]]
    torch.testing.assert_close(rvq.decode(got), x - r, atol=1e-5, rtol=1e-5)

    xg = x.clone().requires_grad_(True)
    out, c, _ = rvq(xg)
    assert torch.equal(c, got)
    torch.testing.assert_close(out, rvq.decode(got))
    out.sum().backward()  # straight-through: d out / d x = identity
    assert torch.equal(xg.grad, torch.ones_like(x))


def test_rvq_rejects_bad_codes():
    rvq = ResidualVQ(4, 3, 8)
    with pytest.raises(ValueError, match="0..7"):
        rvq.decode(torch.full((2, 3), 8))
    with pytest.raises(ValueError, match="levels=4"):
        rvq.decode(torch.zeros(2, 3, dtype=torch.long), levels=4)
    with pytest.raises(ValueError, match="codebook_size=8"):
        rvq.fit(torch.randn(5, 4), iters=2)


# ---- patch encoder --------------------------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 13), B=st.integers(1, 3))
def test_patch_encoder_gives_one_backbone_embedding_per_four_frames(T, B):
    out, mask = encoder()(codes(B, T))
    assert out.shape == (B, math.ceil(T / 4), CFG.out_size) and mask.all()


def test_attention_stays_inside_a_patch():
    enc = encoder(num_layers=2)
    c = codes(1, 12)
    base, _ = enc(c)
    c2 = c.clone()
    c2[0, 5] = (c2[0, 5] + 1) % CFG.codebook_size  # frame 5 lies in patch 1 (frames 4..7)
    changed, _ = enc(c2)
    moved = (changed - base).abs().amax(-1)[0]
    assert moved[1] > 0 and moved[0] == 0 and moved[2] == 0


def test_padded_and_masked_frames_do_not_matter():
    enc = encoder()
    c = codes(2, 6)
    short, _ = enc(c)  # 6 frames → patches of 4 + 2 (padded)
    longer = torch.cat([c, codes(2, 2, seed=9)], dim=1)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[:, 6:] = False
    masked, pmask = enc(longer, mask)
    torch.testing.assert_close(masked, short)
    assert pmask.all()
    with pytest.raises(ValueError, match="expected \\[batch, frames, 20\\]"):
        enc(codes(1, 4)[..., :3])
    with pytest.raises(ValueError, match="0..31"):
        enc(torch.full((1, 4, 20), 32))


@pytest.mark.parametrize("overrides, field", [
    (dict(frame_rate=30.0), "frame_rate"), (dict(n_fft=256), "n_fft"), (dict(num_heads=5), "num_heads"),
    (dict(levels=0), "levels"),
])
def test_bad_audio_configs_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        AudioConfig.preset("tiny", **overrides)


def test_error_curve_figure_draws_one_line_per_curve():
    ax = plot_error_curve({"fit": [1.0, 0.3, 0.1], "held out": [1.0, 0.5, 0.3]})
    assert [list(line.get_ydata()) for line in ax.get_lines()] == [[1.0, 0.3, 0.1], [1.0, 0.5, 0.3]]
    assert ax.get_yscale() == "log"
    plt.close(ax.figure)
