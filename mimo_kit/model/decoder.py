"""The MiMo-V2 backbone: embeddings → N × (attention, FFN) with pre-RMSNorm residuals → norm → LM head (Report §2).

Layer i uses GA or SWA by ``cfg.layer_types[i]`` and a dense SwiGLU FFN or the sparse MoE by
``cfg.mlp_layer_types[i]`` (Flash: dense in layer 0 only). Parameter names equal transformers'
``MiMoV2FlashForCausalLM``, so ``model.load_state_dict(hf_model.state_dict())`` works, and on the same weights the
logits match transformers' eager attention (tests/test_model_conformance.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from mimo_kit.model.attention import MiMoAttention, rope_cos_sin, rope_inv_freq
from mimo_kit.model.cache import KVCache
from mimo_kit.model.config import FULL, SLIDING, MiMoConfig
from mimo_kit.model.moe import MiMoMoE, load_metrics


class RMSNorm(nn.Module):
    """y = w · x / sqrt(mean(x²) + ε), computed in fp32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class DenseMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) ⊙ up(x))."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: MiMoConfig, layer_idx: int):
        super().__init__()
        self.self_attn = MiMoAttention(cfg, layer_idx)
        self.mlp = (MiMoMoE(cfg) if cfg.mlp_layer_types[layer_idx] == "sparse"
                    else DenseMLP(cfg.hidden_size, cfg.intermediate_size))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class MiMoModel(nn.Module):
    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("ga_inv_freq", rope_inv_freq(cfg, cfg.rope_theta), persistent=False)
        self.register_buffer("swa_inv_freq", rope_inv_freq(cfg, cfg.swa_rope_theta), persistent=False)


@dataclasses.dataclass
class CausalLMOutput:
    logits: torch.Tensor  # [B, L, vocab]
    cache: KVCache | None = None
    hidden_states: list[torch.Tensor] | None = None  # output of every layer, [B, L, hidden] each
    last_hidden_state: torch.Tensor | None = None  # after the final norm


@dataclasses.dataclass
class RoutingRecord:
    """Filled by :meth:`MiMoForCausalLM.capture_routing`: ``indices`` [moe_layers, tokens, k] on exit."""

    indices: torch.Tensor | None = None


