"""MiMo-ViT (Report §2.2): receptive fields of order alternation, sink attention, the grid orders, the variants."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.config import ConfigError
from mimo_kit.model.vision import (
    COLUMN,
    ROW,
    EncoderAttention,
    MiMoViT,
    ViTConfig,
    band_mask,
    influence,
    to_grid,
    to_sequence,
    vit_parameter_count,
)


def model(**kw) -> MiMoViT:
    torch.manual_seed(0)
    return MiMoViT(ViTConfig.preset("tiny", **kw)).double()


def grid(height: int, width: int, dim: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, height, width, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.double)


def band(height: int, width: int, window: int, order: str) -> torch.Tensor:
    """Reference: allowed[p, q] (p, q row-major cells) = |pos(p) − pos(q)| <= window in the given reading order."""
    r, c = torch.arange(height).repeat_interleave(width), torch.arange(width).repeat(height)
    pos = r * width + c if order == ROW else c * height + r
    return (pos[:, None] - pos[None, :]).abs() <= window


def compose(*layers: torch.Tensor) -> torch.Tensor:
    """Reach of a stack of layers (first layer first): out p ← in q iff a path p ← … ← q exists."""
    reach = layers[0].long()
    for m in layers[1:]:
        reach = ((m.long() @ reach) > 0).long()
    return reach.bool()


def cells(row: torch.Tensor, width: int) -> set[tuple[int, int]]:
    return {(int(q) // width, int(q) % width) for q in row.nonzero().flatten()}


# ---- (a) receptive field ----------------------------------------------------------------------------------------
def test_alternation_crosses_windows_along_rows_and_columns_in_two_layers():
    H = W = 8
    alt = influence(model(num_layers=2, global_every=0, window=1, alternate=True), grid(H, W))
    assert torch.equal(alt, compose(band(H, W, 1, ROW), band(H, W, 1, COLUMN)))
    reach = cells(alt[3 * W + 3], W)  # interior patch (3, 3)
    assert {r for r, _ in reach} == {2, 3, 4} and {c for _, c in reach} == {2, 3, 4}
    assert {(2, 2), (4, 4), (2, 4), (4, 2)} <= reach  # a diagonal step needs both axes

    same = influence(model(num_layers=2, global_every=0, window=1, alternate=False), grid(H, W))
    assert torch.equal(same, compose(band(H, W, 1, ROW), band(H, W, 1, ROW)))
    for r in range(H):
        for c in range(2, W - 2):  # away from the row ends, where row-major order wraps to the next row
            assert cells(same[r * W + c], W) == {(r, c + d) for d in range(-2, 3)}  # one axis only


@settings(max_examples=6, deadline=None)
@given(height=st.integers(2, 6), width=st.integers(2, 6), window=st.integers(1, 3), layers=st.integers(1, 3),
       seed=st.integers(0, 100))
def test_influence_is_exactly_the_composed_bands(height, width, window, layers, seed):
    m = model(num_layers=layers, global_every=0, window=window, hidden_size=8, num_heads=2, intermediate_size=8)
    got = influence(m, grid(height, width, dim=8, seed=seed))
    orders = [ROW if i % 2 == 0 else COLUMN for i in range(layers)]
    assert torch.equal(got, compose(*(band(height, width, window, o) for o in orders)))


def test_a_global_layer_connects_every_patch():
    m = model()  # tiny: row, column, row, global
    assert m.config.layer_kinds == [ROW, COLUMN, ROW, "global"]
    assert influence(m, grid(4, 4)).all()
    assert influence(model(attention="full", num_layers=1), grid(4, 4)).all()


# ---- (b) sink attention -----------------------------------------------------------------------------------------
@settings(max_examples=10, deadline=None)
@given(L=st.integers(1, 12), window=st.integers(1, 5), seed=st.integers(0, 1000))
def test_sink_attention_equals_the_hand_reference(L, window, seed):
    torch.manual_seed(seed)
    attn = EncoderAttention(16, 4, sinks=True).double()
    with torch.no_grad():
        attn.sinks.normal_(0.0, 2.0)
    x = torch.randn(2, L, 16, dtype=torch.double)
    allowed = band_mask(L, window)
    out = attn(x, allowed)

    H, D = 4, 4
    q = (x @ attn.q_proj.weight.T).view(2, L, H, D).transpose(1, 2)  # [B, H, L, D]
    k = (x @ attn.k_proj.weight.T).view(2, L, H, D).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T).view(2, L, H, D).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) / D ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = attn.sinks.detach()[None, :, None, None].expand(2, H, L, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # [B, H, L, L], sink dropped
    assert (probs.sum(-1) < 1).all()  # the sink absorbed some mass
    ref = (probs @ v).transpose(1, 2).reshape(2, L, H * D) @ attn.o_proj.weight.T
    torch.testing.assert_close(out, ref)


def test_swa_layers_carry_sinks_and_global_layers_do_not():
    m = model()
    has = [layer.block.self_attn.sinks is not None for layer in m.layers]
    assert has == [True, True, True, False]
    assert all(layer.block.self_attn.sinks is None for layer in model(attention="fixed_window").layers)


# ---- (c) the grid orders ----------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(height=st.integers(1, 12), width=st.integers(1, 12), dim=st.integers(1, 4), seed=st.integers(0, 1000))
def test_row_and_column_orders_round_trip(height, width, dim, seed):
    g = torch.randn(2, height, width, dim, generator=torch.Generator().manual_seed(seed))
    for order in (ROW, COLUMN):
        assert torch.equal(to_grid(to_sequence(g, order), height, width, order), g)
    r, c = seed % height, (seed // 7) % width
    assert torch.equal(to_sequence(g, ROW)[:, r * width + c], g[:, r, c])
    assert torch.equal(to_sequence(g, COLUMN)[:, c * height + r], g[:, r, c])


# ---- (d) fixed windows ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layers", [1, 4])
def test_fixed_windows_never_cross_a_tile(layers):
    H = W = 8
    got = influence(model(attention="fixed_window", tile=4, num_layers=layers), grid(H, W))
    r, c = torch.arange(H).repeat_interleave(W) // 4, torch.arange(W).repeat(H) // 4
    same_tile = (r[:, None] == r[None, :]) & (c[:, None] == c[None, :])
    assert torch.equal(got, same_tile)


# ---- shapes, parameter count, bad input ---------------------------------------------------------------------
def test_image_to_grid_shapes_and_the_report_parameter_count():
    out = model()(torch.randn(2, 3, 16, 16, dtype=torch.double))
    assert out.shape == (2, 8, 8, 32)
    cfg = ViTConfig.preset("report")
    kinds = cfg.layer_kinds
    assert len(kinds) == 28 and kinds.count("global") == 4 and kinds.count(ROW) + kinds.count(COLUMN) == 24
    total = vit_parameter_count(cfg)["total"]
    assert abs(total - 681e6) / 681e6 < 0.01, total  # Report §2.2: 681M


@pytest.mark.parametrize("overrides, field", [
    (dict(window=0), "window"),
    (dict(patch_size=3), "patch_size"),
    (dict(num_heads=3), "num_heads"),
    (dict(attention="fixed_window", tile=3), "tile"),
    (dict(attention="tiles"), "attention"),
    (dict(global_every=-1), "global_every"),
])
def test_bad_configs_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        ViTConfig.preset("tiny", **overrides)


def test_bad_inputs_raise_clear_errors():
    m = model()
    with pytest.raises(ValueError, match="expected \\[batch, 3"):
        m(torch.randn(1, 1, 16, 16, dtype=torch.double))
    with pytest.raises(ValueError, match="patch_size=2"):
        m(torch.randn(1, 3, 15, 16, dtype=torch.double))
    with pytest.raises(ValueError, match="image_size=16"):
        m(torch.randn(1, 3, 18, 18, dtype=torch.double))
    with pytest.raises(ValueError, match="tile=4"):
        model(attention="fixed_window").encode_grid(grid(6, 8))
    with pytest.raises(ValueError, match="window=0"):
        band_mask(4, 0)
    with pytest.raises(ValueError, match="order"):
        to_sequence(grid(2, 2), "diagonal")
