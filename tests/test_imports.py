"""The package's import graph: no circles at the top level; the registry imports nothing it registers."""

import ast
from pathlib import Path

import mimo_kit

KIT = Path(mimo_kit.__file__).parent


def module_name(path: Path) -> str:
    rel = path.relative_to(KIT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every mimo_kit module ``path`` imports, at module level or inside functions."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("mimo_kit")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mimo_kit"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    mods = {module_name(p): p for p in KIT.rglob("*.py")}
    return {m: {i for i in imports_of(p) if i in mods and i != m} for m, p in mods.items()}


def reaches(g: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo.extend(g.get(m, ()))
    return False


def test_no_circles_among_the_top_level_modules():
    g = graph()
    top = [m for m in g if m.count(".") == 1 and not any(k.startswith(m + ".") for k in g)]  # plain modules
    cycles = [(a, b) for a in top for b in g[a] if b in top and reaches(g, b, a)]
    assert not cycles, cycles


def test_the_registry_imports_nothing_it_registers():
    g = graph()
    chapter_modules = {m for m in g if m.endswith(".experiments") and m != "mimo_kit.experiments"}
    assert chapter_modules, "no chapter registers experiments"
    assert not any(reaches(g, "mimo_kit.experiments", m) for m in chapter_modules)
    assert "mimo_kit.intro.experiments" in chapter_modules  # chapter 1 registers like every other chapter


def test_cli_and_course_do_not_import_each_other_at_module_level():
    for a, b in (("cli", "course"), ("course", "cli")):
        tree = ast.parse((KIT / f"{a}.py").read_text())
        top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {n.module for n in top_level if isinstance(n, ast.ImportFrom)}
        assert f"mimo_kit.{b}" not in names
