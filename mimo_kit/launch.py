"""From a notebook cell to a shell command to a ``torchrun`` command line.

A cell holds a config; :func:`shell_command` writes the ``mimo-kit run`` line that reproduces it (only the keys
that differ from the preset); :func:`torchrun_command` wraps the same line for N processes on M nodes. The kit's
training loops run in one process today and do not yet read the ranks ``torchrun`` sets, so that line starts
independent copies; sharded multi-process training (FSDP2) is planned.
"""

from __future__ import annotations

import shlex

from mimo_kit.config.base import Config, ConfigError


def _format(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format(v) for v in value) + "]"
    return str(value)


def shell_command(experiment: str, cfg: Config, preset: str = "tiny") -> str:
    """``mimo-kit run EXPERIMENT --preset P key=value ...`` for the keys where ``cfg`` departs from the preset."""
    base = type(cfg).preset(preset)
    args = [f"{k}={_format(v)}" for k, v in cfg.diff(base).items()]
    return shlex.join(["mimo-kit", "run", experiment, "--preset", preset, *args])


def torchrun_command(experiment: str, cfg: Config, preset: str = "tiny", *, nproc_per_node: int = 8,
                     nnodes: int = 1, rdzv_endpoint: str = "$MASTER_ADDR:29500") -> str:
    """The same run under ``torchrun``: ``nnodes × nproc_per_node`` processes, rendezvous at ``rdzv_endpoint``."""
    if nproc_per_node < 1 or nnodes < 1:
        raise ConfigError(f"torchrun_command: nproc_per_node={nproc_per_node}, nnodes={nnodes}; expected >= 1")
    run = shell_command(experiment, cfg, preset).split(" ", 1)[1]  # drop the console-script name
    head = f"torchrun --nnodes={nnodes} --nproc-per-node={nproc_per_node}"
    if nnodes > 1:
        head += f" --rdzv-backend=c10d --rdzv-endpoint={rdzv_endpoint}"
    return f"{head} -m mimo_kit.cli {run}"
