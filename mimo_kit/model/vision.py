"""MiMo-ViT: a vision encoder of sink-augmented sliding-window attention, row/column order alternating (Report §2.2).

Report §2.2: 681M parameters, 28 layers (24 SWA + 4 GA). Instead of fixed non-overlapping windows, the local layers
use *sink-augmented* sliding-window attention over the patch sequence, and consecutive local layers alternate the
order in which the patch grid is read into a sequence, **row-major** then **column-major**, so that two local layers
already mix information along both image axes; a global (full) attention layer every ``global_every`` layers
connects the whole image.

Definitions the kit chooses (the report publishes none of them):

- **Bidirectional window.** The encoder is not causal: a query at sequence position i attends to the keys j with
  ``|i − j| <= window`` (``window`` positions on either side, itself included: ``2·window + 1`` keys in the
  interior, fewer at the sequence ends), plus the head's sink.
- **Sinks.** As in the decoder (:func:`mimo_kit.model.attention.sink_attention`), each SWA head h has a learned
  logit s_h: p_ij = e^(a_ij) / (Σ_j′∈window e^(a_ij′) + e^(s_h)), the sink column dropped after the softmax.
  Global layers have no sink, as the decoder's GA layers.
- **Orders.** Row-major reads grid cell (r, c) of an Hp × Wp grid at position r·Wp + c; column-major at c·Hp + r.
  Local layer k (counting local layers only) is row-major when k is even and column-major when k is odd; the
  permutation is undone after the layer, so every layer takes and returns the grid [B, Hp, Wp, D].
- **Variants** (``attention``, for the comparison experiment): ``"sink_swa"`` (the report's), ``"fixed_window"``
  (the grid cut into ``tile × tile`` tiles, attention only inside a tile, no sinks, no global layers) and
  ``"full"`` (full attention in every layer).
- **Positions.** Learned factorised embeddings, one per grid row plus one per grid column, added after the patch
  embedding (the report does not say how MiMo-ViT encodes positions).

Attention is computed densely (PyTorch's ``scaled_dot_product_attention`` with the mask and the sink as an additive
bias over [B, H, L, L + 1]): fine at toy scale, but it costs every variant L² scores whatever its window; the
report-shaped config is built on the meta device only (:func:`vit_parameter_count`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.model.decoder import DenseMLP, RMSNorm

ROW, COLUMN, GLOBAL, TILE = "row", "column", "global", "tile"
Attention = Literal["sink_swa", "fixed_window", "full"]


@dataclasses.dataclass
class ViTConfig(Config):
    image_size: int = knob(16, "tiny: 16×16 images, 2×2 patches → an 8×8 grid", min=1)
    in_channels: int = knob(3, "RGB", min=1)
    patch_size: int = knob(2, "tiny: 2×2 patches; report shape 14 (unpublished: the common ViT choice)", min=1)
    hidden_size: int = knob(32, "tiny: a forward pass in milliseconds", min=1)
    num_layers: int = knob(4, "tiny: 3 local layers and one global one", min=1)
    num_heads: int = knob(4, "attention heads", min=1)
    intermediate_size: int = knob(64, "SwiGLU FFN width (2 × hidden at tiny scale)", min=1)
    window: int = knob(2, "SWA keys on either side of a query (2·window + 1 in all); tiny: a quarter grid row", min=1)
    global_every: int = knob(7, "layer i is global when (i + 1) % global_every == 0: Report §2.2's 28 / 4 = 7; "
                                "0 = no global layer", min=0)
    attention: Attention = knob("sink_swa", "Report §2.2: sink SWA; fixed_window / full are the comparison's variants")
    alternate: bool = knob(True, "Report §2.2: local layers alternate row-major and column-major order")
    tile: int = knob(4, "fixed_window variant: tiles of tile × tile patches (tiny: 4 tiles of a 8×8 grid)", min=1)
    rms_norm_eps: float = knob(1e-6, "pre-norm epsilon, a common ViT value", min=0.0)
    initializer_range: float = knob(0.02, "std of the normal init, as the decoder's", min=0.0)

    PRESETS = {
        "tiny": dict(global_every=4),
        # Report §2.2: 28 layers, 24 SWA + 4 GA, 681M parameters. Width, heads, FFN, patch and window are not
        # published; hidden 1280 / 16 heads / SwiGLU 4608 (the width of common ~0.6B ViTs) gives 679.86M (681M: -0.2%).
        "report": dict(image_size=448, patch_size=14, hidden_size=1280, num_layers=28, num_heads=16,
                       intermediate_size=4608, window=64, global_every=7, tile=8),
    }

    def check(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"ViTConfig.num_heads: {self.num_heads} does not divide hidden_size="
                              f"{self.hidden_size}; expected a divisor")
        if self.image_size % self.patch_size:
            raise ConfigError(f"ViTConfig.patch_size: {self.patch_size} does not divide image_size="
                              f"{self.image_size}; expected a divisor")
        grid = self.image_size // self.patch_size
        if self.attention == "fixed_window" and grid % self.tile:
            raise ConfigError(f"ViTConfig.tile: {self.tile} does not divide the {grid} × {grid} patch grid; "
                              f"expected a divisor of {grid}")

    @property
    def grid(self) -> int:
        """Patches per side of the largest image: image_size / patch_size."""
        return self.image_size // self.patch_size

    @property
    def layer_kinds(self) -> list[str]:
        """Per layer: ``"row"`` / ``"column"`` (SWA in that order), ``"global"`` or ``"tile"`` (fixed windows)."""
        kinds, local = [], 0
        for i in range(self.num_layers):
            if self.attention == "full":
                kinds.append(GLOBAL)
            elif self.attention == "fixed_window":
                kinds.append(TILE)
            elif self.global_every and (i + 1) % self.global_every == 0:
                kinds.append(GLOBAL)
            else:
                kinds.append(COLUMN if self.alternate and local % 2 else ROW)
                local += 1
        return kinds


# ---- grid ↔ sequence ------------------------------------------------------------------------------------------
def to_sequence(grid: torch.Tensor, order: str) -> torch.Tensor:
    """grid [B, Hp, Wp, D] → sequence [B, Hp·Wp, D]: row-major (r·Wp + c) or column-major (c·Hp + r)."""
    B, Hp, Wp, D = grid.shape
    if order == ROW:
        return grid.reshape(B, Hp * Wp, D)
    if order == COLUMN:
        return grid.transpose(1, 2).reshape(B, Hp * Wp, D)
    raise ValueError(f"order: got {order!r}, expected {ROW!r} or {COLUMN!r}")


def to_grid(seq: torch.Tensor, height: int, width: int, order: str) -> torch.Tensor:
    """The inverse of :func:`to_sequence`: [B, Hp·Wp, D] in ``order`` → grid [B, Hp, Wp, D]."""
    B, L, D = seq.shape
    if L != height * width:
        raise ValueError(f"to_grid: sequence length {L} != height × width = {height} × {width}")
    if order == ROW:
        return seq.reshape(B, height, width, D)
    if order == COLUMN:
        return seq.reshape(B, width, height, D).transpose(1, 2)
    raise ValueError(f"order: got {order!r}, expected {ROW!r} or {COLUMN!r}")


def band_mask(length: int, window: int, device: torch.device | None = None) -> torch.Tensor:
    """Bidirectional SWA: allowed[i, j] = |i − j| <= window.  [L, L] bool"""
    if window < 1:
        raise ValueError(f"band_mask: window={window}; expected >= 1")
    i = torch.arange(length, device=device)
    return (i[:, None] - i[None, :]).abs() <= window


def tile_mask(height: int, width: int, tile: int, device: torch.device | None = None) -> torch.Tensor:
    """Fixed windows over the row-major sequence: allowed[p, q] = p and q lie in the same tile × tile tile."""
    if height % tile or width % tile:
        raise ValueError(f"tile_mask: tile={tile} does not divide the {height} × {width} grid")
    r = torch.arange(height, device=device).repeat_interleave(width) // tile  # [L] tile row of each cell
    c = torch.arange(width, device=device).repeat(height) // tile
    return (r[:, None] == r[None, :]) & (c[:, None] == c[None, :])


# ---- layers ---------------------------------------------------------------------------------------------------
class EncoderAttention(nn.Module):
    """Bidirectional multi-head attention with an optional per-head sink (no RoPE: positions are embedded)."""

    def __init__(self, hidden: int, heads: int, sinks: bool):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"EncoderAttention: heads={heads} does not divide hidden={hidden}")
        self.num_heads, self.head_dim = heads, hidden // heads
        self.scale = self.head_dim ** -0.5
        self.sinks = nn.Parameter(torch.zeros(heads)) if sinks else None
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """x [B, L, hidden]; allowed bool broadcastable to [B, H, 1, L, L] (None = all) → [B, L, hidden].

        The sink softmax of :func:`mimo_kit.model.attention.sink_attention`, computed by PyTorch's fused
        ``scaled_dot_product_attention``: the sink is one extra key whose score is the bias s_h and whose key and
        value are zero, so it takes e^(s_h) of the denominator and adds nothing to the output; a disallowed key
        gets the most negative finite bias (weight exactly 0; a row with no allowed key would be uniform, as in
        ``sink_attention``).
        """
        B, L, _ = x.shape
        H, D = self.num_heads, self.head_dim
        q = self.q_proj(x).view(B, L, H, D).transpose(1, 2)  # [B, H, L, D]
        k = self.k_proj(x).view(B, L, H, D).transpose(1, 2)
        v = self.v_proj(x).view(B, L, H, D).transpose(1, 2)
        bias = None
        if allowed is not None:
            allowed = allowed[:, :, 0] if allowed.dim() == 5 else allowed  # drop the decoder's group axis
            bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(
                ~allowed, torch.finfo(q.dtype).min)
        if self.sinks is not None:
            bias = torch.zeros((), dtype=q.dtype, device=q.device) if bias is None else bias
            bias = torch.broadcast_to(bias, (*torch.broadcast_shapes(bias.shape[:-2], (B, H)), L, L))
            sink = self.sinks.to(q.dtype).view(H, 1, 1).expand(*bias.shape[:-1], 1)
            bias = torch.cat([bias, sink], dim=-1)  # [B, H, L, L + 1]
            zero = q.new_zeros(B, H, 1, D)
            k, v = torch.cat([k, zero], dim=2), torch.cat([v, zero], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale)  # [B, H, L, D]
        return self.o_proj(out.transpose(1, 2).reshape(B, L, H * D))


class EncoderBlock(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + SwiGLU(norm(x)), on a sequence [B, L, hidden]."""

    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, sinks: bool):
        super().__init__()
        self.self_attn = EncoderAttention(hidden, heads, sinks)
        self.mlp = DenseMLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), allowed)
        return x + self.mlp(self.post_attention_layernorm(x))


