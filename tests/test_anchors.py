"""Decoder anchors: the bytes a decode step must read, the per-step clock, the rows (Report §2)."""

import pytest
import torch

from mimo_kit.model import MiMoConfig
from mimo_kit.model.anchors import StepClock, anchor_rows, anchors_markdown, step_bytes
from mimo_kit.model.config import FULL
from mimo_kit.model.decoder import MiMoForCausalLM


@pytest.fixture(scope="module")
def kit():
    torch.manual_seed(0)
    return MiMoForCausalLM(MiMoConfig.preset("tiny")).eval()


def test_step_bytes_counts_weights_chosen_experts_and_kv_by_hand(kit):
    cfg = kit.config
    expert = sum(p.numel() * 4 for n, p in kit.named_parameters() if ".experts." in n)
    dense = sum(p.numel() * 4 for n, p in kit.named_parameters() if ".experts." not in n and "embed" not in n)
    per_token_kv = sum((C := 100) * cfg.num_key_value_heads if t == FULL else
                       min(C, cfg.sliding_window) * cfg.swa_num_key_value_heads for t in cfg.layer_types)
    per_token_kv *= (cfg.head_dim + cfg.v_head_dim) * 4
    one = dense + cfg.hidden_size * 4 + expert * cfg.num_experts_per_tok / cfg.n_routed_experts + per_token_kv
    assert step_bytes(kit, 1, 100) == pytest.approx(one, rel=1e-9)
    # more sequences touch more experts (never more than all of them) and read more KV; longer contexts more KV
    sizes = [step_bytes(kit, b, 100) for b in (1, 2, 8, 64)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    assert step_bytes(kit, 1000, 1) - 1000 * step_bytes(kit, 1, 1) < 0  # the weights are shared by the batch
    assert step_bytes(kit, 1, 400) > step_bytes(kit, 1, 100)


def test_step_clock_leaves_out_the_prompt_and_first_step():
    clock = StepClock()
    clock.times = [0.0, 5.0, 5.1, 5.3, 5.4]  # the prompt, prefill's token, the first step, then steps of 0.2, 0.1
    assert clock.median_step() == pytest.approx(0.15)
    with pytest.raises(ValueError, match="fewer than three"):
        StepClock().median_step()


@pytest.mark.slow
def test_rows_are_timed_against_the_bound(kit):
    from transformers import MiMoV2FlashForCausalLM

    from mimo_kit.model.hf import to_hf

    hf = MiMoV2FlashForCausalLM(to_hf(kit.config)).eval()
    hf.config._attn_implementation = "eager"
    hf.load_state_dict(kit.state_dict())
    rows, bw = anchor_rows(kit, hf, ((2, 32),), tokens=4, repeats=1, bandwidth=1e10,
                           paths=("kit eager", "transformers eager"))
    assert [r.path for r in rows] == ["kit eager", "transformers eager"] and bw == 1e10
    for r in rows:
        assert r.step_s > 0 and r.bound_tok_s == pytest.approx(2 * 1e10 / step_bytes(kit, 2, 32))
        assert 0 < r.share_of_bound  # a share of a bound: measured / (batch × bandwidth / bytes)
    table = anchors_markdown(rows, bw)
    assert "| 2 @ 32 | kit eager |" in table and "1.00×" in table and "10.0 GB/s" in table
    with pytest.raises(ValueError, match="expected 'kit eager'"):
        anchor_rows(kit, hf, ((1, 8),), paths=("transformers eager",))
