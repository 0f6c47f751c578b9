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
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
from PIL import Image, ImageColor, ImageDraw

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "visual"
MAX_SIDE = 256  # toy canvases; also bounds the work an agent's program can ask for
_ARITY = {"canvas": 3, "rect": 5, "circle": 4, "line": (5, 6), "polygon": None}


class DrawingError(ValueError):
    """A drawing program that cannot be rendered; the message names the line and the bad token."""


@dataclasses.dataclass
class Shape:
    kind: str
    color: tuple[int, int, int]
    coords: tuple[int, ...]
    width: int = 1


@dataclasses.dataclass
class Drawing:
    width: int
    height: int
    background: tuple[int, int, int]
    shapes: list[Shape]


def _color(token: str, line_no: int) -> tuple[int, int, int]:
    try:
        return ImageColor.getrgb(token)[:3]
    except ValueError:
        raise DrawingError(f"line {line_no}: {token!r} is not a colour (a name like 'red' or #rrggbb)") from None


def _ints(tokens: list[str], line_no: int) -> list[int]:
    out = []
    for t in tokens:
        try:
            out.append(int(t))
        except ValueError:
            raise DrawingError(f"line {line_no}: {t!r} is not an integer") from None
    return out


def parse_drawing(text: str) -> Drawing:
    """Parse a program; the first statement must be ``canvas W H COLOUR``."""
    canvas, shapes = None, []
    for no, raw in enumerate(text.splitlines(), 1):
        tokens = raw.split()
        for i, t in enumerate(tokens):  # a comment starts at a '#' token that is not a #rrggbb colour
            if t.startswith("#") and not re.fullmatch(r"#[0-9a-fA-F]{6}", t):
                tokens = tokens[:i]
                break
        if not tokens:
            continue
        op, args = tokens[0], tokens[1:]
        if op not in _ARITY:
            raise DrawingError(f"line {no}: unknown statement {op!r}; expected one of {', '.join(_ARITY)}")
        if op == "canvas":
            if canvas is not None or shapes:
                raise DrawingError(f"line {no}: 'canvas' must come once, first")
            if len(args) != 3:
                raise DrawingError(f"line {no}: canvas takes width height colour, got {len(args)} arguments")
            w, h = _ints(args[:2], no)
            if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
                raise DrawingError(f"line {no}: canvas {w}x{h} is outside 1..{MAX_SIDE}")
            canvas = (w, h, _color(args[2], no))
            continue
        if canvas is None:
            raise DrawingError(f"line {no}: the program must start with 'canvas W H COLOUR'")
        if op == "polygon":
            if len(args) < 7 or len(args) % 2 == 0:
                raise DrawingError(f"line {no}: polygon takes a colour and at least 3 x y pairs")
            shapes.append(Shape(op, _color(args[0], no), tuple(_ints(args[1:], no))))
            continue
        arity = _ARITY[op]
        ok = len(args) in arity if isinstance(arity, tuple) else len(args) == arity
        if not ok:
            raise DrawingError(f"line {no}: {op} takes {arity} arguments, got {len(args)}")
        if op == "line":
            nums = _ints(args[:4], no)
            width = _ints(args[5:], no)[0] if len(args) == 6 else 1
            shapes.append(Shape(op, _color(args[4], no), tuple(nums), width))
        else:
            nums = _ints(args[:-1], no)
            shapes.append(Shape(op, _color(args[-1], no), tuple(nums)))
    if canvas is None:
        raise DrawingError("empty program: expected 'canvas W H COLOUR' first")
    return Drawing(*canvas, shapes)


def render(drawing: Drawing | str) -> Image.Image:
    """Render with Pillow (``ImageDraw``)."""
    d = parse_drawing(drawing) if isinstance(drawing, str) else drawing
    img = Image.new("RGB", (d.width, d.height), d.background)
    draw = ImageDraw.Draw(img)
    for s in d.shapes:
        c = s.coords
        if s.kind == "rect":
            draw.rectangle([c[0], c[1], c[0] + c[2] - 1, c[1] + c[3] - 1], fill=s.color)
        elif s.kind == "circle":
            draw.ellipse([c[0] - c[2], c[1] - c[2], c[0] + c[2], c[1] + c[2]], fill=s.color)
        elif s.kind == "line":
            draw.line(list(c), fill=s.color, width=s.width)
        elif s.kind == "polygon":
            draw.polygon(list(c), fill=s.color)
    return img


def similarity(a: Image.Image, b: Image.Image) -> float:
    """1 − mean absolute RGB difference / 255, after resizing ``a`` to ``b``'s size (nearest)."""
    if a.size != b.size:
        a = a.resize(b.size, Image.NEAREST)
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    return float(1 - np.abs(x - y).mean() / 255)


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
    return task


