"""A text corpus every machine has: the Python standard library's own source files, read as UTF-8 bytes.

Chapter 2 trains byte-level toy models on it (token id = byte value); chapter 3 trains a BPE tokenizer on it.
The file order is sorted and the split deterministic, so every run sees the same text.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch


def stdlib_files() -> list[Path]:
    """The stdlib's top-level ``*.py`` files, sorted by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no Python source files under {root}")
    return files


def byte_corpus(max_bytes: int = 2_000_000) -> torch.Tensor:
    """The first ``max_bytes`` bytes of the stdlib sources, concatenated, as a uint8 tensor."""
    chunks, total = [], 0
    for f in stdlib_files():
        data = f.read_bytes()
        chunks.append(data[: max_bytes - total])
        total += len(chunks[-1])
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).clone()


def split(tokens: torch.Tensor, val_fraction: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val): the last ``val_fraction`` of the stream is validation."""
    n = int(len(tokens) * (1 - val_fraction))
    return tokens[:n], tokens[n:]


def batches(tokens: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator):
    """Endless random windows: (inputs [batch, seq_len], targets [batch, seq_len]) as int64."""
    if len(tokens) <= seq_len + 1:
        raise ValueError(f"corpus of {len(tokens)} tokens is too short for seq_len={seq_len}")
    while True:
        start = torch.randint(0, len(tokens) - seq_len - 1, (batch,), generator=generator)
        window = torch.stack([tokens[s : s + seq_len + 1] for s in start.tolist()]).long()
        yield window[:, :-1], window[:, 1:]
