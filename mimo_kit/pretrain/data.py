"""Token streams and packed batches for pre-training (Report §3).

Documents are tokenised, each followed by ``<|endoftext|>``, and concatenated into one stream per split. Packing
cuts the stream into windows of ``seq_len + 1`` tokens that start every ``seq_len`` tokens (the last token of a
window is the first of the next), so every token is a target exactly once per epoch and no padding is spent; a
window may span a document boundary, with the EOS token between, as in GPT-style pre-training.

The loader's whole state is ``(epoch, position)``: the window order of an epoch is a permutation drawn from
``seed + epoch``, so a checkpoint that stores those two integers resumes the data exactly.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from mimo_kit.checkpoint import atomic_save
from mimo_kit.corpus import document_split, documents


def encode_documents(tokenizer, docs: list[tuple[str, str]]) -> torch.Tensor:
    """[total_tokens] int32: every document's ids followed by EOS."""
    eos = tokenizer.eos_token_id
    ids = tokenizer([text for _, text in docs], add_special_tokens=False)["input_ids"]
    return torch.tensor([t for doc in ids for t in (*doc, eos)], dtype=torch.int32)


def token_streams(tokenizer, corpus_bytes: int | None = None, val_fraction: float = 0.05,
                  cache_dir: str | Path | None = None) -> dict[str, torch.Tensor]:
    """``{"train": [N] int32, "val": [M] int32}`` for the corpus split, cached beside the tokenizer.

    The cache key hashes the tokenizer file and the split's settings, so a retrained tokenizer never reuses
    stale ids.
    """
    train, val = document_split(documents(corpus_bytes), val_fraction)
    folder = Path(cache_dir or getattr(tokenizer, "name_or_path", "") or ".")
    tok_file = folder / "tokenizer.json"
    key = hashlib.sha256((tok_file.read_bytes() if tok_file.is_file() else b"") + repr(
        (corpus_bytes, val_fraction, [n for n, _ in train], [n for n, _ in val])).encode()).hexdigest()[:12]
    path = folder / f"streams-{key}.pt"
    if tok_file.is_file() and path.is_file():
        return torch.load(path)
    streams = {"train": encode_documents(tokenizer, train), "val": encode_documents(tokenizer, val)}
    if tok_file.is_file():
        atomic_save(streams, path)
    return streams


class PackedLoader:
    """Endless batches of packed windows: ``next()`` → (inputs [batch, seq_len], targets [batch, seq_len]) int64."""

    def __init__(self, stream: torch.Tensor, batch: int, seq_len: int, seed: int = 0):
        if batch < 1 or seq_len < 1:
            raise ValueError(f"PackedLoader: batch={batch}, seq_len={seq_len}; expected both >= 1")
        self.windows = (len(stream) - 1) // seq_len
        if self.windows < batch:
            raise ValueError(f"PackedLoader: a stream of {len(stream)} tokens holds {self.windows} windows of "
                             f"{seq_len + 1}; need at least batch={batch}")
        self.stream, self.batch, self.seq_len, self.seed = stream, batch, seq_len, seed
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.windows, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))

    def window(self, i: int) -> torch.Tensor:
        """Window i: stream[i·L : i·L + L + 1]."""
        return self.stream[i * self.seq_len : i * self.seq_len + self.seq_len + 1]

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position + self.batch > self.windows:  # drop the epoch's remainder: every batch is full
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        idx = self._order[self.position : self.position + self.batch].tolist()
        self.position += self.batch
        w = torch.stack([self.window(i) for i in idx]).long()  # [batch, seq_len + 1]
        return w[:, :-1], w[:, 1:]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(f"PackedLoader: checkpoint seed {state['seed']} differs from this loader's {self.seed}")
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)


def eval_batches(stream: torch.Tensor, batch: int, seq_len: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``count`` batches of consecutive windows of the validation stream: the same every evaluation."""
    windows = (len(stream) - 1) // seq_len
    if windows < 1:
        raise ValueError(f"eval_batches: validation stream of {len(stream)} tokens is shorter than seq_len={seq_len}")
    out = []
    for b in range(count):
        idx = [(b * batch + j) % windows for j in range(batch)]
        w = torch.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in idx]).long()
        out.append((w[:, :-1], w[:, 1:]))
    return out
