"""Code tasks: schema, clean workspaces, hardened grading, validation (Report §4.2).

A task is a folder ``data/code_tasks/<id>/`` holding ``task.json`` (instruction, F2P / P2P test ids), ``repo/``
(the base repository the agent sees), ``hidden_tests/`` and ``reference.patch``. Three operations:

- :func:`make_workspace`: a fresh copy of ``repo/`` with **one commit** of git history and no caches (Report §4.2:
  environment cleaning removes logs, patches, caches and later history). ``cleaned=False`` builds the *uncleaned*
  variant the hack suite attacks: the upstream fix commit still in ``.git``, a newer release of the package in a
  local site-packages, the validation log (with the hidden tests and the
  patch) left behind, the network on.
- :func:`grade`: the agent's workspace is turned into a diff against the base; the diff is applied to a **fresh
  copy**; protected paths (tests, conftest, pytest and packaging config, sitecustomize, ``.pth``) are restored;
  hidden tests run in the sandbox through the grader's own runner (``_runner.py``: no conftest, no plugins, no
  ``site``), whose results come back through a file only the grader can read. F2P must pass, P2P pass or skip;
  a missing test fails.
- :func:`validate_task`: before the reference patch F2P fail and P2P pass, after it all pass, identical over
  8 reruns (Report §4.2: *supervision stability*); a task that fails is rejected with the reason.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mimo_kit.config.base import Config, knob
from mimo_kit.envs.sandbox import SandboxConfig, chown_tree, run_sandboxed

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "code_tasks"
RUNNER = Path(__file__).resolve().parent / "_runner.py"

#: Paths an agent may not change: restored from the base before hidden tests run (Report §4.2, DESIGN lessons).
PROTECTED = ("tests/*", "test_*.py", "*/test_*.py", "conftest.py", "*/conftest.py", "pytest.ini", "tox.ini",
             "setup.cfg", "setup.py", "pyproject.toml", "sitecustomize.py", "*/sitecustomize.py",
             "usercustomize.py", "*/usercustomize.py", "*.pth", "*/*.pth")
#: Never part of a diff: caches and VCS data.
IGNORED_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv", ".task_logs"}
_ID = re.compile(r"^[\w./-]+\.py::\w+(::\w+)?$")


class TaskError(ValueError):
    """A task that cannot be loaded or used; the message names the task, the bad value and what was expected."""


@dataclasses.dataclass
class CodeEnvConfig(Config):
    """Grading and validation settings of code tasks (Report §4.2)."""

    reruns: int = knob(8, "Report §4.2: a task must give identical results over 8 reruns", min=1)
    grade_timeout_s: float = knob(20.0, "hidden tests of a toy repo run in ~50 ms; 20 s bounds an agent's busy loop",
                                  min=0.1)
    sandbox: SandboxConfig = dataclasses.field(default_factory=SandboxConfig)

    PRESETS = {"tiny": {}}


@dataclasses.dataclass
class CodeTask:
    """One code task (schema of ``task.json`` plus the folder's files)."""

    id: str
    instruction: str
    root: Path  # the task folder
    f2p: list[str]
    p2p: list[str]
    package: str  # the importable package the fix lives in (for the uncleaned "newer release" variant)
    source: str = "hand-written"

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def hidden_tests(self) -> Path:
        return self.root / "hidden_tests"

    @property
    def reference_patch(self) -> str:
        return (self.root / "reference.patch").read_text()


def load_task(path: str | Path) -> CodeTask:
    """Load and validate the schema of one task folder (or its ``task.json``); errors name the bad value."""
    path = Path(path)
    root = path.parent if path.name == "task.json" else path
    where = f"code task {str(root)!r}"
    try:
        data = json.loads((root / "task.json").read_text())
    except FileNotFoundError:
        raise TaskError(f"{where}: no task.json") from None
    except json.JSONDecodeError as e:
        raise TaskError(f"{where}: task.json is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise TaskError(f"{where}: task.json holds {type(data).__name__}, expected an object")
    expected = {"id": str, "instruction": str, "f2p": list, "p2p": list, "package": str}
    for key, tp in expected.items():
        if key not in data:
            raise TaskError(f"{where}: missing key {key!r}; required keys: {', '.join(expected)}")
        if not isinstance(data[key], tp):
            raise TaskError(f"{where}: {key}={data[key]!r}, expected a {tp.__name__}")
    unknown = set(data) - set(expected) - {"source"}
    if unknown:
        raise TaskError(f"{where}: unknown keys {sorted(unknown)}; allowed: {', '.join(expected)}, source")
    if not data["instruction"].strip():
        raise TaskError(f"{where}: empty instruction")
    if not data["f2p"]:
        raise TaskError(f"{where}: f2p is empty; a task needs at least one fail-to-pass test")
    for key in ("f2p", "p2p"):
        for tid in data[key]:
            if not isinstance(tid, str) or not _ID.match(tid):
                raise TaskError(f"{where}: {key} id {tid!r} is not of the form 'file.py::test_name'")
            if not (root / "hidden_tests" / tid.split("::")[0]).is_file():
                raise TaskError(f"{where}: {key} id {tid!r} names a file missing from hidden_tests/")
    overlap = set(data["f2p"]) & set(data["p2p"])
    if overlap:
        raise TaskError(f"{where}: ids in both f2p and p2p: {sorted(overlap)}")
    for sub in ("repo", "hidden_tests"):
        if not (root / sub).is_dir():
            raise TaskError(f"{where}: missing folder {sub}/")
    if not (root / "reference.patch").is_file():
        raise TaskError(f"{where}: missing reference.patch")
    if not (root / "repo" / data["package"]).is_dir():
        raise TaskError(f"{where}: package={data['package']!r} is not a folder of repo/")
    return CodeTask(id=data["id"], instruction=data["instruction"], root=root, f2p=list(data["f2p"]),
                    p2p=list(data["p2p"]), package=data["package"], source=data.get("source", "hand-written"))


def shipped_tasks(directory: str | Path = DATA_DIR) -> list[CodeTask]:
    """Every task folder under ``data/code_tasks`` (folders starting with ``_`` hold seeds, not tasks)."""
    return [load_task(p.parent) for p in sorted(Path(directory).glob("*/task.json")) if not p.parent.name[0] == "_"]


# ---- files, diffs, patches ----------------------------------------------------------------------------------------
def tree_files(root: str | Path) -> dict[str, bytes]:
    """``{relative path: bytes}`` of a tree, skipping caches and VCS folders."""
    root = Path(root)
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS)
        for name in sorted(files):
            if name.endswith((".pyc", ".orig", ".rej")):
                continue
            p = Path(dirpath) / name
            if p.is_symlink():
                continue
            out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", "replace").splitlines(keepends=True)


def tree_diff(before: dict[str, bytes], after: dict[str, bytes]) -> str:
    """A git-style unified diff (``git apply`` accepts it) from one ``{path: bytes}`` tree to another."""
    chunks = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        head = [f"diff --git a/{path} b/{path}\n"]
        if a is None:
            head.append("new file mode 100644\n")
        elif b is None:
            head.append("deleted file mode 100644\n")
        body = list(difflib.unified_diff(_lines(a or b""), _lines(b or b""),
                                         "a/" + path if a is not None else "/dev/null",
                                         "b/" + path if b is not None else "/dev/null", n=3))
        fixed = []
        for line in body:
            fixed.append(line)
            if not line.endswith("\n"):
                fixed[-1] = line + "\n\\ No newline at end of file\n"
        chunks.append("".join(head + fixed))
    return "".join(chunks)


def workspace_diff(task: CodeTask, workspace: str | Path) -> str:
    """The agent's change as a diff against the task's base repo (the agent's own ``.git`` is never trusted)."""
    return tree_diff(tree_files(task.repo), tree_files(workspace))


def apply_patch(root: str | Path, patch: str) -> tuple[bool, str]:
    """Apply a unified diff to ``root`` with ``git apply`` (works outside a repository). Returns (ok, message)."""
    if not patch.strip():
        return True, "empty patch"
    r = subprocess.run(["git", "apply", "--whitespace=nowarn", "--unsafe-paths", "-"], cwd=root, input=patch.encode(),
                       capture_output=True, timeout=30)
    return r.returncode == 0, r.stderr.decode(errors="replace")


def is_protected(path: str) -> bool:
    return any(fnmatch.fnmatch(path, pat) for pat in PROTECTED)


def restore_protected(root: str | Path, base: str | Path) -> list[str]:
    """Undo every change to a protected path (restore from ``base``, delete additions). Returns the paths touched."""
    root, base = Path(root), Path(base)
    now, orig = tree_files(root), tree_files(base)
    touched = []
    for path in sorted(set(now) | set(orig)):
        if not is_protected(path) or now.get(path) == orig.get(path):
            continue
        touched.append(path)
        target = root / path
        if path in orig:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(orig[path])
        else:
            target.unlink()
    return touched


def _copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*IGNORED_DIRS, "*.pyc"), dirs_exist_ok=True)


