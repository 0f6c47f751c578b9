"""Hostile file names, trees and tool input (Report §4.2): a failed action or a failed grade, never a crash.

Every case runs the way the trainer runs an episode: a harness (``run_episode``: the rollout driver, the action
format's parser, the tool registry) in a ``CodeEnv``, then the environment's own ``grade``. Whatever the agent does,
the episode ends as the model's doing (``finish_reason`` is not ``infra_error``, so the trainer scores it instead of
dropping it), the batch is kept, and the grader leaves nothing on the host.
"""

import glob
import os
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_kit.envs import seccomp
from mimo_kit.envs.code import CodeEnvConfig, grade_patch, shipped_tasks
from mimo_kit.envs.patches import MAX_PATH_DEPTH, MAX_TREE_FILES, remove_tree, walk
from mimo_kit.envs.sandbox import SandboxConfig
from mimo_kit.envs.tools import VIEW_MAX_LINES, ToolError, ToolRegistry, Workspace, bash_tool, edit_tool, view_tool
from mimo_kit.harness import HARNESSES, ScriptedPolicy, run_episode
from mimo_kit.harness.envs import CodeEnv
from mimo_kit.harness.formats import FORMATS, FormatError, render_call
from mimo_kit.infra.rollout import Outcome, Turn, play
from mimo_kit.rl.trajectory import Segment

TASK = next(t for t in shipped_tasks() if t.id == "stats-median")
PY = "python3 -c \"{}\""

#: Tool calls that crashed a tool (the episode ended as an infrastructure error, so the trainer dropped it).
TOOL_INPUT = {
    "nul-in-command": [("bash", {"command": "echo a\x00b"})],
    "nul-in-path": [("view", {"path": "stats/\x00x"})],
    "surrogate-in-path": [("view", {"path": "stats/\udcff"})],
    "non-utf8-file-under-str_replace": [("bash", {"command": "printf 'a\\377b' > f.txt"}),
                                        ("str_replace", {"path": "f.txt", "old_str": "a", "new_str": "c"})],
    "symlink-loop-under-view": [("bash", {"command": "ln -s l1 l2; ln -s l2 l1"}), ("view", {"path": "l1"})],
    "link-into-proc-1-root": [("bash", {"command": "ln -s /proc/1/root pr"}), ("view", {"path": "pr/etc/passwd"})],
    "link-out-under-str_replace": [("bash", {"command": "ln -s /etc/passwd pw"}),
                                   ("str_replace", {"path": "pw", "old_str": "root", "new_str": "toor"})],
    "command-over-128-kib": [("bash", {"command": "true " + "x" * 140_000})],
    "view-a-fifo": [("bash", {"command": "mkfifo p"}), ("view", {"path": "p"})],
    "str_replace-a-fifo": [("bash", {"command": "mkfifo p"}),
                           ("str_replace", {"path": "p", "old_str": "a", "new_str": "b"})],
    "str_replace-the-workspace": [("str_replace", {"path": ".", "old_str": "a", "new_str": "b"}),
                                  ("str_replace", {"path": "", "old_str": "a", "new_str": "b"})],
    "command-over-128-kib-in-bytes": [("bash", {"command": "true " + "\u20ac" * 45_000})],
    "dotdot": [("view", {"path": "../../etc/passwd"})],
}
#: Replies no parser could read (each crashed play() itself in its format: the whole batch was lost).
UNREADABLE = {
    "brackets-openai": ("swe-tools", "[" * 3000),
    "brackets-fenced": ("mini-bash", "```tool view\n" + "[" * 3000 + "\n```"),
    "brackets-xml": ("xml-editor", '<tool name="view"><arg name="path">' + "[" * 3000 + "</arg></tool>"),
    "bigint-openai": ("swe-tools", '{"tool_calls": [{"function": {"name": "bash", "arguments": ' + "1" * 5000
                      + "}}]}"),
    "bigint-fenced": ("mini-bash", "```tool view\n" + "1" * 5000 + "\n```"),
    "bigint-xml": ("xml-editor", '<tool name="view"><arg name="path">a</arg><arg name="start">' + "1" * 5000
                   + "</arg></tool>"),
}


