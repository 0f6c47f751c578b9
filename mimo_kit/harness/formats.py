"""Action formats: how a model's text becomes tool calls (Report §4.2 multi-harness; mini-swe-agent's protocol).

Three formats a policy may be trained or evaluated on, one interface: ``parse(text) -> list[ToolCall]`` raising
:class:`FormatError` with feedback for the model, and ``render(tools) -> str``, the tool documentation the prompt
builder puts in the system prompt.

- ``fenced``: one fenced block per turn, ```` ```bash ... ``` ```` (a bash command; the bare command ``submit``
  submits) or ```` ```tool NAME ```` with a JSON object of arguments;
- ``openai``: an OpenAI-style JSON message ``{"tool_calls": [{"function": {"name": ..., "arguments": "<json>"}}]}``;
- ``xml``: ``<tool name="NAME"><arg name="KEY">VALUE</arg>...</tool>``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from mimo_kit.rl.model_json import MalformedJSON, read_json


@dataclasses.dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


class FormatError(ValueError):
    """The model's output cannot be read as an action; the message is the feedback the model gets."""


def loads(text: str, what: str) -> Any:
    """``json.loads`` of model text (:func:`mimo_kit.rl.model_json.read_json`, the one reader the penalty rules use
    too): whatever it fails on (a syntax error, 3,000 nested ``[``, a 5,000-digit number over Python's
    int-conversion limit) is the model's :class:`FormatError`, never an exception that ends the episode or the
    batch."""
    try:
        return read_json(text, what)
    except MalformedJSON as e:
        raise FormatError(str(e)) from None


def _through_last(text: str, close: str) -> str:
    """``text`` up to its last ``close`` tag: a lazy ``<open>(.*?)<close>`` pattern scanned over the rest would try
    every opening tag to the end of the text (quadratic: 300 KB of unclosed ``<tool name="x">`` took 34 s); before
    the last closing tag each opening's scan stops at the next one, so a search is linear."""
    end = text.rfind(close)
    return text[: end + len(close)] if end >= 0 else ""


class ActionFormat:
    name = "base"

    def parse(self, text: str) -> list[ToolCall]:
        raise NotImplementedError

    def render(self, tools: list) -> str:
        raise NotImplementedError


def _schema_line(tool) -> str:
    params = tool.parameters.get("properties", {})
    req = set(tool.parameters.get("required", []))
    args = ", ".join(f"{k}{'' if k in req else '?'}: {v.get('type', 'any')}" for k, v in params.items())
    return f"- {tool.name}({args}): {tool.description}"


class FencedFormat(ActionFormat):
    name = "fenced"
    _BLOCK = re.compile(r"```([\w-]*)[ \t]*([\w-]*)\n(.*?)```", re.S)

    def parse(self, text: str) -> list[ToolCall]:
        blocks = self._BLOCK.findall(text)
        if len(blocks) != 1:
            raise FormatError(f"expected exactly one fenced block (```bash ... ``` or ```tool NAME ... ```), found "
                              f"{len(blocks)}")
        lang, name, body = blocks[0]
        if lang == "bash":
            cmd = body.strip()
            if cmd == "submit":
                return [ToolCall("submit", {})]
            return [ToolCall("bash", {"command": cmd})]
        if lang == "tool":
            if not name:
                raise FormatError("a ```tool block needs a tool name after 'tool', e.g. ```tool view")
            args = loads(body, f"arguments of tool {name!r}") if body.strip() else {}
            if not isinstance(args, dict):
                raise FormatError(f"arguments of tool {name!r} must be a JSON object, got {type(args).__name__}")
            return [ToolCall(name, args)]
        raise FormatError(f"unknown block language {lang!r}; use ```bash or ```tool NAME")

    def render(self, tools: list) -> str:
        return ("Act with exactly one fenced block per reply: ```bash\\n<command>\\n``` runs a command (the command "
                "`submit` submits); ```tool NAME\\n{json arguments}\\n``` calls a tool:\n"
                + "\n".join(_schema_line(t) for t in tools))


