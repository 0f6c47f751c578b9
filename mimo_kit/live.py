"""Live metrics: every training loop's scalars as TensorBoard event files under its run folder.

Pre-training, the SFT warm start, RL and drafter training each keep their own log (``metrics.jsonl``, the
checkpointed ``log``) and, beside it, write each step's scalars to ``RUN/tb/<loop>/`` through PyTorch's
``SummaryWriter``, so a job on a cluster is watched the way its users already watch jobs
(``tensorboard --logdir RUN/tb``); the TRL paths (``distill-sft``) use TRL's own ``report_to="tensorboard"``
(``RUN/trainer/runs/``). Only the main rank writes, and flushes every ``FLUSH_S`` seconds. A killed process may
lose its last unflushed events, so a resumed run purges the folder's earlier events and replays the steps its
checkpoint kept (the loop's own log is the record), then goes on: every step shows once.
:func:`read_scalars` reads a folder's events back.

Progress bars: :func:`progress_bar` is tqdm with the bar switched off where no one watches it. A tqdm bar in a
notebook is a widget: a person running the chapter sees it move, but a headless execution (``mimo-kit notebooks``,
``mimo-kit course``, the test suite's kernels, ``mimo-kit grade``) stores only the widget's text at the moment it was
displayed, "0/300", and a committed notebook would show that. ``MIMO_KIT_PROGRESS=0`` (or ``1``) forces bars off
(or on) everywhere.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

#: the sub-folder of a run folder that holds the event files
TB_DIR = "tb"
#: seconds between flushes to disk: what a watcher lags behind (PyTorch's default is 120)
FLUSH_S = 10


class LiveLog:
    """Scalars of one loop to ``out_dir/tb/<loop>/``; a no-op when ``enabled`` is false (a rank other than 0, or
    a loop run without a folder). ``replay``: a resumed run's ``(step, scalars)`` so far, from its checkpoint; the
    folder's earlier event files are removed and these written in their place. (TensorBoard's own ``purge_step``
    is not enough: readers order event files by name, a timestamp in seconds then the host and pid, so a killed
    process's file from the same second can sort after the resumed one's and its steps would show twice.)"""

    def __init__(self, out_dir: str | Path | None, loop: str, *, enabled: bool = True,
                 replay: Iterable[tuple[int, Mapping[str, object]]] | None = None):
        self.writer = None
        if out_dir is None or not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.path = Path(out_dir) / TB_DIR / loop
        if replay is not None:
            for old in self.path.glob("events.out.tfevents.*"):
                old.unlink()
        self.writer = SummaryWriter(log_dir=str(self.path), flush_secs=FLUSH_S)
        for step, values in replay or ():
            self.scalars(step, values)

    def scalars(self, step: int, values: Mapping[str, object], prefix: str = "") -> None:
        """Every finite number of ``values`` at ``step`` (a list is logged as its mean: per-layer load CVs)."""
        if self.writer is None:
            return
        for key, v in values.items():
            if isinstance(v, (list, tuple)):
                nums = [x for x in v if isinstance(x, (int, float)) and not isinstance(x, bool)]
                v = sum(nums) / len(nums) if nums else None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            self.writer.add_scalar(f"{prefix}{key}", float(v), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def __enter__(self) -> LiveLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of the event files under ``folder`` (one loop's folder, e.g. ``RUN/tb/rl``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


#: the scalars ``mimo-kit runs`` shows of a loop, when it logs them
SHOWN = ("loss", "val_loss", "pass_rate", "reward", "train/loss", "acc/1")


def list_runs(root: str | Path = "runs") -> list[dict]:
    """Every loop folder under ``root`` that holds event files (``…/tb/<loop>/``), newest first: its run folder,
    the loop, its last step and the last values of the :data:`SHOWN` scalars it logs. ``mimo-kit runs`` prints it."""
    folders = {p.parent for p in Path(root).rglob("events.out.tfevents.*")}
    rows = []
    for folder in sorted(folders, key=lambda f: max(p.stat().st_mtime for p in f.iterdir()), reverse=True):
        scalars = read_scalars(folder)
        if not scalars:
            continue
        run = folder.parent.parent if folder.parent.name == TB_DIR else folder
        last = {tag: events[-1] for tag, events in scalars.items()}
        rows.append({"run": str(run), "loop": folder.name if folder.parent.name == TB_DIR else "trl",
                     "step": max(step for step, _ in last.values()),
                     **{tag: f"{last[tag][1]:.4g}" for tag in SHOWN if tag in last}})
    return rows


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


def progress_bar(iterable=None, *, disable: bool = False, **kwargs):
    """``tqdm.auto.tqdm(iterable, **kwargs)``, disabled when ``disable`` or when no one is watching
    (:func:`interactive`)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=disable or not interactive(), **kwargs)
