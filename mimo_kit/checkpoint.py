"""Writing run state so that a long job never loses finished work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def atomic_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` to ``path`` through a temporary file and a rename: a kill mid-write leaves the previous
    file intact, never a half-written one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)
    return path
