"""The root grader never writes or chmods through a path the agent controls (Report §4.2; docs/sandbox.md, host
safety): file names that inject diff headers are refused, only plain edits of regular files are applied, and no
write or chmod follows a symlink."""

import os
import shutil
import stat
import threading

import pytest

from mimo_kit.envs.code import CodeEnvConfig, grade, grade_patch, make_workspace, shipped_tasks
from mimo_kit.envs.patches import (
    UnsafePatch,
    apply_patch,
    check_patch,
    chmod_tree,
    restore_protected,
    tree_diff,
    tree_files,
)
from mimo_kit.envs.tools import ToolRegistry, bash_tool
from mimo_kit.harness.envs import CodeEnv

TASKS = shipped_tasks()
TASK = next(t for t in TASKS if t.id == "stats-median")


@pytest.fixture
def canary(tmp_path):
    d = tmp_path / "host"
    d.mkdir(mode=0o700)
    p = d / "canary"
    p.write_text("secret")
    p.chmod(0o600)
    yield p
    assert p.read_text() == "secret" and stat.S_IMODE(os.lstat(p).st_mode) == 0o600, "the host file was touched"


def _newline_path(target) -> str:
    """The name that made the old diff builder emit a symlink creation (three copies of the injected headers)."""
    inj = ["new file mode 120000", "@@ -0,0 +1 @@", f"+{target}", "\\ No newline at end of file"]
    return "\n".join(["conftest.py b/conftest.py", *inj, "diff --git a/conftest.py b/conftest.py"])


def test_every_shipped_reference_patch_passes_the_check():
    for t in TASKS:
        assert check_patch(t.reference_patch), t.id


def test_newline_path_symlink_patch_through_the_trainers_path(canary):
    """The attack run as an agent would: created by the bash tool in a CodeEnv workspace, then env.grade()."""
    path = _newline_path(canary)
    cmd = f"python3 - <<'X'\nimport os\np = {path!r}\nos.makedirs(os.path.dirname(p))\nopen(p, 'w').close()\nX"
    with CodeEnv(TASK) as env:
        ToolRegistry([bash_tool(env.workspace, 20.0)]).call("bash", {"command": cmd})
        assert os.path.isfile(os.path.join(env.workspace.root, path))  # the file really exists
        g = env.grade()
    assert g["reward"] == 0.0 and "workspace refused" in g["reason"] and "'\\n'" in g["reason"], g["reason"]


def test_an_injected_patch_is_refused_before_git_sees_it(canary, tmp_path):
    """Whatever built the patch (a model can hand one to grade_patch directly), no symlink is ever created."""
    d = tmp_path / "repo"
    d.mkdir()
    legacy = (f"diff --git a/x b/x\nnew file mode 120000\n@@ -0,0 +1 @@\n+{canary}\n\\ No newline at end of file\n")
    cases = {
        legacy: "not allowed",
        "diff --git a/a b/a\nold mode 100644\nnew mode 100755\n": "not allowed",
        "diff --git a/a b/b\nrename from a\nrename to b\n": "expected 'diff --git a/PATH b/PATH'",
        "diff --git a/../../etc/x b/../../etc/x\nnew file mode 100644\n--- /dev/null\n+++ b/../../etc/x\n@@ -0,0 +1 @@"
        "\n+x\n": "'..'",
        "diff --git a/.git/config b/.git/config\nnew file mode 100644\n": "'.git'",
        "diff --git a/a b/a\nGIT binary patch\nliteral 1\n": "not allowed",
        "diff --git a/a b/a\nnew file mode 100644\n--- /dev/null\n+++ b/a\n@@ -0,0 +1 @@\n+x\n+y\n": "line 7: '\\+y'",
        "garbage first\ndiff --git a/a b/a\n": "expected 'diff --git",
        "diff --git a/a\tb b/a\tb\nnew file mode 100644\n": "'\\\\t'",
    }
    for patch, why in cases.items():
        with pytest.raises(UnsafePatch, match=why):
            check_patch(patch)
        ok, msg = apply_patch(d, patch)
        assert not ok and msg
        g = grade_patch(TASK, patch, CodeEnvConfig())
        assert g.reward == 0.0 and "patch does not apply" in g.reason
    assert os.listdir(d) == []


def test_protected_paths_are_restored_without_following_links(canary, tmp_path):
    ws = make_workspace(TASK, tmp_path / "ws")
    visible = next(ws.glob("tests/test_*.py"))
    visible.unlink()
    visible.symlink_to(canary)  # a protected file that is now a link to a host file
    (ws / "conftest.py").symlink_to(canary)
    (ws / "sitecustomize.py").write_text("x = 1\n")
    touched = restore_protected(ws, TASK.repo)
    assert set(touched) == {visible.relative_to(ws).as_posix(), "conftest.py", "sitecustomize.py"}
    assert not visible.is_symlink() and visible.read_bytes() == (TASK.repo / visible.relative_to(ws)).read_bytes()
    assert not os.path.lexists(ws / "conftest.py") and tree_files(ws) == tree_files(TASK.repo)
    # a protected folder replaced by a link: restored as a real folder, the link's target untouched
    shutil.rmtree(ws / "tests")
    (ws / "tests").symlink_to(canary.parent)
    restore_protected(ws, TASK.repo)
    assert (ws / "tests").is_dir() and not (ws / "tests").is_symlink() and os.listdir(canary.parent) == ["canary"]


