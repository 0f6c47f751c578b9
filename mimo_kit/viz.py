"""The figures every chapter shares: one style, smoothed curves, bars, heatmaps, saved when headless.

In JupyterLab figures show inline. When ``MIMO_KIT_FIG_DIR`` is set (``mimo-kit course`` sets it) or no display
is present, :func:`finish` also writes each figure as a PNG there, named after the figure. :func:`finish` also
rotates x tick labels that would overlap (:func:`declutter_ticks`), and :func:`bars` wraps long category names.
"""

from __future__ import annotations

import os
import re
import textwrap
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

#: The kit's palette: one colour per compared variant, in order, colour-blind safe (Okabe–Ito).
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]

STYLE = {
    "figure.figsize": (6.4, 3.6), "figure.dpi": 100, "savefig.dpi": 120, "savefig.bbox": "tight",
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE), "axes.titlesize": 11, "axes.titleweight": "bold",
    "legend.frameon": False, "font.size": 10,
}


def use_style() -> None:
    """Apply the kit's figure style (every chapter calls it once, through ``mimo_kit.nb.start``)."""
    matplotlib.rcParams.update(STYLE)


def smooth(values: Sequence[float], weight: float = 0.8) -> np.ndarray:
    """Debiased exponential moving average, as TensorBoard draws it: s_t = w·s_{t-1} + (1−w)·x_t, / (1 − w^t)."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smooth: weight={weight}; expected 0 <= weight < 1")
    x = np.asarray(values, dtype=float)
    out = np.empty_like(x)
    s = 0.0
    for t, v in enumerate(x):
        s = weight * s + (1 - weight) * v
        out[t] = s / (1 - weight ** (t + 1))
    return out


def _tick(x: float, pos=None) -> str:
    """A tick label: plain below 1,000 (0.5, 250), an SI prefix from 1,000 on (1.5k, 100k, 2M)."""
    if abs(x) < 1000:
        return f"{x:g}"
    return _ENG(x, pos)


_ENG = matplotlib.ticker.EngFormatter(sep="")

#: The x tick formatter of :func:`curves` and :func:`band_curves`: 0.5 stays "0.5" (an SI formatter alone would
#: write "500m"), 100000 becomes "100k".
TICKS = matplotlib.ticker.FuncFormatter(_tick)


def curves(series: Mapping[str, Sequence[float] | tuple[Sequence[float], Sequence[float]]], *, title: str = "",
           xlabel: str = "step", ylabel: str = "", smoothing: float = 0.0, logy: bool = False, ax=None):
    """One line per named series; a series is ``y`` or ``(x, y)``. With smoothing the raw line stays faint."""
    ax = ax or plt.subplots()[1]
    for i, (name, s) in enumerate(series.items()):
        x, y = (s if isinstance(s, tuple) else (np.arange(len(s)), s))
        color = PALETTE[i % len(PALETTE)]
        if smoothing > 0:
            ax.plot(x, y, color=color, alpha=0.25, lw=1)
            ax.plot(x, smooth(y, smoothing), color=color, label=name, lw=1.8)
        else:
            ax.plot(x, y, color=color, label=name, lw=1.8)
    if logy:
        ax.set_yscale("log")
    ax.xaxis.set_major_formatter(TICKS)  # 100000 → 100k, 0.5 → 0.5
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if len(series) > 1:
        ax.legend()
    return ax


#: Opacity of the band :func:`band_curves` shades: the lines stay readable where the bands of several arms overlap.
BAND_ALPHA = 0.2


def _ffill(y: np.ndarray) -> np.ndarray:
    """NaN steps carry the last finite value (leading NaNs take the first), so smoothing does not turn NaN for
    good; an all-NaN series is returned as is."""
    y = np.array(y, dtype=float)
    finite = np.isfinite(y)
    if not finite.any():
        return y
    idx = np.where(finite, np.arange(len(y)), 0)
    np.maximum.accumulate(idx, out=idx)
    out = y[idx]
    out[: np.argmax(finite)] = y[np.argmax(finite)]
    return out


def seed_band(runs: Sequence[Sequence[float]], *, smoothing: float = 0.0,
              band: str = "minmax") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, low, high)`` per step over the seeds' series (each smoothed first when ``smoothing`` > 0;
    truncated to the shortest). ``band``: ``"minmax"`` (the seeds' range) or ``"sd"`` (mean ± sample std)."""
    if band not in ("minmax", "sd"):
        raise ValueError(f"seed_band: band={band!r}; expected 'minmax' or 'sd'")
    if not runs:
        raise ValueError("seed_band: no series (expected one per seed)")
    n = min(len(r) for r in runs)
    rows = [np.asarray(r[:n], dtype=float) for r in runs]
    if smoothing > 0:
        rows = [smooth(_ffill(r), smoothing) for r in rows]
    m = np.vstack(rows)
    with warnings.catch_warnings():  # an all-NaN step stays NaN (nothing to draw there)
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(m, axis=0)
        if band == "minmax":
            return mean, np.nanmin(m, axis=0), np.nanmax(m, axis=0)
        sd = np.nanstd(m, axis=0, ddof=1) if len(rows) > 1 else np.zeros(n)
    return mean, mean - sd, mean + sd


