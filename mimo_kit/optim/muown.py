"""Muown: Muon's orthogonalised direction with an explicit per-row magnitude learned by Adam (Report §3).

Report §3: for large-batch mixed RL, AdamW became inefficient, so MiMo-V2.6 moves its hidden weight matrices to
**Muown**, "Muon-style orthogonalised updates with explicit per-row norm control", and keeps embeddings, LM head
and router on AdamW. The report gives no formula; the kit's definition (docs/design.md "Optimiser") is

.. math::
    W = g \\odot \\frac{v}{\\lVert v \\rVert_{row}},
    \\qquad g \\in \\mathbb{R}^{m}_{\\ge 0},\\ v \\in \\mathbb{R}^{m\\times n}

and one step, for a weight W [m, n] with loss gradient G = ∂L/∂W:

1. decompose the current weight: :math:`g_i = \\lVert W_i \\rVert`, :math:`\\hat v_i = W_i / g_i`, and take
   v = W (any row scale of v gives the same W; this one makes v's step size comparable to Muon on W);
2. chain rule through the decomposition at v = W:
   :math:`\\partial L/\\partial g_i = \\hat v_i \\cdot G_i` and
   :math:`\\partial L/\\partial v_i = G_i - (\\hat v_i \\cdot G_i)\\, \\hat v_i` (the gradient's component
   tangent to the row's sphere: what turns the row without stretching it);
3. v gets a Muon step: momentum (Nesterov) on ∂L/∂v, Newton–Schulz orthogonalisation O,
   :math:`v' = v - \\eta \\cdot 0.2\\sqrt{\\max(m, n)} \\cdot O` (Moonshot's scaling, which matches AdamW's update RMS);
4. g gets an Adam step with decoupled weight decay (the "explicit per-row norm control"):
   :math:`g' = g(1 - \\eta_g \\lambda) - \\eta_g\\, \\hat m / (\\sqrt{\\hat s} + \\epsilon)`;
5. recompose :math:`W \\leftarrow g' \\odot v' / \\lVert v' \\rVert_{row}`.

So after every step the row norms of W equal g' exactly (the decomposition invariant the tests check). A row whose
g' would turn negative is the same weight with (−g', −v̂); the kit stores it that way (and flips that row's Adam
first moment), so g stays ≥ 0. Because g and v are re-read from W at each step, W stays the single source of
truth: loading a checkpoint or switching from AdamW mid-run (the report's switch) needs no conversion.

MoE expert weights are 3-D ([E, m, n]); each expert's [m, n] matrix is its own Muown matrix (a batched
Newton–Schulz over the expert dim).

Departures from torch.optim.Muon, which the kit uses as the Muon baseline: the Newton–Schulz iteration runs in
fp32 by default (torch casts to bf16, which CPUs run slowly), and 3-D tensors are accepted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.optim import Optimizer

#: Keller Jordan's quintic coefficients (also torch.optim.Muon's): maximise the slope at 0, converge to ~[0.7, 1.2]
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(G: torch.Tensor, steps: int = 5, coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                  eps: float = 1e-7, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Approximate the orthogonal factor U Vᵀ of G = U S Vᵀ with a quintic Newton–Schulz iteration.

    G [..., m, n] (batched over leading dims). With X₀ = G / ‖G‖_F (so every singular value ≤ 1):

    .. math:: A = X X^\\top, \\quad X \\leftarrow aX + (bA + cA^2) X

    which maps each singular value σ ↦ aσ + bσ³ + cσ⁵ and drives them all towards ~1 within ``steps`` steps.
    Works on the wide orientation (m ≤ n) so the Gram matrix A is the smaller one.
    """
    if G.dim() < 2:
        raise ValueError(f"newton_schulz: expected a matrix [..., m, n], got shape {tuple(G.shape)}")
    if steps < 1:
        raise ValueError(f"newton_schulz: steps={steps}; expected >= 1")
    a, b, c = coefficients
    X = G.to(dtype)
    tall = X.shape[-2] > X.shape[-1]
    if tall:
        X = X.mT
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp_min(eps)
    for _ in range(steps):
        A = X @ X.mT  # [..., m, m]
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    if tall:
        X = X.mT
    return X.to(G.dtype)


