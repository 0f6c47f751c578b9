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


# ---- chapter 3: documents for the tokenizer and the pre-training loop ---------------------------------------------
KIT_ROOT = Path(__file__).resolve().parent.parent


def kit_text_files() -> list[Path]:
    """Text the kit ships: the markdown files under ``data/`` (task and trace descriptions), sorted."""
    root = KIT_ROOT / "data"
    return sorted(p for p in root.rglob("*.md") if p.is_file()) if root.is_dir() else []


def documents(max_bytes: int | None = None, kit_text: bool = True) -> list[tuple[str, str]]:
    """``(name, text)`` per document: the stdlib's top-level sources, then (optionally) the kit's markdown.

    Names are ``stdlib/<file>`` and ``kit/<path>``; the order is sorted, so the list is the same on every run of
    the same Python. ``max_bytes`` keeps whole documents until the budget is spent (at least one).
    """
    root = KIT_ROOT
    named = [(f"stdlib/{p.name}", p) for p in stdlib_files()]
    if kit_text:
        named += [(f"kit/{p.relative_to(root).as_posix()}", p) for p in kit_text_files()]
    out, total = [], 0
    for name, path in named:
        text = path.read_bytes().decode("utf-8", errors="replace")
        if max_bytes is not None and out and total + len(text.encode()) > max_bytes:
            break
        out.append((name, text))
        total += len(text.encode())
    return out


def document_split(docs: list[tuple[str, str]], val_fraction: float = 0.05
                   ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, val) by whole documents: a document is validation iff crc32(name) mod 10⁴ < val_fraction · 10⁴.

    Hashing the *name* keeps the split stable when documents are added or removed (and never splits a file).
    At least one document lands on each side.
    """
    import zlib

    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"document_split: val_fraction={val_fraction}; expected 0 < val_fraction < 1")
    if len(docs) < 2:
        raise ValueError(f"document_split: need at least 2 documents, got {len(docs)}")
    is_val = [zlib.crc32(name.encode()) % 10_000 < val_fraction * 10_000 for name, _ in docs]
    if not any(is_val):
        is_val[-1] = True
    if all(is_val):
        is_val[0] = False
    train = [d for d, v in zip(docs, is_val) if not v]
    val = [d for d, v in zip(docs, is_val) if v]
    return train, val
