"""Weight sync over a torch.distributed group: learner rank 0 broadcasts every tensor to the engines (Report §6).

After each update the learner's new weights must reach every rollout engine. Through a shared folder
(``/update_weights_from_disk``) that costs a write and a read of the whole model per version; SGLang's other path
joins the learner and the engine into a process group of their own and broadcasts the tensors, one collective per
tensor, in an order both sides agree on. The kit speaks that protocol (field names as in SGLang's
``InitWeightsUpdateGroupReqInput`` / ``UpdateWeightsFromDistributedReqInput``):

.. code-block:: text

    learner (rank 0)                                  engine (rank rank_offset .. world_size − 1)
    POST /init_weights_update_group                   joins the group at master_address:master_port
      {master_address, master_port, rank_offset,
       world_size, group_name, backend}      ──────▶  (the learner joins as rank 0 meanwhile)
    POST /update_weights_from_distributed             allocates each tensor, receives the broadcasts in order,
      {names, dtypes, shapes, group_name,    ──────▶  loads them and stamps weight_version
       weight_version}
    broadcast(names[0]), broadcast(names[1]), …

The group is not torch.distributed's default group (a learner under torchrun keeps its own): it is built from its
own ``TCPStore`` at ``master_address:master_port``, so a learner may hold one group per engine and an engine that
dies fails only its own sync. Backends: ``gloo`` (CPU tensors; tested here) and ``nccl`` (CUDA tensors, what SGLang
on GPUs uses). NCCL needs the learner's rank 0 and each engine on GPUs of their own: on one H200 (NCCL 2.28.9) two
members on one device fail at the first broadcast with "Duplicate GPU detected"; a learner and a server sharing a
GPU use ``gloo``.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

#: SGLang's default ``group_name``
DEFAULT_GROUP = "weight_update_group"
#: how long a member waits for the others to join, or for a broadcast (a 9B model over gloo takes minutes)
GROUP_TIMEOUT_S = 600.0
BACKENDS = ("gloo", "nccl")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (how SGLang's requests name dtypes)."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` (or ``"torch.bfloat16"``) → ``torch.bfloat16``; a ValueError naming anything else."""
    got = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(got, torch.dtype):
        raise ValueError(f"dtype {name!r} is not a torch dtype (expected e.g. 'float32' or 'bfloat16')")
    return got


@dataclasses.dataclass
class WeightGroup:
    """A weight-update process group and the store it was built on (rank 0 serves the store: it lives as long)."""

    backend: Any  # torch.distributed's ProcessGroupGloo / ProcessGroupNCCL
    store: Any
    rank: int
    world_size: int

    def broadcast(self, t: torch.Tensor) -> Any:
        """Rank 0's ``t`` into every member's ``t``; the pending work (``wait()``, ``is_completed()``)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        return self.backend.broadcast([t], opts)


def weight_group(master_address: str, master_port: int, rank: int, world_size: int, *,
                 group_name: str = DEFAULT_GROUP, backend: str = "gloo",
                 timeout_s: float = GROUP_TIMEOUT_S) -> WeightGroup:
    """A process group of ``world_size`` members on its own store (rank 0 hosts it at ``master_address:
    master_port``). Blocks until every member has joined or ``timeout_s`` passes."""
    if backend not in BACKENDS:
        raise ValueError(f"weight group backend {backend!r}; expected one of {BACKENDS}")
    if not 0 <= rank < world_size or world_size < 2:
        raise ValueError(f"weight group: rank {rank} of world_size {world_size} (0 ≤ rank < world_size, ≥ 2)")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("weight group backend 'nccl' needs CUDA, which this process does not have; use 'gloo'")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_address, int(master_port), world_size, is_master=rank == 0, timeout=timeout)
    prefixed = dist.PrefixStore(group_name, store)
    if backend == "gloo":
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    else:
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    return WeightGroup(group, store, rank, world_size)


def send(group: WeightGroup, tensors: Sequence[torch.Tensor], *, abandon: Callable[[], bool] = lambda: False,
         poll_s: float = 0.01) -> None:
    """Rank 0: broadcast each tensor in order. ``abandon()`` is polled while a broadcast waits (the engine said it
    will not receive: its request failed); then a RuntimeError instead of waiting out the group's timeout."""
    for t in tensors:
        work = group.broadcast(t)
        while not work.is_completed():
            if abandon():
                raise RuntimeError("weight sync abandoned: the engine refused the update (see its answer)")
            time.sleep(poll_s)
        work.wait()


def receive(group: WeightGroup, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
            device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A receiving rank: one tensor per name, filled by rank 0's broadcasts in the same order."""
    out = {}
    for name, dt, shape in zip(names, dtypes, shapes):
        t = torch.empty(tuple(int(s) for s in shape), dtype=parse_dtype(dt), device=device)
        group.broadcast(t).wait()
        out[name] = t
    return out


def manifest(state_dict: Mapping[str, torch.Tensor]) -> dict[str, list]:
    """The ``names`` / ``dtypes`` / ``shapes`` of an update request, in the order the tensors are broadcast."""
    names = list(state_dict)
    return {"names": names, "dtypes": [dtype_name(state_dict[n].dtype) for n in names],
            "shapes": [list(state_dict[n].shape) for n in names]}
