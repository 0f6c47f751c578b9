"""Where a training loop runs: device, precision, process group, FSDP2 sharding, activation checkpointing.

Every loop of the kit (pre-training, drafter, SFT, RL learner) calls the same few functions, so that one config
runs in a notebook cell on a laptop CPU, on one GPU, and under ``torchrun`` on many processes and nodes:

- :func:`resolve_device` / :func:`resolve_precision`: ``device="auto"`` is CUDA when there is one, else the CPU;
  ``precision="auto"`` is bf16 on CUDA and fp32 on the CPU (a CPU run computes exactly what it always did).
- :func:`autocast`: bf16 *compute* while the parameters, their gradients and the optimiser state stay fp32. The
  report keeps FP32 master weights and FP32 optimiser (Muown) state (Report §3); autocast runs the matmuls in
  bf16 and the optimiser steps the fp32 copy, which is that recipe without a separate master copy.
- :func:`init_distributed` reads what ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, the rendezvous
  in ``MASTER_ADDR``/``MASTER_PORT``) and opens the process group: NCCL on GPUs, gloo on CPUs. Without
  ``torchrun`` it is a world of one and opens nothing (unless ``fsdp="on"`` asks for a one-process group).
- :func:`shard_model`: FSDP2 (``torch.distributed.fsdp.fully_shard``) on every decoder layer, then on the root,
  so each rank holds 1/world of every parameter, gradient and optimiser state (dim-0 shards, ``DTensor``); a
  layer's full weights exist only while it runs (all-gather before, reduce-scatter of gradients after).
- :func:`data_slice`: data parallelism: every rank draws the same global batch and keeps its own rows, so a run
  on W processes trains on exactly the batches of a run on one, and FSDP's gradient average over ranks equals the
  one-process gradient whenever each rank's loss is normalised by global counts (equal rows here; token weights
  of the whole batch in the RL learner, :func:`mimo_kit.rl.aggregation.token_weights`).
- :func:`checkpointed_layers`: activation checkpointing as a switch: each decoder layer's activations are dropped
  after the forward and recomputed in the backward (memory of one layer instead of all, ~1/3 more compute).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from mimo_kit.config.base import ConfigError

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")
FSDP_MODES = ("auto", "on", "off")


def check_device_knobs(owner: str, device: str, precision: str, fsdp: str = "auto") -> None:
    """ConfigError naming the bad value of a loop's ``device`` / ``precision`` / ``fsdp`` knob."""
    if device not in DEVICES and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ConfigError(f"{owner}.device={device!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if precision not in PRECISIONS:
        raise ConfigError(f"{owner}.precision={precision!r}; expected one of {PRECISIONS}")
    if fsdp not in FSDP_MODES:
        raise ConfigError(f"{owner}.fsdp={fsdp!r}; expected one of {FSDP_MODES}")


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` → ``cuda`` when available, else ``cpu``; asking for CUDA on a machine without it raises."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r}, but this machine has no CUDA device (torch {torch.__version__}); "
                          "use device=cpu or device=auto")
    return device


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    """The compute dtype: ``auto`` → bf16 on CUDA, fp32 on the CPU. Parameters stay fp32 either way."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """bf16 compute on fp32 parameters (matmuls in bf16, reductions and the loss in fp32); fp32: nothing."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


@dataclasses.dataclass
class Dist:
    """This process's place in the job. A world of one has no process group (``group=False``)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    group: bool = False  # a torch.distributed process group is open

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.group:
            dist.barrier()

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Σ over ranks (a copy on ``x``'s device; the identity in a world of one). NCCL reduces on the GPU, so a
        CPU tensor makes the round trip through this rank's device."""
        return self._all_reduce(x, dist.ReduceOp.SUM)

    def all_reduce_max(self, x: torch.Tensor) -> torch.Tensor:
        """Elementwise max over ranks, as :meth:`all_reduce_sum`."""
        return self._all_reduce(x, dist.ReduceOp.MAX)

    def _all_reduce(self, x: torch.Tensor, op) -> torch.Tensor:
        y = x.detach().clone()
        if self.group:
            y = y.to(self.device)
            dist.all_reduce(y, op=op)
        return y.to(x.device)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of rank ``src`` on every rank (pickled; for control data, not tensors of weights)."""
        if not self.group:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]


def world_from_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) as ``torchrun`` sets them; (0, 1, 0) outside it."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def init_distributed(device: str = "auto", fsdp: str = "auto", timeout_s: float = 1800.0) -> Dist:
    """Join the job ``torchrun`` started (or make a world of one) and pick this rank's device.

    On CUDA each rank takes GPU ``LOCAL_RANK``; the backend is NCCL on CUDA and gloo on the CPU. ``fsdp="on"`` in
    a world of one opens a one-process group (FSDP2 needs one), on a free 127.0.0.1 port when ``torchrun`` did not
    set a rendezvous. An already open group is reused (a notebook that runs two loops in one process).
    ``timeout_s``: how long a collective waits for the slowest rank before the job fails (torch's default is 10
    minutes for gloo; the RL learner waits out rank 0's rollouts, so it passes its own, longer one).
    """
    rank, world, local = world_from_env()
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local % max(torch.cuda.device_count(), 1))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    want_group = world > 1 or fsdp == "on"
    if world > 1 and fsdp == "off":
        raise ConfigError(f"fsdp='off' under torchrun with WORLD_SIZE={world}: each process would train its own "
                          "full copy on the same data; use fsdp=auto (shard) or run one process")
    if want_group and not dist.is_initialized():
        if world == 1 and "MASTER_ADDR" not in os.environ:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return Dist(rank, world, local, dev, group=dist.is_initialized())


def close_distributed() -> None:
    """Leave the job together: a barrier, then close the process group (no-op outside one).

    A rank that exits while another still works (rank 0's last evaluation) would tear gloo's threads down under
    a live connection, and the C++ runtime aborts the process; every rank waits here for the slowest first."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def free_port() -> int:
    """A free TCP port on the loopback (the OS picks it): for a rendezvous, a server, a test's listener."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reserved_port(rng=None) -> int:
    """A free loopback port below the OS's ephemeral range (``ip_local_port_range``), for a server that binds it
    seconds later (Ray's agents): a port the OS hands out for ``bind(0)`` or an outgoing connection can be taken by
    another process in the meantime; one below that range is taken only by another explicit pick."""
    import random
    import socket

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = rng or random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def uses_fsdp(d: Dist, fsdp: str) -> bool:
    """``auto``: shard when there is more than one rank; ``on``: always (needs a group); ``off``: never."""
    return d.group and (fsdp == "on" or (fsdp == "auto" and d.world_size > 1))


def shard_model(model: nn.Module, d: Dist) -> nn.Module:
    """FSDP2 on each decoder layer, then the root (embeddings, final norm, LM head); in place, returns ``model``.

    Parameters become ``DTensor`` s sharded on dim 0 across the ranks (an expert stack [E, m, n] splits by
    expert, a matrix [m, n] by rows). Buffers (RoPE tables, expert loads) stay whole on every rank.
    """
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer whole, on the CPU, on every rank (a collective when sharded).

    The weight-sync path of the RL learner: the rollout engine gets full weights from this (gather, then a version
    bump in :meth:`~mimo_kit.infra.engine.InProcessEngine.update_weights`). Unsharded: ``model.state_dict()``.
    """
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
            for k, v in model.state_dict().items()}


def to_float(x: Any) -> float:
    """A Python float from a tensor or DTensor (``clip_grad_norm_`` returns a DTensor on sharded models)."""
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):
        x = x.full_tensor()
    return float(x)


def data_slice(n: int, d: Dist) -> slice:
    """This rank's rows of a global batch of ``n`` rows: contiguous, equal (``n`` must divide by the world)."""
    if n % d.world_size:
        raise ConfigError(f"a batch of {n} rows does not split over {d.world_size} processes; choose a batch "
                          f"that is a multiple of the world size")
    per = n // d.world_size
    return slice(d.rank * per, (d.rank + 1) * per)


@contextlib.contextmanager
def checkpointed_layers(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Activation checkpointing of every decoder layer while the block runs (no effect when ``enabled`` is off).

    Each layer's forward runs under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``: only its input is
    kept, and its activations are recomputed in the backward. Routing replay (R3) consumes recorded experts in
    order, so a recompute would read past them: the RL trainer refuses the combination.
    """
    if not enabled:
        yield
        return
    from torch.utils.checkpoint import checkpoint

    layers = list(model.model.layers)
    originals = [layer.forward for layer in layers]
    for layer, fwd in zip(layers, originals):
        def wrapped(*args, _fwd=fwd, **kwargs):
            if not torch.is_grad_enabled():
                return _fwd(*args, **kwargs)
            return checkpoint(_fwd, *args, use_reentrant=False, **kwargs)
        layer.forward = wrapped
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # the instance attribute goes; the class's forward is back
