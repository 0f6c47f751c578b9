"""Looking inside the decoder: masks, attention maps with the sink's share, and KV-cache size by layer type.

Dense T×T computations, for pictures of short sequences only; the model itself never builds them.
"""

from __future__ import annotations

import torch

from mimo_kit.model.attention import apply_partial_rope, rope_cos_sin
from mimo_kit.model.config import SLIDING, MiMoConfig
from mimo_kit.model.decoder import MiMoForCausalLM


def attention_mask(T: int, window: int | None) -> torch.Tensor:
    """bool [T, T]: query i may see key j (causal; within ``window`` keys incl. itself when given)."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = j <= i
    return allowed & (j > i - window) if window is not None else allowed


@torch.no_grad()
def attention_maps(model: MiMoForCausalLM, input_ids: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [H, T, T], sink share [H, T]) of ``layer`` for one sequence ``input_ids`` [1, T].

    The sink share is the probability mass that query t gives to the sink instead of any token (0 on GA layers).
    """
    out = model(input_ids, output_hidden_states=True)
    x = model.model.embed_tokens(input_ids) if layer == 0 else out.hidden_states[layer - 1]
    block = model.model.layers[layer]
    attn = block.self_attn
    h = block.input_layernorm(x)
    T = input_ids.shape[1]
    H, KV = attn.num_heads, attn.num_kv_heads
    q = attn.q_proj(h).view(1, T, H, attn.head_dim).transpose(1, 2)
    k = attn.k_proj(h).view(1, T, KV, attn.head_dim).transpose(1, 2)
    inv = model.model.swa_inv_freq if attn.is_swa else model.model.ga_inv_freq
    cos, sin = rope_cos_sin(inv, torch.arange(T), q.dtype)
    q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
    k = k.repeat_interleave(H // KV, dim=1)
    scores = (q @ k.transpose(-1, -2))[0] * attn.scale  # [H, T, T]
    scores = scores.masked_fill(~attention_mask(T, attn.window), float("-inf"))
    sink = attn.sinks if attn.sinks is not None else torch.full((H,), float("-inf"))
    full = torch.cat([scores, sink[:, None, None].expand(H, T, 1)], dim=-1).softmax(-1)
    return full[..., :-1], full[..., -1]


def kv_cache_bytes(cfg: MiMoConfig, context: int, bytes_per_value: int = 2) -> dict[str, int]:
    """Bytes of keys + values held at ``context`` tokens, by layer type (bf16 by default), batch 1.

    GA layer: context × KV_GA × (d_qk + d_v); SWA layer: min(context, W − 1) × KV_SWA × (d_qk + d_v).
    """
    per_token = cfg.head_dim + cfg.v_head_dim
    ga = swa = 0
    for t in cfg.layer_types:
        if t == SLIDING:
            swa += min(context, cfg.sliding_window - 1) * cfg.swa_num_key_value_heads * per_token
        else:
            ga += context * cfg.num_key_value_heads * per_token
    return {"GA": ga * bytes_per_value, "SWA": swa * bytes_per_value, "total": (ga + swa) * bytes_per_value}
