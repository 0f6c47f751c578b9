"""Tools and the tool registry of the mini-harness (Report §4.2: system prompt, tools, context management).

A :class:`Tool` is a name, a description, a JSON schema of its arguments and a function. The registry validates
arguments against the schema before calling (required keys, types, enums, unknown keys), so a malformed call
becomes an error observation naming the bad value, never an exception in the loop.

Standard tools act on the episode's :class:`Workspace`: ``bash`` (run in the sandbox as the episode's uid),
``view`` (a file with line numbers, optionally a range), ``str_replace`` (replace one unique occurrence),
``submit``. Environments add domain tools (the general tasks' API mocks).

Every argument is the agent's: a string with a NUL byte or that is not UTF-8 text, a command longer than the
kernel passes, a path through a symlink (a loop, a link into ``/proc/1/root``), a file that is not UTF-8 under
``str_replace``: each is the action's :class:`ToolError` with a reason, never an exception that would end the
episode as the infrastructure's fault. ``view`` and ``str_replace`` run as the grader (root), so they open the
file through descriptors that follow no link (:func:`open_in_workspace`, which checks the kind of file before
anything reads or writes it) and read a bounded window.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mimo_kit.envs.patches import descend
from mimo_kit.envs.sandbox import SandboxConfig, run_sandboxed

#: Bytes of a bash command (UTF-8): Linux passes it as one argument of at most 128 KiB (``MAX_ARG_STRLEN``), and a
#: real command is a few lines; a longer one is refused as the action's error.
MAX_COMMAND_BYTES = 64 * 1024
#: Bytes of a file ``view`` reads (a window from the start; ``bash`` with ``sed -n`` reaches further): a 64 MB file
#: of newlines must not become gigabytes of numbered lines in the root grader.
VIEW_MAX_BYTES = 1 << 20
#: Lines one ``view`` shows (the observation is cut to the harness's ``obs_max_chars`` after that anyway).
VIEW_MAX_LINES = 2000
#: Bytes of a file ``str_replace`` edits (the per-file limit of a workspace is larger; source files are KBs).
EDIT_MAX_BYTES = 8 << 20

_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list,
               "object": dict}


class ToolError(Exception):
    """A tool call that cannot be executed as given; the message is the feedback the model gets."""


@dataclasses.dataclass
class Tool:
    name: str
    description: str
    parameters: dict  # JSON schema: {"type": "object", "properties": {...}, "required": [...]}
    fn: Callable[..., str]
    ends_episode: bool = False


def validate_args(tool: Tool, args: dict[str, Any]) -> None:
    """Check ``args`` against the tool's JSON schema; raise ToolError naming the bad key or value."""
    props = tool.parameters.get("properties", {})
    for key in args:
        if key not in props:
            raise ToolError(f"{tool.name}: unknown argument {key!r}; arguments: {', '.join(props) or '-'}")
    for key in tool.parameters.get("required", []):
        if key not in args:
            raise ToolError(f"{tool.name}: missing required argument {key!r}; arguments: {', '.join(props) or '-'}")
    for key, value in args.items():
        spec = props[key]
        tp = _JSON_TYPES.get(spec.get("type"))
        if tp and (not isinstance(value, tp) or (spec.get("type") in ("integer", "number")
                                                 and isinstance(value, bool))):
            raise ToolError(f"{tool.name}: argument {key}={value!r}, expected {spec['type']}")
        if "enum" in spec and value not in spec["enum"]:
            raise ToolError(f"{tool.name}: argument {key}={value!r}, expected one of {spec['enum']}")
        if isinstance(value, str):
            check_text(value, f"{tool.name}: argument {key}")


def check_text(value: str, where: str) -> str:
    """Text an agent sends to a tool: no NUL byte (no path or command can hold one) and valid UTF-8 (no lone
    surrogate, which JSON's ``\\udcff`` escapes allow); else :class:`ToolError` naming it."""
    if "\x00" in value:
        raise ToolError(f"{where} contains a NUL byte at character {value.index(chr(0))}: not allowed")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ToolError(f"{where} is not valid UTF-8 text (character {e.start})") from None
    return value


