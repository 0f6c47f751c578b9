"""The DFlash-style block drafter: one forward pass proposes the next B − 1 tokens (Report §2 "Speculative decoder").

A token-by-token MTP head drafts k tokens with k sequential passes. A *block* drafter fills a whole block at once,
like one denoising step of a block-diffusion model:

- **context**: the backbone's hidden states at a few chosen layers (report: 0, 11, 23, 35, 47), concatenated per
  position, projected to the hidden size and normalised: c_t = RMSNorm(W_c [h_t^{(l_1)}; …; h_t^{(l_n)}]);
- **block**: [anchor, MASK, …, MASK] (B positions; the anchor is the last token the backbone emitted, the masks are
  one learned embedding), embedded with the backbone's own embedding table;
- **layers**: N transformer layers with a dense SwiGLU FFN; queries come from the block, keys/values from
  [context ; block]; attention is **bidirectional inside the block** and sees at most ``context_window`` (1,024)
  backbone positions before the anchor;
- **head**: the backbone's LM head; block position k (1 ≤ k < B) predicts token anchor + k.

The drafter owns no embedding or LM head: it borrows the backbone's at every call, so it stays small and in
sync with the policy that RL keeps updating (the report retrains the drafter on RL trajectories, §6).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.model.attention import apply_partial_rope, rope_cos_sin
from mimo_kit.model.config import MiMoConfig
from mimo_kit.model.decoder import DenseMLP, MiMoForCausalLM, RMSNorm
from mimo_kit.speculative.decode import draw_drafts


@dataclasses.dataclass
class DrafterConfig(Config):
    block_size: int = knob(8, "Report §2: anchor + 7 drafted tokens (RL serving uses 6)", min=2)
    num_layers: int = knob(2, "tiny: 2 layers (the report's drafter has 5)", min=1)
    feature_layers: tuple[int, ...] | None = knob(None, "backbone layers read; None = spread over the depth "
                                                        "like the report's [0, 11, 23, 35, 47]")
    num_feature_layers: int = knob(5, "Report §2 public drafter config: 5 feature layers", min=1)
    context_window: int = knob(1024, "Report §2: at most 1,024 backbone positions before the anchor", min=1)
    num_attention_heads: int = knob(4, "tiny: as the tiny backbone", min=1)
    num_key_value_heads: int = knob(2, "tiny: grouped-query attention with 2 KV heads", min=1)
    head_dim: int = knob(16, "tiny: 4 heads × 16 = the tiny hidden size", min=2)
    intermediate_size: int = knob(128, "dense FFN width (the report's drafter uses dense FFNs)", min=1)
    rope_theta: float = knob(10_000.0, "the backbone's SWA theta: the drafter looks at a short local context",
                             min=1.0)
    gamma: float = knob(4.0, "loss weight exp(−(k−1)/γ): later block positions are accepted less often, so they "
                             "weigh less; γ = 4 halves the weight every ~3 positions", min=1e-3)
    rms_norm_eps: float = knob(1e-5, "as the backbone", min=0.0)

    PRESETS = {
        "tiny": {},
        "small": {"num_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
                  "intermediate_size": 1024},
        # Report §2: 5 dense layers, block 8, features from layers [0, 11, 23, 35, 47], window 1024.
        "flash": {"num_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                  "intermediate_size": 16384, "feature_layers": (0, 11, 23, 35, 47)},
    }

    def check(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"DrafterConfig.num_key_value_heads: {self.num_key_value_heads} does not divide "
                              f"num_attention_heads={self.num_attention_heads}")

    def layers_for(self, backbone: MiMoConfig) -> tuple[int, ...]:
        """The backbone layers whose outputs form the context features."""
        n_layers = backbone.num_hidden_layers
        if self.feature_layers is not None:
            bad = [i for i in self.feature_layers if not 0 <= i < n_layers]
            if bad:
                raise ConfigError(f"DrafterConfig.feature_layers: {bad} outside the backbone's 0..{n_layers - 1}")
            return self.feature_layers
        n = min(self.num_feature_layers, n_layers)
        if n == 1:
            return (n_layers - 1,)
        return tuple(sorted({i * (n_layers - 1) // (n - 1) for i in range(n)}))


class DraftAttention(nn.Module):
    """Block queries over [context ; block] keys: all context positions allowed by the mask, the whole block."""

    def __init__(self, cfg: DrafterConfig, hidden: int):
        super().__init__()
        self.h, self.kv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(hidden, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, hidden, bias=False)

    def context_kv(self, ctx: torch.Tensor, rope_ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated) and values of context features ctx [N, C, H] → [N, KV, C, d] each."""
        N, C, _ = ctx.shape
        kc = self.k_proj(ctx).view(N, C, self.kv, self.d).transpose(1, 2)
        vc = self.v_proj(ctx).view(N, C, self.kv, self.d).transpose(1, 2)
        return apply_partial_rope(kc, *rope_ctx), vc

    def forward(self, x, ctx_kv, rope_block, ctx_allowed):
        """x [N, B, H] block states; ctx_kv: context keys/values [N, KV, C, d]; ctx_allowed [N, C] → [N, B, H]."""
        N, B, _ = x.shape
        q = self.q_proj(x).view(N, B, self.h, self.d).transpose(1, 2)
        kb = self.k_proj(x).view(N, B, self.kv, self.d).transpose(1, 2)
        vb = self.v_proj(x).view(N, B, self.kv, self.d).transpose(1, 2)
        q, kb = apply_partial_rope(q, *rope_block), apply_partial_rope(kb, *rope_block)
        kc, vc = ctx_kv
        k = torch.cat([kc, kb], dim=2).repeat_interleave(self.h // self.kv, dim=1)  # [N, h, C + B, d]
        v = torch.cat([vc, vb], dim=2).repeat_interleave(self.h // self.kv, dim=1)
        allowed = torch.cat([ctx_allowed, ctx_allowed.new_ones(N, B)], dim=1)[:, None, None, :]  # block: all
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # bidirectional inside the block
        return self.o_proj(out.transpose(1, 2).reshape(N, B, self.h * self.d))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, hidden: int):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, hidden)
        self.post_attention_layernorm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.mlp = DenseMLP(hidden, cfg.intermediate_size)

    def forward(self, x, ctx_kv, rope_block, ctx_allowed):
        x = x + self.self_attn(self.input_layernorm(x), ctx_kv, rope_block, ctx_allowed)
        return x + self.mlp(self.post_attention_layernorm(x))


