"""The web assets the kit's pages and lecture decks load, vendored: a course or a deck opens offline.

``vendor/`` holds, unchanged, the files the pages need from three npm packages (``scripts/vendor_web.sh`` fetches
them at pinned versions and lists them in ``vendor/VERSIONS``):

* MathJax 3 (``tex-chtml-full.js``: TeX input, CommonHTML output, every TeX extension in one file) and its TeX
  fonts (``output/chtml/fonts/woff-v2``), so equations are set in the TeX fonts, variables in math italic;
* reveal.js 5 (its UMD build, the white theme and its font, the speaker-notes plugin), for the decks;
* require.js, which nbconvert's lab page loads first (widget outputs use it).

:func:`install` copies them into ``<out>/assets`` once; a page or deck refers to them by a relative path, so the
folder can be zipped, served from anywhere or opened from disk. ``templates/mimo_page`` is nbconvert's lab template
with MathJax 3 in place of the MathJax 2 block it loads from a CDN.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENDOR = HERE / "vendor"
TEMPLATES = HERE / "templates"

#: the folder :func:`install` writes under the output folder
ASSETS = "assets"
#: entry points, relative to the output folder
MATHJAX = f"{ASSETS}/mathjax/tex-chtml-full.js"
MATH_ITALIC_FONT = "MJXTEX-I"  # the font family MathJax 3's CommonHTML output sets math-italic variables in
REQUIRE_JS = f"{ASSETS}/requirejs/require.js"
REVEAL_JS = f"{ASSETS}/reveal/dist/reveal.js"
REVEAL_CSS = (f"{ASSETS}/reveal/dist/reset.css", f"{ASSETS}/reveal/dist/reveal.css",
              f"{ASSETS}/reveal/dist/theme/white.css")
REVEAL_NOTES = f"{ASSETS}/reveal/plugin/notes/notes.js"


def install(out: Path | str) -> Path:
    """Copy the vendored assets to ``out/assets`` (again only when ``vendor/VERSIONS`` changed); return the folder."""
    target = Path(out) / ASSETS
    versions = (VENDOR / "VERSIONS").read_text()
    if not (target / "VERSIONS").is_file() or (target / "VERSIONS").read_text() != versions:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(VENDOR, target)
    return target


def page_exporter(prefix: str = ""):
    """nbconvert's ``HTMLExporter`` with the kit's page template; ``prefix`` is the path from the page to the
    folder :func:`install` wrote into (``""`` beside it, ``"../"`` one level up)."""
    from nbconvert import HTMLExporter

    return HTMLExporter(template_name="mimo_page", extra_template_basedirs=[str(TEMPLATES)],
                        mathjax_url=prefix + MATHJAX, require_js_url=prefix + REQUIRE_JS)


def remote_urls(html: str) -> list[str]:
    """The ``src`` / ``href`` of every ``<script>``, ``<link>`` and ``<img>`` in ``html`` that points off the
    machine (``http:``, ``https:`` or protocol-relative ``//``): what a page would fetch from the network."""
    import re

    urls = re.findall(r'<(?:script|link|img)\b[^>]*?\b(?:src|href)\s*=\s*["\']([^"\']+)["\']', html, flags=re.I)
    urls += re.findall(r'\bimport\s*\(\s*["\']([^"\']+)["\']', html)
    return [u for u in urls if u.lower().startswith(("http:", "https:", "//"))]
