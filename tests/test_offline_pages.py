"""The course's pages and lecture decks opened from disk in headless Chromium with no network (no host name
resolves): the maths is typeset in MathJax's TeX fonts (variables in math italic, the font file loaded), every
resource comes from the disk, and a deck shows one slide per screen and moves on a key press.

Every chapter's deck is checked slide by slide, once its maths is typeset: each slide's content fits reveal.js's
1280 × 720 canvas, in height and, for every equation (inline or display), in width. The screenshots go to
``runs/browser/page_ch04c.png`` and ``runs/browser/deck_ch04c.png``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from lab_browser import start_chromium, system_browser, wait_for

from mimo_kit import slides, web
from mimo_kit.course import committed_course, notebooks

REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "runs" / "browser"

#: the state of a page's maths once MathJax has typeset it and the fonts it asked for have loaded
MATH_JS = """
const done = arguments[arguments.length - 1];
MathJax.startup.promise.then(() => document.fonts.ready).then(() => {
  const italic = [...document.querySelectorAll('mjx-mi mjx-c')]
      .map(c => getComputedStyle(c).fontFamily).filter(f => f.includes(arguments[0]));
  const faces = [...document.fonts].filter(f => f.family.replace(/"/g, '') === arguments[0]);
  done({containers: document.querySelectorAll('mjx-container').length,
        errors: document.querySelectorAll('mjx-merror').length,
        italic: italic.length, face: faces.map(f => f.status),
        resources: performance.getEntriesByType('resource').map(r => r.name)
            .filter(n => !n.startsWith('file:') && !n.startsWith('data:'))});
});
"""

#: what is on the screen: the leaf slides a viewer can see, and whether the current one fits the canvas. Its
#: equations (those in the speaker notes left out) in layout pixels, reveal.js's scale divided out: a display equation's
#: container is as wide as its line, so what is measured is the typeset maths in it (``mjx-math``), its width and
#: where it ends, from the slide's left edge; the width of the slide is its ``clientWidth``
SCREEN_JS = """
const leaves = [...document.querySelectorAll('.reveal .slides section')].filter(s => !s.querySelector('section'));
const seen = leaves.filter(s => { const st = getComputedStyle(s);
  return st.display !== 'none' && st.visibility !== 'hidden' && parseFloat(st.opacity) > 0; });
const current = Reveal.getCurrentSlide();
const scale = Reveal.getScale(), box = current.getBoundingClientRect();
const maths = [...current.querySelectorAll('mjx-container')].filter(c => !c.closest('aside.notes')).map(c => {
  const r = (c.querySelector('mjx-math') || c).getBoundingClientRect();
  return {width: Math.max(r.width / scale, c.scrollWidth), left: (r.left - box.left) / scale,
          right: (r.right - box.left) / scale};
});
return {visible: seen.length, current: current === seen[0], indices: Reveal.getIndices(),
        height: current.scrollHeight, canvas: Reveal.getConfig().height, total: Reveal.getTotalSlides(),
        notes: (Reveal.getSlideNotes() || '').length, width: current.clientWidth, maths: maths};
"""
#: the equations on a deck's slides (not in the speaker notes): each is measured on its slide
SLIDE_MATHS_JS = """
return [...document.querySelectorAll('.reveal .slides mjx-container')].filter(c => !c.closest('aside.notes')).length;
"""
#: sub-pixel slack for a width measured on the scaled canvas and scaled back
WIDTH_SLACK = 0.5


@pytest.fixture(scope="module")
def offline_browser(tmp_path_factory):
    chromium, driver_path = system_browser()
    root = tmp_path_factory.mktemp("offline")
    driver = start_chromium(chromium, driver_path, profile=root / "chromium", offline=True)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": slides.WIDTH, "height": slides.HEIGHT, "deviceScaleFactor": 1, "mobile": False})
    try:
        yield root, driver
    finally:
        driver.quit()


def _typeset(driver) -> dict:
    wait_for(lambda: driver.execute_script("return !!(window.MathJax && MathJax.startup && MathJax.startup.promise)"),
             timeout=60, what="MathJax loaded")
    return driver.execute_async_script(MATH_JS, web.MATH_ITALIC_FONT)


def _assert_tex(state: dict) -> None:
    assert state["containers"] > 0 and state["errors"] == 0, state
    assert state["italic"] > 0, "no variable is set in MathJax's math-italic TeX font"
    assert state["face"] and set(state["face"]) == {"loaded"}, f"the math-italic font did not load: {state['face']}"
    assert state["resources"] == [], f"fetched from the network: {state['resources']}"


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_page_typesets_maths_offline(offline_browser):
    root, driver = offline_browser
    committed_course(root / "course", only="ch04c")
    driver.get((root / "course" / "ch04c_groupwise_grading.html").as_uri())
    state = _typeset(driver)
    _assert_tex(state)
    assert state["containers"] >= 30  # the chapter's equations, inline and display
    driver.execute_script("document.querySelector('mjx-container[display=\"true\"]')"
                          ".scrollIntoView({block: 'center'});")
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SHOTS / "page_ch04c.png"))


@pytest.mark.browser
@pytest.mark.timeout(900)
def test_every_deck_paginates_fits_and_typesets_offline(offline_browser):
    root, driver = offline_browser
    decks = slides.write_slides(root / "slides")
    assert len(decks) == len(notebooks())
    overflow, wide = [], []
    for deck, path in zip(decks, notebooks()):
        driver.get(deck.as_uri())
        wait_for(lambda: driver.execute_script("return !!(window.Reveal && Reveal.isReady() && window.mkTypeset)"),
                 timeout=60, what=f"{deck.name} ready")
        typeset = _typeset(driver)  # every equation typeset (and fitted to its slide) before any is measured
        assert typeset["errors"] == 0, (deck.name, typeset)
        if "ch04c" in deck.name:
            _assert_tex(typeset)
        state = driver.execute_script(SCREEN_JS)
        assert state["total"] == slides.expected_slides(nbformat.read(path, as_version=4)) > 3, (deck.name, state)
        assert state["visible"] == 1 and state["current"], (deck.name, state)  # one slide per screen
        assert state["notes"] > 0, f"{deck.name}: the title slide has no speaker notes"
        measured = 0
        for i in range(state["total"]):
            if i:
                driver.execute_script("Reveal.next();")
            now = driver.execute_script(SCREEN_JS)
            assert now["visible"] == 1, (deck.name, i, now)
            if now["height"] > now["canvas"]:
                overflow.append((deck.name, now["indices"], now["height"]))
            measured += len(now["maths"])
            wide += [(deck.name, now["indices"], round(m["width"]), round(m["right"]), now["width"])
                     for m in now["maths"] if max(m["width"], m["right"]) > now["width"] + WIDTH_SLACK
                     or m["left"] < -WIDTH_SLACK]
        assert driver.execute_script("return Reveal.isLastSlide();"), deck.name  # next() went through them all
        assert measured == driver.execute_script(SLIDE_MATHS_JS), f"{deck.name}: an equation was not measured"
        if "ch04c" in deck.name:
            driver.execute_script("Reveal.slide(1, 0);")
            assert driver.execute_script(SCREEN_JS)["indices"]["h"] == 1
            assert driver.save_screenshot(str(SHOTS / "deck_ch04c.png"))
    assert overflow == [], f"slides taller than the {slides.HEIGHT}-pixel canvas: {overflow}"
    assert wide == [], f"equations wider than their slide (deck, slide, width, right edge, slide width): {wide}"
