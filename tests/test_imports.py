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
    """module → the kit modules it imports; importing ``a.b.c`` also runs the packages ``a.b`` and ``a``."""
    mods = {module_name(p): p for p in KIT.rglob("*.py")}
    out = {}
    for m, p in mods.items():
        targets = set()
        for i in imports_of(p):
            parts = i.split(".")
            targets |= {".".join(parts[:k]) for k in range(2, len(parts) + 1)}
        out[m] = {i for i in targets if i in mods and i != m}
    return out


def closure(g: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(g.get(m, ()))
    return seen - {start}


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


#: the RL maths: pure functions and the trajectory model (what the trainer, TRL and notebooks all reuse)
PURE_RL = ("advantages", "aggregation", "compose", "config", "losses", "opd", "penalties", "penalty_module",
           "sampling", "trajectory")


#: the RL run's stage modules (the trainer)
RUN = tuple(f"mimo_kit.train.{m}" for m in ("config", "collection", "update", "engines", "run"))


def test_pure_rl_maths_imports_nothing_from_infra_envs_or_the_toy_world():
    g = graph()
    for name in ("mimo_kit.rl", *(f"mimo_kit.rl.{m}" for m in PURE_RL)):
        bad = sorted(m for m in closure(g, name) if m.startswith(("mimo_kit.infra", "mimo_kit.envs",
                                                                   "mimo_kit.harness", "mimo_kit.train.toy",
                                                                   *RUN, "mimo_kit.train.sft")))
        assert not bad, (name, bad)


def test_infra_imports_nothing_from_the_toy_world_or_the_trainer():
    g = graph()
    infra = [m for m in g if m.startswith("mimo_kit.infra")]
    assert "mimo_kit.infra.rollout" in infra
    for name in infra:
        bad = sorted(m for m in closure(g, name) if m.startswith(("mimo_kit.train.toy", *RUN,
                                                                   "mimo_kit.train.experiments")))
        assert not bad, (name, bad)
