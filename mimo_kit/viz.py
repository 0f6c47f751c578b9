"""The figures every chapter shares: one style, smoothed curves, bars, heatmaps, saved when headless.

In JupyterLab figures show inline. When ``MIMO_KIT_FIG_DIR`` is set (``mimo-kit course`` sets it) or no display
is present, :func:`finish` also writes each figure as a PNG there, named after the figure.
"""

from __future__ import annotations

import os
import re
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
    ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))  # 100000 → 100k
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if len(series) > 1:
        ax.legend()
    return ax


def bars(values: Mapping[str, float], *, title: str = "", ylabel: str = "", annotate: bool = True,
         logy: bool = False, ax=None):
    """A bar per named value, labelled with its value."""
    ax = ax or plt.subplots()[1]
    names, vals = list(values), [float(v) for v in values.values()]
    rects = ax.bar(names, vals, color=[PALETTE[i % len(PALETTE)] for i in range(len(names))])
    if annotate:
        ax.bar_label(rects, labels=[f"{v:.3g}" for v in vals], fontsize=8)
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, ylabel=ylabel)
    ax.grid(axis="x", visible=False)
    return ax


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


def fig_dir() -> Path | None:
    """Where figures are saved: ``MIMO_KIT_FIG_DIR``, or ``runs/figures`` when running headless, else None."""
    if os.environ.get("MIMO_KIT_FIG_DIR"):
        return Path(os.environ["MIMO_KIT_FIG_DIR"])
    if matplotlib.get_backend().lower() == "agg":
        return Path("runs/figures")
    return None


def finish(fig=None, name: str | None = None) -> Path | None:
    """Lay out ``fig`` (default: the current figure) and save it as PNG when running headless.

    Returns the saved path, or None when only shown inline.
    """
    fig = fig or plt.gcf()
    fig.tight_layout()
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
