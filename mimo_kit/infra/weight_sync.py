"""Weight sync over a torch.distributed group: learner rank 0 broadcasts every tensor to the engines (Report §6).

After each update the learner's new weights must reach every rollout engine. Through a shared folder
(``/update_weights_from_disk``) that costs a write and a read of the whole model per version; SGLang's other path
joins the learner and the engine into a process group of their own and broadcasts the tensors, one collective per
tensor, in an order both sides agree on. The kit speaks that protocol (field names as in sglang 0.5.23's
``InitWeightsUpdateGroupReqInput`` / ``UpdateWeightsFromDistributedReqInput``, ``managers/io_struct.py``):

.. code-block:: text

    learner (rank 0)                                  server with TP ranks 0 .. T − 1
    POST /init_weights_update_group                   each TP rank joins as rank_offset + tp_rank
      {master_address, master_port, rank_offset,      (model_executor/model_runner_components/weight_updater.py)
       world_size, group_name, backend}      ──────▶  (the learner joins as rank 0 meanwhile)
    POST /update_weights_from_distributed             allocates each tensor, receives the broadcasts in order,
      {names, dtypes, shapes, group_name,    ──────▶  loads them and stamps weight_version
       weight_version}
    broadcast(names[0]), broadcast(names[1]), …

**How the group is formed.** Both sides must build it the same way, or they wait on different store keys until
the timeout. SGLang's server builds it with ``init_custom_process_group`` (``srt/utils/common.py``): a
``tcp://master_address:master_port`` rendezvous (rank 0 hosts the ``TCPStore``), the store wrapped in
``PrefixStore(group_name, store)``, then torch's ``_new_process_group_helper`` with no global ranks (a group of its
own, not a subgroup of the default one), which adds its own ``"{group_name}/"`` and ``"{device}/"`` prefixes, and
the group's ranks recorded as the identity in ``_world.pg_group_ranks``. :func:`custom_process_group` is that
function step for step, so the learner meets any server that runs it (``tests/test_sglang_wheel.py`` runs SGLang's
own function, read from its wheel, against this one). The group is not torch.distributed's default group (a
learner under torchrun keeps its own), so a learner may hold several groups at once, each under its own name.

**Who is in a group.** A server with tensor parallelism T puts its ranks at ``rank_offset + tp_rank``, so a group
of the learner and servers s = 1 … S has world size 1 + Σ T_s, server s at offset 1 + Σ_{s' < s} T_s'; one
broadcast per tensor then feeds every server of the group (:class:`~mimo_kit.infra.sglang.WeightBroadcast`).
SGLang refuses this path on a server under data parallelism (``dp_size > 1``): such a server takes its weights
through the disk.

**Backends and dtypes.** ``gloo`` (CPU tensors; tested here) and ``nccl`` (CUDA tensors, what SGLang on GPUs
uses). NCCL needs the learner's rank 0 and each engine on GPUs of their own: on one H200 (NCCL 2.28.9) two members
on one device fail at the first broadcast with "Duplicate GPU detected"; a learner and a server sharing a GPU use
``gloo``. The tensors travel in the dtype the sender gives them (:func:`wire_tensors`: floating-point weights
narrowed to the learner's compute dtype, bf16 on GPUs, never widened), and the receiver allocates each one in the
dtype the request names.
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


def custom_process_group(backend: str, init_method: str, world_size: int, rank: int, group_name: str,
                         timeout: datetime.timedelta) -> Any:
    """A process group of its own, formed exactly as sglang 0.5.23's ``init_custom_process_group``
    (``srt/utils/common.py``, called by the server's weight updater with ``init_method`` and ``group_name``):

    1. ``rendezvous(init_method, rank, world_size)``: a ``TCPStore`` at the ``tcp://`` address, hosted by rank 0
       (multi-tenant, libuv unless ``USE_LIBUV=0``: torch's ``_create_c10d_store``). The store is made here as that
       rendezvous makes it outside torchelastic: under ``torchrun`` (``TORCHELASTIC_USE_AGENT_STORE``) the
       rendezvous would take every rank for a client of the elastic agent's store, which does not serve this
       group, and a learner under torchrun would wait for a store nobody hosts;
    2. ``PrefixStore(group_name, store)``;
    3. torch's ``_new_process_group_helper(world_size, rank, [], backend, store, group_name=…)``: no global ranks,
       so the group stands alone (no default group needed); it prefixes the store again with ``"{group_name}/"``
       and, per device backend, ``"{device}/"``;
    4. the group's ranks registered as the identity (``_world.pg_group_ranks``), so ``dist.broadcast(src=0)``
       on it means the group's rank 0.
    """
    import os
    from urllib.parse import urlparse

    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

    url = urlparse(init_method)
    if url.scheme != "tcp" or url.hostname is None or url.port is None:
        raise ValueError(f"weight group init_method {init_method!r}; expected tcp://host:port")
    store = dist.TCPStore(url.hostname, url.port, world_size, is_master=rank == 0, timeout=timeout, multi_tenant=True,
                          use_libuv=os.environ.get("USE_LIBUV", "1") == "1")
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                      backend_options=None, timeout=timeout, device_id=None)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def tcp_address(host: str, port: int) -> str:
    """``tcp://host:port`` as SGLang's ``NetworkAddress.to_tcp`` writes it (an IPv6 host in brackets)."""
    return f"tcp://[{host}]:{int(port)}" if ":" in host and not host.startswith("[") else f"tcp://{host}:{int(port)}"


@dataclasses.dataclass
class WeightGroup:
    """A weight-update process group (a member's view: its rank, the group's size, the group's name)."""

    group: Any  # torch.distributed ProcessGroup
    rank: int
    world_size: int
    name: str

    def broadcast(self, t: torch.Tensor) -> Any:
        """Rank 0's ``t`` into every member's ``t``, as SGLang's receiver calls it; the pending work (``wait()``,
        ``is_completed()``)."""
        return dist.broadcast(t, src=0, group=self.group, async_op=True)

    def destroy(self) -> None:
        """Let go of the group (``dist.destroy_process_group``), as SGLang's ``/destroy_weights_update_group``.
        Only with no collective pending: shutting a group down waits for its pending work."""
        if self.group is not None:
            group, self.group = self.group, None
            dist.destroy_process_group(group)

    def abandon(self) -> None:
        """Stop using the group after a collective failed halfway (a broadcast may still be pending, so it is not
        shut down: its work fails at the group's timeout, and the group's name is never used again)."""
        self.group = None


def weight_group(master_address: str, master_port: int, rank: int, world_size: int, *,
                 group_name: str = DEFAULT_GROUP, backend: str = "gloo",
                 timeout_s: float = GROUP_TIMEOUT_S) -> WeightGroup:
    """Join the group of ``world_size`` members at ``master_address:master_port`` as ``rank`` (rank 0 hosts the
    store), formed as SGLang forms it (:func:`custom_process_group`). Blocks until every member has joined or
    ``timeout_s`` passes."""
    if backend not in BACKENDS:
        raise ValueError(f"weight group backend {backend!r}; expected one of {BACKENDS}")
    if not 0 <= rank < world_size or world_size < 2:
        raise ValueError(f"weight group: rank {rank} of world_size {world_size} (0 ≤ rank < world_size, ≥ 2)")
    if not group_name:
        raise ValueError("weight group: group_name is empty (SGLang refuses an empty group name)")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("weight group backend 'nccl' needs CUDA, which this process does not have; use 'gloo'")
    pg = custom_process_group(backend, tcp_address(master_address, master_port), world_size, rank, group_name,
                              datetime.timedelta(seconds=timeout_s))
    return WeightGroup(pg, rank, world_size, group_name)


def wire_tensors(state_dict: Mapping[str, torch.Tensor], device: str | torch.device,
                 dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The tensors as they travel: on ``device``, contiguous, floating-point ones narrowed to ``dtype`` (the
    learner's compute dtype: bf16 halves the bytes of fp32 master weights) and never widened (a bf16 weight stays
    bf16 whatever ``dtype`` says); integer and boolean buffers as they are."""
    out = {}
    for name, t in state_dict.items():
        t = t.detach()
        if dtype is not None and t.is_floating_point() and t.dtype.itemsize > dtype.itemsize:
            t = t.to(dtype)
        out[name] = t.to(device).contiguous()
    return out


def send(group: WeightGroup, tensors: Sequence[torch.Tensor], *, abandon: Callable[[], bool] = lambda: False,
         poll_s: float = 0.01) -> None:
    """Rank 0: broadcast each tensor in order. ``abandon()`` is polled while a broadcast waits (an engine said it
    will not receive: its request failed); then a RuntimeError instead of waiting out the group's timeout."""
    for t in tensors:
        work = group.broadcast(t)
        while not work.is_completed():
            if abandon():
                raise RuntimeError("weight sync abandoned: an engine refused the update (see its answer)")
            time.sleep(poll_s)
        work.wait()


def receive(group: WeightGroup, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
            device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A receiving rank: one tensor per name, allocated in the request's dtype on ``device`` and filled by rank 0's
    broadcasts in the same order (SGLang's ``receive_weights_from_distributed``)."""
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