class MiMoForCausalLM(nn.Module):
    """The kit's MiMo-V2 decoder. ``model(input_ids).logits`` → [batch, seq, vocab]."""

    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        self.config = cfg
        self.model = MiMoModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.reset_parameters()

    # ---- weights ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, initializer_range) for matrices, sinks and router; ones for norms; zero router bias."""
        std = self.config.initializer_range
        for name, p in self.named_parameters():
            if p.device.type == "meta":
                continue
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)
        for m in self.moe_layers():
            if m.gate.e_score_correction_bias.device.type != "meta":
                m.gate.e_score_correction_bias.zero_()

    @classmethod
    def on_meta(cls, cfg: MiMoConfig) -> MiMoForCausalLM:
        """The model's shapes without memory (Flash and Pro fit in no laptop)."""
        with torch.device("meta"):
            return cls(cfg)

    # ---- forward --------------------------------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, L] → token embeddings [B, L, hidden] (the ``inputs_embeds`` of a text-only forward)."""
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None = None, cache: KVCache | None = None, *,
                inputs_embeds: torch.Tensor | None = None, output_hidden_states: bool = False,
                logits_to_keep: int = 0) -> CausalLMOutput:
        """input_ids [B, L] (or ``inputs_embeds`` [B, L, hidden], exactly one of the two) continuing ``cache``
        (if given) → logits [B, L, vocab] (last ``logits_to_keep``).

        ``inputs_embeds`` replaces the embedding lookup, as in transformers: a multimodal model writes encoder
        outputs at its placeholder positions (Report §2.2–2.3) and the rest of the forward is the text one.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("forward: pass exactly one of input_ids and inputs_embeds, got "
                             + ("both" if input_ids is not None else "neither"))
        if inputs_embeds is not None:
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.config.hidden_size:
                raise ValueError(f"inputs_embeds: expected [batch, seq, {self.config.hidden_size}], got shape "
                                 f"{tuple(inputs_embeds.shape)}")
            B, L = inputs_embeds.shape[:2]
        elif input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected [batch, seq], got shape {tuple(input_ids.shape)}")
        else:
            B, L = input_ids.shape
        start = cache.seq_len if cache is not None else 0
        if start + L > self.config.max_position_embeddings:
            raise ValueError(f"positions {start}..{start + L - 1} exceed max_position_embeddings="
                             f"{self.config.max_position_embeddings}")
        if input_ids is not None and L and (int(input_ids.max()) >= self.config.vocab_size
                                            or int(input_ids.min()) < 0):
            raise ValueError(f"input_ids: token ids must lie in 0..{self.config.vocab_size - 1}, got "
                             f"{int(input_ids.min())}..{int(input_ids.max())}")
        m = self.model
        x = m.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        pos = torch.arange(start, start + L, device=x.device)
        rope = {FULL: rope_cos_sin(m.ga_inv_freq, pos, x.dtype), SLIDING: rope_cos_sin(m.swa_inv_freq, pos, x.dtype)}
        hidden = []
        for i, layer in enumerate(m.layers):
            cos, sin = rope[SLIDING if layer.self_attn.is_swa else FULL]
            x = layer(x, cos, sin, cache.layers[i] if cache is not None else None)
            if output_hidden_states:
                hidden.append(x)
        h = m.norm(x)
        logits = self.lm_head(h[:, -logits_to_keep:] if logits_to_keep else h)
        return CausalLMOutput(logits, cache, hidden if output_hidden_states else None, h)

    def new_cache(self, slack: int = 0) -> KVCache:
        """An empty KV cache (``slack`` extra SWA slots allow rolling back that many tokens)."""
        return KVCache(self.config, slack)

    # ---- MoE control and observability ---------------------------------------------------------------------
    def moe_layers(self) -> list[MiMoMoE]:
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, MiMoMoE)]

    def freeze_router(self, frozen: bool = True) -> None:
        """Stop (or restart) gradient updates of every router; the report freezes them in RL (Report §5.4)."""
        for m in self.moe_layers():
            m.gate.weight.requires_grad_(not frozen)

    def expert_loads(self) -> torch.Tensor:
        """Tokens routed to each expert since the last reset: [moe_layers, experts]."""
        return torch.stack([m.expert_load for m in self.moe_layers()])

    def reset_expert_loads(self) -> None:
        for m in self.moe_layers():
            m.expert_load.zero_()

    def load_metrics(self) -> dict[str, torch.Tensor]:
        """Per-MoE-layer CV, max/mean and cold-expert share of the loads so far."""
        return load_metrics(self.expert_loads())

    @contextlib.contextmanager
    def capture_routing(self) -> Iterator[RoutingRecord]:
        """Record the experts every token chose: ``record.indices`` [moe_layers, tokens, k] after the block.

        Tokens are in the order the forwards saw them (batch-major within a forward, forwards concatenated).
        """
        record = RoutingRecord()
        layers = self.moe_layers()
        for m in layers:
            m.capture = []
        try:
            yield record
        finally:
            parts = [torch.cat(m.capture) if m.capture else torch.empty(0, self.config.num_experts_per_tok,
                                                                         dtype=torch.long) for m in layers]
            for m in layers:
                m.capture = None
            record.indices = torch.stack(parts) if parts else None

    @contextlib.contextmanager
    def replay_routing(self, indices: torch.Tensor) -> Iterator[None]:
        """Force the recorded experts (R3, Report §6): indices [moe_layers, tokens, k], consumed in order.

        Gate weights come from the current router logits at the forced experts, so gradients still reach the
        router and the experts chosen at rollout are the ones trained.
        """
        layers = self.moe_layers()
        if indices.dim() != 3 or indices.shape[0] != len(layers) or indices.shape[2] != self.config.num_experts_per_tok:
            raise ValueError(f"replay_routing: expected indices [{len(layers)}, tokens, "
                             f"{self.config.num_experts_per_tok}], got {tuple(indices.shape)}")
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.config.n_routed_experts):
            raise ValueError(f"replay_routing: expert ids must lie in 0..{self.config.n_routed_experts - 1}")
        for m, idx in zip(layers, indices):
            m.replay, m.replay_offset = idx, 0
        try:
            yield
        finally:
            for m in layers:
                m.replay, m.replay_offset = None, 0
