"""Qwen3.5-9B, the distillation path's student: its published config as a transformers ``Qwen3_5Config``.

Qwen3.5-9B is a dense vision-language model. Its text decoder has 32 layers in 8 blocks of
3 × (Gated DeltaNet → FFN) + 1 × (gated full attention → FFN):

- **Gated DeltaNet** (linear attention, 24 layers): 16 query/key heads and 32 value heads of dim 128, a causal
  depthwise convolution of width 4 over q/k/v, a recurrent state [32, 128, 128] per sequence instead of a KV cache;
- **gated full attention** (8 layers): 16 query heads, 4 KV heads, head dim 256, an output gate (``q_proj`` is
  2 × 16 × 256 wide), RMSNorm on q and k, partial RoPE on 64 of the 256 dims;
- **FFN**: SwiGLU, hidden 4096 → 12288; vocabulary 248,320, untied LM head; a 27-layer ViT (hidden 1152).

Where the values come from. The official ``config.json`` of ``Qwen/Qwen3.5-9B`` is not among the sources the
kit could consult, so the values below are the closest published ones, which agree with each other:

- the model's published spec (https://docs.vultr.com/models/alibaba-qwen-35/qwen3.5-9b/nvidia): 32 layers,
  16 attention heads, 4 KV heads, hidden 4096, FFN 12288, 262K native context, 27-layer vision encoder of hidden
  1152;
- the ``config.json`` of public fine-tunes that keep the base model's architecture
  (https://huggingface.co/KnowledgeXLab/ComActor-9B/blob/main/config.json,
  https://huggingface.co/khtsly/Mini-Coder/blob/main/config.json, whose ``model_name`` is ``Qwen/Qwen3.5-9B``):
  head dim 256, the 3:1 ``layer_types``, linear-attention heads 16 (q/k) and 32 (v) of dim 128, conv width 4,
  vocabulary 248,320, ``max_position_embeddings`` 262,144, rms ε 1e-6, untied embeddings;
- transformers' own ``Qwen3_5TextConfig``, whose defaults it documents as "the Qwen3.5-9B style configuration",
  agrees on every shape field; only its context (32,768) and RoPE θ (1e4) differ from the checkpoint's;
- RoPE θ = 1e7 on 25% of the head dims: the GGUF metadata of the model (freq_base 10M, 64 rope dims,
  https://lzwjava.github.io/qwen3-5-9b-hybrid-review-en) and THUDM/slime's Qwen3.5 launch scripts
  (``--rotary-base 10000000 --rotary-percent 0.25``).

Counted on the meta device (:func:`qwen35_9b_parameters`): 8.95B parameters in the text-only causal LM
(``Qwen3_5ForCausalLM``: embeddings, 32 layers, final norm, LM head) and 0.46B in the vision tower; the
one-layer MTP head of the checkpoint is not built by transformers and not counted. Distillation trains the
text-only causal LM, so the memory planner (:mod:`mimo_kit.infra.plan`) counts the text part only.
"""

from __future__ import annotations

import functools
from typing import Any

#: The published text-decoder values (sources in the module docstring).
QWEN35_9B: dict[str, Any] = {
    "vocab_size": 248320,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 8,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "eos_token_id": 248044,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
}

#: The vision tower's published values (27 layers, hidden 1152; it projects into the text hidden size 4096).
QWEN35_9B_VISION: dict[str, Any] = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 4096,
    "num_position_embeddings": 2304,
}


def qwen35_9b_config() -> Any:
    """The Qwen3.5-9B config as a ``transformers.Qwen3_5Config`` (text + vision); ``.text_config`` is the LM's."""
    from transformers import Qwen3_5Config

    return Qwen3_5Config(text_config=dict(QWEN35_9B), vision_config=dict(QWEN35_9B_VISION),
                         image_token_id=248056, video_token_id=248057, vision_start_token_id=248053,
                         vision_end_token_id=248054, tie_word_embeddings=False)


def text_model_on_meta(text_config: Any | None = None) -> Any:
    """The text-only causal LM (``Qwen3_5ForCausalLM``) with shapes and no memory."""
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    with torch.device("meta"):
        return Qwen3_5ForCausalLM(text_config if text_config is not None else qwen35_9b_config().text_config)


@functools.lru_cache(maxsize=1)
def qwen35_9b_parameters() -> dict[str, int]:
    """``{"text", "vision", "total"}`` parameter counts, built on the meta device (MTP head not built, not counted)."""
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration

    text = sum(p.numel() for p in text_model_on_meta().parameters())
    with torch.device("meta"):
        full = Qwen3_5ForConditionalGeneration(qwen35_9b_config())
    vision = sum(p.numel() for name, p in full.named_parameters() if name.startswith("model.visual."))
    return {"text": text, "vision": vision, "total": text + vision}
