"""The engine's per-context KV store: a token trie of finished turns' caches, looked up by longest prefix
(Report §6: a persistent KV cache per conversation context, so a turn prefills only its new suffix).

An agentic episode's next prompt is its last prompt, the action the engine just generated and the tool's
observation. Without a store every turn re-prefills the whole history, so prefill grows with the square of the
number of turns. :class:`PrefixCache` keeps, for each finished request, the KV of the tokens the engine fed
(prompt + action, the last sampled token excepted: it was never fed); the next turn finds the longest stored
prefix of its prompt (:meth:`lookup`) and runs only the rest.

Structure: a trie over token ids (one node per token; radix-style sharing, so a GRPO group's common prompt is one
path). A node where a stored sequence ends holds its :class:`~mimo_kit.model.cache.KVCache`, on host memory when
``park`` (a CUDA engine parks a waiting episode's KV in pinned host memory and the decode batch holds only the
episodes being decoded, :meth:`~mimo_kit.model.cache.KVCache.to`). Entries are evicted least recently used first
while the stored bytes exceed ``budget_bytes``; an entry larger than the budget is not kept. The engine drops every
entry when its weights change (a KV computed by old weights is not the new policy's).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import torch

from mimo_kit.model.cache import KVCache


@dataclasses.dataclass
class _Node:
    children: dict[int, _Node] = dataclasses.field(default_factory=dict)
    kv: KVCache | None = None
    nbytes: int = 0
    used: int = 0  # the store's clock at the last lookup or insert that touched this entry


@dataclasses.dataclass
class PrefixStats:
    """What the store did: lookups and hits, the tokens hits spared from prefill, entries kept and evicted."""

    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    inserts: int = 0
    evictions: int = 0


class PrefixCache:
    """Longest-prefix KV store under a byte budget (the module docstring)."""

    def __init__(self, budget_bytes: int, *, park: str | torch.device | None = None):
        if budget_bytes < 0:
            raise ValueError(f"PrefixCache: budget_bytes={budget_bytes}; expected >= 0 (0 keeps nothing)")
        self.budget_bytes = int(budget_bytes)
        self.park = park  # where entries live (None: where they were made)
        self.root = _Node()
        self.entries: dict[tuple[int, ...], _Node] = {}
        self.nbytes = 0
        self.peak_nbytes = 0
        self.stats = PrefixStats()
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, tokens: Sequence[int]) -> KVCache | None:
        """The KV of the longest stored sequence that is a proper prefix of ``tokens`` (at least one token must
        remain to be prefilled), or None. The caller continues a clone, never the entry itself."""
        self.stats.lookups += 1
        node, best = self.root, None
        for depth, t in enumerate(tokens[:-1], start=1):
            node = node.children.get(int(t))
            if node is None:
                break
            if node.kv is not None:
                best = (depth, node)
        if best is None:
            return None
        depth, node = best
        node.used = next(self._clock)
        self.stats.hits += 1
        self.stats.hit_tokens += depth
        return node.kv

    def insert(self, tokens: Sequence[int], kv: KVCache) -> bool:
        """Keep ``kv`` (holding exactly ``tokens``) and evict until under budget; False when it is not kept."""
        key = tuple(int(t) for t in tokens)
        if kv.seq_len != len(key) or not key:
            raise ValueError(f"PrefixCache.insert: the cache holds {kv.seq_len} tokens for a key of {len(key)}")
        size = kv.nbytes()
        if size > self.budget_bytes:
            return False
        if self.park is not None:
            kv = kv.to(self.park, pin=torch.cuda.is_available() and str(self.park) == "cpu")
        node = self.root
        for t in key:
            node = node.children.setdefault(t, _Node())
        if node.kv is not None:
            self.nbytes -= node.nbytes
        node.kv, node.nbytes, node.used = kv, size, next(self._clock)
        self.entries[key] = node
        self.nbytes += size
        self.stats.inserts += 1
        self._evict()
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)
        return key in self.entries

    def _evict(self) -> None:
        while self.nbytes > self.budget_bytes and self.entries:
            key = min(self.entries, key=lambda k: self.entries[k].used)
            node = self.entries.pop(key)
            self.nbytes -= node.nbytes
            node.kv, node.nbytes = None, 0
            self.stats.evictions += 1
            self._prune(key)

    def _prune(self, key: tuple[int, ...]) -> None:
        """Remove the trie nodes of ``key`` that no longer lead to an entry."""
        path = [self.root]
        for t in key:
            path.append(path[-1].children[t])
        for depth in range(len(key), 0, -1):
            node = path[depth]
            if node.kv is not None or node.children:
                break
            del path[depth - 1].children[key[depth - 1]]

    def clear(self) -> None:
        """Drop every entry (the engine's weights changed)."""
        self.root, self.entries, self.nbytes = _Node(), {}, 0