@pytest.fixture(autouse=True)
def host_tmp(tmp_path, monkeypatch):
    """This test's own temp folder for everything the grader makes (episode volumes, grading folders, stages):
    what is left there after the test is litter, whatever other tests run beside it."""
    private = tmp_path / "host-tmp"
    private.mkdir()
    private.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    return private


def _litter() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "mimo-*")))


def _episode(harness: str, replies: list[str]) -> tuple:
    with CodeEnv(TASK) as env:
        seq = run_episode(ScriptedPolicy(replies + [render_call(HARNESSES[harness].action_format, "submit", {})]),
                          env, harness).sequences[0]
        return seq, env.grade()


@pytest.mark.parametrize("name", list(TOOL_INPUT))
def test_hostile_tool_input_is_the_actions_error(name):
    fmt = HARNESSES["swe-tools"].action_format
    before = _litter()
    seq, g = _episode("swe-tools", [render_call(fmt, n, a) for n, a in TOOL_INPUT[name]])
    assert seq.finish_reason == "stop", (seq.finish_reason, seq.metadata.get("infra_error"))
    tool_texts = [s.text for c in seq.contexts for s in c.segments if s.role == "tool" and s.text]
    assert any("Tool error" in t for t in tool_texts), tool_texts
    assert g["reward"] == 0.0 and _litter() == before
    assert Path("/etc/passwd").read_text().startswith("root:")  # nothing written through a link


@pytest.mark.parametrize("name", list(UNREADABLE))
def test_unreadable_replies_are_format_errors(name):
    harness, reply = UNREADABLE[name]
    seq, _ = _episode(harness, [reply])
    assert seq.finish_reason == "stop"
    errors = [k for c in seq.contexts for s in c.segments for (_, _, k) in s.errors]
    assert errors and set(errors) <= {"format", "tool_arguments"}, errors


#: Trees no real repository has: each made grade() raise (UnicodeEncodeError, RecursionError) or took seconds.
TREES = {
    "non-utf8-name": PY.format("open(b'x\\\\xff', 'w').close()"),
    "nested-1100-folders": PY.format("import os\nfor i in range(1100):\n    os.mkdir('d'); os.chdir('d')"),
    "many-files": PY.format(f"for i in range({MAX_TREE_FILES + 100}):\n    open('f%d' % i, 'w').close()"),
    "long-name": PY.format("import os\nos.makedirs('/'.join(['b' * 200] * 6))"),
}


@pytest.mark.parametrize("name", list(TREES))
def test_hostile_trees_fail_the_grade_with_a_reason(name):
    before = _litter()
    seq, g = _episode("swe-tools", [render_call("openai", "bash", {"command": TREES[name]}),
                                    render_call("openai", "view", {"path": "."})])
    assert seq.finish_reason == "stop"
    assert g["reward"] == 0.0 and g["reason"].startswith("workspace refused:"), g["reason"]
    assert _litter() == before


@pytest.mark.parametrize("path", ["x\udcff.py", "/".join(["d"] * 1100) + "/x.py", "a" * 5000 + ".py"])
def test_grade_patch_refuses_hostile_paths_by_name(path):
    patch = f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x\n"
    before = _litter()
    g = grade_patch(TASK, patch, CodeEnvConfig(grade_timeout_s=8.0))
    assert not g.passed and "patch does not apply" in g.reason, g.reason
    assert any(w in g.reason for w in ("not valid UTF-8", "levels deep", "characters")), g.reason
    assert _litter() == before


def test_the_volume_caps_files_with_a_clear_error():
    cfg = CodeEnvConfig(sandbox=SandboxConfig(max_files=300))
    with CodeEnv(TASK, cfg=cfg) as env:
        seq = run_episode(ScriptedPolicy([render_call("openai", "bash", {"command": PY.format(
            "import os\nfor i in range(2000):\n    open('f%d' % i, 'w').close()")}),
            render_call("openai", "submit", {})]), env, "swe-tools").sequences[0]
        made = len(os.listdir(env.workspace.root))
        tool_text = next(s.text for c in seq.contexts for s in c.segments if s.role == "tool")
        if not env.volume.mounted:
            pytest.skip("no tmpfs episode volume on this machine (not root)")
    assert made < 300 and "No space left on device" in tool_text, (made, tool_text[-300:])