class ViTLayer(nn.Module):
    """One MiMo-ViT layer of kind ``row`` / ``column`` (sink SWA), ``global`` or ``tile``, grid in and grid out."""

    def __init__(self, cfg: ViTConfig, kind: str):
        super().__init__()
        self.kind, self.window, self.tile = kind, cfg.window, cfg.tile
        self.block = EncoderBlock(cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg.rms_norm_eps,
                                  sinks=kind in (ROW, COLUMN))

    def forward(self, grid: torch.Tensor) -> torch.Tensor:
        """grid [B, Hp, Wp, D] → [B, Hp, Wp, D]."""
        _, Hp, Wp, _ = grid.shape
        if self.kind == GLOBAL:
            return to_grid(self.block(to_sequence(grid, ROW), None), Hp, Wp, ROW)
        if self.kind == TILE:
            allowed = tile_mask(Hp, Wp, self.tile, grid.device)
            return to_grid(self.block(to_sequence(grid, ROW), allowed), Hp, Wp, ROW)
        seq = to_sequence(grid, self.kind)  # row- or column-major, then the band over that order
        out = self.block(seq, band_mask(Hp * Wp, self.window, grid.device))
        return to_grid(out, Hp, Wp, self.kind)


class MiMoViT(nn.Module):
    """Image [B, C, H, W] → patch grid [B, H/p, W/p, hidden] after ``num_layers`` layers and a final norm."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.config = cfg
        p = cfg.patch_size
        self.patch_embed = nn.Conv2d(cfg.in_channels, cfg.hidden_size, kernel_size=p, stride=p, bias=False)
        self.row_embed = nn.Parameter(torch.zeros(cfg.grid, cfg.hidden_size))  # [Hp_max, D]
        self.col_embed = nn.Parameter(torch.zeros(cfg.grid, cfg.hidden_size))  # [Wp_max, D]
        self.layers = nn.ModuleList(ViTLayer(cfg, kind) for kind in cfg.layer_kinds)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, initializer_range) for matrices and position tables; ones for norms; zero sinks."""
        for name, p in self.named_parameters():
            if p.device.type == "meta":
                continue
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("sinks"):
                p.zero_()
            else:
                p.normal_(0.0, self.config.initializer_range)

    @classmethod
    def on_meta(cls, cfg: ViTConfig) -> MiMoViT:
        """The encoder's shapes without memory (the report-shaped config)."""
        with torch.device("meta"):
            return cls(cfg)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, C, H, W] → patch grid [B, H/p, W/p, D] with row and column embeddings added."""
        cfg = self.config
        if images.dim() != 4 or images.shape[1] != cfg.in_channels:
            raise ValueError(f"images: expected [batch, {cfg.in_channels}, height, width], got "
                             f"{tuple(images.shape)}")
        H, W = images.shape[-2:]
        if H % cfg.patch_size or W % cfg.patch_size:
            raise ValueError(f"images: {H} × {W} is not divisible by patch_size={cfg.patch_size}")
        if H > cfg.image_size or W > cfg.image_size:
            raise ValueError(f"images: {H} × {W} exceeds image_size={cfg.image_size}")
        grid = self.patch_embed(images).permute(0, 2, 3, 1)  # [B, Hp, Wp, D]
        Hp, Wp = grid.shape[1:3]
        return grid + self.row_embed[:Hp, None, :] + self.col_embed[None, :Wp, :]

    def encode_grid(self, grid: torch.Tensor) -> torch.Tensor:
        """The layers and the final norm on an embedded grid [B, Hp, Wp, D] → [B, Hp, Wp, D]."""
        if grid.dim() != 4 or grid.shape[-1] != self.config.hidden_size:
            raise ValueError(f"grid: expected [batch, Hp, Wp, {self.config.hidden_size}], got {tuple(grid.shape)}")
        if self.config.attention == "fixed_window" and (grid.shape[1] % self.config.tile
                                                        or grid.shape[2] % self.config.tile):
            raise ValueError(f"grid: {grid.shape[1]} × {grid.shape[2]} is not divisible by tile={self.config.tile}")
        for layer in self.layers:
            grid = layer(grid)
        return self.norm(grid)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.encode_grid(self.embed(images))


# ---- analysis -------------------------------------------------------------------------------------------------
def influence(model: MiMoViT, grid: torch.Tensor) -> torch.Tensor:
    """Which input patches reach which output patch: out[p, q] = ‖∂ (u · y_p) / ∂ x_q‖ ≠ 0 for a random u.

    grid [1, Hp, Wp, D] is the embedded input x; y = model.encode_grid(x). Returns a bool [Hp·Wp, Hp·Wp] matrix,
    both axes in row-major order (output patch p, input patch q). One backward pass per output patch.
    """
    if grid.dim() != 4 or grid.shape[0] != 1:
        raise ValueError(f"influence: expected one grid [1, Hp, Wp, D], got {tuple(grid.shape)}")
    x = grid.detach().clone().requires_grad_(True)
    y = model.encode_grid(x)  # [1, Hp, Wp, D]
    u = torch.randn(y.shape[-1], generator=torch.Generator().manual_seed(0), dtype=y.dtype)
    flat = (y[0] @ u).reshape(-1)  # [Hp·Wp]
    rows = []
    for p in range(flat.numel()):
        (g,) = torch.autograd.grad(flat[p], x, retain_graph=True)
        rows.append(g[0].abs().sum(-1).reshape(-1) != 0)
    return torch.stack(rows)


def vit_parameter_count(cfg: ViTConfig) -> dict[str, int]:
    """``{"total", "patch embedding", "positions", "attention", "sinks", "FFN", "norms"}`` on the meta device."""
    model = MiMoViT.on_meta(cfg)
    out = dict.fromkeys(("patch embedding", "positions", "attention", "sinks", "FFN", "norms"), 0)
    for name, p in model.named_parameters():
        group = ("patch embedding" if name.startswith("patch_embed") else "positions" if name.endswith("_embed")
                 else "norms" if "norm" in name else "sinks" if name.endswith("sinks")
                 else "attention" if ".self_attn." in name else "FFN")
        out[group] += p.numel()
    return {"total": sum(out.values()), **out}
