"""``mimo-kit slides``: one reveal.js slide deck per chapter notebook, from the committed notebooks as they are.

Each deck is ``<out>/<stem>.slides.html``, written by nbconvert's ``SlidesExporter`` (what
``jupyter nbconvert --to slides`` uses) from the notebook's committed outputs: nothing is executed, and nothing is
written into ``notebooks/`` (the slide marks below are set on an in-memory copy).

Which cell starts a slide. A cell whose ``metadata.slideshow.slide_type`` is set keeps it. Every other cell is
marked by :func:`slide_type_for`:

* a markdown cell whose first non-blank line is a ``#`` or ``##`` heading starts a new slide (``"slide"``);
* a markdown cell whose first non-blank line is a ``###`` heading starts a sub-slide (``"subslide"``, reached with
  the down arrow);
* a code cell of more than :data:`LONG_CODE_LINES` source lines that carries no figure is a ``"fragment"`` (it
  appears on the next key press, so the slide builds up instead of opening on a wall of code);
* a cell with neither source nor outputs is skipped (``"skip"``); no cell with outputs is ever skipped, so every
  figure is on a slide;
* everything else continues the current slide (``"-"``). The first cell of a deck always opens its first slide.

In the HTML every slide is a ``<section>`` holding one ``<section>`` per sub-slide (its first sub-slide included),
so a deck has ``2 × slides + extra sub-slides`` ``<section>`` tags (:func:`expected_sections`). Long slides
scroll (``reveal_scroll``).

Where reveal.js comes from. By default the deck loads reveal.js from a CDN
(``https://unpkg.com/reveal.js@4.0.2``) and require.js and jQuery from cdnjs: fine in a browser that is
online. For a room without internet, unpack a reveal.js 4 release next to the decks and pass
``--reveal-prefix reveal.js`` (a folder relative to the deck, or any URL); require.js and jQuery still come from
cdnjs. MathJax is local: :func:`mimo_kit.course.local_mathjax` copies it beside the decks (``<out>/mathjax``), so
the equations are typeset offline.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from mimo_kit.course import MATHJAX_ENTRY, NOTEBOOK_DIR, local_mathjax, notebooks

#: A code cell with more source lines than this (and no figure) is shown as a fragment.
LONG_CODE_LINES = 15

#: The slide types nbconvert's reveal template knows.
SLIDE_TYPES = ("slide", "subslide", "fragment", "skip", "notes", "-")

#: nbconvert's default reveal.js location.
DEFAULT_REVEAL_PREFIX = "https://unpkg.com/reveal.js@4.0.2"


def _has_figure(cell: nbformat.NotebookNode) -> bool:
    return any(k.startswith("image/") for o in cell.get("outputs", []) for k in o.get("data", {}))


def slide_type_for(cell: nbformat.NotebookNode) -> str:
    """The slide type of ``cell``: its own ``metadata.slideshow.slide_type`` if set, else the module's rule."""
    own = cell.get("metadata", {}).get("slideshow", {}).get("slide_type")
    if own is not None:
        if own not in SLIDE_TYPES:
            raise ValueError(f"slide_type_for: slide_type={own!r}; expected one of {SLIDE_TYPES}")
        return own
    source = cell.get("source", "")
    if not source.strip() and not cell.get("outputs"):
        return "skip"
    if cell.cell_type == "markdown":
        first = next(line.strip() for line in source.splitlines() if line.strip())
        if first.startswith(("# ", "## ")):
            return "slide"
        if first.startswith("### "):
            return "subslide"
        return "-"
    if cell.cell_type == "code" and len(source.splitlines()) > LONG_CODE_LINES and not _has_figure(cell):
        return "fragment"
    return "-"


def mark_slides(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` with every cell's ``metadata.slideshow.slide_type`` set (``nb`` itself is left as is)."""
    marked = copy.deepcopy(nb)
    for cell in marked.cells:
        kind = slide_type_for(cell)
        metadata = cell.setdefault("metadata", nbformat.NotebookNode())
        metadata["slideshow"] = nbformat.NotebookNode({**metadata.get("slideshow", {}), "slide_type": kind})
    return marked


def expected_sections(nb: nbformat.NotebookNode) -> int:
    """How many ``<section>`` tags the deck of ``nb`` has under the rule: 2 per slide, 1 per further sub-slide."""
    kinds = [slide_type_for(c) for c in nb.cells]
    kinds = [k for k in kinds if k not in ("skip", "notes")]
    if not kinds:
        return 0
    if kinds[0] not in ("slide", "subslide"):
        kinds[0] = "slide"
    slides = sum(k == "slide" for k in kinds) + (kinds[0] == "subslide")
    return 2 * slides + sum(k == "subslide" for k in kinds[1:])


def deck_html(nb: nbformat.NotebookNode, *, reveal_prefix: str = DEFAULT_REVEAL_PREFIX,
              mathjax_url: str | None = None) -> str:
    """The reveal.js deck of ``nb`` (marked by :func:`mark_slides`) as one HTML page; ``mathjax_url`` (relative to
    the deck) points at a local MathJax."""
    from nbconvert import SlidesExporter

    exporter = SlidesExporter(reveal_url_prefix=reveal_prefix, reveal_scroll=True,
                              **({"mathjax_url": mathjax_url} if mathjax_url else {}))
    body, _ = exporter.from_notebook_node(mark_slides(nb))
    return body


def write_slides(out_dir: Path | str = "runs/slides", *, directory: Path = NOTEBOOK_DIR, only: str | None = None,
                 reveal_prefix: str = DEFAULT_REVEAL_PREFIX) -> list[Path]:
    """Write ``<out_dir>/<stem>.slides.html`` for every notebook in ``directory`` (or those whose name contains
    ``only``); return the written paths. Raises when no notebook matches."""
    paths = [p for p in notebooks(directory) if only is None or only in p.stem]
    if not paths:
        raise FileNotFoundError(f"write_slides: no notebook in {directory} matches only={only!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    local_mathjax(out)
    written = []
    for path in paths:
        target = out / f"{path.stem}.slides.html"
        target.write_text(deck_html(nbformat.read(path, as_version=4), reveal_prefix=reveal_prefix,
                                    mathjax_url=f"mathjax/{MATHJAX_ENTRY}"))
        written.append(target)
    return written