def muon_scale(shape: torch.Size | tuple[int, ...]) -> float:
    """0.2 · √max(m, n) for a matrix [..., m, n]: the update RMS of AdamW (Moonshot, "Muon is Scalable")."""
    m, n = shape[-2], shape[-1]
    return 0.2 * math.sqrt(max(m, n))


class Muown(Optimizer):
    """Muown for 2-D (and per-expert 3-D) hidden matrices. See the module docstring for the update.

    ``lr`` is the direction step (as Muon's lr, before the 0.2·√max(m, n) scale); ``lr_norm``, ``betas``, ``eps``
    and ``weight_decay`` are Adam's for the row magnitudes g.
    """

    def __init__(self, params: Iterable, lr: float = 0.02, lr_norm: float = 3e-3, momentum: float = 0.95,
                 nesterov: bool = True, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0, ns_steps: int = 5,
                 ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS, ns_dtype: torch.dtype = torch.float32):
        for name, value in (("lr", lr), ("lr_norm", lr_norm), ("weight_decay", weight_decay), ("eps", eps)):
            if not value >= 0.0:
                raise ValueError(f"Muown: {name}={value}; expected >= 0")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Muown: momentum={momentum}; expected 0 <= momentum < 1")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Muown: betas={betas}; expected each in [0, 1)")
        if ns_steps < 1:
            raise ValueError(f"Muown: ns_steps={ns_steps}; expected >= 1")
        defaults = dict(lr=lr, lr_norm=lr_norm, momentum=momentum, nesterov=nesterov, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, ns_steps=ns_steps, ns_coefficients=tuple(ns_coefficients),
                        ns_dtype=ns_dtype)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() not in (2, 3):
                    raise ValueError(f"Muown: takes 2-D matrices or 3-D stacks of expert matrices, got a parameter "
                                     f"of shape {tuple(p.shape)}; put it in the AdamW group")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for W in group["params"]:
                if W.grad is None:
                    continue
                G = _local(W.grad).float()  # [..., m, n]: this rank's rows (all of them unsharded)
                state = self.state[W]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["momentum_buffer"] = _like(W, torch.zeros_like(G))  # Muon momentum of ∂L/∂v
                    state["exp_avg"] = _like(W, torch.zeros_like(G[..., 0]))  # Adam moments of ∂L/∂g  [..., m]
                    state["exp_avg_sq"] = _like(W, torch.zeros_like(G[..., 0]))
                state["step"] += 1
                t = state["step"].item()
                Wl = _local(W)
                Wf = Wl.float()
                # 1. decompose: g [..., m], v̂ [..., m, n]  (rows are whole on every rank: shards split rows)
                g = Wf.norm(dim=-1)
                v_hat = Wf / g.clamp_min(1e-30)[..., None]
                # 2. gradients of g and of v (at v = W)
                grad_g = (G * v_hat).sum(-1)
                grad_v = G - grad_g[..., None] * v_hat
                # 3. Muon step on v: momentum, Newton–Schulz, 0.2·√max(m, n)
                buf = _local(state["momentum_buffer"])
                buf.lerp_(grad_v, 1 - group["momentum"])
                update = grad_v.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                ortho = _orthogonalize(W, update, group)
                v_new = Wf - group["lr"] * muon_scale(W.shape) * ortho
                # 4. Adam step on g, decoupled weight decay
                m1, m2 = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
                m1.lerp_(grad_g, 1 - beta1)
                m2.mul_(beta2).addcmul_(grad_g, grad_g, value=1 - beta2)
                m_hat, s_hat = m1 / (1 - beta1**t), m2 / (1 - beta2**t)
                g_new = g * (1 - group["lr_norm"] * group["weight_decay"]) - group["lr_norm"] * m_hat / (
                    s_hat.sqrt() + group["eps"])
                neg = g_new < 0  # (g', v̂) ≡ (−g', −v̂): keep g ≥ 0, flip the row's direction and first moment
                m1.copy_(torch.where(neg, -m1, m1))
                # 5. recompose W = g' ⊙ v'/‖v'‖
                v_unit = v_new / v_new.norm(dim=-1, keepdim=True).clamp_min(1e-30)
                Wl.copy_((g_new[..., None] * v_unit).to(Wl.dtype))
                state["g"] = _like(W, g_new.abs())
        return loss


