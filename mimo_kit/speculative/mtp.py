"""Multi-token prediction (MTP): the token-by-token drafter that the block drafter replaced (Report §2, §6).

One MTP layer turns the backbone's hidden state at position t and the embedding of token t + 1 into a state
that predicts token t + 2:

    u_t = W_eh [RMSNorm_e(embed(x_{t+1})) ; RMSNorm_h(h_t)]             (2H → H)
    g_t = RMSNorm_f(block(u_t))                                          block: one SWA attention + dense SwiGLU layer
    q(x_{t+2}) = softmax(lm_head(g_t))                                   the backbone's own embedding and LM head

k drafts take k sequential passes: depth j feeds its state g back as "h" with the token it just drafted
(depth j uses layer min(j, num_layers − 1): one layer is reused at every depth, as vLLM serves Flash). Inside a
layer, a query attends causally to the layer's entries for earlier positions (u_t built from the backbone's
true hidden states and the committed tokens) within a sliding window, and to the depths drafted before it in the
same round.

**Checkpoint layout** (MiMo-V2-Flash's hub checkpoint, as read by vLLM's ``mimo_v2_flash_mtp.py`` loader, which
SGLang's ``mimo_v2_flash_nextn.py`` also follows): per MTP layer ``model.mtp.layers.{i}.`` holds ``enorm``,
``hnorm`` (RMSNorm weights), ``eh_proj`` ([H, 2H], input order [embedding ; hidden]), ``final_layernorm`` and the
decoder block's weights at the same level: ``input_layernorm``, ``self_attn.{q,k,v,o}_proj`` (the backbone's SWA
head shapes), ``self_attn.attention_sink_bias`` (when the config adds SWA sinks), ``post_attention_layernorm``
(some exports name it ``pre_mlp_layernorm``) and a dense ``mlp.{gate,up,down}_proj``. The hub ships three layers
(``model.mtp.layers.{0,1,2}``). The kit's module uses these names under ``layers.{i}.``, so
``model.mtp.`` + a kit key is the hub key (attention sinks in the kit's in-memory name, ``self_attn.sinks``).
The hidden state h is the backbone's final-normed state (``last_hidden_state``), as the serving engines pass it.
"""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn

from mimo_kit.config.base import Config, knob
from mimo_kit.model.attention import apply_partial_rope, rope_cos_sin, rope_inv_freq, sink_attention
from mimo_kit.model.config import MiMoConfig
from mimo_kit.model.decoder import DenseMLP, MiMoForCausalLM, RMSNorm
from mimo_kit.model.hf import MTP_PREFIX, from_hub_layout
from mimo_kit.speculative.decode import draw_drafts


@dataclasses.dataclass
class MTPConfig(Config):
    num_layers: int = knob(1, "tiny: one layer reused at every depth (Flash's checkpoint ships 3)", min=1)
    block_size: int = knob(8, "anchor + k = block_size − 1 drafts per round: the same budget as the block drafter",
                           min=2)
    context_window: int | None = knob(None, "keys a query sees incl. itself; None = the backbone's SWA window "
                                            "(the MTP block is an SWA layer)")
    gamma: float = knob(4.0, "loss weight exp(−j/γ) of depth j: as the block drafter's positions", min=1e-3)

    PRESETS = {"tiny": {}, "flash": {"num_layers": 3}}


