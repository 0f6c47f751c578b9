"""Tools and the tool registry of the mini-harness (Report §4.2: system prompt, tools, context management).

A :class:`Tool` is a name, a description, a JSON schema of its arguments and a function. The registry validates
arguments against the schema before calling (required keys, types, enums, unknown keys), so a malformed call
becomes an error observation naming the bad value, never an exception in the loop.

Standard tools act on the episode's :class:`Workspace`: ``bash`` (run in the sandbox as the episode's uid),
``view`` (a file with line numbers, optionally a range), ``str_replace`` (replace one unique occurrence),
``submit``. Environments add domain tools (the general tasks' API mocks).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mimo_kit.envs.sandbox import SandboxConfig, run_sandboxed

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

    def resolve(self, path: str) -> Path:
        """A workspace path; anything resolving outside (``..``, absolute, symlinks) is refused by name."""
        p = (self.root / path).resolve()
        if p != self.root.resolve() and self.root.resolve() not in p.parents:
            raise ToolError(f"path {path!r} is outside the workspace")
        return p


def bash_tool(ws: Workspace, timeout_s: float) -> Tool:
    def bash(command: str) -> str:
        ws.commands.append(command)
        r = run_sandboxed(command, ws.root, timeout_s=timeout_s, cfg=ws.sandbox, uid=ws.uid, home=ws.home,
                          network=ws.network)
        tail = f"\n[exit code {r.returncode}{', timed out' if r.timed_out else ''}]"
        return (r.output or "") + tail

    return Tool("bash", "run a shell command in the repository (sandboxed, no network)",
                {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}, bash)


def view_tool(ws: Workspace) -> Tool:
    def view(path: str, start: int = 1, end: int = -1) -> str:
        p = ws.resolve(path)
        ws.commands.append(f"view {path}")
        if p.is_dir():
            return "\n".join(sorted(e.name + ("/" if e.is_dir() else "") for e in p.iterdir()
                                    if e.name != ".git"))
        if not p.is_file():
            raise ToolError(f"view: no file {path!r}")
        lines = p.read_text(errors="replace").splitlines()
        end = len(lines) if end == -1 else end
        if not 1 <= start <= max(1, end) or end > len(lines):
            raise ToolError(f"view: range [{start}, {end}] is outside 1..{len(lines)} of {path!r}")
        return "\n".join(f"{i:5d}  {line}" for i, line in enumerate(lines[start - 1:end], start))

    return Tool("view", "show a file with line numbers (or a directory listing)",
                {"type": "object", "properties": {"path": {"type": "string"}, "start": {"type": "integer"},
                                                  "end": {"type": "integer"}}, "required": ["path"]}, view)


def edit_tool(ws: Workspace) -> Tool:
    def str_replace(path: str, old_str: str, new_str: str) -> str:
        p = ws.resolve(path)
        ws.commands.append(f"str_replace {path}")
        if not p.is_file():
            raise ToolError(f"str_replace: no file {path!r}")
        text = p.read_text()
        n = text.count(old_str)
        if n != 1:
            raise ToolError(f"str_replace: old_str occurs {n} times in {path!r}, expected exactly once")
        p.write_text(text.replace(old_str, new_str))
        if ws.uid is not None:
            os.chown(p, ws.uid, ws.uid)
        return f"edited {path}"

    return Tool("str_replace", "replace the unique occurrence of old_str in a file by new_str",
                {"type": "object", "properties": {"path": {"type": "string"}, "old_str": {"type": "string"},
                                                  "new_str": {"type": "string"}},
                 "required": ["path", "old_str", "new_str"]}, str_replace)


def submit_tool() -> Tool:
    return Tool("submit", "submit the workspace for grading; ends the episode",
                {"type": "object", "properties": {}, "required": []}, lambda: "submitted", ends_episode=True)
