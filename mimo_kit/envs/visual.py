"""Visual tasks at toy scale: a tiny drawing language rendered by Pillow (Report §4.2, visual tasks).

The report grades high-fidelity replication with pixel-similarity rules (plus LLM judging) and open-ended design
with individual rubric items (execution, instruction following, layout, basic aesthetics). Here the agent writes
``drawing.txt`` in a tiny drawing language, one shape per line::

    canvas 64 48 white
    rect 0 0 21 48 #0055a4          # x y width height colour
    circle 32 24 8 red              # cx cy radius colour
    line 0 0 63 47 black 2          # x1 y1 x2 y2 colour [width]
    polygon gold 10 40 20 20 30 40  # colour then x y pairs

rendered with Pillow's ``ImageDraw`` (a real renderer from PyPI; a dependency of matplotlib). Replication tasks
(``kind: replicate``) pass when the similarity ``1 − mean |a − b| / 255`` over RGB pixels against the hidden
reference program's rendering reaches the task's threshold; open-ended tasks (``kind: open``) pass when every
rubric item holds (an unparsable program fails every item: *execution first*).

The language, its limits and the grading rules live in :mod:`mimo_kit.envs.render` (re-exported here). Every
program is bounded when parsed (coordinates within ``COORD_MARGIN`` of the canvas, radius and rectangle sides at
most ``MAX_SIZE``, line width at most ``MAX_LINE_WIDTH``, colour components 0..255, at most ``MAX_SHAPES`` shapes),
and :func:`grade_drawing` parses, renders and compares an agent's program in a sandboxed child under
``VisualConfig.render_timeout_s``: a program that breaks the limits, a stalled or crashed renderer is a failed
grade with its reason, never an exception or a stall of the trainer's process.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from mimo_kit.config.base import Config, knob
from mimo_kit.envs import render as _render
from mimo_kit.envs.hidden_tests import grader_python
from mimo_kit.envs.render import (  # noqa: F401  (the language's limits, re-exported)
    COORD_MARGIN,
    MAX_LINE_WIDTH,
    MAX_POLYGON_POINTS,
    MAX_PROGRAM_CHARS,
    MAX_SHAPES,
    MAX_SIDE,
    MAX_SIZE,
    MAX_TOKEN_CHARS,
    RUBRIC_TYPES,
    Drawing,
    DrawingError,
    Shape,
    check_rubric_item,
    parse_drawing,
    render,
    similarity,
)
from mimo_kit.envs.sandbox import SandboxConfig, SandboxError, run_sandboxed

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "visual"
#: Bytes of the renderer's answer read back: a 256 × 256 RGB rendering in base64 is 256 KiB; a grade is < 1 KiB.
ANSWER_LIMIT = 1 << 20
#: The renderer's sandbox: one Python process with Pillow (~40 MB resident, well under a second of CPU).
RENDER_SANDBOX = {"cpu_s": 10, "memory_mb": 256, "nproc": 4, "output_limit": ANSWER_LIMIT}


@dataclasses.dataclass
class VisualConfig(Config):
    """How agent drawings are graded (Report §4.2, visual tasks); the report publishes none of these."""

    render_timeout_s: float = knob(5.0, "parse + render + compare of a bounded program takes ~0.1 s with the "
                                        "child's start; 5 s bounds a stalled renderer on a loaded machine", min=0.1)
    sandbox: SandboxConfig = dataclasses.field(default_factory=lambda: SandboxConfig(**RENDER_SANDBOX))

    PRESETS = {"tiny": {"sandbox": RENDER_SANDBOX}}


# ---- tasks --------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class VisualTask:
    id: str
    kind: str  # replicate | open
    instruction: str
    reference: str = ""  # replicate: the hidden program
    threshold: float = 0.97
    rubric: list[dict] = dataclasses.field(default_factory=list)


def load_visual_task(path: str | Path) -> VisualTask:
    path = Path(path)
    data = json.loads(path.read_text())
    if data.get("kind") not in ("replicate", "open"):
        raise DrawingError(f"visual task {str(path)!r}: kind={data.get('kind')!r}, expected 'replicate' or 'open'")
    task = VisualTask(data["id"], data["kind"], data["instruction"], data.get("reference", ""),
                      float(data.get("threshold", 0.97)), data.get("rubric", []))
    if task.kind == "replicate":
        parse_drawing(task.reference)
    for item in task.rubric:
        if not isinstance(item, dict) or item.get("type") not in RUBRIC_TYPES or "id" not in item:
            raise DrawingError(f"visual task {str(path)!r}: rubric item {item!r}, expected an 'id' and a 'type' "
                               f"among {list(RUBRIC_TYPES)}")
    return task


def shipped_visual_tasks(directory: str | Path = DATA_DIR) -> list[VisualTask]:
    return [load_visual_task(p) for p in sorted(Path(directory).glob("*.json"))]


@dataclasses.dataclass
class VisualGrade:
    task: str
    passed: bool
    reward: float
    score: float  # similarity (replicate) or fraction of rubric items (open)
    details: dict
    reason: str


def run_renderer(request: dict, cfg: VisualConfig | None = None) -> tuple[dict | None, str]:
    """Run one request of :mod:`mimo_kit.envs.render` (``grade`` or ``render``) in a sandboxed child under
    ``cfg.render_timeout_s``: the agent's program is parsed and drawn outside the trainer's process, so a program
    that stalls Pillow (holding the GIL) or crashes it costs that child only. Returns (the child's answer, "") or
    (None, why there is none: the deadline, a crash, an unreadable answer). A child that could not start its
    renderer at all (exit status 1 before any answer: no Pillow for its Python) is the infrastructure's
    :class:`SandboxError`, as is a sandbox that cannot start: never a grade of 0 for every drawing."""
    cfg = cfg or VisualConfig()
    work = Path(tempfile.mkdtemp(prefix="mimo-render-"))  # root-only but enterable; the child reads its script
    try:
        work.chmod(0o711)
        script = work / "render.py"
        shutil.copyfile(_render.__file__, script)
        script.chmod(0o644)
        r = run_sandboxed([grader_python(), "-I", str(script)], work, timeout_s=cfg.render_timeout_s,
                          cfg=cfg.sandbox, stdin=json.dumps(request, ensure_ascii=True).encode("ascii"),
                          visible=(str(work),))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if r.timed_out:
        return None, f"the renderer did not finish within {cfg.render_timeout_s:g} s"
    if r.returncode == 1 and not r.stdout.strip():
        raise SandboxError(f"the renderer could not start: {r.stderr.strip()[-500:]}")
    if r.returncode != 0:
        why = "out of memory" if r.oom_killed else f"exit status {r.returncode}"
        return None, f"the renderer failed ({why}): {r.stderr.strip()[-300:]}"
    lines = r.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return None, f"the renderer gave no answer: {r.stdout[-200:]!r}"
    if "crash" in answer:
        return None, f"the renderer failed: {str(answer['crash'])[:300]}"
    return answer, ""


def _task_data(task: VisualTask) -> dict:
    return {"kind": task.kind, "threshold": task.threshold, "reference": task.reference, "rubric": task.rubric}


def grade_drawing(task: VisualTask, program: str, cfg: VisualConfig | None = None) -> VisualGrade:
    """Replication: similarity ≥ threshold. Open-ended: every rubric item. Unparsable programs score 0.

    The agent's program is parsed, rendered and compared in a sandboxed child (:func:`run_renderer`, next to the
    task's own reference rendering) under ``cfg.render_timeout_s``; a program that does not render, a renderer that
    misses the deadline, crashes or answers nonsense is a failed grade naming the reason, never an exception."""
    if not isinstance(program, str) or len(program) > MAX_PROGRAM_CHARS:
        try:
            parse_drawing(program)  # names the problem without starting the renderer
        except DrawingError as e:
            return VisualGrade(task.id, False, 0.0, 0.0, {}, f"does not render: {e}")
    answer, why = run_renderer({"op": "grade", "task": _task_data(task), "program": program}, cfg)
    if answer is None:
        return VisualGrade(task.id, False, 0.0, 0.0, {}, why)
    passed, score, details, reason = (answer.get(k) for k in ("passed", "score", "details", "reason"))
    if not (isinstance(passed, bool) and isinstance(score, (int, float)) and isinstance(details, dict)
            and isinstance(reason, str)):
        return VisualGrade(task.id, False, 0.0, 0.0, {}, f"the renderer's answer is malformed: {str(answer)[:200]}")
    return VisualGrade(task.id, passed, float(passed), float(score), details, reason)


def render_sandboxed(program: str, cfg: VisualConfig | None = None) -> Image.Image:
    """An agent's program rendered in a sandboxed child (:func:`run_renderer`); :class:`DrawingError` names why
    there is no picture (the program, the deadline, a crash)."""
    answer, why = run_renderer({"op": "render", "program": program}, cfg)
    if answer is None:
        raise DrawingError(why)
    if "error" in answer:
        raise DrawingError(str(answer["error"]))
    try:
        w, h = answer["size"]
        data = base64.b64decode(answer["rgb"], validate=True)
        if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE and len(data) == w * h * 3):
            raise ValueError(f"{w}x{h} with {len(data)} bytes")
    except (KeyError, TypeError, ValueError) as e:
        raise DrawingError(f"the renderer's answer is malformed: {e}") from None
    return Image.frombytes("RGB", (w, h), data)


# ---- the image path into the multimodal model (Report §2.2) ----------------------------------------------------
def task_image(task: VisualTask, program: str | None = None, size: int = 16, cfg: VisualConfig | None = None):
    """A visual task's picture as the tensor a MiMo-ViT takes: [1, 3, size, size] floats in [0, 1].

    The picture is ``program`` rendered when given (e.g. an agent's ``drawing.txt``: rendered in a sandboxed child,
    :func:`render_sandboxed`; :class:`DrawingError` names why when it does not render), else the task's own: a
    replication task's hidden reference program, rendered by Pillow. Open-ended tasks define no picture (only an
    instruction and a rubric), so for them the image is rendered deterministically from the task's data: a blank
    canvas of the rubric's ``canvas`` size (64 × 64 without one) in white. The rendering is letterboxed onto a white
    square (the longer side fills it) and resized to ``size`` (Pillow's bilinear filter).
    """
    import torch

    if size < 1:
        raise ValueError(f"task_image: size={size}; expected a positive side in pixels")
    trusted = program is None
    if program is None and task.kind == "replicate":
        program = task.reference
    if program is None:
        w, h = next((tuple(it["size"]) for it in task.rubric if it.get("type") == "canvas"), (64, 64))
        program = f"canvas {w} {h} white\n"
    img = render(program) if trusted else render_sandboxed(program, cfg)
    side = max(img.size)
    square = Image.new("RGB", (side, side), (255, 255, 255))
    square.paste(img, ((side - img.width) // 2, (side - img.height) // 2))
    pixels = np.asarray(square.resize((size, size), Image.BILINEAR), dtype=np.float32) / 255.0  # [S, S, 3]
    return torch.from_numpy(pixels).permute(2, 0, 1)[None].contiguous()


def visual_prompt(model, task: VisualTask, program: str | None = None, max_text: int = 64) -> dict:
    """A visual task as one multimodal prompt for :class:`mimo_kit.model.MiMoMultimodal`: the instruction's UTF-8
    bytes (token ids 0–255, at most ``max_text``), then one ``<image>`` placeholder per ViT patch of
    :func:`task_image`. Returns ``input_ids`` [1, L], ``images`` [1, 3, S, S] and ``inputs_embeds`` [1, L, hidden]:
    the decoder's input with the ViT's projected patches written at the placeholders."""
    import torch

    vit = model.config.vision
    if vit.in_channels != 3:
        raise ValueError(f"visual_prompt: the model's ViT takes {vit.in_channels} channel(s); task images are RGB (3)")
    images = task_image(task, program, size=vit.image_size)
    text = list(task.instruction.encode("utf-8"))[:max_text]
    ids = torch.tensor([model.sequence(text, model.image_positions(vit.image_size, vit.image_size), 0, [])])
    embeds = model.replace(ids, model.decoder.embed(ids), model.encode_media(images, None))
    return {"input_ids": ids, "images": images, "inputs_embeds": embeds}