def band_curves(series: Mapping[str, Sequence[Sequence[float]]], *, title: str = "", xlabel: str = "step",
                ylabel: str = "", smoothing: float = 0.0, band: str = "minmax", ax=None):
    """Per named variant, the mean over seeds as a line and the seeds' min–max (``band="sd"``: ± sample std) as a
    shaded band; ``series[name]`` holds one per-step series per seed. The legend says the seed count and the band."""
    ax = ax or plt.subplots()[1]
    n_seeds = set()
    for i, (name, runs) in enumerate(series.items()):
        mean, lo, hi = seed_band(runs, smoothing=smoothing, band=band)
        x = np.arange(1, len(mean) + 1)
        color = PALETTE[i % len(PALETTE)]
        ax.fill_between(x, lo, hi, color=color, alpha=BAND_ALPHA, lw=0)
        ax.plot(x, mean, color=color, label=name, lw=1.8)
        n_seeds.add(len(runs))
    ax.xaxis.set_major_formatter(TICKS)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    what = "min–max" if band == "minmax" else "± sd"
    n = n_seeds.pop() if len(n_seeds) == 1 else "/".join(str(k) for k in sorted(n_seeds))
    ax.legend(title=f"mean of {n} seeds, band {what}", title_fontsize=8, fontsize=8)
    return ax


def bars(values: Mapping[str, float], *, title: str = "", ylabel: str = "", annotate: bool = True,
         logy: bool = False, ranges: Mapping[str, tuple[float, float]] | None = None, ax=None):
    """A bar per named value, labelled with its value; ``ranges[name] = (low, high)`` adds a whisker (e.g. the
    min–max over seeds around their mean).

    The value labels stay inside the axes (the y range gets room for them above the bars, and below where a bar is
    negative), so they never run into the title; labels that would overlap their neighbours are written with fewer
    digits, then turned upright (:func:`_fit_bar_labels`)."""
    ax = ax or plt.subplots()[1]
    names, vals = list(values), [float(v) for v in values.values()]
    yerr = None
    if ranges is not None:
        yerr = np.array([[max(v - ranges[k][0], 0.0) for k, v in zip(names, vals)],
                         [max(ranges[k][1] - v, 0.0) for k, v in zip(names, vals)]])
    rects = ax.bar(names, vals, color=[PALETTE[i % len(PALETTE)] for i in range(len(names))], yerr=yerr,
                   capsize=4 if yerr is not None else 0, ecolor="#444444")
    wrapped = [wrap_label(n) if isinstance(n, str) else n for n in names]
    if wrapped != names:  # long category names: one tick per bar, the name on several lines
        ax.set_xticks([r.get_x() + r.get_width() / 2 for r in rects], wrapped)
    if logy:
        ax.set_yscale("log")
    if annotate:
        labels = ax.bar_label(rects, labels=[f"{v:.3g}" for v in vals], fontsize=8, padding=2)
        if not logy:
            lo = min([0.0, *vals] + ([v - e for v, e in zip(vals, yerr[0])] if yerr is not None else []))
            hi = max([0.0, *vals] + ([v + e for v, e in zip(vals, yerr[1])] if yerr is not None else []))
            room = BAR_LABEL_ROOM * ((hi - lo) or 1.0)
            ax.set_ylim(lo - room if min(vals) < 0 else lo, hi + room)
        _fit_bar_labels(ax, labels, vals)
        ax._mimo_bar_labels = labels  # finish() keeps them inside the axes after the final layout
        _labels_inside(ax, labels)
    ax.set(title=title, ylabel=ylabel)
    ax.grid(axis="x", visible=False)
    return ax


