"""Hybrid attention: global attention (GA) and sliding-window attention (SWA) with learned sinks (Report §2).

- **Partial RoPE.** Only the first ``rotary_dim`` of the ``head_dim`` q/k dims rotate (Flash: 64 of 192), with
  theta 5e6 on GA layers and 1e4 on SWA layers.
- **Value scaling.** Values are multiplied by ``attention_value_scale`` (0.707) before they enter the cache.
- **Sinks.** Each SWA head has a learned logit s_h that joins the softmax and is then dropped:

  .. math:: p_{ij} = \\frac{e^{a_{ij}}}{\\sum_{j'} e^{a_{ij'}} + e^{s_h}}

  so a head can put weight "nowhere" instead of on an arbitrary token of its window.
- **SWA cost is linear in length.** Queries are cut into blocks of ``C`` positions; a block sees only the
  ``C + W − 1`` keys its band can reach, so scores are ``[T, C + W − 1]`` instead of ``[T, T]``.
- GA uses ``torch.nn.functional.scaled_dot_product_attention`` (a fused CPU/GPU kernel, no T×T matrix in memory
  on backends that support it).

Two kernels compute the same layer (``MiMoConfig.attention_kernel``):

- ``"eager"``, the reference: SDPA for GA, the blocked SWA above, the sink as an extra softmax column.
- ``"flex"``: ``torch.nn.attention.flex_attention`` for both layer types, compiled on CUDA. The window is a block
  mask (tiles outside the band are never visited), GA the causal block mask. The sink cannot be a column of a
  fused kernel, so it enters after it through the kernel's log-sum-exp ℓ_i = log Σ_j e^{a_ij}:

  .. math:: o_i^{\\text{sink}} = \\frac{\\sum_j e^{a_{ij}} v_j}{e^{\\ell_i} + e^{s_h}}
            = o_i \\cdot \\sigma(\\ell_i - s_h)

  which is differentiable in ℓ, hence in q, k and s_h.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from mimo_kit.model.cache import LayerCache
from mimo_kit.model.config import SLIDING, MiMoConfig

ATTENTION_KERNELS = ("eager", "flex")


# ---- rotary embedding ---------------------------------------------------------------------------------------------
def rope_inv_freq(cfg: MiMoConfig, theta: float) -> torch.Tensor:
    """Inverse frequencies θ^{-2i/d} for the rotary part, d = int(head_dim · partial_rotary_factor).  [d/2]"""
    dim = int(cfg.head_dim * cfg.partial_rotary_factor)
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos/sin tables for ``positions`` [T] → [T, rotary_dim] each (the half-frequencies repeated twice)."""
    freqs = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]  # [T, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of x [B, heads, T, D] by the rotate-half convention; keep the rest."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x_rot * cos + rotated * sin, x_pass), dim=-1)


