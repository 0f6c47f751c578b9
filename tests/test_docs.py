"""What the README, docs/ and the notebooks' markdown name exists: modules, commands, files, make targets.

A sentence that names something planned says so on the same line ("planned"); everything else named in backticks
must exist at this commit.
"""

import importlib
import re
from pathlib import Path

import nbformat
import pytest

from mimo_kit import experiments
from mimo_kit.cli import build_parser
from mimo_kit.course import NOTEBOOK_DIR

ROOT = Path(__file__).resolve().parent.parent
TOP = ("mimo_kit/", "data/", "tests/", "notebooks/", "benchmarks/", "docs/", ".ci/")


def documents() -> list[tuple[str, str]]:
    """(name, text) of every prose document: README, docs/*.md, data READMEs, notebook markdown cells."""
    docs = [("README.md", (ROOT / "README.md").read_text())]
    docs += [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "docs").glob("*.md"))]
    docs += [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "data").rglob("README.md"))]
    for path in sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        docs.append((path.name, md))
    return docs


def claims(pattern: str) -> list[tuple[str, str]]:
    """(document, match) for every match of ``pattern`` inside backticks on a line that does not say planned."""
    out = []
    for name, text in documents():
        for line in text.splitlines():
            if "planned" in line.lower():
                continue
            for code in re.findall(r"`([^`]+)`", line):
                out += [(name, m) for m in re.findall(pattern, code)]
    return out


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_named_module_and_object_exists():
    bad = [(d, m) for d, m in claims(r"mimo_kit(?:\.\w+)+") if not resolves(m)]
    assert not bad, bad


def test_every_named_command_and_experiment_exists():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    known = experiments.discover()
    bad = []
    for d, m in claims(r"mimo-kit [\w-]+(?: [^\s`]+)?"):
        words = m.split()
        if words[1] not in sub:
            bad.append((d, m))
        elif words[1] in ("run", "results") and len(words) > 2 and not words[2].startswith("-"):
            placeholder = words[2].isupper() or "<" in words[2] or "…" in words[2]
            if not placeholder and words[2] not in known:
                bad.append((d, m))
    assert not bad, bad


def test_every_named_file_exists():
    bad = []
    for d, m in claims(r"[\w./-]+"):
        if not m.startswith(TOP) or any(ch in m for ch in "<>*{}…"):
            continue
        path = m.rstrip(".,:;")
        if not (ROOT / path).exists() and not list(ROOT.glob(path + "*")):
            bad.append((d, m))
    assert not bad, bad


def test_every_named_make_target_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    bad = [(d, m) for d, m in claims(r"make [\w-]+") if m.split()[1] not in targets]
    assert not bad, bad


@pytest.mark.parametrize("pattern", [r"\bDESIGN\b", r"REPORT\.md", r"STYLE(\.md|:)", r"\.\./shared"])
def test_no_reference_points_outside_the_repository(pattern):
    hits = [d for d, text in documents() if re.search(pattern, text)]
    code = list(ROOT.glob("mimo_kit/**/*.py")) + list(ROOT.glob("tests/*.py")) + list(ROOT.glob("benchmarks/*.py"))
    for path in code + list(NOTEBOOK_DIR.glob("*.ipynb")):
        if path.name != Path(__file__).name and re.search(pattern, path.read_text()):
            hits.append(str(path.relative_to(ROOT)))
    assert not hits, hits