def test_view_reads_a_bounded_window(tmp_path):
    """A file of 4 MB of newlines: view shows at most VIEW_MAX_LINES lines and allocates a few MB, not 400."""
    (tmp_path / "nl.txt").write_bytes(b"\n" * (4 << 20))
    ws = Workspace(tmp_path, None, tmp_path, SandboxConfig())
    tools = ToolRegistry([view_tool(ws)])
    tracemalloc.start()
    out = tools.call("view", {"path": "nl.txt"})
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert out.count("\n") <= VIEW_MAX_LINES + 1 and "[shown: lines 1-2000 of the first" in out
    assert peak < 40 << 20, peak
    with pytest.raises(ToolError, match="outside"):
        tools.call("view", {"path": "nl.txt", "start": 3_000_000, "end": 3_000_001})


def test_tools_leak_no_descriptor(tmp_path):
    """Refused calls close what they opened (a root trainer runs for days: a leak per call ends in EMFILE)."""
    (tmp_path / "a.py").write_text("x = 1\n")
    os.mkfifo(tmp_path / "p")
    ws = Workspace(tmp_path, None, tmp_path, SandboxConfig())
    tools = ToolRegistry([view_tool(ws), edit_tool(ws)])
    before = len(os.listdir("/proc/self/fd"))
    for name, args in [("str_replace", {"path": ".", "old_str": "a", "new_str": "b"}),
                       ("str_replace", {"path": "p", "old_str": "a", "new_str": "b"}),
                       ("view", {"path": "p"}), ("view", {"path": "nope/x"}), ("view", {"path": "a.py/x"})] * 20:
        with pytest.raises(ToolError):
            tools.call(name, args)
    assert len(os.listdir("/proc/self/fd")) == before


def test_notes_through_a_link_reach_nothing_outside(tmp_path):
    """The general env's note tools run as the grader: notes/ replaced by a link to a host folder is refused."""
    from mimo_kit.envs.general import shop_tools

    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("s3cret")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes").symlink_to(host)
    import sqlite3

    sqlite3.connect(ws / "shop.db").close()
    tools = ToolRegistry([t for t in shop_tools(ws) if t.name in ("read_note", "write_note")])
    with pytest.raises(ToolError):
        tools.call("read_note", {"path": "secret"})
    with pytest.raises(ToolError):
        tools.call("write_note", {"path": "planted", "content": "x"})
    assert sorted(os.listdir(host)) == ["secret"]
    (ws / "notes").unlink()  # gone entirely: still the action's error
    with pytest.raises(ToolError):
        tools.call("read_note", {"path": "secret"})


def test_remove_tree_removes_wide_trees_and_leaves_links_alone(tmp_path):
    wide = tmp_path / "wide"
    for i in range(3000):
        (wide / f"d{i}" / "x").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("k")
    (wide / "d7" / "link").symlink_to(outside)
    remove_tree(wide)
    assert not wide.exists() and (outside / "keep").read_text() == "k"


