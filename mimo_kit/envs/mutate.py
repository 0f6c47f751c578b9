"""Task generator: mutate a correct tiny repo's AST into new, validated code tasks (Report §4.2, source-driven tasks).

A *seed* is a correct repository plus its tests (``data/code_tasks/_seeds/<name>/{repo,tests}``). Each mutation
site becomes a candidate task whose base repo is the mutated (buggy) code and whose reference patch restores the
original. Three mutation operators, the classic ones of mutation testing:

- **operator flip**: ``+``↔``-``, ``*``↔``//``, ``<``↔``<=``, ``>``↔``>=``, ``==``↔``!=``, ``and``↔``or``;
- **off-by-one**: an integer literal ``n`` → ``n + 1`` (``0`` and ``1`` included, the usual boundaries);
- **swapped arguments**: a call with two positional arguments ``f(a, b)`` → ``f(b, a)``.

F2P = the tests that fail on the mutant and pass on the seed; P2P = the tests that pass on both. A mutant no test
catches is rejected ("equivalent or untested mutant"), and every kept task then goes through
:func:`mimo_kit.envs.code.validate_task` like a hand-written one. Only the mutated node is re-printed
(``ast.unparse``), so the rest of the file keeps its formatting and the reference patch stays one hunk.
"""

from __future__ import annotations

import ast
import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mimo_kit.envs.code import (
    DATA_DIR,
    CodeEnvConfig,
    CodeTask,
    TaskError,
    Validation,
    run_hidden_tests,
    validate_task,
    write_task,
)

SEEDS_DIR = DATA_DIR / "_seeds"
_FLIPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
          ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
          ast.And: ast.Or, ast.Or: ast.And}


@dataclasses.dataclass
class Mutation:
    file: str  # path inside the repo
    kind: str  # operator-flip | off-by-one | swap-args
    line: int
    col: int  # byte offsets of the node on its line
    end_col: int
    function: str
    before: str  # the node's source
    after: str  # its mutated source


def _enclosing_functions(tree: ast.AST) -> dict[int, str]:
    out = {}
    for node in ast.walk(tree):  # breadth first: an inner function overwrites its outer one
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body_start = node.body[0].lineno  # the signature line is not behaviour
            for ln in range(body_start, (node.end_lineno or node.lineno) + 1):
                out[ln] = node.name
    return out