def shown_name(name: str) -> str:
    """A file name as the agent may read it: undecodable bytes (lone surrogates from ``os.listdir``) replaced."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class ToolRegistry:
    def __init__(self, tools: list[Tool] = ()):
        self.tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> None:
        if tool.name in self.tools:
            raise ValueError(f"tool {tool.name!r} registered twice")
        self.tools[tool.name] = tool

    def call(self, name: str, args: dict[str, Any]) -> str:
        if name not in self.tools:
            raise ToolError(f"unknown tool {name!r}; available: {', '.join(self.tools)}")
        tool = self.tools[name]
        validate_args(tool, args)
        return tool.fn(**args)

    def __iter__(self):
        return iter(self.tools.values())


@dataclasses.dataclass
class Workspace:
    """The episode's files and the sandbox identity its commands run under."""

    root: Path
    uid: int | None
    home: Path
    sandbox: SandboxConfig
    network: bool = False
    commands: list[str] = dataclasses.field(default_factory=list)  # every bash command, for the audit

    def open(self, path: str, flags: int = os.O_RDONLY, *, kind: str = "any") -> tuple[int, os.stat_result]:
        """``(descriptor, stat)`` of a workspace path: :func:`open_in_workspace`."""
        return open_in_workspace(self.root, path, flags, kind=kind)