def test_walk_and_remove_tree_need_no_recursion(tmp_path):
    """4,000 nested folders (past the recursion limit, and deeper than PATH_MAX allows as one path): walk refuses
    past MAX_PATH_DEPTH, remove_tree removes all of it; a tree MAX_PATH_DEPTH deep is walked whole."""
    deep = tmp_path / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(4000):
        os.mkdir("dd", dir_fd=fd)
        nxt = os.open("dd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    try:
        with pytest.raises(Exception, match=f"more than {MAX_PATH_DEPTH} folders deep"):
            list(walk(deep))
        small = tmp_path / "small"
        os.makedirs(small / "/".join(["s"] * MAX_PATH_DEPTH))
        assert [len(dirs) for _, dirs, _ in walk(small)] == [1] * MAX_PATH_DEPTH + [0]
    finally:
        remove_tree(deep)  # pytest's own clean-up of old temp folders recurses (shutil.rmtree)
    assert not deep.exists()


# ---- one episode's failure is that episode's: the batch is kept ---------------------------------------------------
class _Episode:
    def __init__(self, crash_in: str | None):
        self.crash_in = crash_in

    def prompt(self):
        return [Segment("user", [1, 2, 3])]

    def act(self, action, finish_reason):
        if self.crash_in == "act":
            raise RecursionError("maximum recursion depth exceeded")
        return Turn(done=True)

    def outcome(self):
        if self.crash_in == "outcome":
            raise UnicodeEncodeError("utf-8", "x\udcff", 1, 2, "surrogates not allowed")
        return Outcome(1.0, True)


class _Engine:
    def generate(self, requests):
        from mimo_kit.infra.engine import GenerationOutput

        return [GenerationOutput(r.request_id, [7], [-0.1], "stop", 0) for r in requests]


def test_a_crashing_episode_ends_as_infra_error_and_the_batch_is_kept():
    from mimo_kit.infra.rollout import RolloutSettings

    samples = play(_Engine(), [("g", [_Episode(None), _Episode("act"), _Episode("outcome")])],
                   RolloutSettings(max_turns=2, max_action_tokens=4, stop_token_ids=(7,)))
    seqs = samples[0].sequences
    assert [q.finish_reason for q in seqs] == ["stop", "infra_error", "infra_error"]
    assert seqs[0].passed and "RecursionError" in seqs[1].metadata["infra_error"]
    assert "UnicodeEncodeError" in seqs[2].metadata["infra_error"]


# ---- properties: random bytes, deep nesting and huge numbers through the parsers and the tools ------------------
_TEXT = st.one_of(
    st.text(max_size=300),
    st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.integers(1, 4000).map(lambda n: "[" * n),
    st.integers(1, 6000).map(lambda n: "9" * n),
    st.sampled_from(["{", "<tool", "```tool", "```bash\n", '<arg name="x">', '{"tool_calls": ']),
)
_REPLY = st.lists(_TEXT, min_size=1, max_size=4).map("".join)


@settings(max_examples=150, deadline=None)
@given(fmt=st.sampled_from(sorted(FORMATS)), reply=_REPLY)
def test_every_parser_returns_calls_or_a_format_error(fmt, reply):
    try:
        calls = FORMATS[fmt]().parse(reply)
    except FormatError:
        return
    assert all(isinstance(c.name, str) and isinstance(c.arguments, dict) for c in calls)


_ARG = st.one_of(_TEXT, st.integers(-10**6, 10**6), st.booleans(), st.none(), st.lists(st.integers(), max_size=3))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["view", "str_replace", "nope"]),
       args=st.dictionaries(st.sampled_from(["path", "old_str", "new_str", "start", "end", "x"]), _ARG, max_size=4))
def test_root_side_tools_fail_only_with_tool_errors(tmp_path, name, args):
    """view and str_replace run as the grader: random arguments give an observation or a ToolError, and nothing
    outside the workspace changes (a canary beside it)."""
    ws_root = tmp_path / "ws"
    ws_root.mkdir(exist_ok=True)
    (ws_root / "a.py").write_text("x = 1\n")
    canary = tmp_path / "canary"
    canary.write_text("keep")
    if not (ws_root / "up").is_symlink():
        (ws_root / "up").symlink_to(tmp_path)
    ws = Workspace(ws_root, None, tmp_path, SandboxConfig())
    tools = ToolRegistry([view_tool(ws), edit_tool(ws)])
    try:
        out = tools.call(name, args)
        assert isinstance(out, str)
        out.encode("utf-8")  # what the model reads is text
    except ToolError:
        pass
    assert canary.read_text() == "keep"