def shipped_visual_tasks(directory: str | Path = DATA_DIR) -> list[VisualTask]:
    return [load_visual_task(p) for p in sorted(Path(directory).glob("*.json"))]


def _shapes_of(d: Drawing, kind: str, color: str | None) -> list[Shape]:
    want = ImageColor.getrgb(color)[:3] if color else None
    return [s for s in d.shapes if s.kind == kind and (want is None or _near(s.color, want))]


def _near(a, b, tol: int = 60) -> bool:
    return sum(abs(x - y) for x, y in zip(a, b)) <= tol


def check_rubric_item(item: dict, d: Drawing) -> bool:
    """Open-ended design items: ``canvas``, ``has_shape``, ``min_shapes``, ``colors_at_least``, ``inside``,
    ``above`` (one shape's centre above another's)."""
    t = item["type"]
    if t == "canvas":
        return (d.width, d.height) == tuple(item["size"])
    if t == "has_shape":
        return len(_shapes_of(d, item["shape"], item.get("color"))) >= item.get("count", 1)
    if t == "min_shapes":
        return len(d.shapes) >= item["n"]
    if t == "colors_at_least":
        return len({s.color for s in d.shapes} | {d.background}) >= item["n"]
    if t == "inside":
        for s in d.shapes:
            xs, ys = s.coords[0::2], s.coords[1::2]
            if s.kind == "circle":
                xs, ys = (s.coords[0] - s.coords[2], s.coords[0] + s.coords[2]), (s.coords[1] - s.coords[2],
                                                                                  s.coords[1] + s.coords[2])
            elif s.kind == "rect":
                xs, ys = (s.coords[0], s.coords[0] + s.coords[2]), (s.coords[1], s.coords[1] + s.coords[3])
            if min(xs) < 0 or min(ys) < 0 or max(xs) > d.width or max(ys) > d.height:
                return False
        return True
    if t == "above":
        a = _shapes_of(d, item["shape"], item["upper"])
        b = _shapes_of(d, item["shape"], item["lower"])
        return bool(a and b) and a[0].coords[1] < b[0].coords[1]
    raise DrawingError(f"rubric item {item.get('id')!r}: unknown type {t!r}")


@dataclasses.dataclass
class VisualGrade:
    task: str
    passed: bool
    reward: float
    score: float  # similarity (replicate) or fraction of rubric items (open)
    details: dict
    reason: str


def grade_drawing(task: VisualTask, program: str) -> VisualGrade:
    """Replication: similarity ≥ threshold. Open-ended: every rubric item. Unparsable programs score 0."""
    try:
        d = parse_drawing(program)
        img = render(d)
    except DrawingError as e:
        return VisualGrade(task.id, False, 0.0, 0.0, {}, f"does not render: {e}")
    if task.kind == "replicate":
        sim = similarity(img, render(task.reference))
        ok = sim >= task.threshold
        return VisualGrade(task.id, ok, float(ok), sim, {"similarity": round(sim, 4)},
                           f"similarity {sim:.3f} {'≥' if ok else '<'} threshold {task.threshold}")
    items = {it["id"]: check_rubric_item(it, d) for it in task.rubric}
    score = sum(items.values()) / max(1, len(items))
    ok = all(items.values())
    failed = [k for k, v in items.items() if not v]
    return VisualGrade(task.id, ok, float(ok), score, items, "all rubric items hold" if ok else f"fails {failed}")


# ---- the image path into the multimodal model (Report §2.2) ----------------------------------------------------
def task_image(task: VisualTask, program: str | None = None, size: int = 16):
    """A visual task's picture as the tensor a MiMo-ViT takes: [1, 3, size, size] floats in [0, 1].

    The picture is ``program`` rendered when given (e.g. an agent's ``drawing.txt``), else the task's own: a
    replication task's hidden reference program, rendered by Pillow. Open-ended tasks define no picture (only an
    instruction and a rubric), so for them the image is rendered deterministically from the task's data: a blank
    canvas of the rubric's ``canvas`` size (64 × 64 without one) in white. The rendering is letterboxed onto a white
    square (the longer side fills it) and resized to ``size`` (Pillow's bilinear filter).
    """
    import torch

    if size < 1:
        raise ValueError(f"task_image: size={size}; expected a positive side in pixels")
    if program is None and task.kind == "replicate":
        program = task.reference
    if program is None:
        w, h = next((tuple(it["size"]) for it in task.rubric if it.get("type") == "canvas"), (64, 64))
        program = f"canvas {w} {h} white\n"
    img = render(program)
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
