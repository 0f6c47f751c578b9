"""The mini-harness's swappable modules and its configurations (Report §4.2 *multi-harness*; in the spirit of
mini-swe-agent).

The report trains on minimal, decoupled mini-harnesses recombined from one agent loop (system prompt, tools,
context management), one configuration per domain, and evaluates on held-out harnesses. The loop, one turn of
which is :meth:`mimo_kit.harness.episode.HarnessEpisode.act`, stepped by the rollout driver::

    messages = prompt_builder(env, tools)              # system + user (the task)
    until a limit or submit:
        text = policy(context_manager(messages))       # what the model sees is managed
        calls = action_format.parse(text)              # malformed → a recorded error with feedback
        observation = tool_registry.call(...)          # bad arguments / unknown tool → a recorded error
                                                       # the driver records Sample ⊃ Sequence ⊃ Context ⊃ Segment

Every module is a field of :class:`HarnessConfig`; :data:`HARNESSES` holds 8 named configurations, 5 for training
(``api-agent`` is the general domain's; code tasks train on the other 4) and 3 held out for evaluation (styled
after codex, claude code and mini-swe-agent, as in Report §4.2).
Limits are explicit: steps, wall time, consecutive format errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal, Protocol

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.envs.tools import (
    Tool,
    ToolRegistry,
    Workspace,
    bash_tool,
    edit_tool,
    submit_tool,
    view_tool,
)
from mimo_kit.harness.formats import get_format

STANDARD_TOOLS = ("bash", "view", "str_replace", "submit")


@dataclasses.dataclass
class HarnessConfig(Config):
    """One mini-harness: the modules the loop is composed of. Defaults are the kit's choices (unpublished)."""

    name: str = knob("mini-bash", "the configuration's name")
    split: Literal["train", "eval"] = knob("train", "Report §4.2: training harnesses vs held-out evaluation ones")
    action_format: Literal["fenced", "openai", "xml"] = knob("fenced", "how the model's text becomes tool calls")
    tools: tuple[str, ...] = knob(("bash", "submit"), "standard tools; the environment adds its domain tools")
    domain_tools: bool = knob(True, "expose the environment's own tools (API mocks) to the model")
    system_prompt: str = knob("You are a careful software agent. Solve the task in the workspace, then submit.",
                              "kept minimal: instructions outside the reward get ignored (Report §4.2)")
    obs_max_chars: int = knob(4000, "head+tail truncation of one observation; toy outputs are far smaller", min=200)
    keep_last: int = knob(0, "keep the last k observations verbatim, elide older ones; 0 = keep all", min=0)
    max_steps: int = knob(30, "a toy task needs < 10 actions; 30 leaves room for exploration", min=1)
    max_wall_s: float = knob(300.0, "wall-clock cap of one episode", min=1.0)
    max_format_errors: int = knob(3, "consecutive malformed actions before the episode is cut", min=1)
    bash_timeout_s: float = knob(30.0, "per-command sandbox timeout", min=0.1)

    PRESETS = {"tiny": {}}

    def check(self) -> None:
        bad = [t for t in self.tools if t not in STANDARD_TOOLS]
        if bad:
            raise ConfigError(f"HarnessConfig.tools: unknown {bad}; expected a subset of {list(STANDARD_TOOLS)}")


_P = "Fix the issue described by the user in the repository at the working directory, then submit."
#: Report §4.2: one configuration per domain for training, held-out ones (codex / claude code / mini-swe-agent).
HARNESSES: dict[str, HarnessConfig] = {h.name: h for h in [
    HarnessConfig(name="mini-bash", split="train", action_format="fenced", tools=("bash", "submit")),
    HarnessConfig(name="swe-tools", split="train", action_format="openai",
                  tools=("bash", "view", "str_replace", "submit"), keep_last=6, system_prompt=_P),
    HarnessConfig(name="xml-editor", split="train", action_format="xml", tools=("view", "str_replace", "submit"),
                  obs_max_chars=2000),
    HarnessConfig(name="fenced-editor", split="train", action_format="fenced",
                  tools=("bash", "view", "str_replace", "submit"), obs_max_chars=2000),
    HarnessConfig(name="api-agent", split="train", action_format="openai", tools=("submit",),
                  system_prompt="Use the tools to complete the user's request, then submit."),
    HarnessConfig(name="codex-like", split="eval", action_format="openai", tools=("bash", "submit"),
                  obs_max_chars=1200, system_prompt="You are a coding agent running in a terminal. " + _P),
    HarnessConfig(name="claude-code-like", split="eval", action_format="xml",
                  tools=("bash", "view", "str_replace", "submit"), keep_last=10,
                  system_prompt="You are an interactive agent that helps with software engineering tasks. " + _P),
    HarnessConfig(name="mini-swe-agent-like", split="eval", action_format="fenced", tools=("bash", "submit"),
                  domain_tools=False, obs_max_chars=10000, max_format_errors=5,
                  system_prompt="You are a helpful assistant that can interact with a computer shell. " + _P),
]}


def get_harness(name: str) -> HarnessConfig:
    if name not in HARNESSES:
        raise ConfigError(f"unknown harness {name!r}; known: {', '.join(HARNESSES)}")
    return HARNESSES[name]


# ---- protocols ----------------------------------------------------------------------------------------------------
class Env(Protocol):
    """What the loop needs from an environment (code, general, cyber, visual adapters in ``harness.envs``)."""

    instruction: str
    workspace: Workspace

    def domain_tools(self) -> list[Tool]: ...

    def grade(self) -> dict: ...  # {"reward": float, ...}: called once, after submit or a limit


Policy = Callable[[list[dict]], str]  # messages [{"role", "content"}] → the model's reply text


class ScriptedPolicy:
    """A deterministic policy for tests and demos: replies from a list (then repeats the last, or raises)."""

    def __init__(self, replies: list[str] | Callable[[list[dict], int], str]):
        self.replies = replies
        self.calls = 0

    def __call__(self, messages: list[dict]) -> str:
        i = self.calls
        self.calls += 1
        if callable(self.replies):
            return self.replies(messages, i)
        return self.replies[min(i, len(self.replies) - 1)]


# ---- context manager ----------------------------------------------------------------------------------------------
def truncate(text: str, limit: int) -> str:
    """Head and tail of ``text`` with a notice in between (Report §4.2 context management)."""
    if len(text) <= limit:
        return text
    half = (limit - 60) // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters elided ...]\n{text[-half:]}"


def manage_context(messages: list[dict], keep_last: int) -> list[dict]:
    """Replace all but the last ``keep_last`` tool observations by a stub (0 = keep everything)."""
    if not keep_last:
        return messages
    obs = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    old = set(obs[:-keep_last])
    return [{**m, "content": "[earlier observation elided]"} if i in old else m for i, m in enumerate(messages)]


def build_prompt(cfg: HarnessConfig, env: Env, tools: ToolRegistry) -> list[dict]:
    fmt = get_format(cfg.action_format)
    return [{"role": "system", "content": cfg.system_prompt + "\n\n" + fmt.render(list(tools))},
            {"role": "user", "content": env.instruction}]


def make_registry(cfg: HarnessConfig, env: Env) -> ToolRegistry:
    ws = env.workspace
    std = {"bash": lambda: bash_tool(ws, cfg.bash_timeout_s), "view": lambda: view_tool(ws),
           "str_replace": lambda: edit_tool(ws), "submit": submit_tool}
    reg = ToolRegistry([std[t]() for t in cfg.tools])
    if cfg.domain_tools:
        for t in env.domain_tools():
            reg.register(t)
    return reg
