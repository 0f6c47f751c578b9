"""``mimo-kit slides``: one lecture deck per chapter, built from the committed notebook's narrative, equations and
figures, with the prose as speaker notes. Nothing is executed and nothing is written into ``notebooks/``.

A deck is ``<out>/<stem>.slides.html``: reveal.js 5 and MathJax 3 with its TeX fonts come from ``<out>/assets``
(:mod:`mimo_kit.web`), so a deck opens offline, from disk or any web server. Press ``s`` for the speaker view
(the notes of the slide, a timer, the next slide).

What goes on a slide. A cell may carry Jupyter's own slide mark (``metadata.slideshow.slide_type``, set in
JupyterLab's property inspector); a marked cell is placed as marked, whole: ``slide`` / ``subslide`` opens a new
(sub-)slide with it, ``fragment`` adds it to the current slide on the next key press, ``-`` adds it, ``notes``
puts it in the speaker notes, ``skip`` leaves it out. A marked code cell shows its code (and its figures): code
appears on a slide only where marked. Every unmarked cell follows the lecture rule:

* a markdown cell whose first line is a ``#`` / ``##`` heading opens a slide titled by it (``###``: a sub-slide,
  reached with the down arrow); the slide holds the cell's display equations, lists and tables, and its opening
  sentence as a lead; the whole cell, prose included, is the slide's speaker notes;
* an unmarked markdown cell without a heading adds its equations, lists and tables to the current slide and its
  text to the notes;
* an unmarked code cell shows no code; each figure it drew gets a slide of its own under the current title, and a
  table it displayed (Markdown, at most :data:`MAX_TABLE_ROWS` rows) gets one too; a sentence it displayed as
  Markdown (prose rendered from a record, ``nb.say``) joins the speaker notes; printed text stays out.

A slide whose blocks would not fit one screen (:func:`block_lines` against :data:`SCREEN_LINES`) continues on a
next slide, "(cont.)": one slide per screen.
"""

from __future__ import annotations

import dataclasses
import html
import re
from pathlib import Path

import nbformat

from mimo_kit import web
from mimo_kit.course import NOTEBOOK_DIR, notebooks

#: Jupyter's slide types (``metadata.slideshow.slide_type``)
SLIDE_TYPES = ("slide", "subslide", "fragment", "skip", "notes", "-")
#: a displayed Markdown table with more rows than this stays out of the deck (it would not fit a screen)
MAX_TABLE_ROWS = 10
#: the height of one screen in body lines of the deck's type (1280 × 720 at the theme's 40 px / 1.3 line height,
#: title included)
SCREEN_LINES = 13
#: characters of prose in one line on the slide (the lead, list items)
CHARS_PER_LINE = 80
#: the lead: the cell's first paragraph when it is at most this long, else its first sentence
LEAD_CHARS = 240
#: reveal.js's canvas, scaled to the window
WIDTH, HEIGHT = 1280, 720
#: the smallest size a display equation is set at to fit its slide's width, as a fraction of its typeset size: below
#: half the body size it no longer reads from the back of a lecture room, so its source is to be split instead
MIN_MATH_SCALE = 0.5


@dataclasses.dataclass
class Slide:
    """One screen: a title, HTML blocks (with their height in lines), the speaker notes' HTML."""

    title: str
    vertical: bool = False  # a sub-slide, below the previous one
    blocks: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    figure: bool = False  # holds a figure (or a table): nothing else is added to it

    @property
    def lines(self) -> float:
        return sum(h for _, h in self.blocks)


def slide_mark(cell: nbformat.NotebookNode) -> str | None:
    """The cell's own slide type, or None when unmarked; a clear error for a type Jupyter does not know."""
    own = cell.get("metadata", {}).get("slideshow", {}).get("slide_type")
    if own is not None and own not in SLIDE_TYPES:
        raise ValueError(f"slide_mark: slide_type={own!r}; expected one of {SLIDE_TYPES}")
    return own


_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_LIST = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def markdown_blocks(source: str) -> list[tuple[str, str]]:
    """``source`` split into (kind, text) blocks: ``heading<level>``, ``math`` (display equations), ``list``,
    ``table`` and ``prose``; a display equation that spans blank lines stays one block."""
    blocks, current, kind = [], [], None
    in_math = False
    for line in source.splitlines():
        stripped = line.strip()
        if not in_math and _HEADING.match(stripped):
            if current:
                blocks.append((kind, "\n".join(current)))
            level = len(_HEADING.match(stripped).group(1))
            blocks.append((f"heading{level}", _HEADING.match(stripped).group(2)))
            current, kind = [], None
            continue
        if not stripped and not in_math:
            if current:
                blocks.append((kind, "\n".join(current)))
            current, kind = [], None
            continue
        if not current:
            kind = ("math" if stripped.startswith(("$$", "\\[", "\\begin")) else "list" if _LIST.match(line)
                    else "table" if stripped.startswith("|") else "prose")
        current.append(line)
        in_math = (in_math ^ (stripped.count("$$") % 2 == 1)) if kind == "math" else False
    if current:
        blocks.append((kind, "\n".join(current)))
    return blocks


