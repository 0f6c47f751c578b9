"""The planner's ground truth: one real training step of the kit decoder on CPU, and the bytes of its tensors.

:func:`measure_step` runs forward, cross-entropy, backward and one optimiser step, then reads

- **weights, gradients, optimiser state**: the bytes of the parameters, their ``.grad`` and every tensor in the
  optimiser's state (AdamW's moments and ``step`` scalars, or Muown's);
- **saved for backward**: every tensor autograd saves, seen through ``torch.autograd.graph.saved_tensors_hooks``,
  deduplicated by storage (a view and its base are one allocation), parameters and buffers excluded (they are
  weights); attributed to the decoder layer that saved it, or to "outside" (embedding, final norm, LM head, loss);
- **with activation checkpointing**: the same step with each decoder layer wrapped in
  ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``. The hook then sees, per layer, only what the
  checkpoint keeps (its inputs: the layer input and the RoPE tables; the layer's intermediates go to the
  checkpoint's own hook and are dropped), plus the tensors saved outside the layers; backward recomputes one layer
  at a time, so the peak adds the largest layer's saved bytes measured in the plain step.

:func:`mimo_kit.infra.plan.plan_memory` predicts the same quantities; ``tests/test_plan.py`` and
``benchmarks/bench_plan.py`` compare the two.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from mimo_kit.dist import checkpointed_layers

OUTSIDE = -1  # attribution of tensors saved outside the decoder layers


@dataclasses.dataclass
class Measured:
    """Bytes of the real tensors of one training step (see the module docstring)."""

    weights: int
    gradients: int
    optimizer: int
    saved: int  # saved for backward, plain step (loss included)
    layer_saved: list[int]  # per decoder layer, plain step
    outside_saved: int  # embedding, final norm, LM head input, loss
    checkpoint_saved: list[int]  # per decoder layer, checkpointed step: what each checkpoint keeps
    checkpointed_outside: int  # saved outside the layers in the checkpointed step

    @property
    def saved_checkpointed(self) -> int:
        """Alive through a checkpointed step's backward: the retained tensors plus the largest layer recomputed."""
        return self.checkpointed_outside + sum(self.checkpoint_saved) + max(self.layer_saved)


def _storage(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


class SavedTensors:
    """Bytes of the tensors autograd saves, deduplicated by storage, by the layer that saved them."""

    def __init__(self, model: nn.Module):
        self.exclude = {_storage(t)[0] for t in [*model.parameters(), *model.buffers()]}
        self.seen: set[int] = set()
        self.by_layer: dict[int, int] = {}
        self.layer = OUTSIDE

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        ptr, nbytes = _storage(t)
        if nbytes and ptr not in self.exclude and ptr not in self.seen:
            self.seen.add(ptr)
            self.by_layer[self.layer] = self.by_layer.get(self.layer, 0) + nbytes
        return t

    @contextlib.contextmanager
    def recording(self, layers: nn.ModuleList) -> Iterator[SavedTensors]:
        def enter(i):
            def hook(module, args):
                self.layer = i
            return hook

        def leave(module, args, output):
            self.layer = OUTSIDE

        handles = [h for i, layer in enumerate(layers) for h in (layer.register_forward_pre_hook(enter(i)),
                                                                  layer.register_forward_hook(leave))]
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
                yield self
        finally:
            for h in handles:
                h.remove()


def _loss(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(ids).logits  # [B, T, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _batch(model: nn.Module, batch: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """B × T random token ids and targets over the model's vocabulary, from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    return (torch.randint(0, V, (batch, seq_len), generator=gen),
            torch.randint(0, V, (batch, seq_len), generator=gen))


def _optimizer(model: nn.Module, kind: str):
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3)
    from mimo_kit.optim import OptimConfig, build_optimizer

    return build_optimizer(model, OptimConfig(matrix_optimizer=kind))


def _state_bytes(opt) -> int:
    """Bytes of the optimiser's state tensors (a sharded state: this rank's shards)."""
    from torch.distributed.tensor import DTensor

    parts = opt.parts.values() if hasattr(opt, "parts") else [opt]
    local = [t.to_local() if isinstance(t, DTensor) else t for o in parts for state in o.state.values()
             for t in state.values() if isinstance(t, torch.Tensor)]
    return sum(t.untyped_storage().nbytes() if t.dim() == 0 else t.numel() * t.element_size() for t in local)


