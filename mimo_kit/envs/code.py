"""Code tasks: schema, clean workspaces, hardened grading, validation (Report §4.2).

A task is a folder ``data/code_tasks/<id>/`` holding ``task.json`` (instruction, F2P / P2P test ids), ``repo/``
(the base repository the agent sees), ``hidden_tests/`` and ``reference.patch``. Three operations:

- :func:`make_workspace`: a fresh copy of ``repo/`` with **one commit** of git history and no caches (Report §4.2:
  environment cleaning removes logs, patches, caches and later history). ``cleaned=False`` builds the *uncleaned*
  variant the hack suite attacks: the upstream fix commit still in ``.git``, a newer release of the package in a
  local site-packages, the validation log (with the hidden tests and the patch) left behind, the network on.
- :func:`grade`: the agent's workspace is turned into a diff against the base (file names that could inject diff
  headers are refused); the diff is checked and applied to a **fresh copy** (:mod:`mimo_kit.envs.patches`: only
  edits of regular files, nothing followed through a link); protected paths (tests, conftest, pytest and packaging
  config, sitecustomize, ``.pth``) are restored; then the hidden tests run **split across two sandboxes**: the
  judge (``_judge.py``) executes the tests and decides every outcome, the worker (``_worker.py``) imports the
  agent's code and answers the judge's calls with data. No process that imports agent code decides, prints or
  writes a verdict, and the worker never sees a hidden test. F2P must pass, P2P pass or skip; a missing test fails.
- :func:`validate_task`: before the reference patch F2P fail and P2P pass, after it all pass, identical over
  8 reruns (Report §4.2: *supervision stability*); a task that fails is rejected with the reason.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from mimo_kit.config.base import Config, knob
from mimo_kit.envs.health import describe
from mimo_kit.envs.hidden_tests import judge_tests
from mimo_kit.envs.patches import (  # noqa: F401
    IGNORED_DIRS,
    PROTECTED,
    UnsafePatch,
    apply_patch,
    check_patch,
    chmod_tree,
    is_protected,
    remove_tree,
    restore_protected,
    tree_diff,
    tree_files,
    verify_tree,
)
from mimo_kit.envs.sandbox import SandboxConfig, chown_tree

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "code_tasks"
_ID = re.compile(r"^[\w./-]+\.py::\w+(::\w+)?$")


class TaskError(ValueError):
    """A task that cannot be loaded or used; the message names the task, the bad value and what was expected."""


@dataclasses.dataclass
class CodeEnvConfig(Config):
    """Grading and validation settings of code tasks (Report §4.2)."""

    reruns: int = knob(8, "Report §4.2: a task must give identical results over 8 reruns", min=1)
    grade_timeout_s: float = knob(20.0, "hidden tests of a toy repo run in ~50 ms; 20 s bounds an agent's busy loop",
                                  min=0.1)
    max_patch_mb: float = knob(8.0, "a toy fix is a few KB; a bigger diff is junk the root grader will not apply",
                               min=0.001)
    meta_diff_kb: float = knob(32.0, "the group grader reads a group's patches in the driver: a toy fix is a few "
                               "hundred bytes; past this only the diff's hash, size and changed lines travel", min=0.0)
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


# ---- files, diffs, patches: mimo_kit.envs.patches (safe as root) ----------------------------------------------
def workspace_diff(task: CodeTask, workspace: str | Path, max_change_mb: float | None = None) -> str:
    """The agent's change as a diff against the task's base repo (the agent's own ``.git`` is never trusted).
    ``max_change_mb``: refuse a workspace holding that much more than the base (before reading it all)."""
    base = tree_files(task.repo)
    limit = None if max_change_mb is None else int(max_change_mb * 2**20) + sum(map(len, base.values()))
    return tree_diff(base, tree_files(workspace, limit))


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
#: the leaks environment cleaning removes (Report §4.2), each a way to the solution an uncleaned image leaves open:
#: the fix commit in the git history, a newer release of the package in a local site-packages, the validation log
#: (hidden tests and patch) left behind, and the network (an upstream that serves the fix)
LEAKS = ("history", "release", "logs", "network")


def leaks_of(cleaned: bool = True, leaks=None) -> frozenset[str]:
    """The leaks a workspace keeps: ``leaks`` when given (a subset of :data:`LEAKS`), else none for a cleaned one and
    every one for the uncleaned variant."""
    if leaks is None:
        return frozenset() if cleaned else frozenset(LEAKS)
    unknown = sorted(set(leaks) - set(LEAKS))
    if unknown:
        raise ValueError(f"unknown leaks {unknown}; known: {', '.join(LEAKS)}")
    return frozenset(leaks)


def make_workspace(task: CodeTask, dest: str | Path, *, cleaned: bool = True, uid: int | None = None,
                   leaks=None) -> Path:
    """Build the agent's workspace in ``dest``: the base repo with one commit and no caches (``cleaned``), or the
    uncleaned variant (Report §4.2: fix commit in history, newer release in site-packages, logs left behind).
    ``leaks``: exactly which of :data:`LEAKS` the workspace keeps (the attack/clean rounds clean one at a time;
    ``network`` is the environment's, not the workspace's)."""
    leaks = leaks_of(cleaned, leaks)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    _copy_tree(task.repo, dest)
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "Initial commit")
    if leaks & {"history", "release", "logs"}:
        fixed = Path(tempfile.mkdtemp(prefix="mimo-fixed-"))
        try:
            _copy_tree(task.repo, fixed)
            ok, msg = apply_patch(fixed, task.reference_patch)
            if not ok:
                raise TaskError(f"code task {task.id!r}: reference.patch does not apply ({msg.strip()})")
            if "history" in leaks:  # later upstream history: the fix on origin/main, reachable with `git log --all`
                _git(dest, "checkout", "-q", "-b", "upstream")
                apply_patch(dest, task.reference_patch)
                _git(dest, "commit", "-q", "-am", f"Fix {task.id} (upstream)")
                _git(dest, "update-ref", "refs/remotes/origin/main", "HEAD")
                _git(dest, "checkout", "-q", "main")
                _git(dest, "branch", "-q", "-D", "upstream")
            if "release" in leaks:  # a newer release of the package installed next to the project
                site = dest / ".venv" / "lib" / "python3" / "site-packages"
                shutil.copytree(fixed / task.package, site / task.package)
            if "logs" in leaks:  # the validation log, hidden tests included
                logs = dest / ".task_logs"
                logs.mkdir()
                for f in sorted(task.hidden_tests.glob("*.py")):
                    (logs / f.name).write_bytes(f.read_bytes())
                (logs / "fix.patch").write_text(task.reference_patch)
                (logs / "validation.log").write_text("F2P: " + " ".join(task.f2p) + "\nP2P: " + " ".join(task.p2p)
                                                     + "\n")
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
    unstable: bool = False  # independent gradings of this patch disagreed (GradeCache): scored 0, flagged


def agent_modules(task: CodeTask) -> list[str]:
    """Top-level modules of the task's base repo: what a hidden test imports from the agent's code."""
    names = {task.package}
    for p in task.repo.iterdir():
        if p.is_dir() and p.name.isidentifier() and p.name != "tests":
            names.add(p.name)
        elif p.suffix == ".py" and p.stem.isidentifier() and not is_protected(p.name):
            names.add(p.stem)
    return sorted(names)


def run_hidden_tests(task: CodeTask, repo_dir: Path, ids: list[str], cfg: CodeEnvConfig) -> tuple[dict, str]:
    """Run hidden test ``ids`` against ``repo_dir`` (:func:`mimo_kit.envs.hidden_tests.judge_tests`: the judge in
    one sandbox, the agent's code in another). Returns ({id: outcome}, the agent's prints and the judge's notes)."""
    bad = [t for t in ids if not isinstance(t, str) or not _ID.match(t)]
    if bad:
        raise TaskError(f"code task {task.id!r}: test ids {bad} are not of the form 'file.py::test_name'")
    return judge_tests(task.hidden_tests, repo_dir, ids, agent_modules(task), cfg.sandbox, cfg.grade_timeout_s)


def _failed(task: CodeTask, patch: str, reason: str, t0: float) -> CodeGrade:
    return CodeGrade(task.id, False, 0.0, {t: "missing" for t in task.f2p + task.p2p}, reason, patch,
                     wall_s=time.perf_counter() - t0)


def grade_patch(task: CodeTask, patch: str, cfg: CodeEnvConfig | None = None) -> CodeGrade:
    """Grade a diff: check and apply it to a fresh copy, restore protected paths, run hidden F2P + P2P tests."""
    cfg = cfg or CodeEnvConfig()
    t0 = time.perf_counter()
    if not isinstance(patch, str):
        raise TaskError(f"code task {task.id!r}: patch is a {type(patch).__name__}, expected a str (a unified diff)")
    if len(patch) > cfg.max_patch_mb * 2**20:
        return _failed(task, patch[:2000], f"patch of {len(patch):,} characters exceeds max_patch_mb="
                                           f"{cfg.max_patch_mb}: refused", t0)
    fresh = Path(tempfile.mkdtemp(prefix="mimo-fresh-"))
    try:
        _copy_tree(task.repo, fresh)
        try:  # everything that touches what the agent wrote: its failure is this patch's failed grade, never infra
            ok, msg = apply_patch(fresh, patch)
            if not ok:
                return _failed(task, patch, f"patch does not apply: {msg.strip()[:300]}", t0)
            verify_tree(fresh)
            restored = restore_protected(fresh, task.repo)  # a protected file replaced by a folder: refused here
            chmod_tree(fresh)  # read-only for the sandbox uid: tests cannot rewrite the code
        except UnsafePatch as e:
            return _failed(task, patch, f"patched tree refused: {e}", t0)
        except Exception as e:  # noqa: BLE001 - IsADirectoryError, a name git wrote that Python cannot, ...
            return _failed(task, patch, f"patched tree refused: {describe(e)}", t0)
        outcomes, output = run_hidden_tests(task, fresh, task.f2p + task.p2p, cfg)
    finally:
        remove_tree(fresh)
    bad_f2p = [t for t in task.f2p if outcomes[t] != "passed"]
    bad_p2p = [t for t in task.p2p if outcomes[t] not in ("passed", "skipped")]
    passed = not bad_f2p and not bad_p2p
    reason = "all F2P pass, P2P pass or skip" if passed else "; ".join(
        [f"F2P {t}: {outcomes[t]}" for t in bad_f2p] + [f"P2P {t}: {outcomes[t]}" for t in bad_p2p])
    return CodeGrade(task.id, passed, float(passed), outcomes, reason, patch, restored, output,
                     time.perf_counter() - t0)


class GradeCache:
    """Stable verdicts by (task, diff hash): a group's identical patches are graded once, and luck is never cached.

    RL groups repeat patches often (every rollout that found the one-line fix), so a verdict is worth keeping; but a
    patch can pass by chance (it picks the fix with ``os.urandom``, races a timer), and one lucky verdict cached
    would pay every later copy. Report §4.2 *supervision stability* admits a task only when its tests agree over
    ``reruns`` runs; the cache asks the same of a patch: a first pass is graded again until ``confirmations``
    independent gradings (default: the task's ``reruns``) agree, and only then returned and kept. A patch whose
    gradings disagree scores 0, is flagged (``CodeGrade.unstable``), and that verdict is kept. A failure is kept as
    it is (scoring a chance failure 0 rewards nothing). A timeout or a crashed sandbox is not a verdict: graded
    again next time.

    Entries hold the verdict, its reasons (the tests' output cut to :data:`OUTPUT_CHARS`, as a grade carries it) and
    the diff's hash, never the diff; least recently used first out past ``max_bytes``. Thread-safe (one grading
    per patch at a time); counts hits and evictions.
    """

    def __init__(self, max_bytes: int = 4 * 2**20, confirmations: int | None = None) -> None:
        if max_bytes <= 0:
            raise ValueError(f"GradeCache: max_bytes={max_bytes}; expected a positive byte budget")
        if confirmations is not None and confirmations < 1:
            raise ValueError(f"GradeCache: confirmations={confirmations}; expected at least 1 grading per pass")
        self.max_bytes, self.confirmations = max_bytes, confirmations
        self._d: collections.OrderedDict[tuple[str, str], tuple[CodeGrade, int]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._patch_locks = [threading.Lock() for _ in range(64)]  # striped: one grading of a patch at a time
        self.bytes = self.hits = self.misses = self.evictions = 0

    @staticmethod
    def key(task: CodeTask, patch: str) -> tuple[str, str]:
        return str(task.root), hashlib.sha256(patch.encode("utf-8", "surrogatepass")).hexdigest()

    def _get(self, key):
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                self._d.move_to_end(key)
            return hit

    def _put(self, key, g: CodeGrade) -> None:
        kept = dataclasses.replace(g, diff="", test_output=bounded_output(g.test_output), wall_s=0.0)  # the verdict,
        # its reasons (what a fresh grade's metadata carries too), never the diff
        size = len(json.dumps(dataclasses.asdict(kept))) + len(key[0]) + len(key[1]) + 200  # + the entry's own
        with self._lock:
            if key in self._d:
                self.bytes -= self._d.pop(key)[1]
            self._d[key] = (kept, size)
            self.bytes += size
            while self.bytes > self.max_bytes and len(self._d) > 1:
                self.bytes -= self._d.popitem(last=False)[1][1]
                self.evictions += 1

    def __len__(self) -> int:
        return len(self._d)

    def grade(self, task: CodeTask, patch: str, cfg: CodeEnvConfig) -> CodeGrade:
        key = self.key(task, patch)
        with self._patch_locks[hash(key) % len(self._patch_locks)]:
            hit = self._get(key)
            with self._lock:
                self.hits += hit is not None
                self.misses += hit is None
            if hit is not None:
                return dataclasses.replace(hit[0], diff=patch)
            g = grade_patch(task, patch, cfg)
            if not _definite(g):  # a timeout or a crash may not recur: not a verdict
                return g
            if g.passed:
                g = self._confirm(task, patch, cfg, g)
            self._put(key, g)
            return g

    def _confirm(self, task: CodeTask, patch: str, cfg: CodeEnvConfig, first: CodeGrade) -> CodeGrade:
        """Grade a first pass again until ``confirmations`` gradings agree; any disagreement: 0, flagged."""
        n = self.confirmations or cfg.reruns
        passes, t_total = 1, first.wall_s
        for _ in range(n - 1):
            g = grade_patch(task, patch, cfg)
            t_total += g.wall_s
            if not _definite(g):  # the sandbox failed, not the patch: the pass stands unconfirmed, not cached
                return dataclasses.replace(first, wall_s=t_total)
            if not g.passed:
                return dataclasses.replace(
                    g, passed=False, reward=0.0, unstable=True, wall_s=t_total,
                    reason=f"unstable verdict: {passes} of {passes + 1} gradings passed ({g.reason}); a patch "
                           f"whose gradings disagree scores 0")
            passes += 1
        return dataclasses.replace(first, wall_s=t_total)


#: How much of the tests' output a grade keeps: its head (the agent's prints) and its tail (the judge's notes on
#: failures); the agent can print megabytes, and each grade travels with its rollout and sits in the cache.
OUTPUT_CHARS = 4000


def bounded_output(text: str, limit: int = OUTPUT_CHARS) -> str:
    """``text`` when it fits, else its head and tail around a line that says how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}\n[... {len(text) - limit:,} characters cut ...]\n{text[-limit // 2:]}"


def _definite(g: CodeGrade) -> bool:
    """Every test passed, failed or skipped (no test missing because the sandbox or the judge gave out)."""
    return all(o in ("passed", "failed", "skipped") for o in g.outcomes.values())


def diff_summary(diff: str, cfg: CodeEnvConfig) -> dict:
    """What of a diff travels with a rollout's grade: its hash, size and changed lines always; its text only up to
    ``meta_diff_kb`` (a cut diff says so), so no rollout carries megabytes of patch into the driver."""
    limit = int(cfg.meta_diff_kb * 1024)
    changed = sum(1 for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---"))
    data = diff.encode("utf-8", "surrogatepass")
    return {"diff": diff if len(data) <= limit else data[:limit].decode("utf-8", "ignore") + "\n# (diff cut)\n",
            "diff_sha256": hashlib.sha256(data).hexdigest(), "diff_bytes": len(data), "changed_lines": changed}


def grade(task: CodeTask, workspace: str | Path, cfg: CodeEnvConfig | None = None,
          cache: GradeCache | None = None) -> CodeGrade:
    """Grade an agent's workspace: its diff against the base is what gets applied (never its files or .git).
    A file name that could inject diff headers fails the grade, naming the file."""
    t0 = time.perf_counter()
    cfg = cfg or CodeEnvConfig()
    try:
        diff = workspace_diff(task, workspace, cfg.max_patch_mb)
    except UnsafePatch as e:
        return _failed(task, "", f"workspace refused: {e}", t0)
    except (OSError, ValueError) as e:  # a tree the agent made unreadable in a way no check names: its failure
        return _failed(task, "", f"workspace refused: {describe(e)}", t0)
    return cache.grade(task, diff, cfg) if cache is not None else grade_patch(task, diff, cfg)


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
