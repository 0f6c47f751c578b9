"""Where the chapter notebooks live and their order: read by the course (which runs them) and the claim records
(which read their committed outputs back)."""

from __future__ import annotations

from pathlib import Path

#: The chapter notebooks of a checkout of the kit.
NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"


def notebooks(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The chapter notebooks, in chapter order (file names start ``chNN``)."""
    return sorted(p for p in Path(directory).glob("*.ipynb") if not p.name.startswith("."))