# ---- attention kernels ----------------------------------------------------------------------------------------------
def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
                   sinks: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Dense attention with an optional per-head sink column.

    q [B, KV, G, Lq, D]; k [B, KV, Lk, D]; v [B, KV, Lk, Dv]; allowed: bool, broadcastable to [.., Lq, Lk];
    sinks [KV, G] or None. Returns [B, KV, G, Lq, Dv].
    """
    scores = torch.einsum("bkgqd,bkjd->bkgqj", q, k) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    if sinks is not None:
        sink_col = sinks[None, :, :, None, None].to(scores.dtype).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink_col], dim=-1)
    probs = torch.softmax(scores - scores.amax(dim=-1, keepdim=True), dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]  # the sink absorbs probability mass and contributes no value
    return torch.einsum("bkgqj,bkjd->bkgqd", probs.to(v.dtype), v)


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_past: int, window: int,
                             sinks: torch.Tensor | None, scale: float, block: int | None = None) -> torch.Tensor:
    """Blocked SWA: each query sees the ``window`` most recent keys, itself included, plus the sink.

    q [B, KV, G, L, D] are the L new positions; k/v [B, KV, n_past + L, ·] are the ``n_past`` (≤ window − 1)
    cached keys followed by the new ones, in order. Cost O(L · (C + W)) with block size C (default W).
    Returns [B, KV, G, L, Dv].
    """
    B, KV, G, L, D = q.shape
    W, C = window, block or window
    pad = W - 1 - n_past  # left padding so that every block finds its W − 1 predecessors
    if pad < 0:
        raise ValueError(f"sliding_window_attention: n_past={n_past} exceeds window − 1 = {W - 1}")
    nb = math.ceil(L / C)
    right = nb * C - L
    k = F.pad(k, (0, 0, pad, right))  # [B, KV, W − 1 + nb·C, D]; padded key j ↔ absolute position j − (W − 1)
    v = F.pad(v, (0, 0, pad, right))
    kb = k.unfold(2, C + W - 1, C).transpose(-1, -2)  # [B, KV, nb, C + W − 1, D]
    vb = v.unfold(2, C + W - 1, C).transpose(-1, -2)
    qb = F.pad(q, (0, 0, 0, right)).view(B, KV, G, nb, C, D)
    scores = torch.einsum("bkgncd,bknjd->bkgncj", qb, kb) * scale  # [B, KV, G, nb, C, C + W − 1]
    i = torch.arange(C, device=q.device)[:, None]
    j = torch.arange(C + W - 1, device=q.device)[None, :]
    n = torch.arange(nb, device=q.device)[:, None, None]
    allowed = (j >= i) & (j <= i + W - 1) & (n * C + j >= pad)  # band ∩ not-padding: [nb, C, C + W − 1]
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    if sinks is not None:
        sink_col = sinks[None, :, :, None, None, None].to(scores.dtype).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink_col], dim=-1)
    probs = torch.softmax(scores - scores.amax(dim=-1, keepdim=True), dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    out = torch.einsum("bkgncj,bknjd->bkgncd", probs.to(vb.dtype), vb)  # [B, KV, G, nb, C, Dv]
    return out.reshape(B, KV, G, nb * C, -1)[..., :L, :]


def global_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_past: int, scale: float) -> torch.Tensor:
    """Causal attention over all ``n_past + L`` keys via SDPA. q [B, KV, G, L, D] → [B, KV, G, L, Dv]."""
    B, KV, G, L, D = q.shape
    Dv = v.shape[-1]
    qh = q.reshape(B, KV * G, L, D)
    kh = k.repeat_interleave(G, dim=1)  # [B, H, S, D]
    vh = v.repeat_interleave(G, dim=1)
    if Dv < D:  # fused kernels want equal head dims: pad values with zeros, drop them after
        vh = F.pad(vh, (0, D - Dv))
    if n_past == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=L > 1, scale=scale)
    else:
        S = n_past + L
        mask = torch.arange(S, device=q.device)[None, :] <= (n_past + torch.arange(L, device=q.device))[:, None]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask if L > 1 else None, scale=scale)
    return out[..., :Dv].reshape(B, KV, G, L, Dv)


# ---- FlexAttention -------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def flex_block_mask(L: int, S: int, n_past: int, window: int | None, device: str):
    """The block mask of L queries at positions n_past … n_past + L − 1 over S = n_past + L keys (key j at position
    j): causal, and with a ``window`` only the ``window`` most recent keys, the query's own included. Built once per
    shape (building it evaluates the mask on every tile)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + n_past

    def sliding(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + n_past) & (q_idx + n_past - kv_idx < window)

    return create_block_mask(causal if window is None else sliding, None, None, L, S, device=device)


_FLEX_COMPILED = None


def _flex_kernel(device: torch.device):
    """``flex_attention`` as it runs fast: compiled on CUDA (its Triton kernel), eager elsewhere (the CPU's
    compiled kernel returns no log-sum-exp; eager runs the same maths densely, for tests and small shapes)."""
    from torch.nn.attention.flex_attention import flex_attention

    global _FLEX_COMPILED
    if device.type != "cuda":
        return _eager_flex
    if _FLEX_COMPILED is None:
        _FLEX_COMPILED = torch.compile(flex_attention, dynamic=False)
    return _FLEX_COMPILED


def _eager_flex(*args, **kwargs):
    """Uncompiled ``flex_attention``, without its once-per-process advice to compile (off CUDA, eager is meant)."""
    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(*args, **kwargs)


