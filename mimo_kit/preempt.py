"""Stopping a long job for a requeue: a stop request, a checkpoint at the end of the step, an exit Slurm can requeue.

A Slurm job learns that it must go before its time limit from the signal ``sbatch --signal=B:USR1@S`` asks for
(or, where the cluster sets ``SlurmctldParameters=preempt_send_user_signal``, before it is preempted). The ``B:``
sends it to the batch shell only: sent to the job step it would reach ``torchrun``, which dies of a ``SIGUSR1`` it
does not handle (the signals it does handle it passes to its workers, and kills them 30 s later), so the workers
would never reach the end of their step. The batch shell of :func:`mimo_kit.launch.sbatch_script` relays it: its
trap creates the file named by ``$MIMO_KIT_STOP_FILE`` in the run folder, which every node sees.

A run inside :class:`StopRequest` asks at the end of each step (:meth:`StopRequest.agreed`) whether that file
exists or this process got ``SIGUSR1`` itself (a run started without ``torchrun``: ``kill -USR1 PID``); the ranks
agree through one all-reduce, so all of them stop after the same step. The run then writes its checkpoint, and
:meth:`StopRequest.leave` records ``stopped.json`` (the step, the checkpoint) beside the stop file, or in the run's
folder when no stop file is named, and raises :class:`Stopped`, a ``SystemExit`` with status :data:`REQUEUE_EXIT`.
The batch shell requeues the job when ``stopped.json`` is there (``scontrol requeue``); the requeued job runs the
same script and resumes from that checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import torch

from mimo_kit.dist import Dist

#: the environment variable that names the stop file: its appearance asks the run to stop after the current step
STOP_FILE_ENV = "MIMO_KIT_STOP_FILE"
#: the record a stopped run leaves once its checkpoint is written; the batch shell requeues the job on seeing it
STOPPED_NAME = "stopped.json"
#: exit status of a run that stopped on request with its checkpoint written: sysexits' EX_TEMPFAIL, "try again"
REQUEUE_EXIT = 75
#: the signal a process takes as a stop request (Slurm's --signal of the generated script)
STOP_SIGNAL = signal.SIGUSR1


class Stopped(SystemExit):
    """The run stopped on request after ``step`` of ``steps`` steps, its checkpoint in ``checkpoint``; exit status
    :data:`REQUEUE_EXIT` (``mimo-kit run`` exits with it)."""

    def __init__(self, step: int, steps: int, checkpoint: Path):
        super().__init__(REQUEUE_EXIT)
        self.step, self.steps, self.checkpoint = step, steps, checkpoint

    def __str__(self) -> str:
        return f"stopped on request after step {self.step} of {self.steps}; checkpoint in {self.checkpoint}"


class StopRequest:
    """A stop request for the run in ``folder``: the file named by ``$MIMO_KIT_STOP_FILE`` or ``SIGUSR1`` (caught
    while the block runs, on the main thread only; the previous handler comes back after)."""

    def __init__(self, folder: str | Path, d: Dist | None = None):
        self.d = d or Dist()
        named = os.environ.get(STOP_FILE_ENV, "").strip()
        self.file = Path(named) if named else None
        self.record = (self.file.parent if self.file else Path(folder)) / STOPPED_NAME
        self.signalled = False
        self._previous = None
        self._refused = False  # said once that a run without checkpoints goes on

    def __enter__(self) -> StopRequest:
        if self.d.is_main:  # an earlier stop's record: this run has resumed from it
            self.record.unlink(missing_ok=True)
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(STOP_SIGNAL, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(STOP_SIGNAL, self._previous)
            self._previous = None

    def _on_signal(self, signum, frame) -> None:
        self.signalled = True

    def requested(self) -> bool:
        """This process's view: the signal came, or the stop file exists."""
        return self.signalled or (self.file is not None and self.file.exists())

    def agreed(self, resumable: bool = True) -> bool:
        """Whether any rank saw a request: every rank calls it at the same point and gets the same answer.

        A run that keeps no checkpoints (``resumable`` false) could not resume after stopping: it says so once and
        goes on (every rank takes this branch alike, so no collective is needed)."""
        if not resumable:
            if self.d.is_main and not self._refused and self.requested():
                self._refused = True
                print("stop requested, but this run keeps no checkpoints (checkpoint_every=0) and could not resume: "
                      "it goes on", file=sys.stderr, flush=True)
            return False
        return bool(self.d.all_reduce_max(torch.tensor([float(self.requested())])).item())

    def leave(self, step: int, steps: int, checkpoint: str | Path) -> None:
        """Record the stop and raise :class:`Stopped` on every rank. Called once the checkpoint is complete
        (:func:`mimo_kit.checkpoint.save_sharded` returns after its last barrier); rank 0 writes the record
        through a temporary file and a rename, so the batch shell never reads half of it."""
        if self.d.is_main:
            text = json.dumps({"step": step, "steps": steps, "checkpoint": str(Path(checkpoint).absolute())})
            tmp = self.record.with_name(f"{self.record.name}.tmp{os.getpid()}")
            tmp.write_text(text + "\n")
            tmp.replace(self.record)
            print(f"stop requested: checkpoint of step {step}/{steps} in {checkpoint}; exit {REQUEUE_EXIT} "
                  "(a requeued job resumes from it)", file=sys.stderr, flush=True)
        raise Stopped(step, steps, Path(checkpoint))