class MTPAttention(nn.Module):
    """The backbone's SWA attention shapes (heads, SWA KV heads, head dims, sinks), over explicit keys/values."""

    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        self.h, self.kv, self.d, self.dv = (cfg.num_attention_heads, cfg.swa_num_key_value_heads, cfg.head_dim,
                                            cfg.v_head_dim)
        self.scale, self.v_scale = cfg.head_dim ** -0.5, cfg.attention_value_scale
        self.sinks = nn.Parameter(torch.zeros(self.h))
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv * self.dv, bias=False)
        self.o_proj = nn.Linear(self.h * self.dv, cfg.hidden_size, bias=False)

    def keys_values(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed inputs x [N, L, H] → rotated keys [N, KV, L, d] and scaled values [N, KV, L, dv]."""
        N, L, _ = x.shape
        k = self.k_proj(x).view(N, L, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(N, L, self.kv, self.dv).transpose(1, 2) * self.v_scale
        return apply_partial_rope(k, *rope), v

    def forward(self, x: torch.Tensor, rope, keys: torch.Tensor, values: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        """One query per row x [N, 1, H] over keys/values [N, KV, C, ·] (its own included); allowed [N, C]."""
        N = x.shape[0]
        G = self.h // self.kv
        q = apply_partial_rope(self.q_proj(x).view(N, 1, self.h, self.d).transpose(1, 2), *rope)
        out = sink_attention(q.view(N, self.kv, G, 1, self.d), keys, values, allowed[:, None, None, None, :],
                             self.sinks.view(self.kv, G), self.scale)  # [N, KV, G, 1, dv]
        return self.o_proj(out.reshape(N, 1, self.h * self.dv))


class MTPLayer(nn.Module):
    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        H = cfg.hidden_size
        self.enorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(H, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = MTPAttention(cfg)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = DenseMLP(H, cfg.intermediate_size)
        self.final_layernorm = RMSNorm(H, cfg.rms_norm_eps)

    def fuse(self, emb: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """u = W_eh [enorm(embed(x_{t+1})) ; hnorm(h_t)]: [N, L, H] each → [N, L, H]."""
        return self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h)], dim=-1))

    def forward(self, u, rope, keys, values, allowed) -> torch.Tensor:
        """u [N, 1, H] whose own key/value are the last of ``keys``/``values`` → g [N, 1, H] (final-normed)."""
        x = u + self.self_attn(self.input_layernorm(u), rope, keys, values, allowed)
        return self.final_layernorm(x + self.mlp(self.post_attention_layernorm(x)))


@dataclasses.dataclass
class MTPState:
    """Decoding state: per layer the committed entries' keys/values (last window − 1 positions) and the backbone's
    hidden state at the position before the anchor."""

    keys: list[torch.Tensor]  # per layer [1, KV, C, d]
    values: list[torch.Tensor]  # per layer [1, KV, C, dv]
    last_hidden: torch.Tensor  # [1, 1, H]


class MTPDrafter(nn.Module):
    """``propose(backbone, state, anchor, pos, temperature, generator)`` → drafts [k], q logits [k, V]."""

    def __init__(self, cfg: MTPConfig, backbone_cfg: MiMoConfig):
        super().__init__()
        self.config, self.backbone_config = cfg, backbone_cfg
        self.layers = nn.ModuleList(MTPLayer(backbone_cfg) for _ in range(cfg.num_layers))
        self.window = cfg.context_window or backbone_cfg.sliding_window
        self.register_buffer("inv_freq", rope_inv_freq(backbone_cfg, backbone_cfg.swa_rope_theta),
                             persistent=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                elif name.endswith("sinks"):
                    p.zero_()
                else:
                    p.normal_(0.0, backbone_cfg.initializer_range)

    @property
    def num_drafts(self) -> int:
        return self.config.block_size - 1

    def layer(self, depth: int) -> MTPLayer:
        return self.layers[min(depth, len(self.layers) - 1)]

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return rope_cos_sin(self.inv_freq, positions, dtype)

    def entries(self, backbone: MiMoForCausalLM, hidden: torch.Tensor, next_tokens: torch.Tensor,
                positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, keys/values of committed entries: hidden h_t [N, L, H], tokens x_{t+1} [N, L] at
        positions t + 1 [L]."""
        emb = backbone.model.embed_tokens(next_tokens)
        rope = self.rope(positions, emb.dtype)
        return [layer.self_attn.keys_values(layer.input_layernorm(layer.fuse(emb, hidden)), rope)
                for layer in self.layers]

    def chain(self, backbone: MiMoForCausalLM, h0: torch.Tensor, first: torch.Tensor, pos: torch.Tensor,
              ctx: list[tuple[torch.Tensor, torch.Tensor]], ctx_allowed: torch.Tensor, steps: int,
              next_token=None, ctx_positions: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Run ``steps`` depths from h0 [N, 1, H] (hidden before the anchor), anchors ``first`` [N] at positions
        ``pos`` [N]. Depth j's query sits at pos + j and sees its layer's context ``ctx`` ([N, KV, C, ·]) where
        ``ctx_allowed`` [N, C], and depths 0 … j − 1. ``next_token(j, logits [N, V])`` → the token fed to depth
        j + 1 (drafted at inference, the text in training). Returns per-depth logits [N, V].

        The window: a query whose layer holds m of this round's entries (its own included) sees the latest
        window − m context entries. Without ``ctx_positions`` the entries are in position order (the last the
        latest); with ``ctx_positions`` [N, C] (any order, as in :meth:`rows_state`'s rings) those at positions
        ≥ pos + m − window, the same set."""
        N = first.shape[0]
        h, tok, logits = h0, first, []
        own: dict[int, tuple[list, list]] = {}  # per layer: this round's keys/values, depth by depth
        for j in range(steps):
            li = min(j, len(self.layers) - 1)
            layer = self.layers[li]
            u = layer.fuse(backbone.model.embed_tokens(tok)[:, None], h)  # [N, 1, H]
            cos, sin = self.rope(pos + j, u.dtype)  # [N, r]
            rope = (cos[:, None, None], sin[:, None, None])
            k, v = layer.self_attn.keys_values(layer.input_layernorm(u), rope)
            ks, vs = own.setdefault(li, ([], []))
            ks.append(k)
            vs.append(v)
            keys = torch.cat([ctx[li][0], *ks], dim=2)
            values = torch.cat([ctx[li][1], *vs], dim=2)
            # the window: context positions ≥ query − window + 1, and this round's depths
            seen = (_in_window(ctx_allowed, len(ks), self.window) if ctx_positions is None
                    else ctx_positions >= (pos + len(ks) - self.window)[:, None])
            allowed = torch.cat([ctx_allowed & seen, ctx_allowed.new_ones(N, len(ks))], dim=1)
            h = layer(u, rope, keys, values, allowed)
            logits.append(backbone.lm_head(h[:, 0]))
            if j + 1 < steps:
                tok = next_token(j, logits[-1])
        return logits

    # ---- the speculative-decoding protocol (mimo_kit.speculative.decode) ------------------------------------------
    def begin(self, backbone: MiMoForCausalLM, out, prompt: torch.Tensor) -> MTPState:
        """After the backbone's prefill ``out`` of ``prompt`` [1, T]: entries t = 0 … T − 2."""
        h = out.last_hidden_state  # [1, T, H]
        T = prompt.shape[1]
        kv = self.entries(backbone, h[:, :-1], prompt[:, 1:], torch.arange(1, T))
        return self._keep(MTPState([k for k, _ in kv], [v for _, v in kv], h[:, -1:]))

    def propose(self, backbone, state: MTPState, anchor: int, pos: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """k drafts after ``anchor`` (at ``pos``), each drawn from q_j given the drafts before it."""
        drafts: list[int] = []

        def draw(logits: torch.Tensor) -> int:
            if temperature == 0:
                d = int(logits[0].argmax())
            else:
                d = int(draw_drafts(logits[None], temperature, generator)[0, 0])
            drafts.append(d)
            return d

        C = state.keys[0].shape[2]
        logits = self.chain(backbone, state.last_hidden, torch.tensor([anchor]), torch.tensor([pos]),
                            list(zip(state.keys, state.values)), torch.ones(1, C, dtype=torch.bool),
                            self.num_drafts, lambda j, lg: torch.tensor([draw(lg)]))
        draw(logits[-1])
        return torch.tensor(drafts), torch.cat(logits).float()  # [k], [k, V]

    def commit(self, backbone, state: MTPState, out, block: torch.Tensor, accepted: int, pos: int) -> MTPState:
        """After verifying ``block`` [1, B] = [anchor, drafts] at ``pos`` with ``accepted`` drafts kept: entries
        t = pos − 1 … pos + a − 1 (hidden: the previous last one, then the block's), tokens anchor, d_1 … d_a."""
        a = accepted
        h = torch.cat([state.last_hidden, out.last_hidden_state[:, :a]], dim=1)  # [1, a + 1, H]
        kv = self.entries(backbone, h, block[:, : a + 1], torch.arange(pos, pos + a + 1))
        keys = [torch.cat([k, nk], 2) for k, (nk, _) in zip(state.keys, kv)]
        values = [torch.cat([v, nv], 2) for v, (_, nv) in zip(state.values, kv)]
        return self._keep(MTPState(keys, values, out.last_hidden_state[:, a : a + 1]))

    def _keep(self, state: MTPState) -> MTPState:
        """Only the last window − 1 entries can be seen by a query (it sees itself too)."""
        n = max(self.window - 1, 0)
        state.keys = [k[:, :, k.shape[2] - min(n, k.shape[2]):] for k in state.keys]
        state.values = [v[:, :, v.shape[2] - min(n, v.shape[2]):] for v in state.values]
        return state


    # ---- the batched protocol (mimo_kit.speculative.rows): every row's entries in one ring ----------------------
    def rows_state(self, rows: int, device: torch.device | str | None = None) -> MTPRows:
        """No entries yet for ``rows`` rows: per layer a ring of window − 1 slots (all a depth-0 query sees besides
        itself), plus a discard slot."""
        S = max(self.window - 1, 1)
        a = self.layers[0].self_attn
        dtype = a.q_proj.weight.dtype
        H = a.q_proj.weight.shape[1]
        return MTPRows([torch.zeros(rows, a.kv, S + 1, a.d, dtype=dtype, device=device) for _ in self.layers],
                       [torch.zeros(rows, a.kv, S + 1, a.dv, dtype=dtype, device=device) for _ in self.layers],
                       torch.full((rows, S + 1), -1, dtype=torch.long, device=device),
                       torch.zeros(rows, 1, H, dtype=dtype, device=device))

    def observe(self, backbone: MiMoForCausalLM, state: MTPRows, rows: torch.Tensor, out, tokens: torch.Tensor,
                start: torch.Tensor, count: torch.Tensor, fresh: bool = False) -> None:
        """The backbone ran ``tokens`` [n, T] of ``rows`` [n] at positions start … start + T − 1 (its output ``out``)
        and keeps the first ``count`` [n]: entry p = (h_{p−1}, x_p) for each kept p goes into slot p mod S, h_{p−1}
        being the row's last hidden state for p = start (``fresh``: a row just prefilled has none, so its first
        position makes no entry); the row's last hidden state becomes that of its last kept token."""
        n, T = tokens.shape
        S = state.positions.shape[1] - 1
        j = torch.arange(T, device=tokens.device)
        pos = start[:, None] + j  # [n, T]
        keep = (j < count[:, None]) & (j >= count[:, None] - S) & ((j > 0) if fresh else True)
        h = out.last_hidden_state  # [n, T, H]
        prev = torch.cat([state.last_hidden[rows], h[:, :-1]], dim=1)  # h_{p−1} for each p: [n, T, H]
        lo = max(0, int(count.min()) - S)  # no row keeps an earlier entry: a long prefill runs its last ones
        pos, keep, prev, T = pos[:, lo:], keep[:, lo:], prev[:, lo:], T - lo
        emb = backbone.model.embed_tokens(tokens[:, lo:])
        cos, sin = self.rope(pos.reshape(-1), emb.dtype)
        rope = (cos.view(n, 1, T, -1), sin.view(n, 1, T, -1))
        slots = torch.where(keep, pos % S, S)  # [n, T]: the discard slot S for the rest
        for layer, keys, values in zip(self.layers, state.keys, state.values):
            k, v = layer.self_attn.keys_values(layer.input_layernorm(layer.fuse(emb, prev)), rope)
            keys[rows] = keys[rows].scatter_(2, slots[:, None, :, None].expand_as(k), k)
            values[rows] = values[rows].scatter_(2, slots[:, None, :, None].expand_as(v), v)
        state.positions[rows] = state.positions[rows].scatter_(1, slots, pos)
        state.positions[:, S] = -1
        last = h.gather(1, (count - 1).clamp_min(0)[:, None, None].expand(n, 1, h.shape[-1]))  # [n, 1, H]
        state.last_hidden[rows] = torch.where((count > 0)[:, None, None], last, state.last_hidden[rows])

    def propose_rows(self, backbone: MiMoForCausalLM, state: MTPRows, anchors: torch.Tensor, pos: torch.Tensor,
                     temperature: float = 0.0, generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`propose` for every row at once: anchors [N] at positions pos [N] → drafts [N, k], q logits
        [N, k, V], the depths run one after another over all rows."""
        p = state.positions
        drafts: list[torch.Tensor] = []

        def draw(logits: torch.Tensor) -> torch.Tensor:  # [N, V] → [N]
            d = draw_drafts(logits[:, None], temperature, generator)[:, 0]
            drafts.append(d)
            return d

        logits = self.chain(backbone, state.last_hidden, anchors, pos, list(zip(state.keys, state.values)),
                            (p >= 0) & (p < pos[:, None]), self.num_drafts, lambda j, lg: draw(lg), ctx_positions=p)
        draw(logits[-1])
        return torch.stack(drafts, 1), torch.stack(logits, 1).float()  # [N, k], [N, k, V]


@dataclasses.dataclass
class MTPRows:
    """Every row's MTP entries (:meth:`MTPDrafter.rows_state`)."""

    keys: list[torch.Tensor]  # per layer [N, KV, S + 1, d]: slot p mod S holds entry p (S = window − 1)
    values: list[torch.Tensor]  # per layer [N, KV, S + 1, dv]
    positions: torch.Tensor  # [N, S + 1] long: the entry each slot holds, −1 when empty (the discard slot S)
    last_hidden: torch.Tensor  # [N, 1, H]: the backbone's final-normed state at each row's last kept token


def _in_window(ctx_allowed: torch.Tensor, depth_plus_one: int, window: int) -> torch.Tensor:
    """bool [N, C]: of the visible context entries (the last ones are the latest), keep those a query at depth
    ``depth_plus_one − 1`` still sees: window − depth_plus_one context keys."""
    N, C = ctx_allowed.shape
    room = window - depth_plus_one
    if room <= 0:
        return torch.zeros_like(ctx_allowed)
    # rank of each visible entry from the end: 0 = the latest
    rank = ctx_allowed.flip(1).long().cumsum(1).flip(1) - 1
    return rank < room


# ---- the hub checkpoint's MTP weights ---------------------------------------------------------------------------
def mtp_to_hub(mtp_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An MTP drafter's ``state_dict()`` → hub keys: ``model.mtp.`` + key, sinks as ``attention_sink_bias``."""
    return {MTP_PREFIX + k.replace("self_attn.sinks", "self_attn.attention_sink_bias"): v
            for k, v in mtp_state.items()}


def load_mtp(mtp_state: dict[str, torch.Tensor], cfg: MiMoConfig, block_size: int = 8):
    """The MTP drafter of a checkpoint: ``mtp_state`` as :func:`load_checkpoint` sets it aside (hub keys
    ``model.mtp.layers.{i}.*``), ``cfg`` the backbone's config, ``block_size`` the drafting budget (anchor + k).

    The number of layers is read from the keys; ``pre_mlp_layernorm`` is accepted for
    ``post_attention_layernorm``. Missing or unexpected keys raise with their names.
    """
    state = {}
    for key, value in from_hub_layout(mtp_state).items():
        if not key.startswith(MTP_PREFIX):
            raise ValueError(f"load_mtp: {key!r} is not an MTP key (expected the prefix {MTP_PREFIX!r})")
        state[key[len(MTP_PREFIX):].replace("pre_mlp_layernorm", "post_attention_layernorm")] = value
    layers = sorted({int(m.group(1)) for k in state if (m := re.match(r"layers\.(\d+)\.", k))})
    if not layers:
        raise ValueError("load_mtp: no model.mtp.layers.{i}.* keys in the checkpoint")
    mtp = MTPDrafter(MTPConfig(num_layers=layers[-1] + 1, block_size=block_size), cfg)
    expected = set(mtp.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        name = lambda keys: [MTP_PREFIX + k for k in keys[:5]]  # noqa: E731
        raise ValueError(f"load_mtp: MTP weights do not fit the config: missing {name(missing)}, "
                         f"unexpected {name(unexpected)}")
    mtp.load_state_dict(state)
    return mtp.eval()
