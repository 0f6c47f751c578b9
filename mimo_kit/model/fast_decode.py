"""Decoding a batch of sequences with a preallocated cache: a decode step is a fixed list of kernels (Report §2).

:func:`generate` runs the model's general forward once per token: it builds a position range, rope tables per
layer type, orders the SWA ring, concatenates past and new keys, checks token ids on the host and loops over the
experts in Python. At a decode step those small ops, not the arithmetic, set the speed. This file decodes a
batch of rows of *different* lengths (a GRPO group, or several groups with different prompts) with:

- :class:`StaticKVCache`: per layer a buffer allocated once. GA keeps every position, ``[B, KV, max_len, D]``;
  SWA keeps a ring of ``R = window + slack`` slots, position p in slot ``p mod R``, plus one **sink slot**
  (below). ``lengths [B]`` is each row's position of its next token, so each row has its own rope angles and slots.
- :func:`decode_logits`: one token per row → logits [B, V]. Per step, once for all layers: rope cos/sin
  gathered from tables at ``lengths``, an additive mask per layer type. Per layer: the new key/value is scattered
  into its slot, then ``softmax(q Kᵀ · scale + bias) V`` over the buffer. The ring needs no ordering (softmax
  does not mind): a query at position q sees slot s iff ``s ≤ q`` (written) and ``(q − s) mod R < window`` (the
  slot's latest position is within the window); with ``slack = 0`` the second test always holds.
- :func:`block_logits`: T tokens per row at once (speculative verification, Report §2) → logits [B, T, V] and the
  layers' hidden states; :meth:`StaticKVCache.rollback` then drops a row's rejected tokens. A rejected position
  r, q < r ≤ q + slack, leaves its key in slot r mod R, where ``(q − r) mod R = R − (r − q) ≥ window`` masks it,
  and the position it overwrote, r − R, is older than q's window; within a block, query q sees none of the block's
  later keys for the same reason: ``slack ≥ T − 1`` keeps both true.
- The **sink** (Report §2, attention sinks) is a key slot that never changes: k = 0 and v = 0, so its score is
  the bias alone, which holds the head's sink logit. softmax over ``[scores, sink]`` without a concatenation.
- Experts: for a handful of rows the k chosen experts' weights are gathered and multiplied with ``bmm``
  (no per-expert Python loop, no host sync; eager CPU instead multiplies by each chosen expert in place, where a
  host read is free and a gather would copy the weights; compiled, a multiply-and-sum whose loads the gather is
  fused into, so each chosen expert is read once); for a batch the sorted-token grouped product of
  :class:`~mimo_kit.model.moe.Experts`.

Nothing in :func:`decode_logits` reads a tensor on the host (no ``.item()``, ``.tolist()``, data-dependent
shapes), so ``torch.compile(fullgraph=True)`` traces it and a CUDA graph captures it (:func:`compiled_step`:
``mode="reduce-overhead"`` on CUDA, the cache's buffers static addresses); :func:`block_logits`, the speculative
verification, likewise (:func:`verify_step`). The number of GA keys a step reads (``n_keys``) is a host integer
the caller keeps (:attr:`StaticKVCache.span`), or ``max_len`` for a fixed-shape graph.

Departures from :func:`~mimo_kit.model.generate.generate`: prompts are prefilled with the model's forward, one
batched forward per distinct prompt length, identical prompts once (a GRPO group shares one prefill), and
copied into the rows. Routing replay (R3) is not supported on this path (:func:`fast_generate` refuses it);
routing capture records one ``[B, k]`` per decode step but prefill forwards per distinct prompt, so capture
order is not ``generate``'s: the RL engine keeps the old path for requests that capture routing. Expert loads
(``expert_load``) are counted as in the forward. Speculative verification runs here too (:func:`block_logits`,
:meth:`StaticKVCache.rollback`; ``speculative_sample(..., fast=True)``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from mimo_kit.model.cache import KVCache
from mimo_kit.model.config import FULL, SLIDING, MiMoConfig
from mimo_kit.model.decoder import CausalLMOutput, MiMoForCausalLM
from mimo_kit.model.generate import Generation, sampling_loop
from mimo_kit.model.moe import MiMoMoE

#: At most this many (token, expert) pairs take the gather + bmm expert path; above it the sorted grouped product
#: wins (gathering copies k expert matrices per row: cheap for one row, a waste when rows share experts).
GATHER_MAX_PAIRS = 8


class StaticKVCache:
    """Preallocated keys/values of a batch of ``batch`` rows up to ``max_len`` positions each.

    ``k[i]`` [B, KV, S_i, D], ``v[i]`` [B, KV, S_i, Dv]: GA S_i = max_len; SWA S_i = R + 1 (ring of R = window
    + ``slack`` slots, then the sink slot, kept at zero). ``lengths`` [B] = tokens held per row; ``span`` ≥
    max(lengths) as a host int (how many GA keys a step reads). ``slack`` lets a row roll back that many tokens.
    """

    def __init__(self, cfg: MiMoConfig, batch: int, max_len: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, slack: int = 0):
        if batch < 1 or max_len < 1:
            raise ValueError(f"StaticKVCache: batch={batch}, max_len={max_len}; expected both >= 1")
        if max_len > cfg.max_position_embeddings:
            raise ValueError(f"StaticKVCache: max_len={max_len} exceeds max_position_embeddings="
                             f"{cfg.max_position_embeddings}")
        if slack < 0:
            raise ValueError(f"StaticKVCache: slack={slack}; expected >= 0 (spare SWA slots for rolling back)")
        self.config, self.batch, self.max_len = cfg, batch, max_len
        self.window, self.slack = cfg.sliding_window, slack
        self.ring = cfg.sliding_window + slack  # R: slot of position p is p mod R
        self.layer_types = cfg.layer_types
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        for t in self.layer_types:
            kv = cfg.swa_num_key_value_heads if t == SLIDING else cfg.num_key_value_heads
            S = self.ring + 1 if t == SLIDING else max_len
            self.k.append(torch.zeros(batch, kv, S, cfg.head_dim, dtype=dtype, device=device))
            self.v.append(torch.zeros(batch, kv, S, cfg.v_head_dim, dtype=dtype, device=device))
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.span = 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    # ---- prefill ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, model: MiMoForCausalLM, prompts: Sequence[Sequence[int]],
                prefixes: Sequence[KVCache | None] | None = None, *,
                on_forward: Callable[[list[list[int]], CausalLMOutput, int], None] | None = None) -> torch.Tensor:
        """Run every prompt through ``model`` and store its keys in its row → last-position logits [B, V].

        Rows with identical prompts share one forward; distinct prompts of equal length share a batched one.
        ``prefixes[b]``, when given, is a :class:`KVCache` holding the first ``seq_len`` tokens of prompt ``b``
        (a prefix cache's hit): only the suffix is run, on a clone of it (Report §6, suffix-only prefill).
        :attr:`prefilled` counts the tokens this call ran through the model. ``on_forward(rows, out, start)`` sees
        each forward's output with every layer's hidden states (what a drafter begins from): its sequence j
        holds the tokens from position ``start`` on of the prompt of rows ``rows[j]``."""
        cfg = self.config
        if len(prompts) != self.batch:
            raise ValueError(f"prefill: {len(prompts)} prompts for a cache of batch {self.batch}")
        if prefixes is not None and len(prefixes) != self.batch:
            raise ValueError(f"prefill: {len(prefixes)} prefixes for a cache of batch {self.batch}")
        rows_of: dict[tuple[int, ...], list[int]] = {}
        for b, p in enumerate(prompts):
            p = self._checked("prefill", b, p, None if prefixes is None else prefixes[b])
            rows_of.setdefault(p, []).append(b)
        device = self.lengths.device
        logits = None
        self.prefilled = 0
        cached: dict[tuple[int, ...], KVCache] = {}  # prompt → the prefix its rows continue
        for p, rows in rows_of.items():
            hit = None if prefixes is None else prefixes[rows[0]]
            if hit is not None:
                cached[p] = hit
        hidden = on_forward is not None
        for p, hit in cached.items():  # one forward per distinct prompt: its suffix only, on a clone of the prefix
            out, kv = _continue(model, p, hit, device, hidden)
            if hidden:
                on_forward([rows_of[p]], out, hit.seq_len)
                out = out.logits[:, -1]
            if logits is None:
                logits = out.new_empty(self.batch, out.shape[-1])
            rows = torch.tensor(rows_of[p], device=device)
            logits[rows] = out[0]
            self._store(kv, 0, rows, len(p))
            self.prefilled += len(p) - hit.seq_len
        by_len: dict[int, list[tuple[int, ...]]] = {}
        for p in rows_of:
            if p not in cached:
                by_len.setdefault(len(p), []).append(p)
        for T, group in by_len.items():
            kv = KVCache(cfg)
            ids = torch.tensor(group, dtype=torch.long, device=device)  # [n, T]
            out = model(ids, kv, logits_to_keep=1, output_hidden_states=hidden)
            if hidden:
                on_forward([rows_of[p] for p in group], out, 0)
            out = out.logits[:, -1]  # [n, V]
            if logits is None:
                logits = out.new_empty(self.batch, out.shape[-1])
            for j, p in enumerate(group):
                rows = torch.tensor(rows_of[p], device=device)
                logits[rows] = out[j]
                self._store(kv, j, rows, T)
            self.prefilled += T * len(group)
        self.lengths.copy_(torch.tensor([len(p) for p in prompts]))
        self.span = max(len(p) for p in prompts)
        return logits

    @torch.no_grad()
    def fill_row(self, model: MiMoForCausalLM, b: int, prompt: Sequence[int],
                 prefix: KVCache | None = None, *, output_hidden_states: bool = False):
        """Admit one sequence into row ``b`` while the other rows keep theirs (continuous batching, Report §6):
        run ``prompt`` through ``model`` (only its suffix past ``prefix``, a :class:`KVCache` of its first
        ``seq_len`` tokens, continued on a clone) and store its keys in row ``b`` → the last position's logits [V]
        (``output_hidden_states``: the forward's :class:`CausalLMOutput`, every layer's states of the run tokens, as a
        drafter begins from). Row ``b``'s earlier contents are overwritten where read and masked elsewhere.
        :attr:`prefilled` counts the tokens run."""
        if not 0 <= b < self.batch:
            raise ValueError(f"fill_row: row {b}; expected 0..{self.batch - 1}")
        p = self._checked("fill_row", b, prompt, prefix)
        device = self.lengths.device
        out, kv = _continue(model, p, prefix, device, output_hidden_states)
        self._store(kv, 0, torch.tensor([b], device=device), len(p))
        self.lengths[b] = len(p)
        self.span = max(self.span, len(p))
        self.prefilled = len(p) - (prefix.seq_len if prefix is not None else 0)
        return out if output_hidden_states else out[0]

    def rollback(self, counts: Sequence[int] | torch.Tensor) -> None:
        """Drop the last ``counts[b]`` tokens of each row (the drafts verification rejected, Report §2): each at
        most ``slack``, since their keys stay in the SWA rings' spare slots, masked, until overwritten."""
        counts = torch.as_tensor(counts, dtype=torch.long, device=self.lengths.device).reshape(-1)
        if counts.shape[0] != self.batch:
            raise ValueError(f"rollback: {counts.shape[0]} counts for a cache of batch {self.batch}")
        lo, hi = int(counts.min()), int(counts.max())
        if lo < 0 or hi > self.slack or bool((counts > self.lengths).any()):
            raise ValueError(f"rollback: counts {counts.tolist()}; expected 0..slack={self.slack} and at most each "
                             f"row's length {self.lengths.tolist()}")
        self.lengths.sub_(counts)
        self.span = int(self.lengths.max())

    def _checked(self, where: str, b: int, prompt: Sequence[int], prefix: KVCache | None) -> tuple[int, ...]:
        """Prompt ``b`` as a tuple of ids, refused by name when it cannot go into a row: empty, no position left to
        decode, an id outside the vocabulary, or a prefix that leaves no suffix to give the next token's logits."""
        p = tuple(int(t) for t in prompt)
        if not p:
            raise ValueError(f"{where}: prompt {b} is empty; a prompt needs at least one token")
        if len(p) >= self.max_len:
            raise ValueError(f"{where}: prompt {b} has {len(p)} tokens; the cache holds max_len={self.max_len} "
                             "positions and decoding needs at least one more")
        bad = [t for t in p if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"{where}: prompt {b} holds token id {bad[0]}; expected 0..{self.config.vocab_size - 1}")
        if prefix is not None and not 0 < prefix.seq_len < len(p):
            raise ValueError(f"{where}: the prefix of prompt {b} holds {prefix.seq_len} tokens; expected "
                             f"1..{len(p) - 1} (a suffix must remain to give the next token's logits)")
        return p

    def held_bytes(self, length: int) -> int:
        """Bytes of KV one row of ``length`` tokens really holds: every position in a GA layer, at most the window
        in an SWA ring (what a paged engine's token pool would hold for it; the preallocation is :meth:`nbytes`)."""
        per = getattr(self, "_per_token", None)
        if per is None:  # bytes per token over the GA layers and over the SWA layers, counted once per cache
            per = {FULL: 0, SLIDING: 0}
            for i, t in enumerate(self.layer_types):
                per[t] += self.k[i].shape[1] * (self.k[i].shape[3] + self.v[i].shape[3]) * self.k[i].element_size()
            self._per_token = per
        return per[FULL] * length + per[SLIDING] * min(length, self.window)

    def export_row(self, b: int) -> KVCache:
        """Row ``b``'s keys and values as a :class:`KVCache` of its ``lengths[b]`` positions (GA: every position;
        SWA: the last ``window − 1``), on this cache's device: what a prefix cache keeps of a finished turn."""
        L = int(self.lengths[b])
        kv = KVCache(self.config)
        for i, layer in enumerate(kv.layers):
            layer.seen = L
            if self.layer_types[i] == FULL:
                layer.k, layer.v = self.k[i][b:b + 1, :, :L].clone(), self.v[i][b:b + 1, :, :L].clone()
            elif layer.capacity > 0:
                n = min(L, layer.capacity)
                src = torch.arange(L - n, L, device=self.k[i].device)
                k = self.k[i].new_zeros(1, self.k[i].shape[1], layer.capacity, self.k[i].shape[3])
                v = self.v[i].new_zeros(1, self.v[i].shape[1], layer.capacity, self.v[i].shape[3])
                k[:, :, src % layer.capacity] = self.k[i][b:b + 1, :, src % self.ring]
                v[:, :, src % layer.capacity] = self.v[i][b:b + 1, :, src % self.ring]
                layer.k, layer.v = k, v
        return kv

    def _store(self, kv: KVCache, j: int, rows: torch.Tensor, T: int) -> None:
        """Copy row ``j`` of a forward's cache (T positions) into ``rows`` of this one."""
        for i, layer in enumerate(kv.layers):
            k, v = layer.ordered()  # GA: positions 0..T−1; SWA: the last n ≤ window − 1
            k, v = k[j], v[j]  # [KV, n, ·]
            n = k.shape[1]
            if self.layer_types[i] == FULL:
                self.k[i][rows, :, :T] = k.to(self.k[i].dtype)
                self.v[i][rows, :, :T] = v.to(self.v[i].dtype)
            elif n:
                slots = torch.arange(T - n, T, device=k.device) % self.ring
                for r in rows.tolist():  # prefill only: a handful of rows per prompt
                    self.k[i][r, :, slots] = k.to(self.k[i].dtype)
                    self.v[i][r, :, slots] = v.to(self.v[i].dtype)


def _continue(model: MiMoForCausalLM, prompt: Sequence[int], prefix: KVCache | None, device: torch.device,
              output_hidden_states: bool = False) -> tuple[torch.Tensor, KVCache]:
    """One prompt through ``model``, continuing a clone of ``prefix`` (its first ``seq_len`` tokens) when given →
    (last-position logits [1, V], or with ``output_hidden_states`` the whole output; the cache of the prompt)."""
    kv = prefix.clone().to(device) if prefix is not None else KVCache(model.config)
    ids = torch.tensor([list(prompt)[kv.seq_len:]], dtype=torch.long, device=device)  # [1, suffix]
    out = model(ids, kv, logits_to_keep=1, output_hidden_states=output_hidden_states)
    return (out if output_hidden_states else out.logits[:, -1]), kv


# ---- the decode step ---------------------------------------------------------------------------------------------
def _rope_tables(model: MiMoForCausalLM, cache: StaticKVCache) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """cos/sin [max_len, r/2] per layer type, built once per cache (rotate-half uses each half-frequency twice)."""
    tables = getattr(cache, "_rope", None)
    if tables is None:
        pos = torch.arange(cache.max_len, device=cache.lengths.device, dtype=torch.float)
        tables = {}
        for t, inv in ((FULL, model.model.ga_inv_freq), (SLIDING, model.model.swa_inv_freq)):
            freqs = pos[:, None] * inv.to(pos.device)[None, :]  # [max_len, r/2]
            dtype = cache.k[0].dtype
            tables[t] = (freqs.cos().to(dtype), freqs.sin().to(dtype))
        cache._rope = tables
    return tables


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rope on the first r dims of x [..., D]; cos/sin broadcast to [..., r/2].

    x₁' = x₁c − x₂s, x₂' = x₂c + x₁s."""
    h = cos.shape[-1]
    x1, x2, rest = x[..., :h], x[..., h : 2 * h], x[..., 2 * h :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)


def _sink_column(cache: StaticKVCache, i: int, a) -> torch.Tensor:
    """[1, KV, G, R + 1]: zeros, the head's sink logit in the sink slot; built once per cache and layer."""
    cols = cache.__dict__.setdefault("_sinks", {})
    if i not in cols:
        KV, G = a.num_kv_heads, a.num_heads // a.num_kv_heads
        col = torch.zeros(1, KV, G, cache.ring + 1, dtype=cache.k[i].dtype, device=cache.k[i].device)
        col[..., cache.ring] = a.sinks.detach().view(KV, G).to(col.dtype)
        cols[i] = col
    return cols[i]


def _moe(m: MiMoMoE, x: torch.Tensor, grouped: bool = False) -> torch.Tensor:
    """The sparse FFN on x [N, H] without host syncs; counts ``expert_load`` and honours routing capture.
    ``grouped`` takes the sorted grouped product whatever N (a verification block: its tokens share experts)."""
    idx, w = m.gate(x)  # [N, k] each
    m.expert_load.index_add_(0, idx.reshape(-1), torch.ones(idx.numel(), dtype=m.expert_load.dtype,
                                                            device=idx.device))
    if m.capture is not None:
        m.capture.append(idx.detach())
    N, k = idx.shape
    ex = m.experts
    if (grouped or N * k > GATHER_MAX_PAIRS) and not torch.compiler.is_compiling():
        return ex(x, idx, w)  # compiled, the gather below: the grouped product's data-dependent offsets do not trace
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        # eager CPU: a host read costs nothing here, and multiplying by each chosen expert's weights in place reads
        # them once, where a gather would copy them first
        out = torch.zeros_like(x)
        for n, row in enumerate(idx.tolist()):
            for j, e in enumerate(row):
                gate, up = F.linear(x[n], ex.gate_up_proj[e]).chunk(2)  # [I] each
                out[n] += w[n, j].to(x.dtype) * F.linear(F.silu(gate) * up, ex.down_proj[e])
        return out
    flat = idx.reshape(-1)
    if torch.compiler.is_compiling():
        # products written as multiply-and-sum: inductor fuses the expert gather into the reduction's loads, so a
        # step reads each chosen expert's weights once (a bmm would read a gathered copy, written first)
        xr = x.repeat_interleave(k, dim=0).to(ex.gate_up_proj.dtype)  # [N·k, H]
        gate, up = (ex.gate_up_proj[flat] * xr[:, None, :]).sum(-1).chunk(2, dim=-1)  # [N·k, I] each
        h = (F.silu(gate) * up).to(ex.down_proj.dtype)
        y = (ex.down_proj[flat] * h[:, None, :]).sum(-1)  # [N·k, H]
        return (y.view(N, k, -1) * w[:, :, None].to(y.dtype)).sum(1).to(x.dtype)
    gu = ex.gate_up_proj[flat]  # [N·k, 2I, H]: the chosen experts only
    xr = x.repeat_interleave(k, dim=0)[:, :, None].to(gu.dtype)  # [N·k, H, 1]
    gate, up = torch.bmm(gu, xr).chunk(2, dim=1)  # [N·k, I, 1] each
    y = torch.bmm(ex.down_proj[flat], F.silu(gate) * up)[:, :, 0]  # [N·k, H]
    return (y.view(N, k, -1) * w[:, :, None].to(y.dtype)).sum(1).to(x.dtype)


def _qkv(layer, x: torch.Tensor, rope: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's attention inputs from x [..., hidden]: roped and scaled queries [..., heads, D], roped keys
    [..., KV, D], scaled values [..., KV, Dv]; ``rope`` maps the layer type to cos/sin broadcasting over them."""
    a = layer.self_attn
    lead = x.shape[:-1]
    h = layer.input_layernorm(x)
    cos, sin = rope[SLIDING if a.is_swa else FULL]
    q = _rope(a.q_proj(h).view(*lead, a.num_heads, a.head_dim), cos, sin) * a.scale
    k = _rope(a.k_proj(h).view(*lead, a.num_kv_heads, a.head_dim), cos, sin)
    v = a.v_proj(h).view(*lead, a.num_kv_heads, a.v_head_dim) * a.v_scale
    return q, k, v


def _biases(cache: StaticKVCache, pos: torch.Tensor, n_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive masks for queries at positions pos [B, T]: GA [B, T, n_keys] (keys 0..q) and SWA [B, T, R + 1]
    (slot s written, s ≤ q, and holding a position within the window, (q − s) mod R < window, which always holds
    without slack; the sink slot always on)."""
    dtype = cache.k[0].dtype
    neg = torch.finfo(dtype).min
    B, T = pos.shape
    ga = torch.zeros(B, T, n_keys, dtype=dtype, device=pos.device).masked_fill_(
        torch.arange(n_keys, device=pos.device) > pos[:, :, None], neg)
    R = cache.ring
    slot_ids = torch.arange(R + 1, device=pos.device)
    stale = (slot_ids > pos[:, :, None]) | ((pos[:, :, None] - slot_ids) % R >= cache.window)
    ring = torch.zeros(B, T, R + 1, dtype=dtype, device=pos.device).masked_fill_(stale & (slot_ids < R), neg)
    return ga, ring


def block_logits(model: MiMoForCausalLM, tokens: torch.Tensor, cache: StaticKVCache, n_keys: int, *,
                 output_hidden_states: bool = False):
    """tokens [B, T] at positions ``cache.lengths`` … ``+ T − 1`` → logits [B, T, V]; writes their keys and advances
    ``lengths`` by T. ``output_hidden_states``: (logits, every layer's output [B, T, H] as a list, the final-normed
    state [B, T, H]), what a drafter reads after verification (Report §2).

    ``n_keys`` (host int, ≥ max(lengths) + T) bounds the GA keys read. No host syncs: graph- and compile-safe.
    T > 1 needs ``cache.slack ≥ T − 1`` when the model has SWA layers (module docstring)."""
    m = model.model
    B, T = tokens.shape
    if n_keys > cache.max_len:
        raise ValueError(f"block_logits: {T} tokens read n_keys={n_keys} positions; the cache holds max_len="
                         f"{cache.max_len} (build it larger)")
    if T > 1 and cache.slack < T - 1 and SLIDING in cache.layer_types:
        raise ValueError(f"block_logits: a block of {T} tokens needs slack >= {T - 1} in the SWA rings, the cache "
                         f"has slack={cache.slack}: a block's later keys would overwrite keys its earlier queries read")
    pos = cache.lengths[:, None] + torch.arange(T, device=tokens.device)  # [B, T]
    tables = _rope_tables(model, cache)
    rope = {t: (c[pos][:, :, None], s[pos][:, :, None]) for t, (c, s) in tables.items()}  # [B, T, 1, r/2] each
    ga_bias, ring_bias = (b[:, None, None] for b in _biases(cache, pos, n_keys))  # [B, 1, 1, T, S] each
    ring_slot = (pos % cache.ring)[:, None, :, None]  # [B, 1, T, 1]
    ga_slot = pos[:, None, :, None]

    x = m.embed_tokens(tokens)  # [B, T, H]
    hidden = []
    for i, layer in enumerate(m.layers):
        a = layer.self_attn
        H, KV, D, Dv = a.num_heads, a.num_kv_heads, a.head_dim, a.v_head_dim
        G = H // KV
        q, k, v = _qkv(layer, x, rope)  # [B, T, H, D], [B, T, KV, D], [B, T, KV, Dv]
        kb, vb = cache.k[i], cache.v[i]
        slot = ring_slot if a.is_swa else ga_slot
        kb.scatter_(2, slot.expand(B, KV, T, D), k.transpose(1, 2).to(kb.dtype))
        vb.scatter_(2, slot.expand(B, KV, T, Dv), v.transpose(1, 2).to(vb.dtype))
        if a.is_swa:
            keys, values = kb, vb  # [B, KV, R + 1, ·], the last slot the sink
            bias = ring_bias + _sink_column(cache, i, a)[:, :, :, None, :]  # [B, KV, G, T, R + 1]
        else:
            keys, values, bias = kb[:, :, :n_keys], vb[:, :, :n_keys], ga_bias
        # a group's G·T queries share their KV head's keys: one [G·T, S] product per (row, KV head), no broadcast
        # copy of the keys over G
        qg = q.view(B, T, KV, G, D).permute(0, 2, 3, 1, 4).reshape(B, KV, G * T, D)
        S = keys.shape[2]
        scores = torch.matmul(qg.to(keys.dtype), keys.transpose(-1, -2)).view(B, KV, G, T, S) + bias
        out = torch.matmul(scores.softmax(-1).view(B, KV, G * T, S), values).view(B, KV, G, T, -1)  # [.., T, Dv]
        x = x + a.o_proj(out.permute(0, 3, 1, 2, 4).reshape(B, T, H * Dv).to(x.dtype))
        h = layer.post_attention_layernorm(x)
        x = x + (_moe(layer.mlp, h.reshape(B * T, -1), T > 1).view(B, T, -1) if isinstance(layer.mlp, MiMoMoE)
                 else layer.mlp(h))
        if output_hidden_states:
            hidden.append(x)
    cache.lengths.add_(T)
    h = m.norm(x)
    logits = model.lm_head(h)
    return (logits, hidden, h) if output_hidden_states else logits


def decode_logits(model: MiMoForCausalLM, tokens: torch.Tensor, cache: StaticKVCache,
                  n_keys: int) -> torch.Tensor:
    """tokens [B] at positions ``cache.lengths`` → logits [B, V]; writes their keys and advances ``lengths``.

    ``n_keys`` (host int, ≥ max(lengths) + 1) bounds the GA keys read. No host syncs: graph- and compile-safe.
    :func:`block_logits` with T = 1 computes the same; this step keeps no T axis, which the hot loop of plain
    decoding measured 7–19% faster (3- and 16-layer backbones, 1 and 16 rows, one thread)."""
    m = model.model
    B = tokens.shape[0]
    pos = cache.lengths  # [B]
    tables = _rope_tables(model, cache)
    rope = {t: (c[pos][:, None], s[pos][:, None]) for t, (c, s) in tables.items()}  # [B, 1, r/2] each
    ga_bias, ring_bias = (b[:, None] for b in _biases(cache, pos[:, None], n_keys))  # [B, 1, 1, S] each
    ring_slot = (pos % cache.ring)[:, None, None, None]  # [B, 1, 1, 1]
    ga_slot = pos[:, None, None, None]

    x = m.embed_tokens(tokens)  # [B, H]
    for i, layer in enumerate(m.layers):
        a = layer.self_attn
        H, KV, D, Dv = a.num_heads, a.num_kv_heads, a.head_dim, a.v_head_dim
        G = H // KV
        q, k, v = _qkv(layer, x, rope)  # [B, H, D], [B, KV, D], [B, KV, Dv]
        kb, vb = cache.k[i], cache.v[i]
        slot = ring_slot if a.is_swa else ga_slot
        kb.scatter_(2, slot.expand(B, KV, 1, D), k[:, :, None].to(kb.dtype))
        vb.scatter_(2, slot.expand(B, KV, 1, Dv), v[:, :, None].to(vb.dtype))
        if a.is_swa:
            keys, values = kb, vb  # [B, KV, R + 1, ·], the last slot the sink
            bias = ring_bias + _sink_column(cache, i, a)  # [B, KV, G, R + 1]
        else:
            keys, values, bias = kb[:, :, :n_keys], vb[:, :, :n_keys], ga_bias
        scores = torch.matmul(q.view(B, KV, G, D).to(keys.dtype), keys.transpose(-1, -2)) + bias  # [B, KV, G, S]
        out = torch.matmul(scores.softmax(-1), values)  # [B, KV, G, Dv]
        x = x + a.o_proj(out.reshape(B, H * Dv).to(x.dtype))
        h = layer.post_attention_layernorm(x)
        x = x + (_moe(layer.mlp, h) if isinstance(layer.mlp, MiMoMoE) else layer.mlp(h))
    cache.lengths.add_(1)
    return model.lm_head(m.norm(x))


#: compiled steps, one per (step, device type): ``"decode"`` (:func:`decode_logits`), ``"verify"`` (:func:`block_logits`
#: with the layers' hidden states, what speculative verification reads)
_COMPILED: dict[tuple[str, str], Callable] = {}


#: compiled decoding rounds a cache's length up to a multiple of this many positions: one graph serves every cache of
#: the same rows up to that length (each new shape compiles, seconds to a minute)
GRAPH_LEN_BUCKET = 256


def graph_len(cfg: MiMoConfig, length: int) -> int:
    """``length`` rounded up to a multiple of :data:`GRAPH_LEN_BUCKET`, at most ``max_position_embeddings``."""
    return max(length, min(-(-length // GRAPH_LEN_BUCKET) * GRAPH_LEN_BUCKET, cfg.max_position_embeddings))


def graph_mode(device: torch.device | str) -> str:
    """``torch.compile`` mode of the decode steps: ``"reduce-overhead"`` on CUDA (inductor's kernels captured in a
    CUDA graph: a step is one graph launch, so batch-1 decode is bound by reading the weights, not by launching
    ~800 kernels), ``"default"`` elsewhere (no graphs off CUDA)."""
    return "reduce-overhead" if torch.device(device).type == "cuda" else "default"


def _own_inductor_cache() -> None:
    """Under ``ATEN_CPU_CAPABILITY`` (torch's CPU kernel set: default, avx2, avx512) inductor's CPU code goes to a
    cache folder of that kernel set, unless ``TORCHINDUCTOR_CACHE_DIR`` names another than inductor's default (which
    inductor writes into the environment itself, and child processes inherit): inductor's cache key does not hold
    the kernel set, and C++ it generated for the machine's own vector units fails to build under another."""
    isa = os.environ.get("ATEN_CPU_CAPABILITY")
    if not isa:
        return
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    if os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR", default)) == default:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default}-{isa}"


def compiled_step(step: str, device: torch.device | str) -> Callable:
    """:func:`decode_logits` (``step="decode"``) or :func:`block_logits` (``"verify"``) under ``torch.compile``
    (fullgraph, static shapes), built once per process and device type. Called with ``n_keys = max_len``, one graph
    serves every step of a cache (no recompilation as the context grows); the GA keys past a row's length are
    masked, so the logits equal the eager step's up to float rounding."""
    key = (step, torch.device(device).type)
    if key[1] == "cpu":
        _own_inductor_cache()
    if key not in _COMPILED:
        fn = {"decode": decode_logits, "verify": block_logits}[step]
        _COMPILED[key] = torch.compile(fn, fullgraph=True, dynamic=False, mode=graph_mode(device))
    return _COMPILED[key]


def _graph_ready(model: MiMoForCausalLM, cache: StaticKVCache) -> None:
    """Before a compiled step: the rope tables and the sink columns built eagerly (built inside the graph, step 2
    would fail a guard and compile again, and a CUDA graph's replay could overwrite them) and, once per cache, its
    buffers marked static addresses: a CUDA graph reads and writes the cache in place (keys, values, ``lengths``)
    instead of copying it into the graph's own inputs every replay."""
    if cache.lengths.device.type == "cpu":
        _own_inductor_cache()  # before torch._dynamo fixes inductor's cache folder
    tables = _rope_tables(model, cache)
    sinks = [_sink_column(cache, i, layer.self_attn) for i, layer in enumerate(model.model.layers)
             if layer.self_attn.is_swa]  # eagerly too: a tensor a graph creates lives in (and dies with) its pool
    if not cache.__dict__.get("_static"):
        for t in [*cache.k, *cache.v, cache.lengths, *(x for pair in tables.values() for x in pair), *sinks]:
            torch._dynamo.mark_static_address(t, guard=False)
        cache._static = True
    if graph_mode(cache.lengths.device) == "reduce-overhead":
        torch.compiler.cudagraph_mark_step_begin()  # a new iteration: the last replay's outputs may be reused


def _owned(x):
    """A graph replay's outputs live in the graph's memory pool, overwritten by the next replay: copies."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    return type(x)(_owned(y) for y in x)


def decode_step(model: MiMoForCausalLM, tokens: torch.Tensor, cache: StaticKVCache, *,
                compiled: bool = False) -> torch.Tensor:
    """One token per row (tokens [B]) → logits [B, V]; the host keeps ``cache.span``. ``compiled`` runs the step
    through :func:`compiled_step` (the first step of a new shape pays the compilation; on CUDA a graph replay)."""
    if cache.span >= cache.max_len:
        raise ValueError(f"decode_step: a row reached max_len={cache.max_len}; build the cache larger")
    if compiled:
        _graph_ready(model, cache)
        logits = compiled_step("decode", tokens.device)(model, tokens, cache, cache.max_len)
        if graph_mode(tokens.device) == "reduce-overhead":
            logits = logits.clone()
    else:
        logits = decode_logits(model, tokens, cache, cache.span + 1)
    cache.span += 1
    return logits


def verify_step(model: MiMoForCausalLM, block: torch.Tensor, cache: StaticKVCache, *, compiled: bool = False):
    """Speculative verification of a block [B, T] (each row's anchor and its drafts) → (logits [B, T, V], the
    layers' outputs, the final-normed state): :func:`block_logits` with ``output_hidden_states``, eager (reading
    ``span + T`` GA keys) or ``compiled`` on the decode step's terms (``n_keys = max_len``, one graph per T; on CUDA
    a graph replay). The caller rolls back the rejected tokens (:meth:`StaticKVCache.rollback`)."""
    T = block.shape[1]
    if not compiled:
        return block_logits(model, block, cache, cache.span + T, output_hidden_states=True)
    if cache.span + T > cache.max_len:
        raise ValueError(f"verify_step: a block of {T} tokens after {cache.span} runs past the cache's max_len="
                         f"{cache.max_len} (build it larger)")
    _graph_ready(model, cache)
    out = compiled_step("verify", block.device)(model, block, cache, cache.max_len, output_hidden_states=True)
    return _owned(out) if graph_mode(block.device) == "reduce-overhead" else out


# ---- generation ------------------------------------------------------------------------------------------------
@torch.no_grad()
def fast_generate(model: MiMoForCausalLM, prompts: Sequence[Sequence[int]] | torch.Tensor, max_new_tokens: int, *,
                  temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, eos_token_id: int | None = None,
                  pad_id: int = 0, return_candidates: bool = False,
                  generator: torch.Generator | None = None, compiled: bool = False) -> Generation:
    """:func:`~mimo_kit.model.generate.generate` for prompts of different lengths, on a :class:`StaticKVCache`.

    Same sampling (:func:`sample_next`), same :class:`Generation`; rows that stopped are fed ``pad_id``.
    ``compiled`` decodes through ``torch.compile`` (:func:`compiled_step`): worth it for long generations,
    since the first call of each (batch, length) shape compiles (tens of seconds on a CPU)."""
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist()
    if not prompts:
        raise ValueError("fast_generate: no prompts")
    if max_new_tokens < 1:
        raise ValueError(f"fast_generate: max_new_tokens={max_new_tokens}; expected >= 1")
    if any(m.replay is not None for m in model.moe_layers()):
        raise ValueError("fast_generate: routing replay (R3) is active; use generate() with the KV cache")
    B = len(prompts)
    device = next(model.parameters()).device
    max_len = max(len(p) for p in prompts) + max_new_tokens
    cache = StaticKVCache(model.config, B, max_len, dtype=next(model.parameters()).dtype, device=device)
    logits = cache.prefill(model, prompts)
    return sampling_loop(logits, lambda tok: decode_step(model, tok, cache, compiled=compiled), max_new_tokens,
                         temperature=temperature,
                         top_k=top_k, top_p=top_p, eos_token_id=eos_token_id, pad_id=pad_id,
                         return_candidates=return_candidates, generator=generator)
