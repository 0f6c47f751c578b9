"""The kit's decoder against transformers' MiMoV2FlashForCausalLM (eager attention) on the same weights."""

import random

import pytest
import torch
from transformers import MiMoV2FlashForCausalLM

from mimo_kit.model import MiMoConfig, MiMoForCausalLM
from mimo_kit.model.hf import from_hf, split_mtp, to_hf


def random_config(seed: int) -> MiMoConfig:
    """A small random config that transformers can express (SWA KV heads = 2 × GA KV heads)."""
    rng = random.Random(seed)
    kv = rng.choice([1, 2])
    heads = 2 * kv * rng.choice([1, 2, 3])
    layers = rng.randint(2, 5)
    experts = rng.choice([4, 6, 8])
    return MiMoConfig(
        vocab_size=rng.choice([97, 128, 300]), hidden_size=rng.choice([32, 48, 64]), num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, swa_num_key_value_heads=2 * kv,
        head_dim=rng.choice([12, 16, 24]), v_head_dim=rng.choice([8, 12, 16]),
        intermediate_size=rng.choice([48, 64]), moe_intermediate_size=rng.choice([16, 24]),
        n_routed_experts=experts, num_experts_per_tok=rng.randint(1, min(4, experts)),
        sliding_window=rng.choice([2, 5, 8, 13]),
        global_layers=tuple(sorted({0} | {i for i in range(layers) if rng.random() < 0.3})),
        dense_layers=tuple(sorted({0} | ({layers - 1} if rng.random() < 0.3 else set()))),
        rope_theta=rng.choice([1e4, 5e6]), swa_rope_theta=rng.choice([1e4, 5e5]),
        partial_rotary_factor=rng.choice([0.334, 0.5, 1.0]), attention_value_scale=rng.choice([0.707, 1.0]),
        norm_topk_prob=rng.random() < 0.8)


def pair(cfg: MiMoConfig, seed: int):
    torch.manual_seed(seed)
    hf = MiMoV2FlashForCausalLM(to_hf(cfg)).eval()
    with torch.no_grad():  # transformers zero-inits sinks and the correction bias: make them matter
        for name, p in hf.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0, 1.0)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.05)
    kit = MiMoForCausalLM(cfg).eval()
    kit.load_state_dict(hf.state_dict())
    return hf, kit


@pytest.mark.parametrize("seed", range(6))
def test_logits_match_transformers_for_random_configs(seed, no_near_ties):
    cfg = random_config(seed)
    hf, kit = pair(cfg, seed)
    T = 3 * cfg.sliding_window + 7  # several windows long
    ids = torch.randint(0, cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref, out = hf(ids).logits, kit(ids).logits
    assert out.shape == (2, T, cfg.vocab_size)
    # the same maths along different kernels: equal to fp32 rounding (≤ 3e-7 on logits of size ~0.5), provided
    # rounding cannot flip an expert choice
    no_near_ties(kit, ids)
    assert (ref - out).abs().max().item() <= 1e-5
    short = ids[:, : max(1, cfg.sliding_window // 2)]  # shorter than the window too
    with torch.no_grad():
        assert (hf(short).logits - kit(short).logits).abs().max().item() <= 1e-5


@pytest.mark.parametrize("seed", range(6))
def test_cached_decoding_matches_full_forward(seed, no_near_ties):
    cfg = random_config(100 + seed)
    hf, kit = pair(cfg, seed)
    T = 3 * cfg.sliding_window + 5
    ids = torch.randint(0, cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(seed))
    no_near_ties(kit, ids)  # rounding cannot flip an expert choice, so the logits agree to rounding
    rng = random.Random(seed)
    with torch.no_grad():
        ref = hf(ids).logits
        cache, outs, t = kit.new_cache(), [], 0
        while t < T:  # random chunk sizes: prefill chunks and single-token decode steps mixed
            n = rng.choice([1, 1, 1, 2, cfg.sliding_window, 2 * cfg.sliding_window + 1])
            outs.append(kit(ids[:, t : t + n], cache).logits)
            t += n
    assert cache.seq_len == T
    assert (torch.cat(outs, 1) - ref).abs().max().item() <= 1e-5


def test_state_dict_keys_and_shapes_equal_transformers():
    cfg = random_config(7)
    hf = MiMoV2FlashForCausalLM(to_hf(cfg))
    kit = MiMoForCausalLM(cfg)
    a, b = hf.state_dict(), kit.state_dict()
    assert list(a) == list(b)
    assert all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)


def test_config_round_trip_through_transformers():
    for seed in range(5):
        cfg = random_config(seed)
        assert from_hf(to_hf(cfg)) == cfg
        assert from_hf(to_hf(cfg).to_dict()) == cfg
    flash = MiMoConfig.preset("flash")
    assert from_hf(to_hf(flash)).layer_types == flash.layer_types


def test_hub_style_config_json_window_and_mtp_split():
    cfg = from_hf({"model_type": "mimo_v2_flash", **{k: v for k, v in to_hf(MiMoConfig.preset("tiny")).to_dict().items()
                                                     if k != "sliding_window"}, "sliding_window_size": 128})
    assert cfg.sliding_window == 129
    backbone, mtp = split_mtp({"model.norm.weight": torch.ones(1), "model.mtp.0.x": torch.ones(1)})
    assert list(backbone) == ["model.norm.weight"] and list(mtp) == ["model.mtp.0.x"]


def test_export_refuses_what_transformers_cannot_express():
    with pytest.raises(ValueError, match="2 × GA KV heads"):
        to_hf(MiMoConfig.preset("pro"))
    bad = to_hf(MiMoConfig.preset("tiny")).to_dict()
    bad["layer_types"] = bad["layer_types"][:-1]
    with pytest.raises(ValueError, match="layer_types has 3 entries, expected num_hidden_layers=4"):
        from_hf(bad)


@pytest.mark.slow
def test_parameter_counts_match_transformers_on_meta():
    from mimo_kit.model import count_parameters

    with torch.device("meta"):
        hf = MiMoV2FlashForCausalLM(to_hf(MiMoConfig.preset("flash")))
    assert count_parameters(MiMoConfig.preset("flash"))["total"] == sum(p.numel() for p in hf.parameters())


def test_load_checkpoint_from_a_saved_transformers_folder(tmp_path, no_near_ties):
    from mimo_kit.model import load_checkpoint

    cfg = random_config(3)
    hf, _ = pair(cfg, 3)
    hf.save_pretrained(tmp_path)
    model, mtp = load_checkpoint(tmp_path)
    ids = torch.randint(0, cfg.vocab_size, (1, 20), generator=torch.Generator().manual_seed(3))
    no_near_ties(model, ids)
    with torch.no_grad():
        assert (model(ids).logits - hf(ids).logits).abs().max().item() <= 1e-5
    assert mtp == {}
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_checkpoint(tmp_path)
