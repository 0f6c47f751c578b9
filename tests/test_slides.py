import re

import nbformat
import pytest

from mimo_kit import slides
from mimo_kit.cli import main
from mimo_kit.course import NOTEBOOK_DIR, notebooks

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


def _deck_notebook():
    """Title slide, a slide with a sub-slide, a long code cell, a skipped cell, an empty cell, a figure."""
    v4 = nbformat.v4
    figure = v4.new_code_cell("plot()")
    figure.outputs = [v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"})]
    skipped = v4.new_code_cell("print('SKIPPED-CELL')", metadata={"slideshow": {"slide_type": "skip"}})
    own = v4.new_markdown_cell("a note that opens its own slide", metadata={"slideshow": {"slide_type": "slide"}})
    return v4.new_notebook(cells=[
        v4.new_markdown_cell("# Chapter title\nwhat it covers"),       # slide 1
        v4.new_code_cell("x = 1"),                                    # -
        v4.new_markdown_cell("## Section A\ntext"),                   # slide 2
        v4.new_code_cell("\n".join(f"y{i} = {i}" for i in range(20))),  # fragment (long, no figure)
        v4.new_markdown_cell("### A, exercise"),                      # sub-slide of slide 2
        skipped,                                                      # skip (its own metadata)
        v4.new_code_cell(""),                                         # skip (empty)
        v4.new_markdown_cell("## Section B"),                         # slide 3
        figure,                                                       # -
        own,                                                          # slide 4 (its own metadata)
    ])


def test_rule_marks_cells_and_leaves_the_notebook_alone():
    nb = _deck_notebook()
    before = nbformat.writes(nb)
    kinds = [c.metadata.slideshow.slide_type for c in slides.mark_slides(nb).cells]
    assert kinds == ["slide", "-", "slide", "fragment", "subslide", "skip", "skip", "slide", "-", "slide"]
    assert nbformat.writes(nb) == before
    assert slides.expected_sections(nb) == 2 * 4 + 1


def test_deck_has_one_section_per_slide_and_drops_skipped_cells():
    nb = _deck_notebook()
    deck = slides.deck_html(nb, reveal_prefix="reveal.js")
    assert deck.count("<section") == deck.count("</section>") == 2 * 4 + 1
    top = re.findall(r"<section>\s*<section>", deck)
    assert len(top) == 4
    assert "SKIPPED-CELL" not in deck and "<img" in deck and "Section B" in deck
    assert 'class="fragment"' in deck
    assert '"reveal.js/dist/reveal.js"' in deck and "unpkg.com/reveal.js" not in deck


def test_own_slide_type_is_checked():
    cell = nbformat.v4.new_markdown_cell("x", metadata={"slideshow": {"slide_type": "big"}})
    with pytest.raises(ValueError, match="'big'"):
        slides.slide_type_for(cell)


def test_cli_writes_one_deck_for_a_committed_chapter(tmp_path, capsys, assert_local_mathjax):
    (path,) = [p for p in notebooks() if "ch04c" in p.stem]
    before = path.read_bytes()
    assert main(["slides", "--out", str(tmp_path), "--only", "ch04c"]) == 0
    decks = sorted(tmp_path.glob("*.slides.html"))
    assert [d.name for d in decks] == [f"{path.stem}.slides.html"] and str(decks[0]) in capsys.readouterr().out
    deck = decks[0].read_text()
    assert_local_mathjax(deck, tmp_path)
    nb = nbformat.read(path, as_version=4)
    has_images = any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert has_images and "<img" in deck
    assert deck.count("<section") == slides.expected_sections(nb)
    assert path.read_bytes() == before  # the committed notebook is not touched


def test_cli_default_prefix_matches_the_module():
    from mimo_kit.cli import parse_args

    assert parse_args(["slides"]).reveal_prefix == slides.DEFAULT_REVEAL_PREFIX
    with pytest.raises(FileNotFoundError, match="no-such-chapter"):
        slides.write_slides("unused", directory=NOTEBOOK_DIR, only="no-such-chapter")