class BlockDrafter(nn.Module):
    """``drafter(backbone, drafter.context(features, positions), ctx_allowed, anchors, anchor_pos)`` → logits
    [N, B − 1, V]."""

    def __init__(self, cfg: DrafterConfig, backbone_cfg: MiMoConfig):
        super().__init__()
        self.config, self.backbone_config = cfg, backbone_cfg
        hidden = backbone_cfg.hidden_size
        self.feature_layers = cfg.layers_for(backbone_cfg)
        self.fc = nn.Linear(len(self.feature_layers) * hidden, hidden, bias=False)
        self.fc_norm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(hidden))
        self.layers = nn.ModuleList(DraftLayer(cfg, hidden) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.register_buffer("inv_freq", 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float()
                                                                     / cfg.head_dim)), persistent=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" not in name:
                    p.normal_(0.0, backbone_cfg.initializer_range)

    def features(self, hidden_states: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate the chosen backbone layers' outputs: list of [N, T, H] → [N, T, n·H] (detached)."""
        return torch.cat([hidden_states[i] for i in self.feature_layers], dim=-1).detach()

    def context(self, features: torch.Tensor, ctx_positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the keys/values of context features [N, C, n·H] at positions ``ctx_positions`` [C].

        Computed once per position: decoding appends the new positions' entries instead of recomputing the window.
        """
        ctx = self.fc_norm(self.fc(features.to(self.fc.weight.dtype)))
        rope_ctx = rope_cos_sin(self.inv_freq, ctx_positions, ctx.dtype)
        return [layer.self_attn.context_kv(ctx, rope_ctx) for layer in self.layers]

    def forward(self, backbone: MiMoForCausalLM, ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
                ctx_allowed: torch.Tensor, anchors: torch.Tensor, anchor_pos: torch.Tensor) -> torch.Tensor:
        """Draft one block per row.

        ctx_kv: :meth:`context` of the rows' context positions ([N, KV, C, d] per layer); ctx_allowed [N, C] bool:
        which context positions each row's block may see (those before its anchor, at most ``context_window``);
        anchors [N] token ids; anchor_pos [N] their positions. Returns logits [N, B − 1, V] for tokens
        anchor + 1 … anchor + B − 1.
        """
        B = self.config.block_size
        N = anchors.shape[0]
        emb = backbone.model.embed_tokens(anchors)[:, None, :]  # [N, 1, H]
        x = torch.cat([emb, self.mask_embedding.to(emb.dtype).expand(N, B - 1, -1)], dim=1)  # [N, B, H]
        block_pos = anchor_pos[:, None] + torch.arange(B, device=x.device)[None, :]  # [N, B]
        cos_b, sin_b = rope_cos_sin(self.inv_freq, block_pos.reshape(-1), x.dtype)
        rope_block = (cos_b.view(N, 1, B, -1), sin_b.view(N, 1, B, -1))
        for layer, kv in zip(self.layers, ctx_kv):
            x = layer(x, kv, rope_block, ctx_allowed)
        return backbone.lm_head(self.norm(x[:, 1:]))


    # ---- the speculative-decoding protocol (mimo_kit.speculative.decode) ------------------------------------------
    @property
    def num_drafts(self) -> int:
        return self.config.block_size - 1

    def begin(self, backbone: MiMoForCausalLM, out, prompt: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Context keys/values of the prompt's last ``context_window`` positions, from the prefill ``out``."""
        window = self.config.context_window
        positions = torch.arange(prompt.shape[1])
        return self.context(self.features(out.hidden_states)[:, -window:], positions[-window:])

    def propose(self, backbone: MiMoForCausalLM, state, anchor: int, pos: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """All B − 1 drafts in one pass; each drawn from its own q_k (a block drafter ignores the other drafts)."""
        n_ctx = state[0][0].shape[2]
        q_logits = self(backbone, state, torch.ones(1, n_ctx, dtype=torch.bool), torch.tensor([anchor]),
                        torch.tensor([pos]))[0].float()  # [B − 1, V]
        if temperature == 0:
            return q_logits.argmax(-1), q_logits
        return draw_drafts(q_logits[None], temperature, generator)[0], q_logits

    def commit(self, backbone: MiMoForCausalLM, state, out, block: torch.Tensor, accepted: int, pos: int):
        """Append the anchor's and the accepted drafts' context entries; keep the last ``context_window``."""
        window, a = self.config.context_window, accepted
        new = self.context(self.features(out.hidden_states)[:, : a + 1], torch.arange(pos, pos + a + 1))
        return [(torch.cat([k, nk], 2)[:, :, -window:], torch.cat([v, nv], 2)[:, :, -window:])
                for (k, v), (nk, nv) in zip(state, new)]


    # ---- the batched protocol (mimo_kit.speculative.rows): every row's context in one ring ----------------------
    def rows_state(self, rows: int, device: torch.device | str | None = None) -> BlockRows:
        """An empty context for ``rows`` rows: per draft layer a ring of ``context_window`` slots, plus a discard
        slot (where :meth:`observe` sends the entries it does not keep)."""
        W, a = self.config.context_window, self.layers[0].self_attn
        dtype = self.fc.weight.dtype
        return BlockRows([torch.zeros(rows, a.kv, W + 1, a.d, dtype=dtype, device=device) for _ in self.layers],
                         [torch.zeros(rows, a.kv, W + 1, a.d, dtype=dtype, device=device) for _ in self.layers],
                         torch.full((rows, W + 1), -1, dtype=torch.long, device=device))

    def observe(self, backbone: MiMoForCausalLM, state: BlockRows, rows: torch.Tensor, out, tokens: torch.Tensor,
                start: torch.Tensor, count: torch.Tensor, fresh: bool = False) -> None:
        """The backbone ran ``tokens`` [n, T] of ``rows`` [n] at positions start … start + T − 1 (its output
        ``out``, hidden states included) and keeps the first ``count`` [n] of them: their context entries go into
        slot p mod W of each row's ring, the last W at most (``fresh`` is for MTP: a block drafter's entry at p
        needs only position p's states)."""
        n, T = tokens.shape
        W = self.config.context_window
        j = torch.arange(T, device=tokens.device)
        pos = start[:, None] + j  # [n, T]
        keep = (j < count[:, None]) & (j >= count[:, None] - W)  # the last W kept: one position per slot
        lo = max(0, int(count.min()) - W)  # no row keeps an earlier position: a long prefill runs its last ones
        pos, keep, T = pos[:, lo:], keep[:, lo:], T - lo
        feats = self.features([h[:, lo:] for h in out.hidden_states])
        ctx = self.fc_norm(self.fc(feats.to(self.fc.weight.dtype)))  # [n, T, H]
        cos, sin = rope_cos_sin(self.inv_freq, pos.reshape(-1), ctx.dtype)
        rope = (cos.view(n, 1, T, -1), sin.view(n, 1, T, -1))
        slots = torch.where(keep, pos % W, W)  # [n, T]: the discard slot W for the rest
        for layer, keys, values in zip(self.layers, state.keys, state.values):
            k, v = layer.self_attn.context_kv(ctx, rope)  # [n, KV, T, d] each
            index = slots[:, None, :, None].expand_as(k)
            keys[rows] = keys[rows].scatter_(2, index, k)
            values[rows] = values[rows].scatter_(2, index, v)
        state.positions[rows] = state.positions[rows].scatter_(1, slots, pos)
        state.positions[:, W] = -1

    def propose_rows(self, backbone: MiMoForCausalLM, state: BlockRows, anchors: torch.Tensor, pos: torch.Tensor,
                     temperature: float = 0.0, generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`propose` for every row at once: anchors [N] at positions pos [N] → drafts [N, k], q logits
        [N, k, V]. Row n sees the ring slots holding positions pos_n − W … pos_n − 1."""
        W, p = self.config.context_window, state.positions
        allowed = (p >= 0) & (p < pos[:, None]) & (p >= pos[:, None] - W)  # [N, W + 1]
        q_logits = self(backbone, list(zip(state.keys, state.values)), allowed, anchors, pos).float()  # [N, k, V]
        return draw_drafts(q_logits, temperature, generator), q_logits


@dataclasses.dataclass
class BlockRows:
    """Every row's drafter context (:meth:`BlockDrafter.rows_state`)."""

    keys: list[torch.Tensor]  # per draft layer [N, KV, W + 1, d]: slot p mod W holds position p's entry
    values: list[torch.Tensor]  # per draft layer [N, KV, W + 1, d]
    positions: torch.Tensor  # [N, W + 1] long: the position each slot holds, −1 when empty (the discard slot W)


def context_mask(ctx_positions: torch.Tensor, anchor_pos: torch.Tensor, window: int) -> torch.Tensor:
    """bool [N, C]: context position p is visible to the block anchored at a iff a − window ≤ p < a."""
    p, a = ctx_positions[None, :], anchor_pos[:, None]
    return (p < a) & (p >= a - window)
