"""Progress bars for the kit's long loops that never end up half-drawn in a committed notebook.

A tqdm bar in a notebook is a widget: a person running the chapter sees it move, but a headless execution (``mimo-kit
notebooks``, ``mimo-kit course``, the test suite's kernels, ``mimo-kit grade``) stores only the widget's text at the
moment it was displayed, "0/300", and that is what a committed notebook would show. :func:`bar` is tqdm with the
bar switched off where no one watches it.

>>> for step in bar(range(100), desc="SFT", leave=False): ...

``MIMO_KIT_PROGRESS=0`` (or ``1``) forces bars off (or on) everywhere.
"""

from __future__ import annotations

import os

#: Environment variable that forces bars on ("1") or off ("0"); unset: :func:`interactive` decides.
PROGRESS_ENV = "MIMO_KIT_PROGRESS"


def interactive() -> bool:
    """Whether someone can watch a bar: ``$MIMO_KIT_PROGRESS`` when set, else False in a notebook kernel whose
    current request cannot take input (a headless client: nbclient, which the kit's notebook runners use, sends
    every cell with ``allow_stdin=False``; JupyterLab and VS Code allow it), True everywhere else (a terminal, a
    script, a kernel a person drives)."""
    forced = os.environ.get(PROGRESS_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    try:
        from IPython import get_ipython
    except ImportError:
        return True
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None) if shell is not None else None
    if kernel is None:  # a terminal IPython, or no IPython at all
        return True
    return bool(getattr(kernel, "_allow_stdin", True))


def bar(iterable=None, *, disable: bool = False, **kwargs):
    """``tqdm.auto.tqdm(iterable, **kwargs)``, disabled when ``disable`` or when no one is watching
    (:func:`interactive`)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=disable or not interactive(), **kwargs)
