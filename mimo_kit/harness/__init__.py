"""The mini-harness: one minimal agent loop composed of swappable modules (Report §4.2 multi-harness).

>>> from mimo_kit.harness import HARNESSES, ScriptedPolicy, run_episode
"""

from mimo_kit.harness.formats import FORMATS, FormatError, ToolCall, get_format, render_call
from mimo_kit.harness.loop import HARNESSES, HarnessConfig, ScriptedPolicy, get_harness, run_episode
from mimo_kit.harness.record import Recorder, error_segments, generated_segments, load_sample
from mimo_kit.harness.tools import Tool, ToolError, ToolRegistry, Workspace

__all__ = ["FORMATS", "FormatError", "ToolCall", "get_format", "render_call", "HARNESSES", "HarnessConfig",
           "ScriptedPolicy", "get_harness", "run_episode", "Recorder", "error_segments", "generated_segments",
           "load_sample", "Tool", "ToolError", "ToolRegistry", "Workspace"]