def _mutants(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    import copy

    if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in _FLIPS:
        m = copy.deepcopy(node)
        m.op = _FLIPS[type(node.op)]()
        yield "operator-flip", m
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIPS:
        m = copy.deepcopy(node)
        m.ops = [_FLIPS[type(node.ops[0])]()]
        yield "operator-flip", m
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield "off-by-one", ast.Constant(node.value + 1)
    elif isinstance(node, ast.Call) and len(node.args) == 2 and not node.keywords and not any(
            isinstance(a, ast.Starred) for a in node.args):
        m = copy.deepcopy(node)
        m.args = [node.args[1], node.args[0]]
        if ast.unparse(m) != ast.unparse(node):
            yield "swap-args", m


def find_mutations(source: str, file: str) -> list[Mutation]:
    """Every mutation site of one Python file, in source order (docstrings and annotations are skipped)."""
    tree = ast.parse(source)
    funcs = _enclosing_functions(tree)
    out = []
    for node in ast.walk(tree):
        if not hasattr(node, "lineno") or node.lineno != getattr(node, "end_lineno", None):
            continue  # single-line nodes only: the patch stays one small hunk
        if node.lineno not in funcs:
            continue  # module-level constants and signatures are not behaviour
        for kind, mutant in _mutants(node):
            before = ast.get_source_segment(source, node)
            if before is None:
                continue
            out.append(Mutation(file, kind, node.lineno, node.col_offset, node.end_col_offset, funcs[node.lineno],
                                before, ast.unparse(mutant)))
    return sorted(out, key=lambda m: (m.line, m.col, m.kind))


def apply_mutation(source: str, m: Mutation) -> str:
    lines = source.splitlines(keepends=True)
    line = lines[m.line - 1].encode()
    if line[m.col:m.end_col].decode() != m.before:
        raise TaskError(f"mutation at {m.file}:{m.line}: expected {m.before!r} at columns {m.col}-{m.end_col}")
    lines[m.line - 1] = (line[:m.col] + m.after.encode() + line[m.end_col:]).decode()
    return "".join(lines)


@dataclasses.dataclass
class Generated:
    mutation: Mutation
    task: CodeTask | None
    reason: str  # why it was kept or rejected
    validation: Validation | None = None


def generate_tasks(seed: str | Path, dest: str | Path, *, package: str, limit: int = 10,
                   cfg: CodeEnvConfig | None = None) -> list[Generated]:
    """Mutate ``seed/repo`` (tested by ``seed/tests``) into up to ``limit`` validated tasks under ``dest``."""
    cfg = cfg or CodeEnvConfig()
    seed, dest = Path(seed), Path(dest)
    if not (seed / "repo" / package).is_dir() or not (seed / "tests").is_dir():
        raise TaskError(f"seed {str(seed)!r}: expected repo/{package}/ and tests/ folders")
    repo = {p.relative_to(seed / "repo").as_posix(): p.read_text() for p in sorted((seed / "repo").rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}
    tests = {p.name: p.read_text() for p in sorted((seed / "tests").glob("test_*.py"))}
    ids = [f"{name}::{node.name}" for name, text in tests.items() for node in ast.parse(text).body
           if isinstance(node, ast.FunctionDef) and node.name.startswith("test")]
    out: list[Generated] = []
    kept = 0
    for file in sorted(f for f in repo if f.startswith(package + "/") and f.endswith(".py")):
        for m in find_mutations(repo[file], file):
            if kept >= limit:
                return out
            mutated = dict(repo, **{file: apply_mutation(repo[file], m)})
            outcomes = _outcomes(mutated, tests, ids, cfg)
            f2p = [t for t in ids if outcomes[t] == "failed"]
            if not f2p:
                out.append(Generated(m, None, "rejected: no test catches this mutant (equivalent or untested)"))
                continue
            if any(v == "missing" for v in outcomes.values()):
                out.append(Generated(m, None, "rejected: the mutant breaks test collection"))
                continue
            p2p = [t for t in ids if t not in f2p]
            task_id = f"{seed.name}-{m.kind}-l{m.line}c{m.col}"
            instruction = (f"`{m.function}` in `{file}` misbehaves: the behaviour checked by "
                           f"{', '.join(t.split('::')[1] for t in f2p)} is broken. Fix the bug without changing "
                           f"the function's signature.")
            task = write_task(dest / task_id, task_id=task_id, instruction=instruction, base=mutated, fixed=repo,
                              hidden_tests=tests, f2p=f2p, p2p=p2p, package=package, source=f"mutation:{m.kind}")
            v = validate_task(task, cfg)
            if not v.ok:
                shutil.rmtree(dest / task_id, ignore_errors=True)
                out.append(Generated(m, None, "rejected by validation: " + "; ".join(v.reasons), v))
                continue
            kept += 1
            out.append(Generated(m, task, f"kept: F2P {len(f2p)}, P2P {len(p2p)}", v))
    return out


def _outcomes(files: dict[str, str], tests: dict[str, str], ids: list[str], cfg: CodeEnvConfig) -> dict[str, str]:
    tmp = Path(tempfile.mkdtemp(prefix="mimo-mutant-"))
    try:
        (tmp / "repo").mkdir()
        (tmp / "hidden_tests").mkdir()
        for rel, text in files.items():
            (tmp / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "repo" / rel).write_text(text)
        for rel, text in tests.items():
            (tmp / "hidden_tests" / rel).write_text(text)
        for p in [tmp, *tmp.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        probe = CodeTask("probe", "probe", tmp, ids[:1], ids[1:], "")
        outcomes, _ = run_hidden_tests(probe, tmp / "repo", ids, cfg)
        return outcomes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
