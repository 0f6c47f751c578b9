"""The kit's import layers (``docs/design.md``, "Layers"): read statically from the source, every import counted
(top-level, inside functions, under ``TYPE_CHECKING``), so a lazy import cannot hide a cycle.

- no cycle between packages, and none between modules;
- an import goes to the same layer or a lower one, never up;
- ``mimo_kit.rl`` (the maths) imports nothing of the kit outside ``rl`` and ``config``;
- every package and top-level module has a layer (a new one must be placed);
- the RL run stays in rooms a reader can hold: no file of ``mimo_kit/train`` over :data:`TRAIN_MAX_LINES` lines, and
  ``run_rl`` (the run in run order) within :data:`RUN_RL_MAX_LINES`.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "mimo_kit"

#: Bottom to top. A name is a subpackage or a top-level module of ``mimo_kit``.
LAYERS: list[tuple[str, set[str]]] = [
    ("config", {"config"}),
    ("services", {"experiments", "results", "spread", "cache", "checkpoint", "corpus", "viz", "chapters", "claims",
                  "nb", "dist", "launch", "ray_launch", "preempt", "live"}),
    ("model", {"model", "optim"}),
    ("model training", {"pretrain", "speculative"}),
    ("maths", {"rl"}),
    ("environments", {"envs", "grading"}),
    ("infra", {"infra"}),
    ("harness", {"harness"}),
    ("train", {"train"}),
    ("distill", {"distill"}),
    ("course", {"intro", "solutions", "course", "slides", "exercises", "answers", "grade", "grade_kernel", "gradebook",
                "student", "web", "envcheck", "cli", "__init__"}),
]
LAYER_OF = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The kit module an import names (``mimo_kit.rl.advantages.grpo_advantages`` → ``mimo_kit.rl.advantages``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    """Every kit module ``module`` imports, wherever the import statement stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) ==
              "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            names = [str(node.args[0].value)]
        for name in names:
            if name.startswith("mimo_kit"):
                target = _resolve(name)
                if target and target != module and target != "mimo_kit":
                    found.add(target)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _unit(module: str) -> str:
    """A module's package, or the module itself at the top level (``mimo_kit`` itself: ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _edges(a: str, b: str) -> list[str]:
    return [f"{m} → {t}" for m, ts in sorted(GRAPH.items()) for t in sorted(ts) if _unit(m) == a and _unit(t) == b]


def test_no_module_imports_another_in_a_cycle():
    assert _cycles(GRAPH) == []


def test_no_package_imports_another_in_a_cycle():
    packages: dict[str, set[str]] = defaultdict(set)
    for m, targets in GRAPH.items():
        packages[_unit(m)] |= {_unit(t) for t in targets if _unit(t) != _unit(m)}
    cycles = _cycles(packages)
    detail = {f"{a} → {b}": _edges(a, b) for c in cycles for a in c for b in c if a != b and _edges(a, b)}
    assert cycles == [], detail


def test_every_package_has_a_layer():
    assert sorted({_unit(m) for m in MODULES} - set(LAYER_OF)) == []
    assert sorted(set(LAYER_OF) - {_unit(m) for m in MODULES}) == []  # no stale name either


def test_imports_go_to_the_same_layer_or_below():
    upward = [f"{m} → {t} ({LAYERS[LAYER_OF[_unit(m)]][0]} → {LAYERS[LAYER_OF[_unit(t)]][0]})"
              for m, targets in sorted(GRAPH.items()) for t in sorted(targets)
              if LAYER_OF[_unit(t)] > LAYER_OF[_unit(m)]]
    assert upward == []


def test_the_rl_maths_imports_only_itself_and_config():
    outside = [f"{m} → {t}" for m, targets in sorted(GRAPH.items()) if _unit(m) == "rl"
               for t in sorted(targets) if _unit(t) not in ("rl", "config")]
    assert outside == []


#: a stage of the RL run is one report section; past this it holds two (``docs/design.md``, "Layers")
TRAIN_MAX_LINES = 600
#: ``run_rl`` reads on one screen: every optional mode enters through one named call
RUN_RL_MAX_LINES = 80


def test_no_file_of_the_rl_run_outgrows_one_stage():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "train").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > TRAIN_MAX_LINES}
    assert long == {}


def test_run_rl_reads_on_one_screen():
    tree = ast.parse((ROOT / "train" / "run.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_rl")
    assert fn.end_lineno - fn.lineno + 1 <= RUN_RL_MAX_LINES


@pytest.mark.parametrize("source, expected", [
    ("import mimo_kit.rl.advantages\n", {"mimo_kit.rl.advantages"}),
    ("def f():\n    from mimo_kit.train import update\n", {"mimo_kit.train", "mimo_kit.train.update"}),
    ("if TYPE_CHECKING:\n    from mimo_kit.model.config import MiMoConfig\n", {"mimo_kit.model.config"}),
    ("import importlib\nimportlib.import_module('mimo_kit.infra.pool')\n", {"mimo_kit.infra.pool"}),
    ("from . import losses\n", {"mimo_kit.rl", "mimo_kit.rl.losses"}),
    ("from .advantages import grpo_advantages\n", {"mimo_kit.rl.advantages"}),
])
def test_the_reader_sees_every_kind_of_import(tmp_path, source, expected):
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert _imports("mimo_kit.rl.probe", path) == expected


def test_a_cycle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
