"""Code tasks (Report §4.2): schema errors, clean workspaces, hardened grading, validation, the mutation generator."""

import json
import random
import shutil
import subprocess

import pytest

from mimo_kit.envs.code import (
    CodeEnvConfig,
    TaskError,
    apply_patch,
    grade,
    grade_patch,
    load_task,
    make_workspace,
    restore_protected,
    shipped_tasks,
    tree_diff,
    tree_files,
    validate_task,
    write_task,
)
from mimo_kit.envs.mutate import SEEDS_DIR, apply_mutation, find_mutations, generate_tasks

TASKS = shipped_tasks()


def test_at_least_six_tasks_ship():
    assert len(TASKS) >= 6 and len({t.id for t in TASKS}) == len(TASKS)
    assert sum(t.source == "hand-written" for t in TASKS) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS, ids=[t.id for t in TASKS])
def test_every_shipped_task_passes_validation_over_8_reruns(task):
    v = validate_task(task)
    assert v.reruns == 8 and v.ok, v.reasons


def _copy_task(tmp_path, task):
    dest = tmp_path / task.id
    shutil.copytree(task.root, dest)
    return dest


def test_schema_errors_name_the_bad_value(tmp_path):
    root = _copy_task(tmp_path, TASKS[0])
    meta = json.loads((root / "task.json").read_text())
    cases = [({**meta, "f2p": []}, "f2p is empty"), ({**meta, "f2p": ["nope"]}, "'nope' is not of the form"),
             ({**meta, "f2p": ["missing.py::test_x"]}, "missing from hidden_tests"),
             ({**meta, "instruction": 3}, "instruction=3, expected a str"),
             ({**meta, "extra": 1}, "unknown keys \\['extra'\\]"),
             ({k: v for k, v in meta.items() if k != "package"}, "missing key 'package'"),
             ({**meta, "package": "nopkg"}, "package='nopkg' is not a folder")]
    for data, msg in cases:
        (root / "task.json").write_text(json.dumps(data))
        with pytest.raises(TaskError, match=msg):
            load_task(root)
    (root / "task.json").write_text("{not json")
    with pytest.raises(TaskError, match="not valid JSON"):
        load_task(root)


def test_tree_diff_round_trips_through_git_apply(tmp_path):
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "", "delta"]
    for trial in range(20):
        before = {f"f{i}.txt": "\n".join(rng.choice(words) for _ in range(rng.randrange(0, 8))).encode()
                  for i in range(3)}
        after = dict(before)
        after["f0.txt"] = before["f0.txt"] + (b"\nnew" if trial % 2 else b"")  # no trailing newline either way
        after.pop("f1.txt")
        after["sub/new.txt"] = b"x\ny\n"
        root = tmp_path / f"t{trial}"
        for rel, data in before.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        ok, msg = apply_patch(root, tree_diff(before, after))
        assert ok, msg
        assert tree_files(root) == after


def test_clean_workspace_has_one_commit_and_no_caches(tmp_path):
    task = TASKS[0]
    (task.repo / "__pycache__").mkdir(exist_ok=True)
    try:
        ws = make_workspace(task, tmp_path / "ws")
    finally:
        shutil.rmtree(task.repo / "__pycache__")
    log = subprocess.run(["git", "log", "--all", "--oneline"], cwd=ws, capture_output=True, text=True).stdout
    assert len(log.splitlines()) == 1
    assert not list(ws.rglob("__pycache__")) and not (ws / ".task_logs").exists() and not (ws / ".venv").exists()
    assert tree_files(ws) == tree_files(task.repo)
    dirty = make_workspace(task, tmp_path / "dirty", cleaned=False)
    log = subprocess.run(["git", "log", "--all", "--oneline"], cwd=dirty, capture_output=True, text=True).stdout
    assert len(log.splitlines()) == 2 and (dirty / ".task_logs").is_dir()


def test_reference_passes_base_fails_and_a_missing_test_fails(tmp_path):
    task = TASKS[0]
    good = grade_patch(task, task.reference_patch)
    assert good.passed and good.reward == 1.0 and set(good.outcomes.values()) == {"passed"}
    bad = grade_patch(task, "")
    assert not bad.passed and all(bad.outcomes[t] == "failed" for t in task.f2p)
    # a test the hidden file does not define counts as a failure, not as "not run"
    root = _copy_task(tmp_path, task)
    meta = json.loads((root / "task.json").read_text())
    meta["p2p"] = meta["p2p"] + [meta["p2p"][0].split("::")[0] + "::test_does_not_exist"]
    (root / "task.json").write_text(json.dumps(meta))
    g = grade_patch(load_task(root), task.reference_patch)
    assert not g.passed and "test_does_not_exist: failed" in g.reason


