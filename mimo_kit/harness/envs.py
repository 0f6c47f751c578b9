"""Environment adapters for the mini-harness: one workspace per episode, graded once at the end (Report §4.2).

Each adapter builds the episode's sandbox identity (a leased throw-away uid owning the workspace and a private HOME,
both on the episode's size-limited volume), exposes the task text as ``instruction`` and its domain tools, and
grades with the environment's own grader. Use as a context manager so the workspace is removed afterwards.
"""

from __future__ import annotations

import os
import re
import struct
import sys

from mimo_kit.envs import code as code_env
from mimo_kit.envs import cyber as cyber_env
from mimo_kit.envs.hacks import audited_reward
from mimo_kit.envs.patches import UnsafePatch, read_regular
from mimo_kit.envs.sandbox import SandboxConfig, chown_tree, new_uid
from mimo_kit.envs.tools import Tool, Workspace
from mimo_kit.envs.uids import release_uid
from mimo_kit.envs.volume import EpisodeVolume


class BaseEnv:
    instruction: str = ""

    def __init__(self, sandbox: SandboxConfig | None = None, network: bool = False):
        self.sandbox = sandbox or SandboxConfig()
        self.volume = EpisodeVolume(self.sandbox.disk_mb, max_files=self.sandbox.max_files)
        self.tmp = self.volume.path
        uid = new_uid(self.sandbox) if os.geteuid() == 0 and self.sandbox.drop_privileges else None
        (self.tmp / "home").mkdir()
        self.workspace = Workspace(self.tmp / "ws", uid, self.tmp / "home", self.sandbox, network)

    def _own(self) -> None:
        chown_tree(self.workspace.root, self.workspace.uid)
        chown_tree(self.workspace.home, self.workspace.uid)

    def domain_tools(self) -> list[Tool]:
        return []

    def grade(self) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        self.volume.close()
        release_uid(self.workspace.uid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CodeEnv(BaseEnv):
    """A code task: the clean single-commit workspace; graded by the hardened grader, then audited."""

    def __init__(self, task: code_env.CodeTask, *, cleaned: bool = True, audit: bool = True,
                 cfg: code_env.CodeEnvConfig | None = None, cache: code_env.GradeCache | None = None, leaks=None):
        self.cfg = cfg or code_env.CodeEnvConfig()
        self.cache = cache
        self.leaks = code_env.leaks_of(cleaned, leaks)  # what environment cleaning left open (none when cleaned)
        super().__init__(self.cfg.sandbox, network="network" in self.leaks)
        self.task, self.audit = task, audit
        code_env.make_workspace(task, self.workspace.root, leaks=self.leaks)
        self._own()
        self.instruction = task.instruction

    def grade(self) -> dict:
        g = code_env.grade(self.task, self.workspace.root, self.cfg, self.cache)
        reward, flags = audited_reward(g.reward, self.workspace.commands, g.diff) if self.audit else (g.reward, [])
        reasons = [f.reason for f in flags]
        if self.audit and g.reason.startswith("workspace refused") and "holds more than" not in g.reason:
            # names or trees no repository has (not UTF-8, control characters, too deep): hostile, not just big
            reasons.append(f"the grader refused the workspace ({g.reason[len('workspace refused: '):][:160]})")
        if g.unstable:  # independent gradings disagreed: a pass by chance is no pass (GradeCache)
            reasons.append("unstable verdict: independent gradings of this patch disagreed")
        return {"reward": reward, "tests_passed": g.passed, "reason": g.reason,
                **code_env.diff_summary(g.diff, self.cfg),
                "hack_flags": reasons, "test_output": code_env.bounded_output(g.test_output),
                "checked": compiled_after_change(self.workspace, g.diff)}


def compiled_after_change(ws: Workspace, diff: str) -> bool:
    """Whether the episode ran its change: every Python file the diff changes was imported (or compiled) after
    its last change, read from the bytecode its commands left beside it (``__pycache__``,
    :func:`~mimo_kit.envs.tools.bytecode_env`) whose header names the final file's mtime and size (PEP 552: magic,
    flags 0, mtime, size). An effect on the episode's files, not the words of a command: ``sed -n 1p`` then
    ``python3 -c 0`` leaves no such file. Read as root without following links
    (:func:`~mimo_kit.envs.patches.read_regular`)."""
    paths = sorted(set(re.findall(r"^\+\+\+ b/(\S+\.py)$", diff, re.M)))
    if not paths:
        return False
    for rel in paths:
        folder, name = os.path.split(rel)
        pyc = os.path.join(folder, "__pycache__", f"{name[:-3]}.{sys.implementation.cache_tag}.pyc")
        try:
            st = os.lstat(ws.root / rel)
            data = read_regular(ws.root, pyc, 2**20)
        except (OSError, ValueError, UnsafePatch):
            return False
        if data is None or len(data) < 16:
            return False
        flags, mtime, size = struct.unpack("<III", data[4:16])
        if flags != 0 or mtime != int(st.st_mtime) & 0xFFFFFFFF or size != st.st_size & 0xFFFFFFFF:
            return False
    return True


class CyberEnv(BaseEnv):
    """A cyber target: the stripped sources; the agent writes ``poc.bin`` and submits."""

    def __init__(self, target: cyber_env.CyberTarget, cfg: cyber_env.CyberConfig | None = None):
        self.cfg = cfg or cyber_env.CyberConfig()
        super().__init__(self.cfg.sandbox)
        self.target = target
        cyber_env.make_workspace(target, self.workspace.root)
        self._own()
        self.instruction = target.description + " Write the input to poc.bin in the working directory, then submit."

    def grade(self) -> dict:
        try:  # read as root: never through a link the agent planted
            poc = read_regular(self.workspace.root, "poc.bin", self.cfg.max_poc_bytes)
        except UnsafePatch as e:
            return {"reward": 0.0, "reason": str(e)}
        if poc is None:
            return {"reward": 0.0, "reason": "no poc.bin in the workspace"}
        g = cyber_env.grade_poc(self.target, poc, self.cfg)
        return {"reward": g.reward, "reason": g.reason, "got": list(g.got or ())}


class GeneralEnv(BaseEnv):
    """A general task: the mock shop's API as domain tools; graded by rubric, state and negative checks."""

    def __init__(self, task, judge=None, sandbox: SandboxConfig | None = None):
        from mimo_kit.envs import general

        super().__init__(sandbox)
        self.general, self.task, self.judge = general, task, judge
        general.make_workspace(task, self.workspace.root)
        self._own()
        self.instruction = task.instruction

    def domain_tools(self) -> list[Tool]:
        return self.general.shop_tools(self.workspace.root)

    def grade(self) -> dict:
        g = self.general.grade_general(self.task, self.workspace.root, self.judge)
        return {"reward": g.reward, "rubric_score": g.rubric_score, "reasons": g.reasons,
                "state_ok": g.state_ok, "negative_ok": g.negative_ok}


class VisualEnv(BaseEnv):
    """A visual task: the agent writes ``drawing.txt`` (the tiny drawing language) and submits."""

    def __init__(self, task, sandbox: SandboxConfig | None = None):
        from mimo_kit.envs import visual

        super().__init__(sandbox)
        self.visual, self.task = visual, task
        self.workspace.root.mkdir()
        (self.workspace.root / "LANGUAGE.md").write_text(visual.__doc__.split("::")[1].split("rendered")[0])
        self._own()
        self.instruction = task.instruction + " Write the drawing program to drawing.txt, then submit."

    def grade(self) -> dict:
        try:  # read as root: never through a link the agent planted
            prog = read_regular(self.workspace.root, "drawing.txt")
        except UnsafePatch as e:
            return {"reward": 0.0, "reason": str(e)}
        if prog is None:
            return {"reward": 0.0, "reason": "no drawing.txt"}
        g = self.visual.grade_drawing(self.task, prog.decode("utf-8", "replace"))
        return {"reward": g.reward, "score": g.score, "reason": g.reason}