def measure_step(model: nn.Module, batch: int, seq_len: int, *, optimizer: str = "adamw",
                 seed: int = 0) -> Measured:
    """One forward + backward + optimiser step of ``model`` (the kit decoder, any dtype) on B × T random tokens."""
    ids, targets = _batch(model, batch, seq_len, seed)
    layers = model.model.layers
    model.zero_grad(set_to_none=True)

    saved = SavedTensors(model)
    with saved.recording(layers):
        loss = _loss(model, ids, targets)
    loss.backward()
    del loss
    opt = _optimizer(model, optimizer)
    opt.step()
    params = list({id(p): p for p in model.parameters()}.values())
    weights = sum(p.untyped_storage().nbytes() for p in params)
    grads = sum(p.grad.untyped_storage().nbytes() for p in params if p.grad is not None)
    state = _state_bytes(opt)
    model.zero_grad(set_to_none=True)
    del opt

    ck = SavedTensors(model)
    with checkpointed_layers(model), ck.recording(layers):
        loss = _loss(model, ids, targets)
    loss.backward()
    model.zero_grad(set_to_none=True)

    per_layer = [saved.by_layer.get(i, 0) for i in range(len(layers))]
    return Measured(weights=weights, gradients=grads, optimizer=state, saved=sum(saved.by_layer.values()),
                    layer_saved=per_layer, outside_saved=saved.by_layer.get(OUTSIDE, 0),
                    checkpoint_saved=[ck.by_layer.get(i, 0) for i in range(len(layers))],
                    checkpointed_outside=ck.by_layer.get(OUTSIDE, 0))


# ---- FSDP2's unsharded units and the chunked loss: peaks, seen through torch's memory trackers -------------------
@dataclasses.dataclass
class MeasuredFSDP:
    """One rank's bytes in one FSDP2 training step (:func:`measure_fsdp_step`)."""

    weights: int  # this rank's parameter shards
    gradients: int  # this rank's gradient shards
    optimizer: int  # this rank's optimiser state
    unsharded: int  # peak of gathered parameters, unsharded gradients and the collectives' buffers
    rank: int
    world: int