# ---- kernel keyrings: no channel between episodes (the seccomp layer) ------------------------------------------
def _bpf_run(code: bytes, arch: int, nr: int) -> int:
    """A classic-BPF interpreter for the four instructions the filter uses, over ``struct seccomp_data``."""
    import struct

    insns = [struct.unpack("HBBI", code[i:i + 8]) for i in range(0, len(code), 8)]
    data = {0: nr & 0xFFFFFFFF, 4: arch}
    pc = acc = 0
    while True:
        op, jt, jf, k = insns[pc]
        if op == 0x20:
            acc = data[k]
        elif op == 0x15:
            pc += jt if acc == k else jf
        elif op == 0x35:
            pc += jt if acc >= k else jf
        elif op == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected BPF opcode {op:#x}")
        pc += 1


@settings(max_examples=300, deadline=None)
@given(machine=st.sampled_from(sorted(seccomp.ARCHES)), nr=st.integers(0, 0x4FFFFFFF))
def test_the_seccomp_program_denies_exactly_its_list(machine, nr):
    arch, numbers = seccomp.ARCHES[machine]
    code = seccomp.program(machine)
    deny = seccomp.SECCOMP_RET_ERRNO | seccomp.EPERM
    x32 = machine == "x86_64" and nr >= seccomp.X32_SYSCALL_BIT
    want = deny if x32 or nr in set(numbers.values()) else seccomp.SECCOMP_RET_ALLOW
    assert _bpf_run(code, arch, nr) == want
    for name in seccomp.DENIED:
        assert _bpf_run(code, arch, numbers[name]) == deny
    assert _bpf_run(code, 0x40000003, 0) == deny  # another ABI (i386) is never allowed through


KEY_SCRIPT = """import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = {nr}
key = libc.syscall(nr["add_key"], b"user", b"{marker}", b"the hidden inputs", 17, ctypes.c_int(-4))
print("add_key", key, ctypes.get_errno())
if key > 0:
    libc.syscall(nr["keyctl"], 5, key, 0x3f3f3f3f)  # KEYCTL_SETPERM: everyone may view and read
print("x32 keyctl", libc.syscall(0x40000000 + nr["keyctl"], 0, -4, 0), ctypes.get_errno())
"""


def test_kernel_keyrings_are_no_channel_between_episodes():
    from mimo_kit.envs.isolation import capabilities

    if not capabilities().seccomp:
        pytest.skip("no seccomp filter on this machine (see mimo-kit env-check)")
    marker = f"mimo-leak-{os.getpid()}"
    numbers = seccomp.ARCHES[seccomp.platform.machine()][1]
    script = KEY_SCRIPT.format(nr={k: numbers[k] for k in ("add_key", "keyctl")}, marker=marker)
    with CodeEnv(TASK) as first:
        (first.workspace.root / "k.py").write_text(script)
        wrote = ToolRegistry([bash_tool(first.workspace, 20.0)]).call("bash", {"command": "python3 k.py"})
    with CodeEnv(TASK) as later:  # another episode, another uid
        listing = ToolRegistry([bash_tool(later.workspace, 20.0)]).call("bash", {"command": "cat /proc/keys"})
    assert "add_key -1 1" in wrote and "x32 keyctl -1 1" in wrote, wrote
    assert marker not in listing and marker not in Path("/proc/keys").read_text()


def _render(fmt: str, name: str, args: dict) -> str:
    try:
        return render_call(fmt, name, args)
    except (KeyError, TypeError):  # the fenced bash block needs a command: a malformed call then
        return f"```tool {name}\n{args!r}\n```"


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(harness=st.sampled_from(["swe-tools", "xml-editor", "mini-bash"]),
       replies=st.lists(st.one_of(_REPLY, st.builds(
           lambda n, a: (n, a), st.sampled_from(["view", "str_replace", "bash"]),
           st.dictionaries(st.sampled_from(["path", "old_str", "new_str", "start", "command"]), _ARG, max_size=3))),
           min_size=1, max_size=3))
def test_random_actions_through_a_whole_episode_never_escape_it(host_tmp, harness, replies):
    """Random replies (raw text, or well-formed calls with random arguments) through a harness episode: the episode
    ends as the model's doing, the grade is a verdict, the host keeps no litter."""
    fmt = HARNESSES[harness].action_format
    texts = [r if isinstance(r, str) else _render(fmt, *r) for r in replies]
    before = _litter()
    seq, g = _episode(harness, texts)
    assert seq.finish_reason in ("stop", "length", "format_errors"), (seq.finish_reason, seq.metadata)
    assert g["reward"] in (0.0, 1.0) and _litter() == before