def _math_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\$\$.*?\$\$|\$[^$]*\$", text, flags=re.S)]


def lead_of(paragraph: str) -> str:
    """The paragraph if short (:data:`LEAD_CHARS`), else its first sentence (a full stop outside ``$…$`` followed by
    a space and a capital, a ``$`` or a backquote)."""
    text = " ".join(paragraph.split())
    if len(text) <= LEAD_CHARS:
        return text
    math = _math_spans(text)
    for m in re.finditer(r"[.!?:](?=\s+[A-Z$`*(])", text):
        if not any(a <= m.start() < b for a, b in math):
            return text[:m.end()]
    return text


def block_lines(kind: str, text: str) -> float:
    """The height of a block on a slide, in body lines (an estimate that errs long)."""
    if kind == "math":
        return 1.6 * max(1, text.count("\\\\") + 1)
    if kind == "table":
        return 1.1 * sum(1 for line in text.splitlines() if line.strip().startswith("|") and "---" not in line)
    if kind == "list":  # set at 0.85 of the body size
        return 0.85 * sum(max(1, -(-len(" ".join(i.split())) // (CHARS_PER_LINE * 1.15))) for i in list_items(text))
    if kind == "code":
        return 0.75 * (text.count("\n") + 1) + 0.5
    return max(1, -(-len(" ".join(text.split())) // CHARS_PER_LINE)) + 0.3


def list_items(text: str) -> list[str]:
    """A list block's items (an item's continuation lines stay with it)."""
    return re.split(r"\n(?=\s*(?:[-*+]|\d+[.)])\s)", text)


def _md(text: str) -> str:
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    return markdown2html_mistune(text)


def _figures(cell: nbformat.NotebookNode) -> list[str]:
    out = []
    for o in cell.get("outputs", []):
        data = o.get("data", {})
        if "image/png" in data:
            out.append(f'<img class="mk-figure" src="data:image/png;base64,{data["image/png"].strip()}" alt="figure">')
        elif "image/svg+xml" in data:
            svg = data["image/svg+xml"]
            out.append(f'<div class="mk-figure">{"".join(svg) if isinstance(svg, list) else svg}</div>')
    return out


def _markdown_outputs(cell: nbformat.NotebookNode) -> list[str]:
    """The Markdown a code cell displayed (claim records left out: chapter 8 tabulates them)."""
    out = []
    for o in cell.get("outputs", []):
        data = o.get("data", {})
        text = data.get("text/markdown")
        if text is not None and "application/vnd.mimo-kit.claim+json" not in data:
            out.append("".join(text) if isinstance(text, list) else text)
    return out


def _is_table_row(line: str) -> bool:
    return line.strip().startswith("|")


def _tables(cell: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(table, the rest) of each Markdown output holding a table of at most :data:`MAX_TABLE_ROWS` rows: the table
    goes on a slide, the output's other text (a heading, a caption) to the notes."""
    out = []
    for text in _markdown_outputs(cell):
        lines = text.splitlines()
        rows = [line for line in lines if _is_table_row(line)]
        if rows and len(rows) - 2 <= MAX_TABLE_ROWS:
            out.append(("\n".join(rows), "\n".join(line for line in lines if not _is_table_row(line)).strip()))
    return out


class _Deck:
    """Slides in the making."""

    def __init__(self):
        self.slides: list[Slide] = []
        self.title = ""

    @property
    def current(self) -> Slide:
        if not self.slides:
            self.slides.append(Slide(self.title))
        return self.slides[-1]

    def open(self, title: str, vertical: bool = False, figure: bool = False) -> Slide:
        self.slides.append(Slide(title, vertical=vertical, figure=figure))
        return self.slides[-1]

    def add(self, html_block: str, lines: float) -> None:
        """Add a block to the current slide, continuing on a new slide when it would not fit one screen."""
        slide = self.current
        if slide.figure or (slide.blocks and slide.lines + lines > SCREEN_LINES - 1.5):
            title = slide.title if slide.title.endswith("(cont.)") else f"{slide.title} (cont.)"
            slide = self.open(title)
        slide.blocks.append((html_block, lines))

    def notes(self, html_block: str) -> None:
        self.current.notes.append(html_block)


def _code_html(source: str) -> str:
    return f'<pre class="mk-code"><code>{html.escape(source)}</code></pre>'


def _place_marked(deck: _Deck, cell: nbformat.NotebookNode, mark: str) -> None:
    """A cell the author marked: placed as marked, whole."""
    if mark == "skip":
        return
    if cell.cell_type == "markdown":
        blocks = markdown_blocks(cell.source)
        title = next((t for k, t in blocks if k.startswith("heading")), None)
        body = [(k, t) for k, t in blocks if not k.startswith("heading")] if title else blocks
        content = "\n\n".join(t for _, t in body)
        html_block, lines = _md(content), sum(block_lines(k, t) for k, t in body)
    else:
        title, html_block, lines = None, _code_html(cell.source), block_lines("code", cell.source)
    if mark == "notes":
        deck.notes(_md(cell.source) if cell.cell_type == "markdown" else html_block)
        return
    if mark in ("slide", "subslide"):
        if title:
            deck.title = title
        deck.open(title or deck.title, vertical=mark == "subslide")
    if mark == "fragment":
        html_block = f'<div class="fragment">{html_block}</div>'
    if html_block.strip():
        deck.add(html_block, lines)
    for figure in _figures(cell):
        deck.open(deck.title, figure=True).blocks.append((figure, SCREEN_LINES - 2))


def _place_markdown(deck: _Deck, cell: nbformat.NotebookNode) -> None:
    blocks = markdown_blocks(cell.source)
    opened = False
    for kind, text in blocks:
        if kind.startswith("heading"):
            level = int(kind[-1])
            if level <= 3:
                title = _md(text).strip().removeprefix("<p>").removesuffix("</p>")
                deck.title = title
                deck.open(title, vertical=level == 3)
                opened = True
            continue
        if kind == "prose":
            if opened:  # the opening sentence of a section is its lead
                deck.add(f'<p class="mk-lead">{_inline(lead_of(text))}</p>',
                         block_lines("prose", lead_of(text)))
                opened = False
            continue
        opened = False
        for part in _screenfuls(kind, text):
            deck.add(_md(part), block_lines(kind, part))
    deck.notes(_md(cell.source))


def _screenfuls(kind: str, text: str) -> list[str]:
    """A list longer than a screen as several lists (numbering kept), each at most a screen; other blocks whole."""
    if kind != "list" or block_lines(kind, text) <= SCREEN_LINES - 2:
        return [text]
    parts, current = [], []
    for item in list_items(text):
        if current and block_lines(kind, "\n".join([*current, item])) > SCREEN_LINES - 2:
            parts.append("\n".join(current))
            current = []
        current.append(item)
    return [*parts, "\n".join(current)]


def _inline(text: str) -> str:
    """One paragraph's inline Markdown as HTML, without the enclosing ``<p>``."""
    return _md(text).strip().removeprefix("<p>").removesuffix("</p>")


def _prose_outputs(cell: nbformat.NotebookNode) -> list[str]:
    """Markdown a code cell displayed that holds no table (a sentence rendered from a record, ``nb.say``)."""
    return [t for t in _markdown_outputs(cell) if not any(_is_table_row(line) for line in t.splitlines())]


def _place_code(deck: _Deck, cell: nbformat.NotebookNode) -> None:
    for text in _prose_outputs(cell):  # the chapter's prose, rendered from its records: the speaker notes
        deck.notes(_md(text))
    for figure in _figures(cell):
        deck.open(deck.title, figure=True).blocks.append((figure, SCREEN_LINES - 2))
    for table, rest in _tables(cell):
        slide = deck.open(deck.title, figure=True)
        slide.blocks.append((_md(table), block_lines("table", table)))
        if rest:
            slide.notes.append(_md(rest))


def deck_slides(nb: nbformat.NotebookNode) -> list[Slide]:
    """The slides of ``nb`` under the marks and the lecture rule (the module's docstring)."""
    deck = _Deck()
    for cell in nb.cells:
        mark = slide_mark(cell)
        if mark is not None:
            _place_marked(deck, cell, mark)
        elif cell.cell_type == "markdown" and cell.source.strip():
            _place_markdown(deck, cell)
        elif cell.cell_type == "code":
            _place_code(deck, cell)
    return [s for s in deck.slides if s.blocks or s.title]


_STYLE = """
<style>
.reveal { font-size: 34px; }
.reveal h1, .reveal h2 { text-transform: none; } .reveal h2 { font-size: 1.25em; margin-bottom: 0.4em; }
.reveal .slides section { text-align: left; }
.reveal p.mk-lead { font-size: 0.9em; color: #333; }
.reveal ul, .reveal ol { display: block; margin-left: 1em; font-size: 0.85em; }
.reveal table { font-size: 0.6em; margin: 0.3em 0; } .reveal table th, .reveal table td { padding: 0.15em 0.5em; }
.reveal pre.mk-code { font-size: 0.45em; width: 100%; box-shadow: none; }
.reveal pre.mk-code code { max-height: 560px; }
.reveal .mk-figure { display: block; margin: 0 auto; max-height: 580px; max-width: 100%; }
.reveal mjx-container[display="true"] { margin: 0.4em 0 !important; }
</style>
"""


#: A display equation wider than the room it has on its slide is set smaller, just enough to fit (never below
#: :data:`MIN_MATH_SCALE` of its size; one still too wide at that size is named in the console). It runs on the typeset
#: hook, chained before the deck's own (reveal.js's layout), once reveal.js has sized the slides to the canvas.
_FIT_MATHS = """
<script>
(() => {
  const MIN_SCALE = {min_scale};
  const fit = () => {
    const leaves = [...document.querySelectorAll('.reveal .slides section')].filter(s => !s.querySelector('section'));
    leaves.forEach((slide, i) => {
      // reveal.js lays out only the slides near the current one: show this one (and its stack) while measuring
      const shown = [slide, slide.parentElement].map(e => [e, e.style.display]);
      shown.forEach(([e]) => { e.style.display = 'block'; });
      for (const c of slide.querySelectorAll('mjx-container[display="true"]')) {
        const maths = c.querySelector('mjx-math');
        if (!maths || c.closest('aside.notes')) continue;  // the speaker notes are not on the slide
        const size = parseFloat(getComputedStyle(c).fontSize);
        let scale = 1;
        // widths in the same (scaled) pixels; a few rounds, as rule thicknesses and rounding do not scale
        for (let k = 0; k < 4; k++) {
          const room = c.getBoundingClientRect().width, need = maths.getBoundingClientRect().width;
          if (need <= room || scale === MIN_SCALE) break;
          scale = Math.max(MIN_SCALE, scale * room / need * 0.999);  // a hair under: it fits after rounding
          c.style.fontSize = `${size * scale}px`;
        }
        if (maths.getBoundingClientRect().width > c.getBoundingClientRect().width)
          console.warn(`slide ${i + 1}: an equation is wider than the slide at ${MIN_SCALE} of its size`);
      }
      shown.forEach(([e, display]) => { e.style.display = display; });
    });
  };
  const after = window.mkAfterTypeset;
  window.mkAfterTypeset = () => {
    if (Reveal.isReady()) fit(); else Reveal.on('ready', fit);
    if (after) after();
  };
  if (window.mkTypeset) window.mkAfterTypeset();
})();
</script>
"""


def deck_html(nb: nbformat.NotebookNode, *, title: str | None = None) -> str:
    """The deck of ``nb`` as one HTML page; it loads its assets from ``assets/`` beside it (:func:`web.install`).
    Over-wide display equations are shrunk to fit once typeset (:data:`_FIT_MATHS`)."""
    from jinja2 import Environment, FileSystemLoader

    slides = deck_slides(nb)
    env = Environment(loader=FileSystemLoader(str(web.TEMPLATES)), autoescape=False)
    page = env.get_template("deck.html.j2").render(
        slides=_grouped(slides), title=html.escape(title or (slides[0].title if slides else "deck")), style=_STYLE,
        css=web.REVEAL_CSS, reveal=web.REVEAL_JS, notes=web.REVEAL_NOTES, mathjax=web.MATHJAX,
        width=WIDTH, height=HEIGHT)
    # after the template's own script, which sets the typeset hook this one chains onto
    head, body_end, tail = page.rpartition("</body>")
    if not body_end:
        raise ValueError("deck_html: the deck template has no </body> to put the equation fit before")
    return head + _FIT_MATHS.replace("{min_scale}", str(MIN_MATH_SCALE)) + body_end + tail


def _grouped(slides: list[Slide]) -> list[list[Slide]]:
    """Slides as reveal.js stacks: each horizontal slide with the sub-slides below it."""
    stacks: list[list[Slide]] = []
    for s in slides:
        if s.vertical and stacks:
            stacks[-1].append(s)
        else:
            stacks.append([s])
    return stacks


def expected_slides(nb: nbformat.NotebookNode) -> int:
    """How many screens the deck of ``nb`` has (reveal.js's ``getTotalSlides()``)."""
    return len(deck_slides(nb))


def write_slides(out_dir: Path | str = "runs/slides", *, directory: Path = NOTEBOOK_DIR,
                 only: str | None = None) -> list[Path]:
    """Write ``<out_dir>/<stem>.slides.html`` for every notebook in ``directory`` (or those whose name contains
    ``only``) and the assets beside them; return the written decks. Raises when no notebook matches."""
    paths = [p for p in notebooks(directory) if only is None or only in p.stem]
    if not paths:
        raise FileNotFoundError(f"write_slides: no notebook in {directory} matches only={only!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    web.install(out)
    written = []
    for path in paths:
        target = out / f"{path.stem}.slides.html"
        target.write_text(deck_html(nbformat.read(path, as_version=4)))
        written.append(target)
    return written