class Muon(torch.optim.Muon):
    """``torch.optim.Muon`` (the kit's Muon baseline) that also takes 3-D expert stacks, one matrix per expert.

    A 3-D parameter's expert slices ``p[e]`` are views, so torch's own update (momentum, bf16 Newton–Schulz,
    ``adjust_lr_fn`` scaling, decoupled weight decay) runs unchanged on each expert's [m, n] matrix in place.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                 eps: float = 1e-7, ns_steps: int = 5, adjust_lr_fn: str | None = None):
        # torch's constructor insists on p.ndim == 2; build a 2-D-only instance for its argument checks, then set
        # up this one with the same defaults and our own shape check.
        torch.optim.Muon([torch.zeros(1, 1, requires_grad=True)], lr=lr, weight_decay=weight_decay,
                         momentum=momentum, nesterov=nesterov, ns_coefficients=ns_coefficients, eps=eps,
                         ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        Optimizer.__init__(self, params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() not in (2, 3):
                    raise ValueError(f"Muon: takes 2-D matrices or 3-D stacks of expert matrices, got a parameter "
                                     f"of shape {tuple(p.shape)}; put it in the AdamW group")

    def _init_group(self, group, params_with_grad, grads, muon_momentum_bufs):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            if p.dim() == 3:  # one [m, n] view per expert: torch updates them in place
                params_with_grad.extend(p.unbind(0))
                grads.extend(p.grad.unbind(0))
                muon_momentum_bufs.extend(state["momentum_buffer"].unbind(0))
            else:
                params_with_grad.append(p)
                grads.append(p.grad)
                muon_momentum_bufs.append(state["momentum_buffer"])
        return False


# ---- sharded parameters (FSDP2) --------------------------------------------------------------------------------
# Under FSDP2 a parameter is a DTensor sharded on dim 0: a matrix [m, n] by rows, an expert stack [E, m, n] by
# expert. Steps 1, 2, 4 and 5 are row-wise, so every rank runs them on its own rows. Newton–Schulz (step 3) needs
# the whole matrix: a 2-D parameter's update is all-gathered, orthogonalised on every rank, and each rank keeps its
# rows; an expert stack's matrices are whole on the rank that holds them, so they need no communication.


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: in-place updates write the parameter); a plain tensor as is."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _like(W: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """State ``local`` (this rank's rows of a tensor shaped [W.shape[:k]]) as a DTensor sharded like ``W``, so a
    sharded checkpoint knows its global shape; plain when W is plain."""
    from torch.distributed.tensor import DTensor

    if not isinstance(W, DTensor):
        return local
    shape = W.shape[: local.dim()]
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, W.device_mesh, W.placements, run_check=False, shape=shape, stride=stride)


def _orthogonalize(W: torch.Tensor, update: torch.Tensor, group: dict) -> torch.Tensor:
    """Newton–Schulz of this rank's ``update`` rows; a row-sharded 2-D matrix is gathered first (see above)."""
    from torch.distributed.tensor import DTensor, Replicate

    ns = dict(steps=group["ns_steps"], coefficients=group["ns_coefficients"], dtype=group["ns_dtype"])
    if not isinstance(W, DTensor) or W.dim() == 3:  # plain, or whole expert matrices on this rank
        return newton_schulz(update, **ns)
    full = DTensor.from_local(update, W.device_mesh, W.placements, run_check=False, shape=W.shape,
                              stride=W.stride()).full_tensor()  # [m, n] on every rank
    ortho = newton_schulz(full, **ns)
    return DTensor.from_local(ortho, W.device_mesh, [Replicate()], run_check=False).redistribute(
        W.device_mesh, W.placements).to_local()
