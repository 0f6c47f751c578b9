"""MXFP4 per the OCP MX spec: hand-computed vectors, packing, round trips, STE, QAT/PTQ of the experts.

Values are compared bit for bit throughout: every dequantised value is a grid point times a power of two, exactly
representable in fp32, and the quantiser is elementwise (no sums whose rounding could depend on blocking).
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.model import MiMoConfig, MiMoForCausalLM
from mimo_kit.optim.mxfp4 import (
    BLOCK,
    dequantize_mxfp4,
    e2m1_decode,
    e2m1_encode,
    pack_nibbles,
    qat_experts,
    qdq,
    qdq_ste,
    quantize_experts_,
    quantize_mxfp4,
    shared_exponent,
    unpack_nibbles,
)


def block(*values: float) -> torch.Tensor:
    """One 32-element block: the given values, then zeros."""
    return torch.tensor(list(values) + [0.0] * (BLOCK - len(values)))


def test_e2m1_grid_exact_values_round_trip():
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    x = torch.tensor(grid + [-g for g in grid[1:]])
    codes = e2m1_encode(x)
    assert codes[:8].tolist() == list(range(8))
    assert codes[8:].tolist() == [8 + i for i in range(1, 8)]  # sign bit 3
    assert torch.equal(e2m1_decode(codes), x)


def test_ties_round_to_the_even_code():
    # midpoints between neighbours; the even code wins: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_decode(e2m1_encode(x)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert e2m1_decode(e2m1_encode(-x)).tolist() == [0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]


def test_nearest_and_saturation():
    x = torch.tensor([0.26, 0.74, 2.4, 2.6, 4.9, 5.1, 6.5, 100.0, -7.9])
    assert e2m1_decode(e2m1_encode(x)).tolist() == [0.5, 0.5, 2.0, 3.0, 4.0, 6.0, 6.0, 6.0, -6.0]


def test_shared_scale_is_floor_log2_amax_minus_2():
    # amax 6 → 2^(2-2) = 1; amax 7 → 1 (7 saturates to 6); amax 8 → 2; amax 0.1 → 2^(-4-2)
    blocks = torch.stack([block(6.0), block(-7.0), block(8.0, 1.0), block(0.1)])
    assert shared_exponent(blocks).tolist() == [0, 0, 1, -6]


def test_hand_computed_block():
    # amax 3.0 → scale 2^(1-2) = 0.5; values / 0.5 = [6, -1, 0.5, 1.25 (tie → 1), 5.5 (→ 6), 0.3 (→ 0.5)]
    x = block(3.0, -0.5, 0.25, 0.625, 2.75, 0.15)
    expected = block(3.0, -0.5, 0.25, 0.5, 3.0, 0.25)
    assert torch.equal(qdq(x), expected)
    q = quantize_mxfp4(x)
    assert q.scales.tolist() == [127 - 1]  # biased E8M0 of 2^-1
    assert torch.equal(q.dequantize(), expected)


def test_saturation_within_a_block():
    # amax 7.5 → scale 1: 7.5 and 6.9 saturate to 6 (no overflow to inf or to the next binade)
    assert qdq(block(7.5, 6.9, -7.9)).tolist()[:3] == [6.0, 6.0, -6.0]


def test_zero_block_and_negative_zero():
    x = torch.zeros(2, BLOCK)
    x[1, 3] = -0.0
    q = quantize_mxfp4(x)
    assert q.scales.tolist() == [[0], [0]]  # exponent -127, the smallest E8M0
    assert torch.equal(q.dequantize(), torch.zeros(2, BLOCK))
    assert unpack_nibbles(q.packed).max().item() == 0  # -0 stored as +0


def test_blocks_are_independent():
    # a huge value in block 0 must not change block 1's scale
    x = torch.cat([block(1000.0), block(1.0, 0.5)])
    assert torch.equal(qdq(x)[BLOCK:], block(1.0, 0.5))


def test_padding_of_a_partial_last_block():
    x = torch.linspace(-3, 3, 40)  # one full block + 8 values
    q = quantize_mxfp4(x)
    assert q.packed.shape == (2, 16) and q.scales.shape == (2,)
    assert q.dequantize().shape == (40,)
    assert torch.equal(q.dequantize(), qdq(x))


def test_nibble_packing_order_and_round_trip():
    codes = torch.tensor([1, 2, 15, 0, 8, 7], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [1 | 2 << 4, 15 | 0 << 4, 8 | 7 << 4]
    assert torch.equal(unpack_nibbles(packed), codes)
    all_codes = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(pack_nibbles(unpack_nibbles(all_codes)), all_codes)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="non-finite"):
        qdq(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="0..15"):
        pack_nibbles(torch.tensor([16, 0], dtype=torch.uint8))
    with pytest.raises(TypeError, match="floating-point"):
        quantize_mxfp4(torch.tensor([1, 2]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=100),
       st.integers(-20, 20))
def test_round_trip_properties(values, exp):
    x = torch.tensor(values) * 2.0**exp
    q = quantize_mxfp4(x)
    y = dequantize_mxfp4(q)
    assert torch.equal(y, qdq(x))  # packed storage = QDQ
    assert torch.equal(qdq(y), y)  # idempotent: dequantised values are representable
    assert q.nbytes == math.ceil(len(values) / BLOCK) * 17  # 16 bytes of nibbles + 1 scale per block
    # error bound per block: half the widest grid gap (2X) within ±6X, plus the saturation distance beyond
    n = len(values)
    pad = (-n) % BLOCK
    xb = torch.nn.functional.pad(x, (0, pad)).view(-1, BLOCK)
    scale = torch.exp2(shared_exponent(xb).float())[:, None]
    err = (torch.nn.functional.pad(y - x, (0, pad)).view(-1, BLOCK)).abs()
    bound = torch.maximum(scale, xb.abs() - 6 * scale)
    assert (err <= bound + 1e-6 * xb.abs()).all()
    assert (torch.sign(y) * torch.sign(x) >= 0).all()  # never flips the sign


def test_straight_through_gradient():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    out = qdq_ste(x)
    assert torch.equal(out.detach(), qdq(x.detach()))  # x + (q − x): q − x is exact in fp32, so this is q again
    (out * torch.arange(64.0)).sum().backward()
    assert torch.equal(x.grad, torch.arange(64.0).expand(4, 64))  # identity backward: the upstream gradient itself


def test_qat_context_reads_experts_through_qdq_and_restores():
    torch.manual_seed(0)
    model = MiMoForCausalLM(MiMoConfig.preset("tiny"))
    experts = model.moe_layers()[0].experts
    original = experts.gate_up_proj
    keys = list(model.state_dict())
    x = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(0))
    with qat_experts(model):
        assert torch.equal(experts.gate_up_proj, qdq(original.detach()))
        model(x).logits.sum().backward()
    assert experts.gate_up_proj is original and original.grad is not None  # the optimiser's tensor got the grad
    assert list(model.state_dict()) == keys


def test_ptq_quantises_every_expert_weight():
    torch.manual_seed(0)
    model = MiMoForCausalLM(MiMoConfig.preset("tiny"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sizes = quantize_experts_(model)
    for n, p in model.named_parameters():
        if n.endswith(("gate_up_proj", "down_proj")) and ".experts." in n:
            assert torch.equal(p, qdq(before[n])) and not torch.equal(p, before[n])
        else:
            assert torch.equal(p, before[n])  # not written
    assert sizes["mxfp4_bytes"] * 3.7 < sizes["bf16_bytes"]  # 4.25 bits vs 16
