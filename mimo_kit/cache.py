"""A content-addressed cache of trained artefacts: the same training, asked for twice, runs once.

Several runs start from the same expensive artefact: every RL run of a preset starts from the same SFT warm start
(Report §4.1), whatever its ``out_dir``. :func:`lookup` / :func:`store` keep such an artefact under

    <cache root>/<kind>/<sha256(kind, key, code fingerprint)>.pt

where ``key`` is everything the artefact depends on (its config, seed, world) and the code fingerprint is the
sha256 of every source file of the package, so any edit to the kit retrains instead of loading a stale result.

The cache root is ``$MIMO_KIT_CACHE``, else ``~/.cache/mimo_kit``: the one folder for everything the kit trains
once and reuses (trained tokenizers and tokenised corpora live there too, :mod:`mimo_kit.pretrain.tokenizer`).
The test suite gives each run its own root under ``runs/``, so a test run trains each artefact once and two
concurrent runs share nothing. Writes go through a temporary file and a rename, so concurrent writers of one key
each leave a whole file and a reader never sees half of one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from mimo_kit.checkpoint import atomic_save

#: environment variable naming the cache root
CACHE_ENV = "MIMO_KIT_CACHE"
PACKAGE_DIR = Path(__file__).resolve().parent


def cache_root() -> Path:
    """``$MIMO_KIT_CACHE`` or ``~/.cache/mimo_kit``: trained tokenizers, tokenised corpora and the artefacts below."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mimo_kit")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over the path and bytes of every ``.py`` file of the package, in path order."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def path_for(kind: str, key: dict) -> Path:
    """Where the artefact ``kind`` with ``key`` lives (whether or not it exists).

    ``key`` must be JSON-serialisable: it is hashed in canonical form (sorted keys)."""
    try:
        blob = json.dumps({"kind": kind, "key": key, "code": code_fingerprint()}, sort_keys=True)
    except TypeError as e:
        raise TypeError(f"cache key for {kind!r} must be JSON-serialisable: {e}") from e
    return cache_root() / kind / f"{hashlib.sha256(blob.encode()).hexdigest()}.pt"


def lookup(kind: str, key: dict) -> Any | None:
    """The stored artefact, or ``None`` when absent or unreadable."""
    path = path_for(kind, key)
    if not path.is_file():
        return None
    try:
        return torch.load(path, weights_only=False)
    except Exception:  # a file from another torch build, a disk error: train again
        return None


def store(kind: str, key: dict, obj: Any) -> Path:
    """Store ``obj`` for ``kind`` / ``key``; returns the path."""
    path = path_for(kind, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_save(obj, path)