def flex_sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_past: int, window: int | None,
                        sinks: torch.Tensor | None, scale: float) -> torch.Tensor:
    """GA (``window=None``) or SWA attention of the L new queries on FlexAttention, sinks through the log-sum-exp.

    q [B, KV, G, L, D]; k/v [B, KV, n_past + L, ·] (the keys in position order); sinks [KV, G] or None.
    o = flex(q, k, v) ⊙ σ(ℓ − s_h) (module docstring). Returns [B, KV, G, L, Dv]."""
    from torch.nn.attention.flex_attention import AuxRequest

    B, KV, G, L, D = q.shape
    S = k.shape[2]
    # one dtype for the kernel: under autocast its compute dtype (roped q/k leave the projections in fp32 when the
    # rope tables are, values do not), else the widest of the three
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    else:
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    mask = flex_block_mask(L, S, n_past, window, str(q.device))
    kernel = _flex_kernel(q.device)
    qh = q.reshape(B, KV * G, L, D)
    if sinks is None:
        out = kernel(qh, k, v, block_mask=mask, scale=scale, enable_gqa=G > 1)
    else:
        out, aux = kernel(qh, k, v, block_mask=mask, scale=scale, enable_gqa=G > 1,
                          return_aux=AuxRequest(lse=True))  # out [B, H, L, Dv], lse [B, H, L] (natural log)
        keep = torch.sigmoid(aux.lse.float() - sinks.reshape(1, KV * G, 1).float())  # e^ℓ / (e^ℓ + e^s)
        out = out * keep[..., None].to(out.dtype)
    return out.reshape(B, KV, G, L, -1)


# ---- the module -------------------------------------------------------------------------------------------------
class MiMoAttention(nn.Module):
    """One attention layer, GA or SWA by ``cfg.layer_types[layer_idx]``; parameter names as transformers'."""

    def __init__(self, cfg: MiMoConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.is_swa = cfg.layer_types[layer_idx] == SLIDING
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.swa_num_key_value_heads if self.is_swa else cfg.num_key_value_heads
        self.head_dim, self.v_head_dim = cfg.head_dim, cfg.v_head_dim
        self.window = cfg.sliding_window if self.is_swa else None
        self.kernel = cfg.attention_kernel
        self.scale = cfg.head_dim ** -0.5
        self.v_scale = cfg.attention_value_scale
        H, KV = self.num_heads, self.num_kv_heads
        self.sinks = nn.Parameter(torch.zeros(H)) if self.is_swa else None  # first, as in transformers' order
        self.q_proj = nn.Linear(cfg.hidden_size, H * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, KV * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, KV * cfg.v_head_dim, bias=False)
        self.o_proj = nn.Linear(H * cfg.v_head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        """x [B, L, hidden] at consecutive positions after ``cache.seen`` earlier ones → [B, L, hidden]."""
        B, L, _ = x.shape
        H, KV, G = self.num_heads, self.num_kv_heads, self.num_heads // self.num_kv_heads
        q = self.q_proj(x).view(B, L, H, self.head_dim).transpose(1, 2)  # [B, H, L, D]
        k = self.k_proj(x).view(B, L, KV, self.head_dim).transpose(1, 2)  # [B, KV, L, D]
        v = self.v_proj(x).view(B, L, KV, self.v_head_dim).transpose(1, 2) * self.v_scale  # [B, KV, L, Dv]
        q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
        q = q.view(B, KV, G, L, self.head_dim)
        sinks = self.sinks.view(KV, G) if self.sinks is not None else None

        if self.is_swa and cache is not None and L == 1 and cache.held() > 0:
            # decode: the ring buffer's slots are unordered, which softmax does not mind
            ring_k, ring_v, valid = cache.ring_view()
            keys, values = torch.cat([ring_k, k], dim=2), torch.cat([ring_v, v], dim=2)
            allowed = None if valid is None else torch.cat([valid, valid.new_ones(1)])[None, None, None, None, :]
            out = sink_attention(q, keys, values, allowed, sinks, self.scale)
            cache.append(k, v)
        else:
            n_past, keys, values = 0, k, v
            if cache is not None:
                if cache.held():
                    past_k, past_v = cache.ordered()
                    n_past = past_k.shape[2]
                    keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
                cache.append(k, v)
            if self.kernel == "flex":
                if q.device.type == "cpu" and torch.is_grad_enabled() and q.requires_grad:
                    raise RuntimeError("attention_kernel='flex': torch's FlexAttention has no backward on the CPU; "
                                       "train there with attention_kernel='eager' (the same maths)")
                out = flex_sink_attention(q, keys, values, n_past, self.window, sinks, self.scale)
            elif self.is_swa:
                out = sliding_window_attention(q, keys, values, n_past, self.window, sinks, self.scale)
            else:
                out = global_attention(q, keys, values, n_past, self.scale)
        out = out.reshape(B, H, L, self.v_head_dim).transpose(1, 2).reshape(B, L, H * self.v_head_dim)
        return self.o_proj(out)
