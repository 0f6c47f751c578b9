"""The visual tasks' drawing language, its renderer and its grading rules, runnable as a sandboxed child (Report
§4.2, visual tasks).

The language is described in :mod:`mimo_kit.envs.visual`, which re-exports everything here. This module imports
only the standard library and Pillow, so the grader can copy it into a grading folder and run it as
``python -I render.py`` in the sandbox (:func:`mimo_kit.envs.visual.grade_drawing`): the agent's program is parsed,
rendered and compared there, under a deadline, outside the trainer's process. The request is one JSON object on
stdin, the answer one JSON line on stdout.

Every program is bounded at parse time, so a bad drawing fails fast with a :class:`DrawingError` naming the line and
the value: at most ``MAX_PROGRAM_CHARS`` characters and ``MAX_SHAPES`` shapes; coordinates within ``COORD_MARGIN``
of the canvas; a radius or a rectangle's side at most ``MAX_SIZE``; a line at most ``MAX_LINE_WIDTH`` wide; a
polygon at most ``MAX_POLYGON_POINTS`` corners; colour components 0..255. Within those limits the work of one
shape is bounded (Pillow's ellipse and line work grows with the radius and the width: a radius of 700,000 took
~30 s), so a whole program renders in well under a second.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import sys

from PIL import Image, ImageChops, ImageColor, ImageDraw

MAX_SIDE = 256  # toy canvases; also bounds the work an agent's program can ask for
#: Characters of a program: a toy drawing is well under 1 KB; the parser's work and the renderer's request stay small.
MAX_PROGRAM_CHARS = 64 * 1024
#: Shapes of a program: toy designs use tens; with each shape's work bounded, this bounds the whole rendering.
MAX_SHAPES = 256
#: Characters of one token: the longest colour name has 20 and ``rgb(100%,100%,100%)`` 19; a 5,000-digit number is
#: refused before it is converted.
MAX_TOKEN_CHARS = 32
#: Pixels a coordinate may lie off the canvas (a shape partly outside it); further out draws nothing visible.
COORD_MARGIN = MAX_SIDE
#: A circle's radius or a rectangle's side: from one margin across the largest canvas to the other; Pillow's work
#: grows with the size (a radius of 700,000 held the GIL ~30 s; 10**20 raised SystemError).
MAX_SIZE = 3 * MAX_SIDE
#: A line's width: one as wide as the largest canvas covers it; Pillow's work grows with the width.
MAX_LINE_WIDTH = MAX_SIDE
#: Corners of a polygon: toy polygons have a handful; Pillow's fill work grows with the edges.
MAX_POLYGON_POINTS = 256
_ARITY = {"canvas": 3, "rect": 5, "circle": 4, "line": (5, 6), "polygon": None}
_INT = re.compile(r"[+-]?[0-9]+")


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
    """A colour Pillow names (``red``, ``#rrggbb``, ``rgb(…)``, ``hsl(…)``) whose components all lie in 0..255."""
    if len(token) > MAX_TOKEN_CHARS:
        raise DrawingError(f"line {line_no}: a colour of {len(token)} characters; at most {MAX_TOKEN_CHARS}")
    try:
        rgb = ImageColor.getrgb(token)
    except (ValueError, OverflowError, TypeError):
        raise DrawingError(f"line {line_no}: {token!r} is not a colour (a name like 'red' or #rrggbb)") from None
    bad = [c for c in rgb if not (isinstance(c, int) and 0 <= c <= 255)]
    if bad:
        raise DrawingError(f"line {line_no}: colour {token!r} has component {bad[0]}, expected 0..255")
    return tuple(rgb[:3])


def _int(token: str, line_no: int, what: str, lo: int, hi: int) -> int:
    if not _INT.fullmatch(token):
        raise DrawingError(f"line {line_no}: {_token(token)} is not an integer")
    value = int(token) if len(token) <= MAX_TOKEN_CHARS else None
    if value is None or not lo <= value <= hi:
        raise DrawingError(f"line {line_no}: {what}={_shown(token)} is outside {lo}..{hi}")
    return value


def _token(token: str) -> str:
    """Any token as a message quotes it: its repr, cut after ``MAX_TOKEN_CHARS`` characters."""
    return repr(token) if len(token) <= MAX_TOKEN_CHARS else f"{token[:MAX_TOKEN_CHARS]!r}… ({len(token)} characters)"


def _shown(token: str) -> str:
    """A number token as a message names it (a 5,000-digit one cut, with its length)."""
    return token if len(token) <= MAX_TOKEN_CHARS else f"{token[:12]}… ({len(token)} digits)"


def _xy(tokens: list[str], line_no: int, w: int, h: int) -> list[int]:
    """x y pairs within ``COORD_MARGIN`` of a ``w`` × ``h`` canvas."""
    return [_int(t, line_no, "xy"[i % 2], -COORD_MARGIN, (w, h)[i % 2] + COORD_MARGIN) for i, t in enumerate(tokens)]


def parse_drawing(text: str) -> Drawing:
    """Parse a program; the first statement must be ``canvas W H COLOUR``. Any program that is not a bounded
    drawing (see the module's limits) raises :class:`DrawingError` naming the line and the value."""
    if not isinstance(text, str):
        raise DrawingError(f"a program is text, got {type(text).__name__}")
    if len(text) > MAX_PROGRAM_CHARS:
        raise DrawingError(f"a program of {len(text):,} characters; at most {MAX_PROGRAM_CHARS:,}")
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
            raise DrawingError(f"line {no}: unknown statement {_token(op)}; expected one of {', '.join(_ARITY)}")
        if op == "canvas":
            if canvas is not None or shapes:
                raise DrawingError(f"line {no}: 'canvas' must come once, first")
            if len(args) != 3:
                raise DrawingError(f"line {no}: canvas takes width height colour, got {len(args)} arguments")
            for t in args[:2]:
                if not _INT.fullmatch(t):
                    raise DrawingError(f"line {no}: {_token(t)} is not an integer")
            w, h = (int(t) if len(t) <= MAX_TOKEN_CHARS else MAX_SIDE + 1 for t in args[:2])
            if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
                raise DrawingError(f"line {no}: canvas {_shown(args[0])}x{_shown(args[1])} is outside "
                                   f"1..{MAX_SIDE}")
            canvas = (w, h, _color(args[2], no))
            continue
        if canvas is None:
            raise DrawingError(f"line {no}: the program must start with 'canvas W H COLOUR'")
        if len(shapes) >= MAX_SHAPES:
            raise DrawingError(f"line {no}: more than {MAX_SHAPES} shapes")
        w, h = canvas[0], canvas[1]
        if op == "polygon":
            if len(args) < 7 or len(args) % 2 == 0:
                raise DrawingError(f"line {no}: polygon takes a colour and at least 3 x y pairs")
            if (len(args) - 1) // 2 > MAX_POLYGON_POINTS:
                raise DrawingError(f"line {no}: a polygon of {(len(args) - 1) // 2} points; at most "
                                   f"{MAX_POLYGON_POINTS}")
            shapes.append(Shape(op, _color(args[0], no), tuple(_xy(args[1:], no, w, h))))
            continue
        arity = _ARITY[op]
        ok = len(args) in arity if isinstance(arity, tuple) else len(args) == arity
        if not ok:
            raise DrawingError(f"line {no}: {op} takes {arity} arguments, got {len(args)}")
        if op == "line":
            nums = _xy(args[:4], no, w, h)
            width = _int(args[5], no, "width", 1, MAX_LINE_WIDTH) if len(args) == 6 else 1
            shapes.append(Shape(op, _color(args[4], no), tuple(nums), width))
        elif op == "circle":
            nums = _xy(args[:2], no, w, h) + [_int(args[2], no, "radius", 0, MAX_SIZE)]
            shapes.append(Shape(op, _color(args[3], no), tuple(nums)))
        else:  # rect
            nums = _xy(args[:2], no, w, h) + [_int(args[2], no, "width", 1, MAX_SIZE),
                                              _int(args[3], no, "height", 1, MAX_SIZE)]
            shapes.append(Shape(op, _color(args[4], no), tuple(nums)))
    if canvas is None:
        raise DrawingError("empty program: expected 'canvas W H COLOUR' first")
    return Drawing(*canvas, shapes)


def render(drawing: Drawing | str) -> Image.Image:
    """Render with Pillow (``ImageDraw``); a program text is parsed first (and bounded by the parser's limits)."""
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
    """1 − mean absolute RGB difference / 255, after resizing ``a`` to ``b``'s size (nearest). The sum of the
    differences is exact (a histogram), so the value is the same as numpy's ``1 - abs(x - y).mean() / 255``."""
    if a.size != b.size:
        a = a.resize(b.size, Image.NEAREST)
    hist = ImageChops.difference(a.convert("RGB"), b.convert("RGB")).histogram()  # 256 bins per band
    total = sum((i % 256) * n for i, n in enumerate(hist))
    return float(1 - total / (b.width * b.height * 3) / 255)


# ---- rubric items of open-ended tasks -----------------------------------------------------------------------------
RUBRIC_TYPES = ("canvas", "has_shape", "min_shapes", "colors_at_least", "inside", "above")


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


# ---- the grading itself (in the sandboxed child) ------------------------------------------------------------------
def grade_program(task: dict, program: str) -> dict:
    """Grade ``program`` for a task given as data (``kind``, ``threshold``, ``reference``, ``rubric``): the fields
    of a :class:`mimo_kit.envs.visual.VisualGrade` except the task id. Replication: similarity ≥ threshold.
    Open-ended: every rubric item. Unparsable programs score 0."""
    try:
        d = parse_drawing(program)
        img = render(d)
    except DrawingError as e:
        return {"passed": False, "score": 0.0, "details": {}, "reason": f"does not render: {e}"}
    if task["kind"] == "replicate":
        sim = similarity(img, render(task["reference"]))
        ok = sim >= task["threshold"]
        return {"passed": ok, "score": sim, "details": {"similarity": round(sim, 4)},
                "reason": f"similarity {sim:.3f} {'≥' if ok else '<'} threshold {task['threshold']}"}
    items = {it["id"]: check_rubric_item(it, d) for it in task["rubric"]}
    score = sum(items.values()) / max(1, len(items))
    ok = all(items.values())
    failed = [k for k, v in items.items() if not v]
    return {"passed": ok, "score": score, "details": items,
            "reason": "all rubric items hold" if ok else f"fails {failed}"}


def render_program(program: str) -> dict:
    """Render ``program``: its size and its RGB pixels (base64), or the reason it does not render."""
    try:
        img = render(program)
    except DrawingError as e:
        return {"error": str(e)}
    return {"size": list(img.size), "rgb": base64.b64encode(img.tobytes()).decode("ascii")}


def main() -> None:
    """The child: one request on stdin (``{"op": "grade", "task": …, "program": …}`` or ``{"op": "render",
    "program": …}``), one JSON line on stdout (ASCII: a lone surrogate in a message is escaped). A failure the
    parser did not foresee is answered as ``{"crash": …}``, so exit status 1 (an uncaught exception) means the
    child never got here: no Pillow, no Python (the grader's infrastructure, not the agent's program)."""
    try:
        req = json.loads(sys.stdin.buffer.read())
        out = grade_program(req["task"], req["program"]) if req["op"] == "grade" else render_program(req["program"])
    except Exception as e:  # noqa: BLE001 - any failure on the agent's program is its grade's reason
        out = {"crash": f"{type(e).__name__}: {str(e)[:300]}"}
    sys.stdout.write("\n" + json.dumps(out, ensure_ascii=True) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