class OpenAIFormat(ActionFormat):
    name = "openai"

    def parse(self, text: str) -> list[ToolCall]:
        msg = loads(text, "the reply's contents (expected a JSON message)")
        calls = msg.get("tool_calls") if isinstance(msg, dict) else None
        if not isinstance(calls, list) or not calls:
            raise FormatError("expected a JSON object with a non-empty 'tool_calls' list")
        out = []
        for i, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise FormatError(f"tool_calls[{i}] needs a 'function' object with a string 'name'")
            raw = fn.get("arguments", "{}")
            args = loads(raw, f"tool_calls[{i}] ({fn['name']}): arguments") if isinstance(raw, str) else raw
            if not isinstance(args, dict):
                raise FormatError(f"tool_calls[{i}] ({fn['name']}): arguments must be a JSON object")
            out.append(ToolCall(fn["name"], args))
        return out

    def render(self, tools: list) -> str:
        specs = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                   "parameters": t.parameters}} for t in tools]
        return ("Reply with a JSON message {\"tool_calls\": [{\"function\": {\"name\": ..., \"arguments\": "
                "\"<json>\"}}]}. Tools:\n" + json.dumps(specs, indent=1))


class XMLFormat(ActionFormat):
    name = "xml"
    _TOOL = re.compile(r"<tool\s+name=\"([\w-]+)\"\s*>(.*?)</tool>", re.S)
    _ARG = re.compile(r"<arg\s+name=\"([\w-]+)\"\s*>(.*?)</arg>", re.S)

    def parse(self, text: str) -> list[ToolCall]:
        tools = self._TOOL.findall(_through_last(text, "</tool>"))
        if not tools:
            if "<tool" in text:
                raise FormatError('malformed <tool> element: expected <tool name="NAME">...</tool>')
            raise FormatError('no <tool name="NAME">...</tool> element in the reply')
        out = []
        for name, body in tools:
            args: dict[str, Any] = {}
            head = _through_last(body, "</arg>")
            for key, value in self._ARG.findall(head):
                value = value.strip("\n")
                try:  # numbers and lists arrive as JSON, everything else as text
                    args[key] = loads(value, "") if value[:1] in "[{0123456789-" else value
                except FormatError:
                    args[key] = value
            leftover = (self._ARG.sub("", head) + body[len(head):]).strip()
            if leftover:
                raise FormatError(f"tool {name!r}: text outside <arg> elements: {leftover[:60]!r}")
            out.append(ToolCall(name, args))
        return out

    def render(self, tools: list) -> str:
        return ('Call tools as <tool name="NAME"><arg name="KEY">VALUE</arg></tool>. Tools:\n'
                + "\n".join(_schema_line(t) for t in tools))


FORMATS: dict[str, type[ActionFormat]] = {"fenced": FencedFormat, "openai": OpenAIFormat, "xml": XMLFormat}


def get_format(name: str) -> ActionFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown action format {name!r}; expected one of {', '.join(FORMATS)}")
    return FORMATS[name]()


def render_call(fmt: str, name: str, args: dict[str, Any]) -> str:
    """Write a tool call in a format: what a scripted policy types (the inverse of ``parse``)."""
    if fmt == "fenced":
        if name == "bash":
            return f"```bash\n{args['command']}\n```"
        if name == "submit" and not args:
            return "```bash\nsubmit\n```"
        return f"```tool {name}\n{json.dumps(args)}\n```"
    if fmt == "openai":
        return json.dumps({"tool_calls": [{"function": {"name": name, "arguments": json.dumps(args)}}]})
    if fmt == "xml":
        inner = "".join(f'<arg name="{k}">{v if isinstance(v, str) else json.dumps(v)}</arg>' for k, v in args.items())
        return f'<tool name="{name}">{inner}</tool>'
    raise ValueError(f"unknown action format {fmt!r}; expected one of {', '.join(FORMATS)}")