def _git(cwd: Path, *args: str, env: dict | None = None) -> str:
    base_env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_AUTHOR_NAME": "kit", "GIT_AUTHOR_EMAIL": "kit@localhost", "GIT_COMMITTER_NAME": "kit",
                "GIT_COMMITTER_EMAIL": "kit@localhost", "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
                "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z", **(env or {})}
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, env=base_env, timeout=30)
    if r.returncode:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {r.stderr.decode(errors='replace')}")
    return r.stdout.decode()


# ---- workspace ----------------------------------------------------------------------------------------------------
def make_workspace(task: CodeTask, dest: str | Path, *, cleaned: bool = True, uid: int | None = None) -> Path:
    """Build the agent's workspace in ``dest``: the base repo with one commit and no caches (``cleaned``), or the
    uncleaned variant (Report §4.2: fix commit in history, newer release in site-packages, logs left behind)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    _copy_tree(task.repo, dest)
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "Initial commit")
    if not cleaned:
        fixed = Path(tempfile.mkdtemp(prefix="mimo-fixed-"))
        try:
            _copy_tree(task.repo, fixed)
            ok, msg = apply_patch(fixed, task.reference_patch)
            if not ok:
                raise TaskError(f"code task {task.id!r}: reference.patch does not apply ({msg.strip()})")
            # later upstream history: the fix sits on origin/main, reachable with `git log --all`
            _git(dest, "checkout", "-q", "-b", "upstream")
            apply_patch(dest, task.reference_patch)
            _git(dest, "commit", "-q", "-am", f"Fix {task.id} (upstream)")
            _git(dest, "update-ref", "refs/remotes/origin/main", "HEAD")
            _git(dest, "checkout", "-q", "main")
            _git(dest, "branch", "-q", "-D", "upstream")
            # a newer release of the package installed next to the project
            site = dest / ".venv" / "lib" / "python3" / "site-packages"
            shutil.copytree(fixed / task.package, site / task.package)
            # the validation log, hidden tests included
            logs = dest / ".task_logs"
            logs.mkdir()
            for f in sorted(task.hidden_tests.glob("*.py")):
                (logs / f.name).write_bytes(f.read_bytes())
            (logs / "fix.patch").write_text(task.reference_patch)
            (logs / "validation.log").write_text("F2P: " + " ".join(task.f2p) + "\nP2P: " + " ".join(task.p2p) + "\n")
        finally:
            shutil.rmtree(fixed, ignore_errors=True)
    if uid is not None:
        chown_tree(dest, uid)
    return dest


# ---- grading ------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class CodeGrade:
    """What the grader concluded about one submission."""

    task_id: str
    passed: bool
    reward: float
    outcomes: dict[str, str]  # test id → passed | failed | skipped | missing
    reason: str
    diff: str = ""
    restored: list[str] = dataclasses.field(default_factory=list)
    test_output: str = ""
    wall_s: float = 0.0


def run_hidden_tests(task: CodeTask, repo_dir: Path, ids: list[str], cfg: CodeEnvConfig) -> tuple[dict, str]:
    """Run hidden test ``ids`` against ``repo_dir`` with the grader's runner; return ({id: outcome}, output)."""
    work = Path(tempfile.mkdtemp(prefix="mimo-grade-"))  # root-only (0700): the result file lives here
    try:
        tests = work / "tests"
        shutil.copytree(task.hidden_tests, tests)
        os.chmod(work, 0o711)  # traversable, not listable: the sandbox reaches tests/ but not results.jsonl
        for p in [tests, *tests.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        results = work / "results.jsonl"
        fd = os.open(results, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        nonce = secrets.token_hex(16)
        try:
            r = run_sandboxed([sys.executable, "-I", "-S", str(RUNNER), str(repo_dir), str(tests), *ids],
                              cwd=repo_dir, timeout_s=cfg.grade_timeout_s, cfg=cfg.sandbox,
                              stdin=(nonce + "\n").encode(), pass_fds=(fd,),
                              env={"MIMO_RESULT_FD": str(fd)}, visible=(tests,))
        finally:
            os.close(fd)
        outcomes = {tid: "missing" for tid in ids}
        for line in results.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("nonce") == nonce and rec.get("id") in outcomes and outcomes[rec["id"]] == "missing":
                outcomes[rec["id"]] = rec.get("outcome", "failed")
        return outcomes, r.output + ("\n[timed out]" if r.timed_out else "")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def grade_patch(task: CodeTask, patch: str, cfg: CodeEnvConfig | None = None) -> CodeGrade:
    """Grade a diff: apply to a fresh copy, restore protected paths, run hidden F2P + P2P tests (Report §4.2)."""
    cfg = cfg or CodeEnvConfig()
    t0 = time.perf_counter()
    fresh = Path(tempfile.mkdtemp(prefix="mimo-fresh-"))
    try:
        _copy_tree(task.repo, fresh)
        ok, msg = apply_patch(fresh, patch)
        if not ok:
            return CodeGrade(task.id, False, 0.0, {t: "missing" for t in task.f2p + task.p2p},
                             f"patch does not apply: {msg.strip()[:300]}", patch, wall_s=time.perf_counter() - t0)
        restored = restore_protected(fresh, task.repo)
        for p in [fresh, *fresh.rglob("*")]:  # read-only for the sandbox uid: tests cannot rewrite the code
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        outcomes, output = run_hidden_tests(task, fresh, task.f2p + task.p2p, cfg)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    bad_f2p = [t for t in task.f2p if outcomes[t] != "passed"]
    bad_p2p = [t for t in task.p2p if outcomes[t] not in ("passed", "skipped")]
    passed = not bad_f2p and not bad_p2p
    reason = "all F2P pass, P2P pass or skip" if passed else "; ".join(
        [f"F2P {t}: {outcomes[t]}" for t in bad_f2p] + [f"P2P {t}: {outcomes[t]}" for t in bad_p2p])
    return CodeGrade(task.id, passed, float(passed), outcomes, reason, patch, restored, output,
                     time.perf_counter() - t0)


def grade(task: CodeTask, workspace: str | Path, cfg: CodeEnvConfig | None = None) -> CodeGrade:
    """Grade an agent's workspace: its diff against the base is what gets applied (never its files or .git)."""
    return grade_patch(task, workspace_diff(task, workspace), cfg)


# ---- validation ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Validation:
    task_id: str
    ok: bool
    reasons: list[str]
    reruns: int
    wall_s: float


def validate_task(task: CodeTask, cfg: CodeEnvConfig | None = None) -> Validation:
    """Report §4.2 supervision stability: before gold F2P fail / P2P pass, after gold all pass, over ``reruns``."""
    cfg = cfg or CodeEnvConfig()
    t0 = time.perf_counter()
    reasons: list[str] = []
    touched = [p for p in _patch_paths(task.reference_patch) if is_protected(p)]
    if touched:
        reasons.append(f"reference patch edits protected paths {touched}")
    seen: dict[str, set] = {"before": set(), "after": set()}
    for _ in range(cfg.reruns):
        for phase, patch in (("before", ""), ("after", task.reference_patch)):
            g = grade_patch(task, patch, cfg)
            seen[phase].add(tuple(sorted(g.outcomes.items())))
    for phase in ("before", "after"):
        if len(seen[phase]) > 1:
            reasons.append(f"{phase} the reference patch, results differ across {cfg.reruns} reruns (flaky)")
    before = dict(next(iter(seen["before"])))
    after = dict(next(iter(seen["after"])))
    reasons += [f"F2P {t} does not fail before the reference patch ({before[t]})" for t in task.f2p
                if before[t] not in ("failed",)]
    reasons += [f"P2P {t} does not pass before the reference patch ({before[t]})" for t in task.p2p
                if before[t] != "passed"]
    reasons += [f"{t} does not pass after the reference patch ({after[t]})" for t in task.f2p + task.p2p
                if after[t] != "passed"]
    return Validation(task.id, not reasons, reasons, cfg.reruns, time.perf_counter() - t0)


def _patch_paths(patch: str) -> list[str]:
    return sorted({m.group(1) for m in re.finditer(r"^diff --git a/(\S+) b/", patch, re.M)})


def write_task(dest: str | Path, *, task_id: str, instruction: str, base: dict[str, str], fixed: dict[str, str],
               hidden_tests: dict[str, str], f2p: list[str], p2p: list[str], package: str,
               source: str = "hand-written") -> CodeTask:
    """Write a task folder from the base repo and its fixed version (the reference patch is their diff)."""
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    for sub, files in (("repo", base), ("hidden_tests", hidden_tests)):
        for rel, text in files.items():
            p = dest / sub / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    enc = lambda files: {k: v.encode() for k, v in files.items()}  # noqa: E731
    (dest / "reference.patch").write_text(tree_diff(enc(base), enc(fixed)))
    meta = {"id": task_id, "instruction": instruction, "f2p": f2p, "p2p": p2p, "package": package, "source": source}
    (dest / "task.json").write_text(json.dumps(meta, indent=2) + "\n")
    return load_task(dest)