def test_grading_applies_the_workspace_diff_and_ignores_its_git(tmp_path):
    task = TASKS[0]
    ws = make_workspace(task, tmp_path / "ws")
    assert apply_patch(ws, task.reference_patch)[0]
    shutil.rmtree(ws / ".git")  # an agent may wreck its git; the grader never reads it
    assert grade(task, ws).passed


def test_protected_paths_are_restored(tmp_path):
    task = TASKS[0]
    ws = make_workspace(task, tmp_path / "ws")
    (ws / "conftest.py").write_text("x = 1\n")
    (ws / "sitecustomize.py").write_text("x = 1\n")
    (ws / "pkg.pth").write_text("import os\n")
    visible = next(ws.glob("tests/test_*.py"))
    visible.write_text("def test_nothing():\n    pass\n")
    touched = restore_protected(ws, task.repo)
    assert set(touched) == {"conftest.py", "sitecustomize.py", "pkg.pth", visible.relative_to(ws).as_posix()}
    assert tree_files(ws) == tree_files(task.repo)


@pytest.mark.slow
def test_validation_rejects_broken_tasks_with_reasons(tmp_path):
    task = TASKS[0]
    files = {p.relative_to(task.repo).as_posix(): p.read_text() for p in task.repo.rglob("*.py")}
    hidden = {p.name: p.read_text() for p in task.hidden_tests.glob("*.py")}
    # the "fix" changes nothing: F2P passes neither before nor after
    t = write_task(tmp_path / "noop", task_id="noop", instruction="x", base=files, fixed=files, hidden_tests=hidden,
                   f2p=task.f2p, p2p=task.p2p, package=task.package)
    v = validate_task(t, CodeEnvConfig(reruns=2))
    assert not v.ok and any("does not pass after" in r for r in v.reasons)
    # a flaky test: passes on every other run (state kept in a file next to the hidden tests is not writable, so
    # flakiness comes from the clock)
    flaky = {"test_flaky.py": "import time\n\ndef test_f():\n    assert int(time.time() * 1000) % 2 == 0\n\n"
                              "def test_p():\n    pass\n"}
    t = write_task(tmp_path / "flaky", task_id="flaky", instruction="x", base=files, fixed=files,
                   hidden_tests=flaky, f2p=["test_flaky.py::test_f"], p2p=["test_flaky.py::test_p"],
                   package=task.package)
    v = validate_task(t, CodeEnvConfig(reruns=8))
    assert not v.ok and any("differ across 8 reruns" in r for r in v.reasons)


def test_mutations_cover_the_three_operators():
    src = "def f(a, b):\n    if a < b:\n        return g(a, b) + 1\n    return a and b\n"
    kinds = {m.kind for m in find_mutations(src, "m.py")}
    assert kinds == {"operator-flip", "off-by-one", "swap-args"}
    muts = {(m.kind, m.before): apply_mutation(src, m) for m in find_mutations(src, "m.py")}
    assert "if a <= b:" in muts[("operator-flip", "a < b")]
    assert "return g(b, a) + 1" in muts[("swap-args", "g(a, b)")]
    assert "return g(a, b) + 2" in muts[("off-by-one", "1")]


@pytest.mark.slow
def test_generator_makes_validated_tasks_and_rejects_uncaught_mutants(tmp_path):
    out = generate_tasks(SEEDS_DIR / "gridkit", tmp_path, package="gridkit", limit=3, cfg=CodeEnvConfig(reruns=2))
    kept = [g for g in out if g.task is not None]
    assert len(kept) == 3 and all(g.validation.ok for g in kept)
    for g in kept:
        assert grade_patch(g.task, g.task.reference_patch).passed and not grade_patch(g.task, "").passed
    rejected = [g for g in generate_tasks(SEEDS_DIR / "gridkit", tmp_path / "all", package="gridkit", limit=100,
                                          cfg=CodeEnvConfig(reruns=1)) if g.task is None]
    assert rejected and all("no test catches" in g.reason for g in rejected)
