"""The mini-harness: one minimal agent loop composed of swappable modules (Report §4.2 multi-harness).

A harness configuration wraps an environment and a tokenizer into an episode of the rollout driver
(:class:`HarnessEpisode`), so a model acts in it token-in/token-out and every run is recorded in the one trajectory
schema; :func:`run_episode` runs a text policy (scripted or an API) the same way.

>>> from mimo_kit.harness import HARNESSES, ScriptedPolicy, run_episode
"""

from mimo_kit.envs.tools import Tool, ToolError, ToolRegistry, Workspace
from mimo_kit.harness.config import HARNESSES, HarnessConfig, ScriptedPolicy, get_harness
from mimo_kit.harness.episode import (
    ByteTokenizer,
    HarnessEpisode,
    PolicyEngine,
    harness_settings,
    run_episode,
)
from mimo_kit.harness.formats import FORMATS, FormatError, ToolCall, get_format, render_call
from mimo_kit.harness.record import error_segments, generated_segments

__all__ = ["FORMATS", "ByteTokenizer", "FormatError", "HARNESSES", "HarnessConfig", "HarnessEpisode",
           "PolicyEngine", "ScriptedPolicy", "Tool", "ToolCall", "ToolError", "ToolRegistry", "Workspace",
           "error_segments", "generated_segments", "get_format", "get_harness", "harness_settings", "render_call",
           "run_episode"]