def test_chmod_never_follows_a_link(canary, tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "f").write_text("x")
    chmod_tree(tmp_path / "t", 0o755, 0o640)
    assert stat.S_IMODE(os.stat(tmp_path / "t" / "f").st_mode) == 0o640
    (tmp_path / "t" / "link").symlink_to(canary)
    with pytest.raises(OSError):
        chmod_tree(tmp_path / "t")


def test_fifos_links_and_floods_in_the_workspace_never_hang_or_overwhelm_the_grader(tmp_path):
    ws = make_workspace(TASK, tmp_path / "ws")
    os.mkfifo(ws / "stats" / "pipe.py")  # reading it would block forever
    (ws / "outside").symlink_to("/etc/passwd")
    done = []
    t = threading.Thread(target=lambda: done.append(grade(TASK, ws)), daemon=True)
    t.start()
    t.join(20)
    assert done and not done[0].passed and "passwd" not in done[0].diff
    (ws / "stats" / "pipe.py").unlink()
    (ws / "big.bin").write_bytes(b"\0" * (3 << 20))
    g = grade(TASK, ws, CodeEnvConfig(max_patch_mb=1.0))
    assert not g.passed and "more than" in g.reason and "refused" in g.reason


def test_tree_diff_splits_lines_only_where_git_does(tmp_path):
    before = {"a.txt": b"x\n"}
    after = {"a.txt": b"x\rdiff --git a/evil b/evil\x0cnew file mode 120000\n\x1c@@ -0,0 +1 @@\n+y\n"}
    patch = tree_diff(before, after)
    assert check_patch(patch) == ["a.txt"]
    (tmp_path / "a.txt").write_bytes(before["a.txt"])
    ok, msg = apply_patch(tmp_path, patch)
    assert ok, msg
    assert tree_files(tmp_path) == after and os.listdir(tmp_path) == ["a.txt"]


def test_other_graders_never_read_or_write_through_a_link(canary):
    """Cyber, visual and general graders read agent files (and the general task's API mocks write its database) as
    root: a link the agent plants to a host file is refused, never followed."""
    import sqlite3

    from mimo_kit.envs import cyber, general, visual
    from mimo_kit.envs.tools import ToolError
    from mimo_kit.harness.envs import CyberEnv, GeneralEnv, VisualEnv

    def bash(env, cmd):
        return ToolRegistry([bash_tool(env.workspace, 20.0)]).call("bash", {"command": cmd})

    with CyberEnv(cyber.shipped_targets()[0]) as env:
        bash(env, f"ln -s {canary} poc.bin")
        g = env.grade()
    assert g["reward"] == 0.0 and "'poc.bin' goes through a link" in g["reason"], g
    with VisualEnv(visual.shipped_visual_tasks()[0]) as env:
        bash(env, "mkfifo drawing.txt")  # a FIFO would block a plain read forever
        g = env.grade()
    assert g["reward"] == 0.0 and "not a regular file" in g["reason"], g
    host_db = canary.parent / "host.db"
    with sqlite3.connect(host_db) as con:
        con.execute("CREATE TABLE orders (id INTEGER, status TEXT, customer_id INTEGER, address TEXT)")
        con.execute("INSERT INTO orders VALUES (1, 'pending', 1, 'x')")
    before = host_db.read_bytes()
    task = general.shipped_general_tasks()[0]
    with GeneralEnv(task) as env:
        bash(env, f"rm shop.db && ln -s {host_db} shop.db && mkdir -p notes && ln -s {canary} notes/refunds.txt")
        tools = {t.name: t for t in env.domain_tools()}
        with pytest.raises(ToolError, match="shop.db is not a regular file"):
            tools["cancel_order"].fn(order_id=1, reason="x")
        g = general.grade_general(task, env.workspace.root)
    assert not g.passed and any("shop.db unreadable" in r for r in g.reasons), g.reasons
    assert host_db.read_bytes() == before


def test_observations_name_workspace_paths_relative_to_it():
    """A traceback names the module's file; written relative to the workspace, two episodes of the same task that
    run the same command see the same tokens (the folder's random name never reaches the model)."""
    cmd = "python3 -c 'import stats, os; print(os.getcwd()); stats.median([])'"
    seen = []
    for _ in range(2):
        with CodeEnv(TASK) as env:
            out = ToolRegistry([bash_tool(env.workspace, 20.0)]).call("bash", {"command": cmd})
            assert str(env.workspace.root) not in out and "mimo-episode" not in out, out
            seen.append(out)
    assert seen[0] == seen[1], seen
    assert 'File "stats/__init__.py"' in seen[0] and seen[0].startswith(".\n"), seen[0]