#: Share of a bar chart's value range added above (and below, with negative bars) for the value labels.
BAR_LABEL_ROOM = 0.15


def _labels_inside(ax, labels, tries: int = 4) -> None:
    """Widen ``ax``'s y range until every text of ``labels`` lies inside the axes (a linear y axis)."""
    if ax.get_yscale() != "linear":
        return
    renderer = ax.figure.canvas.get_renderer()
    for _ in range(tries):
        box = ax.get_window_extent(renderer)
        ext = [t.get_window_extent(renderer) for t in labels if t.get_text()]
        over = max([0.0, *(b.y1 - box.y1 for b in ext)])
        under = max([0.0, *(box.y0 - b.y0 for b in ext)])
        if over <= 0 and under <= 0:
            return
        lo, hi = ax.get_ylim()
        per_px = (hi - lo) / max(box.height, 1.0)
        ax.set_ylim(lo - (under + 3) * per_px if under > 0 else lo, hi + (over + 3) * per_px if over > 0 else hi)


def _fit_bar_labels(ax, labels, vals: Sequence[float]) -> None:
    """Bar value labels that overlap a neighbour as drawn: two significant digits, and if that is not enough, turned
    upright."""
    renderer = ax.figure.canvas.get_renderer()

    def clash() -> bool:  # any two labels' boxes meet, widened by 2 px
        boxes = [t.get_window_extent(renderer).expanded(1.0, 1.0).padded(1.0) for t in labels]
        return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])

    if len(labels) < 2 or not clash():
        return
    for t, v in zip(labels, vals):
        t.set_text(f"{v:.2g}")
    if clash():
        for t in labels:
            t.set_rotation(90)


#: Category names longer than this many characters are wrapped onto several lines by :func:`wrap_label`.
WRAP_CHARS = 14

#: The least angle (degrees) :func:`declutter_ticks` turns overlapping x tick labels by.
TICK_ROTATION = 30


def wrap_label(name: str, width: int = WRAP_CHARS) -> str:
    """``name`` wrapped at word boundaries onto lines of at most ``width`` characters (a longer word stays whole)."""
    if width < 1:
        raise ValueError(f"wrap_label: width={width}; expected >= 1")
    return textwrap.fill(str(name), width, break_long_words=False, break_on_hyphens=False) or str(name)


def _overlapping(labels, renderer, pad: float = 2.0) -> bool:
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    return any(a.x1 + pad > b.x0 for a, b in zip(boxes, boxes[1:]))


def rotation_needed(labels, renderer, *, least: float = TICK_ROTATION, gap: float = 1.3) -> float:
    """The smallest angle (a multiple of 15°, at least ``least``, at most 90°) at which neighbouring labels,
    turned about their tick, sit ``gap`` label heights apart: ``spacing · sin(angle) ≥ gap · height`` (a wrapped
    label is as high as its lines)."""
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    centres = [(b.x0 + b.x1) / 2 for b in boxes]
    spacing = min((b - a for a, b in zip(centres, centres[1:])), default=0.0)
    height = max(t.get_fontsize() * t.figure.dpi / 72 * (t.get_text().count("\n") + 1) for t in labels)
    if spacing <= 0:
        return 90.0
    angle = np.degrees(np.arcsin(min(1.0, gap * height / spacing)))
    return float(min(90.0, max(least, 15.0 * np.ceil(angle / 15.0))))


