"""The KV cache of the hybrid decoder: GA layers grow, SWA layers keep a ring buffer of ``window − 1`` entries.

A SWA query sees the ``window`` most recent keys including its own, so a layer never needs more than the
``window − 1`` keys before the current token: SWA memory is flat in context length, and with 39 of 48 Flash layers
sliding, most of the cache stops growing (Report §2). GA layers keep every key; their buffers double in capacity
so appending stays amortised O(1).

``rollback(n)`` forgets the last n tokens (speculative decoding rejects drafted tokens). A ring buffer can only
roll back what it still holds, so it keeps ``slack`` extra slots when a drafter will need them.
"""

from __future__ import annotations

import torch

from mimo_kit.model.config import SLIDING, MiMoConfig


class LayerCache:
    """Keys [B, KV, ·, D] and values [B, KV, ·, Dv] of one layer."""

    def __init__(self, window: int | None, slack: int = 0):
        self.window = window
        self.capacity = None if window is None else window - 1 + slack
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.seen = 0  # tokens written so far (= position of the next token)

    # GA: buffer[:, :, :seen]; SWA: ring slot of position p is p % capacity
    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        L = k.shape[2]
        if self.capacity is None:
            self._grow(k, v, self.seen + L)
            self.k[:, :, self.seen : self.seen + L] = k
            self.v[:, :, self.seen : self.seen + L] = v
        elif self.capacity > 0:
            if self.k is None:
                self.k = k.new_zeros(*k.shape[:2], self.capacity, k.shape[3])
                self.v = v.new_zeros(*v.shape[:2], self.capacity, v.shape[3])
            keep = min(L, self.capacity)
            slots = (torch.arange(self.seen + L - keep, self.seen + L, device=k.device)) % self.capacity
            self.k[:, :, slots] = k[:, :, L - keep :]
            self.v[:, :, slots] = v[:, :, L - keep :]
        self.seen += L

    def _grow(self, k: torch.Tensor, v: torch.Tensor, needed: int) -> None:
        if self.k is not None and self.k.shape[2] >= needed:
            return
        cap = max(needed, 2 * (self.k.shape[2] if self.k is not None else 0), 16)
        new_k = k.new_zeros(*k.shape[:2], cap, k.shape[3])
        new_v = v.new_zeros(*v.shape[:2], cap, v.shape[3])
        if self.k is not None:
            new_k[:, :, : self.seen] = self.k[:, :, : self.seen]
            new_v[:, :, : self.seen] = self.v[:, :, : self.seen]
        self.k, self.v = new_k, new_v

    def held(self) -> int:
        """How many past positions this layer can still attend to."""
        if self.capacity is None:
            return self.seen
        return min(self.seen, self.window - 1)

    def ordered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys/values a new chunk needs, oldest first: all of them (GA) or the last ≤ window − 1 (SWA)."""
        if self.held() == 0:
            raise ValueError("ordered(): the cache holds no positions yet")
        if self.capacity is None:
            return self.k[:, :, : self.seen], self.v[:, :, : self.seen]
        n = self.held()
        slots = torch.arange(self.seen - n, self.seen, device=self.k.device) % self.capacity
        return self.k[:, :, slots], self.v[:, :, slots]

    def ring_view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """SWA decode: the slots in storage order and a bool mask [capacity] of those within the window
        (None when every slot is: a full ring without slack holds exactly the window − 1 previous keys)."""
        if self.seen >= self.capacity == self.window - 1:
            return self.k, self.v, None
        slot_pos = self._slot_positions()
        valid = (slot_pos >= 0) & (slot_pos >= self.seen - (self.window - 1))
        return self.k, self.v, valid

    def _slot_positions(self) -> torch.Tensor:
        """Absolute position held by each ring slot (−1 when never written)."""
        cap, s = self.capacity, self.seen
        slots = torch.arange(cap, device=self.k.device)
        last = s - 1 - ((s - 1 - slots) % cap)  # the latest position p < s with p % cap == slot
        return torch.where(last >= 0, last, torch.full_like(last, -1))

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` tokens (they must still be held: SWA needs ``slack ≥ n``)."""
        if n < 0 or n > self.seen:
            raise ValueError(f"rollback({n}): expected 0 <= n <= {self.seen} cached tokens")
        if self.capacity is not None and n > self.capacity - (self.window - 1):
            raise ValueError(f"rollback({n}): this SWA ring keeps only {self.capacity - (self.window - 1)} "
                             "slack slots; build the cache with a larger slack")
        self.seen -= n

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)

    def clone(self) -> LayerCache:
        """An independent copy holding the same positions (a GA buffer trimmed to what it holds)."""
        other = LayerCache(self.window)
        other.capacity, other.seen = self.capacity, self.seen
        if self.k is not None:
            n = self.seen if self.capacity is None else self.k.shape[2]
            other.k, other.v = self.k[:, :, :n].clone(), self.v[:, :, :n].clone()
        return other


class KVCache:
    """One :class:`LayerCache` per decoder layer; ``seq_len`` is the number of tokens already processed."""

    def __init__(self, cfg: MiMoConfig, slack: int = 0):
        self.layers = [LayerCache(cfg.sliding_window if t == SLIDING else None, slack) for t in cfg.layer_types]

    @property
    def seq_len(self) -> int:
        return self.layers[0].seen

    def rollback(self, n: int) -> None:
        for layer in self.layers:
            layer.rollback(n)

    def nbytes(self) -> int:
        """Bytes allocated for keys and values, all layers."""
        return sum(layer.nbytes() for layer in self.layers)

    def clone(self) -> KVCache:
        """An independent copy (a prefix cache hands out clones, so a continuation never writes into its entry)."""
        other = KVCache.__new__(KVCache)
        other.layers = [layer.clone() for layer in self.layers]
        return other

    def to(self, device: torch.device | str, *, pin: bool = False) -> KVCache:
        """The cache on ``device`` (a copy unless it is there already); ``pin`` pins host memory (a CUDA engine
        parks a waiting episode's KV there and brings it back asynchronously)."""
        for layer in self.layers:
            for name in ("k", "v"):
                t = getattr(layer, name)
                if t is not None:
                    t = t.to(device)
                    setattr(layer, name, t.pin_memory() if pin and t.device.type == "cpu" else t)
        return self
