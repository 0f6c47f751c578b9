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


def _optimizer(model: nn.Module, kind: str):
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3)
    from mimo_kit.optim import OptimConfig, build_optimizer

    return build_optimizer(model, OptimConfig(matrix_optimizer=kind))


def _state_bytes(opt) -> int:
    parts = opt.parts.values() if hasattr(opt, "parts") else [opt]
    return sum(t.untyped_storage().nbytes() for o in parts for state in o.state.values()
               for t in state.values() if isinstance(t, torch.Tensor))


def measure_step(model: nn.Module, batch: int, seq_len: int, *, optimizer: str = "adamw",
                 seed: int = 0) -> Measured:
    """One forward + backward + optimiser step of ``model`` (the kit decoder, any dtype) on B × T random tokens."""
    gen = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    ids = torch.randint(0, V, (batch, seq_len), generator=gen)
    targets = torch.randint(0, V, (batch, seq_len), generator=gen)
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
