"""Lecture decks (``mimo-kit slides``): what goes on a slide, the speaker notes, local assets only."""

import re

import nbformat
import pytest

from mimo_kit import slides, web
from mimo_kit.cli import main
from mimo_kit.course import NOTEBOOK_DIR, notebooks

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
v4 = nbformat.v4


def _figure_cell(source="plot()"):
    cell = v4.new_code_cell(source)
    cell.outputs = [v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}),
                    v4.new_output("stream", name="stdout", text="PRINTED-TEXT\n")]
    return cell


def _lecture():
    """A chapter: a title cell, a section with an equation and prose, a figure, a marked code cell, a sub-section,
    a skipped cell, a notes cell and a table output."""
    said = v4.new_code_cell("nb.say(...)")
    said.outputs = [v4.new_output("display_data", data={"text/markdown": "MEASURED-SENTENCE: 3 of 5 seeds.",
                                                         "text/plain": "<Markdown>"})]
    table = v4.new_code_cell("nb.table(rows)")
    table.outputs = [v4.new_output("display_data", data={"text/markdown": "| a | b |\n|---|---|\n| 1 | 2 |",
                                                          "text/plain": "<Markdown>"})]
    return v4.new_notebook(cells=[
        v4.new_markdown_cell("# Chapter title\n\nFirst sentence of the chapter. Second sentence " + "x " * 150),
        v4.new_code_cell("import HIDDEN_CODE"),
        v4.new_markdown_cell("## Section A\n\nLead of A. " + "More prose of A. " * 20 + "\n\n$$A_i = r_i - b$$\n\n"
                             "Closing PROSE-ONLY-IN-NOTES."),
        _figure_cell(),
        v4.new_code_cell("SHOWN_CODE = 1", metadata={"slideshow": {"slide_type": "fragment"}}),
        v4.new_markdown_cell("### A, detail\n\n- one\n- two"),
        v4.new_markdown_cell("SKIPPED-CELL", metadata={"slideshow": {"slide_type": "skip"}}),
        v4.new_markdown_cell("NOTES-CELL", metadata={"slideshow": {"slide_type": "notes"}}),
        v4.new_markdown_cell("## Section B"),
        said,
        table,
    ])


def test_lecture_rule_places_narrative_equations_figures_and_notes():
    nb = _lecture()
    before = nbformat.writes(nb)
    deck = slides.deck_slides(nb)
    assert nbformat.writes(nb) == before  # the notebook is not touched
    titles = [(s.title, s.vertical, s.figure) for s in deck]
    assert titles == [("Chapter title", False, False), ("Section A", False, False), ("Section A", False, True),
                      ("Section A (cont.)", False, False),  # a figure's slide holds the figure alone
                      ("A, detail", True, False), ("Section B", False, False), ("Section B", False, True)]
    on_slide = ["".join(b for b, _ in s.blocks) for s in deck]
    notes = ["".join(s.notes) for s in deck]
    assert on_slide[0].count("First sentence of the chapter.") == 1 and "Second sentence" not in on_slide[0]
    assert "Second sentence" in notes[0]
    assert "Lead of A." in on_slide[1] and "$$A_i = r_i - b$$" in on_slide[1]
    assert "PROSE-ONLY-IN-NOTES" not in on_slide[1] and "PROSE-ONLY-IN-NOTES" in notes[1]
    assert "<img" in on_slide[2] and "PRINTED-TEXT" not in "".join(on_slide)
    assert "HIDDEN_CODE" not in "".join(on_slide)
    assert 'class="fragment"' in on_slide[3] and "SHOWN_CODE" in on_slide[3]  # a marked code cell shows its code
    assert "<li>one</li>" in on_slide[4] and "NOTES-CELL" in notes[4]
    assert "SKIPPED-CELL" not in "".join(on_slide + notes)
    assert "<table>" in on_slide[6]
    assert "MEASURED-SENTENCE" in notes[5] and "MEASURED-SENTENCE" not in "".join(on_slide)
    assert slides.expected_slides(nb) == len(deck) == 7


def test_a_long_list_continues_on_a_next_slide():
    items = "\n".join(f"{i}. item {i} " + "word " * 30 for i in range(1, 13))
    deck = slides.deck_slides(v4.new_notebook(cells=[v4.new_markdown_cell(f"## Many\n\n{items}")]))
    assert [s.title for s in deck][:2] == ["Many", "Many (cont.)"] and len(deck) >= 2
    assert all(s.lines <= slides.SCREEN_LINES for s in deck)
    text = "".join(b for s in deck for b, _ in s.blocks)
    assert all(f"item {i} " in text for i in range(1, 13))
    assert 'start="' in "".join(b for b, _ in deck[1].blocks)  # the numbering goes on


def test_blocks_and_leads():
    blocks = slides.markdown_blocks("## T\n\ntext one\ntext two\n\n$$a\n\n= b$$\n\n- x\n  more\n- y\n\n| a |\n|---|")
    assert [k for k, _ in blocks] == ["heading2", "prose", "math", "list", "table"]
    assert blocks[2][1] == "$$a\n\n= b$$"
    assert slides.lead_of("Short one. Two.") == "Short one. Two."
    long = "The rate $p = 0.5. Q$ holds. Then " + "more " * 60
    assert slides.lead_of(long) == "The rate $p = 0.5. Q$ holds."  # no cut inside maths


def test_own_slide_type_is_checked():
    cell = v4.new_markdown_cell("x", metadata={"slideshow": {"slide_type": "big"}})
    with pytest.raises(ValueError, match="'big'"):
        slides.slide_mark(cell)


def test_deck_loads_only_local_assets(tmp_path, assert_local_mathjax):
    (deck,) = slides.write_slides(tmp_path, only="ch04c")
    page = deck.read_text()
    assert_local_mathjax(page, tmp_path)
    for src in [web.REVEAL_JS, web.REVEAL_NOTES, *web.REVEAL_CSS]:
        assert f'"{src}"' in page and (tmp_path / src).is_file(), src
    assert web.remote_urls(page) == []
    assert page.count('<aside class="notes">') >= 5


def test_cli_writes_one_deck_per_committed_chapter(tmp_path, capsys):
    (path,) = [p for p in notebooks() if "ch04c" in p.stem]
    before = path.read_bytes()
    assert main(["slides", "--out", str(tmp_path), "--only", "ch04c"]) == 0
    decks = sorted(tmp_path.glob("*.slides.html"))
    assert [d.name for d in decks] == [f"{path.stem}.slides.html"] and str(decks[0]) in capsys.readouterr().out
    page = decks[0].read_text()
    nb = nbformat.read(path, as_version=4)
    figures = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert page.count('<img class="mk-figure"') == figures > 0  # every figure of the chapter is on a slide
    assert len(re.findall(r"<section data-mk-slide=", page)) == slides.expected_slides(nb)
    assert path.read_bytes() == before  # the committed notebook is not touched
    assert main(["slides", "--out", str(tmp_path), "--only", "no-such-chapter"]) == 2
    assert "no-such-chapter" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="no-such-chapter"):
        slides.write_slides(tmp_path, directory=NOTEBOOK_DIR, only="no-such-chapter")