def measure_fsdp_step(model: nn.Module, batch: int, seq_len: int, *, seed: int = 0) -> MeasuredFSDP:
    """Shard ``model`` (the kit decoder) with :func:`mimo_kit.dist.shard_model` in the running process group and
    take one step; every rank calls this.

    The unsharded peak comes from torch's ``FSDPMemTracker`` (``torch.distributed._tools``), which files every
    allocation under FSDP's categories: gathered parameters, all-gather and reduce-scatter buffers, unsharded
    gradients. The root's unsharded gradients (the LM head's, from the first backward op on) reach it as plain
    temporaries, so they are read off the root's parameters, which FSDP2 points at their gathered tensors during
    the step. The peak is the largest sum over the step of all of them at one moment."""
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
    from torch.distributed.tensor import DTensor

    from mimo_kit.dist import Dist, shard_model

    inside = {id(p) for p in model.model.layers.parameters()}
    root = [(mod, name) for mod in model.modules() for name, p in mod.named_parameters(recurse=False)
            if id(p) not in inside]
    kinds = (_FSDPRefType.UNSHARDED_PARAM, _FSDPRefType.ALL_GATHER, _FSDPRefType.UNSHARDED_GRAD,
             _FSDPRefType.REDUCE_SCATTER)

    class Peaks(FSDPMemTracker):
        peak = 0

        def _update_snap(self, *args, **kwargs):  # every allocation and free passes here
            super()._update_snap(*args, **kwargs)
            root_grads = 0
            for mod, name in root:
                p = getattr(mod, name)
                if not isinstance(p, DTensor) and p.grad is not None:
                    root_grads += p.grad.untyped_storage().nbytes()
            for snap in self._curr_mem_snap.values():
                self.peak = max(self.peak, root_grads + sum(snap.get(k, 0) for k in kinds))

    rank, world = dist.get_rank(), dist.get_world_size()
    shard_model(model, Dist(rank, world, rank, torch.device("cpu"), group=True))
    ids, targets = _batch(model, batch, seq_len, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    tracker = Peaks(model, opt)
    with tracker:
        _loss(model, ids, targets).backward()
        opt.step()
    local = [p.to_local() for p in model.parameters()]
    grads = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
    return MeasuredFSDP(weights=sum(t.numel() * t.element_size() for t in local),
                        gradients=sum(t.numel() * t.element_size() for t in grads),
                        optimizer=_state_bytes(opt), unsharded=tracker.peak, rank=rank, world=world)


def measure_loss_head(hidden_size: int, vocab: int, tokens: int, *, chunked: bool, seed: int = 0) -> int:
    """Peak bytes of the LM head and its loss over one forward and backward on ``tokens`` rows, beyond the inputs
    (the head's weight, the hidden states), seen by torch's ``MemTracker``; fp32.

    ``chunked=False``: the kit decoder's loss (``lm_head`` → fp32 logits [N, V] → cross-entropy, as
    :func:`_loss`). ``chunked=True``: TRL's fused LM head (``ChunkedLogProbFunction``, what distill-sft trains
    with) on the rows copied out of the shifted hidden states. On a CPU TRL folds each tile with torch ops instead
    of its Triton kernel, which adds a few fp32 temporaries of one tile: small only where the head's gradient
    dominates (V·H ≫ tile)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE, _ChunkedLogProbFunction

    gen = torch.Generator().manual_seed(seed)
    weight = nn.Parameter(torch.randn(vocab, hidden_size, generator=gen) * 0.02)
    hidden = torch.randn(tokens + 1, hidden_size, generator=gen).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    before = (weight.numel() + hidden.numel()) * 4 + targets.numel() * 8
    tracker = MemTracker()
    with tracker:
        if chunked:
            rows = hidden[:-1][targets >= 0]  # TRL's GPU path scores the labelled rows: a copy
            out = _ChunkedLogProbFunction.apply(rows, weight, None, targets, 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None,
                                                1.0, ("log_probs", "entropy", "is_top1"))
            loss = out[0].sum().neg()
        else:
            loss = F.cross_entropy(F.linear(hidden[:-1], weight).float(), targets)
        loss.backward()
    peak = max(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())
    return peak - before


def measure_fsdp_ranks(preset: str, overrides: dict, batch: int, seq_len: int, *, nproc: int = 2,
                       timeout: float = 300.0) -> list[MeasuredFSDP]:
    """:func:`measure_fsdp_step` on ``nproc`` CPU ranks (torchrun, gloo) for the kit decoder of ``preset`` with
    ``overrides``; one record per rank, each written by its rank to a file of its own."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="mimo-kit-fsdp-measure-") as out:
        arg = json.dumps([preset, {k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()}, batch,
                          seq_len, out])
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "-m",
                               "mimo_kit.infra.measure", arg], capture_output=True, text=True, timeout=timeout)
        files = sorted(Path(out).glob("rank*.json"))
        if proc.returncode != 0 or len(files) != nproc:
            raise RuntimeError(f"measure_fsdp_ranks: torchrun exited {proc.returncode} with {len(files)} of {nproc} "
                               f"records\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        return sorted((MeasuredFSDP(**json.loads(f.read_text())) for f in files), key=lambda m: m.rank)


def _rank_main(arg: str) -> None:
    """One rank of :func:`measure_fsdp_ranks`: build, shard, step, write this rank's record."""
    import json
    from pathlib import Path

    import torch.distributed as dist

    from mimo_kit.dist import close_distributed
    from mimo_kit.model.config import MiMoConfig
    from mimo_kit.model.decoder import MiMoForCausalLM

    preset, overrides, batch, seq_len, out = json.loads(arg)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    m = measure_fsdp_step(MiMoForCausalLM(MiMoConfig.preset(preset, **overrides)), batch, seq_len)
    (Path(out) / f"rank{m.rank}.json").write_text(json.dumps(dataclasses.asdict(m)))
    close_distributed()


if __name__ == "__main__":
    import sys

    _rank_main(sys.argv[1])
