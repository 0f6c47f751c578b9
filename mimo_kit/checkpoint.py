"""Writing run state so that a long job never loses finished work."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any

import torch


def atomic_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` to ``path`` through a temporary file and a rename: a kill mid-write leaves the previous
    file intact, never a half-written one. The temporary name is the writer's own (pid and thread), so two
    processes saving the same file at once each rename a whole file."""
    import os
    import threading

    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}-{threading.get_ident()}")
    torch.save(obj, tmp)
    tmp.replace(path)
    return path


# ---- sharded checkpoints (torch.distributed.checkpoint) ---------------------------------------------------------
#
# A sharded checkpoint is a folder: ``weights/`` holds the model and optimiser state written by
# ``torch.distributed.checkpoint`` (each rank writes its own shards plus a global metadata file that records every
# tensor's full shape and which rank wrote which piece), and ``trainer.pt`` holds the loop's own state (step, log,
# data position, RNG) written by rank 0. Loading reads the metadata and fetches the pieces this process needs for
# *its* layout, so a checkpoint written by 2 processes loads into 1 (plain tensors) and the reverse.


def optimizer_parts(opt: Any) -> list[torch.optim.Optimizer]:
    """The torch optimisers inside ``opt``: the parts of an :class:`~mimo_kit.optim.build.OptimizerSet` or itself."""
    return list(opt.parts.values()) if hasattr(opt, "parts") else [opt]


def _materialize(opts: list[torch.optim.Optimizer]) -> None:
    """Create every optimiser's state (a template to load into) without moving any weight: one step with zero
    gradients and every learning rate at 0 (Muown's ``lr_norm`` too), then the rates and gradients restored."""
    params = [p for opt in opts for g in opt.param_groups for p in g["params"]]
    if all(opt.state for opt in opts) or any(p.grad is not None for p in params):
        return
    for p in params:
        p.grad = torch.zeros_like(p)
    saved = [[{k: g[k] for k in ("lr", "lr_norm") if k in g} for g in opt.param_groups] for opt in opts]
    for opt in opts:
        for g in opt.param_groups:
            for k in ("lr", "lr_norm"):
                if k in g:
                    g[k] = 0.0 if not isinstance(g[k], torch.Tensor) else torch.zeros_like(g[k])
    snapshot = [p.detach().clone() for p in params]
    for opt in opts:
        opt.step()
    with torch.no_grad():
        for p, s in zip(params, snapshot):
            p.copy_(s)  # a zero-lr step may still renormalise (Muown recomposes W): put every weight back
    for opt, groups in zip(opts, saved):
        for g, keep in zip(opt.param_groups, groups):
            g.update(keep)
        opt.zero_grad(set_to_none=True)


@contextlib.contextmanager
def _one_process_ok():
    """Silence DCP's notice that it runs without a process group: a world of one is a supported layout here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_sharded(folder: str | Path, model: torch.nn.Module, opt: Any, extra: dict[str, Any], *,
                 is_main: bool = True) -> Path:
    """Write ``folder`` (model + optimiser through torch.distributed.checkpoint, ``trainer.pt`` from rank 0).

    Every rank calls it (a collective when the model is sharded). The folder is written under ``folder.tmp`` and
    renamed when complete, so a kill mid-write leaves the previous checkpoint as the newest one.
    """
    import shutil

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    if is_main and tmp.exists():
        shutil.rmtree(tmp)
    if dist.is_initialized():
        dist.barrier()
    msd, osd = get_state_dict(model, optimizer_parts(opt))
    with _one_process_ok():
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / "weights"))
    if is_main:
        torch.save(extra, tmp / "trainer.pt")
    if dist.is_initialized():
        dist.barrier()
    if is_main:
        if folder.exists():
            shutil.rmtree(folder)
        tmp.replace(folder)
    if dist.is_initialized():
        dist.barrier()
    return folder


def load_sharded(folder: str | Path, model: torch.nn.Module, opt: Any) -> dict[str, Any]:
    """Load a :func:`save_sharded` folder into ``model`` and ``opt`` (any process count); returns ``trainer.pt``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = Path(folder)
    if not (folder / "weights" / ".metadata").is_file() or not (folder / "trainer.pt").is_file():
        raise FileNotFoundError(f"{folder} is not a complete sharded checkpoint (expected weights/.metadata and "
                                "trainer.pt)")
    parts = optimizer_parts(opt)
    _materialize(parts)
    msd, osd = get_state_dict(model, parts)
    state = {"model": msd, "optim": osd}
    with _one_process_ok():
        dcp.load(state, checkpoint_id=str(folder / "weights"))
    set_state_dict(model, parts, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return torch.load(folder / "trainer.pt", weights_only=False)