def declutter_ticks(ax, rotation: float | None = None, *, draw: bool = True) -> float:
    """When any two of ``ax``'s x tick labels overlap as drawn, turn them all, right-aligned at their tick, by
    ``rotation`` degrees (default: :func:`rotation_needed`, at least :data:`TICK_ROTATION`); return the angle
    turned by, 0.0 when nothing overlapped. Labels already rotated by the caller are left alone. ``draw=False``
    skips drawing the figure first (the caller just drew it)."""
    fig = ax.figure
    if draw:
        fig.canvas.draw()
    lo, hi = sorted(ax.get_xlim())
    labels = [t for t in ax.get_xticklabels()
              if t.get_visible() and t.get_text() and lo <= ax.xaxis.convert_units(t.get_position()[0]) <= hi]
    if len(labels) < 2 or any(t.get_rotation() for t in labels):
        return 0.0
    renderer = fig.canvas.get_renderer()
    if not _overlapping(labels, renderer):
        return 0.0
    angle = rotation_needed(labels, renderer) if rotation is None else float(rotation)
    ax.tick_params(axis="x", labelrotation=angle)
    for t in ax.get_xticklabels():
        t.set_horizontalalignment("right")
        t.set_rotation_mode("anchor")
    return angle


def heatmap(matrix, *, title: str = "", xlabel: str = "", ylabel: str = "", cmap: str = "viridis",
            colorbar: bool = True, ax=None, **imshow_kwargs):
    """A matrix as an image (attention maps, masks, expert loads per layer)."""
    ax = ax or plt.subplots()[1]
    m = np.asarray(matrix.detach().cpu() if hasattr(matrix, "detach") else matrix, dtype=float)
    im = ax.imshow(m, cmap=cmap, aspect="auto", interpolation="nearest", **imshow_kwargs)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(False)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def png_bytes(fig, dpi: int | None = 110) -> bytes:
    """The figure as PNG bytes (a published figure's file content; ``dpi`` None: matplotlib's setting); the figure
    is closed."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", **({"dpi": dpi} if dpi else {}))
    plt.close(fig)
    return buf.getvalue()


def fig_dir() -> Path | None:
    """Where figures are saved: ``MIMO_KIT_FIG_DIR``, or ``runs/figures`` when running headless, else None."""
    if os.environ.get("MIMO_KIT_FIG_DIR"):
        return Path(os.environ["MIMO_KIT_FIG_DIR"])
    if matplotlib.get_backend().lower() == "agg":
        return Path("runs/figures")
    return None


def finish(fig=None, name: str | None = None) -> Path | None:
    """Lay out ``fig`` (default: the current figure), rotate overlapping x tick labels, and save it as PNG when
    running headless.

    Returns the saved path, or None when only shown inline.
    """
    fig = fig or plt.gcf()
    fig.tight_layout()
    fig.canvas.draw()
    if any([declutter_ticks(ax, draw=False) for ax in fig.axes]):
        fig.tight_layout()
    for ax in fig.axes:  # the final layout may have shrunk an axes: its bar labels must still fit inside
        if getattr(ax, "_mimo_bar_labels", None):
            _labels_inside(ax, ax._mimo_bar_labels)
    out = fig_dir()
    if out is None:
        return None
    if name is None:
        title = fig._suptitle.get_text() if fig._suptitle else (fig.axes[0].get_title() if fig.axes else "")
        name = title or f"figure-{fig.number}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / (re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-").lower() + ".png")
    fig.savefig(path)
    return path
