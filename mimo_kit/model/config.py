"""The MiMo-V2 backbone's shape: one dataclass, four presets from a laptop toy to the report's Pro.

Report §2: Flash 48 layers (39 SWA / 9 GA), hidden 4096, 256 experts top-8, window 128; Pro 70 layers (60 / 10),
hidden 6144, 384 experts top-8. Field names follow transformers' ``MiMoV2FlashConfig`` so that
:func:`mimo_kit.model.hf.to_hf` / :func:`~mimo_kit.model.hf.from_hf` are plain renames, with two departures:

- ``swa_num_key_value_heads`` is its own field. transformers fixes SWA KV heads at 2 × GA KV heads (Flash: 8 / 4);
  the public Pro converter uses 8 on both layer types, which only the kit's config can express.
- ``global_layers`` lists the GA layer indices (``None`` = transformers' rule ``i == 0 or (i + 1) % 6 == 0``)
  instead of a 48-entry ``layer_types`` list.

``sliding_window`` counts the keys a SWA query sees *including itself*, as transformers does: the report's
window of 128 previous tokens is ``sliding_window = 129``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from mimo_kit.config.base import Config, ConfigError, knob

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclasses.dataclass
class MiMoConfig(Config):
    vocab_size: int = knob(512, "tiny: a byte-level BPE of a few hundred merges is enough for toy corpora", min=2)
    hidden_size: int = knob(64, "tiny: a laptop forward pass in milliseconds", min=1)
    num_hidden_layers: int = knob(4, "tiny: 4 layers are enough to show one GA layer among SWA layers", min=1)
    num_attention_heads: int = knob(4, "query heads", min=1)
    num_key_value_heads: int = knob(1, "KV heads of GA layers", min=1)
    swa_num_key_value_heads: int = knob(2, "KV heads of SWA layers (transformers: 2 × GA)", min=1)
    head_dim: int = knob(24, "q/k head dim; 24 × 0.334 gives 8 rotary dims", min=1)
    v_head_dim: int = knob(16, "value head dim (the report's backbone uses 128 < q/k 192)", min=1)
    intermediate_size: int = knob(128, "dense SwiGLU FFN width of the dense layers", min=1)
    moe_intermediate_size: int = knob(32, "FFN width of each routed expert", min=1)
    n_routed_experts: int = knob(8, "tiny: 8 experts keep load histograms readable", min=1)
    num_experts_per_tok: int = knob(2, "top-k experts per token", min=1)
    sliding_window: int = knob(16, "keys a SWA query sees incl. itself; tiny sequences are a few windows long", min=1)
    global_layers: tuple[int, ...] | None = knob((0, 3), "GA layer indices; None = transformers' every-6th rule")
    dense_layers: tuple[int, ...] = knob((0,), "layers with a dense FFN; Report §2: the first block only")
    rope_theta: float = knob(5_000_000.0, "Report §2: GA rope theta 5e6", min=1.0)
    swa_rope_theta: float = knob(10_000.0, "Report §2: SWA rope theta 1e4", min=1.0)
    partial_rotary_factor: float = knob(0.334, "Report §2: 64 of 192 q/k dims are rotary", min=0.0, max=1.0)
    attention_value_scale: float = knob(0.707, "Report §2: values scaled by 0.707", min=0.0)
    rms_norm_eps: float = knob(1e-5, "transformers' MiMoV2FlashConfig default", min=0.0)
    max_position_embeddings: int = knob(4096, "tiny: longest position the toy model accepts", min=1)
    norm_topk_prob: bool = knob(True, "Report §2: top-k weights renormalised")
    routed_scaling_factor: float = knob(1.0, "transformers' default; the checkpoint stores null = 1.0", min=0.0)
    tie_word_embeddings: bool = knob(False, "Report §2 backbone keeps a separate LM head")
    initializer_range: float = knob(0.02, "std of the normal init, as transformers", min=0.0)
    attention_kernel: Literal["eager", "flex"] = knob(
        "eager", "eager: SDPA + blocked SWA, the reference; flex: FlexAttention, for CUDA (no CPU backward)")

    PRESETS = {
        "tiny": {},
        # The chapter-2 benchmark shape: a CPU-minutes model that still has 16 experts and a real window.
        "small": dict(vocab_size=8192, hidden_size=256, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=2, swa_num_key_value_heads=4, head_dim=48, v_head_dim=32,
                      intermediate_size=1024, moe_intermediate_size=256, n_routed_experts=16,
                      num_experts_per_tok=4, sliding_window=128, global_layers=(0, 5), max_position_embeddings=32768),
        # Report §2 / transformers' MiMoV2FlashConfig defaults: 308.78B total, 15.45B active.
        "flash": dict(vocab_size=152576, hidden_size=4096, num_hidden_layers=48, num_attention_heads=64,
                      num_key_value_heads=4, swa_num_key_value_heads=8, head_dim=192, v_head_dim=128,
                      intermediate_size=16384, moe_intermediate_size=2048, n_routed_experts=256,
                      num_experts_per_tok=8, sliding_window=129, global_layers=None,
                      max_position_embeddings=262144),
        # Report §2 (public converter): 128 q heads, 8 KV heads on both types, 384 experts, GA at 0, 7, 15, ..., 69.
        "pro": dict(vocab_size=152576, hidden_size=6144, num_hidden_layers=70, num_attention_heads=128,
                    num_key_value_heads=8, swa_num_key_value_heads=8, head_dim=192, v_head_dim=128,
                    intermediate_size=16384, moe_intermediate_size=2048, n_routed_experts=384,
                    num_experts_per_tok=8, sliding_window=129,
                    global_layers=(0, 7, 15, 23, 31, 39, 47, 55, 62, 69), max_position_embeddings=262144),
    }

    def check(self) -> None:
        for name in ("num_key_value_heads", "swa_num_key_value_heads"):
            kv = getattr(self, name)
            if self.num_attention_heads % kv:
                raise ConfigError(f"MiMoConfig.{name}: {kv} does not divide num_attention_heads="
                                  f"{self.num_attention_heads}; expected a divisor")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ConfigError(f"MiMoConfig.num_experts_per_tok: got {self.num_experts_per_tok}, expected "
                              f"<= n_routed_experts={self.n_routed_experts}")
        for name in ("global_layers", "dense_layers"):
            for i in getattr(self, name) or ():
                if not 0 <= i < self.num_hidden_layers:
                    raise ConfigError(f"MiMoConfig.{name}: layer {i} is outside 0..{self.num_hidden_layers - 1}")

    # ---- derived shape ------------------------------------------------------------------------------------
    @property
    def layer_types(self) -> list[str]:
        """``"full_attention"`` (GA) or ``"sliding_attention"`` (SWA) per layer."""
        if self.global_layers is None:
            return [FULL if (i == 0 or (i + 1) % 6 == 0) else SLIDING for i in range(self.num_hidden_layers)]
        ga = set(self.global_layers)
        return [FULL if i in ga else SLIDING for i in range(self.num_hidden_layers)]

    @property
    def mlp_layer_types(self) -> list[str]:
        """``"dense"`` or ``"sparse"`` (MoE) per layer."""
        return ["dense" if i in set(self.dense_layers) else "sparse" for i in range(self.num_hidden_layers)]

    @property
    def rotary_dim(self) -> int:
        """Rotary dims per head: ``int(head_dim · partial_rotary_factor)`` rounded down to even (Flash: 64)."""
        return int(self.head_dim * self.partial_rotary_factor) // 2 * 2

    def summary(self) -> dict[str, Any]:
        types = self.layer_types
        return {"layers": self.num_hidden_layers, "GA": types.count(FULL), "SWA": types.count(SLIDING),
                "hidden": self.hidden_size, "q heads": self.num_attention_heads,
                "KV heads GA/SWA": f"{self.num_key_value_heads}/{self.swa_num_key_value_heads}",
                "experts": f"{self.n_routed_experts} top-{self.num_experts_per_tok}",
                "window": self.sliding_window, "vocab": self.vocab_size}