def open_in_workspace(root: Path, path: str, flags: int = os.O_RDONLY, *,
                      kind: str = "any") -> tuple[int, os.stat_result]:
    """Open ``root/path`` one component at a time with ``O_NOFOLLOW``: no symlink is followed below ``root`` (a
    loop, a link into ``/proc/1/root`` or out of the workspace is refused by name; ``root`` is the grader's own
    folder), ``..`` and absolute paths are refused, ``.`` or ``""`` is the workspace itself; a file made with
    ``O_CREAT`` gets mode 0644. ``kind="file"``: anything but a regular file (a folder, a FIFO, a device) is
    refused before the caller reads or writes. Returns the descriptor (the caller closes it) and its ``fstat``."""
    check_text(path, "path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or ".." in parts:
        raise ToolError(f"path {path!r} is outside the workspace: expected a path relative to it, without '..'")
    if len(parts) > 64 or len(path) > 4096:
        raise ToolError(f"path of {len(path):,} characters and {len(parts)} parts: too long")
    if not parts and (kind == "file" or flags & (os.O_WRONLY | os.O_RDWR)):
        raise ToolError(f"path {path!r} is the workspace folder: expected a file")
    fd, st = _descend(root, path, parts, flags)
    if kind == "file" and not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ToolError(f"{path!r} is not a regular file")
    return fd, st


def _descend(root: Path, path: str, parts: list[str], flags: int) -> tuple[int, os.stat_result]:
    try:
        fd = descend(root, parts, flags)
    except FileNotFoundError:
        if not root.is_dir():
            raise ToolError(f"path {path!r}: the folder it lives in is gone") from None
        raise ToolError(f"no file {path!r}") from None
    except OSError as e:  # ELOOP, ENOTDIR, EISDIR, ENAMETOOLONG, EACCES: the path itself is the problem
        raise ToolError(f"path {path!r}: {e.strerror} (links are not followed)") from None
    return fd, os.fstat(fd)


def relative_to_workspace(text: str, root: Path) -> str:
    """``text`` with the workspace's absolute path written relative to it (``/tmp/mimo-episode-x1/ws/calc/a.py`` →
    ``calc/a.py``; the folder itself → ``.``): commands run there, so the paths still work, and an observation no
    longer carries the random name of the episode's folder (a traceback would otherwise make two rollouts of the
    same actions see different tokens)."""
    for form in sorted({str(root), os.path.realpath(root)}, key=len, reverse=True):
        text = text.replace(form + "/", "").replace(form, ".")
    return text


def bytecode_env(ws: Workspace) -> dict[str, str]:
    """The bash tool's Python writes bytecode beside the sources (``__pycache__``, which no diff carries): a module
    imported (or compiled) after its last change leaves a ``.pyc`` whose header names that version's mtime and
    size, an effect of running the code that the behaviour score reads
    (:func:`mimo_kit.harness.envs.compiled_after_change`), never the words of a command. The read-only Python
    installation keeps its own bytecode."""
    return {"PYTHONDONTWRITEBYTECODE": ""}


def bash_tool(ws: Workspace, timeout_s: float) -> Tool:
    def bash(command: str) -> str:
        size = len(command.encode("utf-8"))
        if size > MAX_COMMAND_BYTES:
            raise ToolError(f"bash: a command of {size:,} bytes; at most {MAX_COMMAND_BYTES:,} "
                            "(write long content to a file in several commands)")
        ws.commands.append(command)
        r = run_sandboxed(command, ws.root, timeout_s=timeout_s, cfg=ws.sandbox, uid=ws.uid, home=ws.home,
                          network=ws.network, env=bytecode_env(ws))
        tail = f"\n[exit code {r.returncode}{', timed out' if r.timed_out else ''}]"
        return relative_to_workspace(r.output or "", ws.root) + tail

    return Tool("bash", "run a shell command in the repository (sandboxed, no network)",
                {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}, bash)


def view_tool(ws: Workspace) -> Tool:
    def view(path: str, start: int = 1, end: int = -1) -> str:
        ws.commands.append(f"view {path}")
        fd, st = ws.open(path)
        try:
            if stat.S_ISDIR(st.st_mode):
                names = sorted(os.listdir(fd))
                return "\n".join(shown_name(n) + ("/" if _is_dir(fd, n) else "") for n in names if n != ".git")
            if not stat.S_ISREG(st.st_mode):
                raise ToolError(f"view: {path!r} is not a regular file")
            with os.fdopen(fd, "rb", closefd=False) as fh:
                data = fh.read(VIEW_MAX_BYTES + 1)
        finally:
            os.close(fd)
        cut = len(data) > VIEW_MAX_BYTES
        lines = data[:VIEW_MAX_BYTES].decode("utf-8", "replace").split("\n")
        if lines[-1] == "":
            lines.pop()
        end = len(lines) if end == -1 else end
        where = f"the first {VIEW_MAX_BYTES:,} bytes of " if cut else ""
        if not 1 <= start <= max(1, end) or end > len(lines):
            raise ToolError(f"view: range [{start}, {end}] is outside 1..{len(lines)} of {where}{path!r}")
        asked = end
        end = min(end, start + VIEW_MAX_LINES - 1)
        body = "\n".join(f"{i:5d}  {line}" for i, line in enumerate(lines[start - 1:end], start))
        if cut or end < asked:
            body += (f"\n[shown: lines {start}-{end} of {where}{path} ({st.st_size:,} bytes); "
                     "view a range with start/end, or use bash]")
        return body

    return Tool("view", "show a file with line numbers (or a directory listing)",
                {"type": "object", "properties": {"path": {"type": "string"}, "start": {"type": "integer"},
                                                  "end": {"type": "integer"}}, "required": ["path"]}, view)


def edit_tool(ws: Workspace) -> Tool:
    def str_replace(path: str, old_str: str, new_str: str) -> str:
        ws.commands.append(f"str_replace {path}")
        fd, st = ws.open(path, os.O_RDWR, kind="file")
        with os.fdopen(fd, "r+b") as fh:
            if st.st_size > EDIT_MAX_BYTES:
                raise ToolError(f"str_replace: {path!r} has {st.st_size:,} bytes; it edits files up to "
                                f"{EDIT_MAX_BYTES:,}")
            try:
                text = fh.read(EDIT_MAX_BYTES + 1).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ToolError(f"str_replace: {path!r} is not UTF-8 text (byte {e.start}); edit it with bash") \
                    from None
            n = text.count(old_str)
            if n != 1:
                raise ToolError(f"str_replace: old_str occurs {n} times in {path!r}, expected exactly once")
            try:
                fh.seek(0)
                fh.write(text.replace(old_str, new_str).encode("utf-8"))
                fh.truncate()  # after the write: a full volume leaves the old text, not an empty file
            except OSError as e:  # ENOSPC on the episode's volume: the agent filled it
                raise ToolError(f"str_replace: writing {path!r} failed: {e.strerror}") from None
            if ws.uid is not None:
                os.fchown(fd, ws.uid, ws.uid)
        return f"edited {path}"

    return Tool("str_replace", "replace the unique occurrence of old_str in a file by new_str",
                {"type": "object", "properties": {"path": {"type": "string"}, "old_str": {"type": "string"},
                                                  "new_str": {"type": "string"}},
                 "required": ["path", "old_str", "new_str"]}, str_replace)


def submit_tool() -> Tool:
    return Tool("submit", "submit the workspace for grading; ends the episode",
                {"type": "object", "properties": {}, "required": []}, lambda: "submitted", ends_episode=True)


def _is_dir(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False
