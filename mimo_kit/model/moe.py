"""The sparse MoE FFN: sigmoid router with a selection-only bias, top-k, no shared expert (Report §2, §5.4, §6).

Router, in fp32 (Report §2):

.. math:: s = \\sigma(W_r x), \\quad \\mathcal{K} = \\operatorname{topk}(s + b, k), \\quad
          g_e = \\frac{s_e}{\\sum_{e' \\in \\mathcal{K}} s_{e'}} \\ (e \\in \\mathcal{K})

The correction bias b only decides *which* experts are chosen; the gate weights g come from s alone.

Experts run on tokens sorted by expert: one contiguous slice per expert, computed with ``torch._grouped_mm``
where the backend supports it, else one matmul per expert (never a python loop over tokens).

Observability and control for RL (Report §5.4, §6):
- every forward adds the tokens each expert received to ``expert_load`` (see :func:`load_metrics`);
- ``freeze()`` stops router gradients (the report freezes the router during RL);
- routing capture records the chosen experts; routing replay (R3) forces them, with gate weights recomputed from
  the current router logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mimo_kit.model.config import MiMoConfig

COLD_FRACTION = 0.1  # an expert is "cold" below 10% of the mean load (the kit's threshold; the report gives none)


class TopkRouter(nn.Module):
    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        self.top_k, self.num_experts = cfg.num_experts_per_tok, cfg.n_routed_experts
        self.norm_topk_prob, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(cfg.n_routed_experts, cfg.hidden_size, dtype=torch.float32))
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor, forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] → (indices [N, k], weights [N, k]); ``forced`` [N, k] replays given experts."""
        with torch.autocast(x.device.type, enabled=False):  # the router stays fp32 under bf16 autocast
            scores = F.linear(x.float(), self.weight.float()).sigmoid()  # [N, E]
        if forced is None:
            idx = torch.topk(scores + self.e_score_correction_bias, self.top_k, dim=-1).indices
        else:
            idx = forced.to(device=x.device, dtype=torch.long)
        weights = scores.gather(1, idx)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, weights * self.scaling


class Experts(nn.Module):
    """All experts' SwiGLU weights as 3-D tensors (transformers' layout): gate_up [E, 2I, H], down [E, H, I]."""

    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        E, H, inner = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.num_experts = E
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * inner, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, inner))

    def forward(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H], idx/weights [N, k] → Σ_k g_k · expert_k(x)  [N, H]."""
        N, k = idx.shape
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)  # token-slots sorted by expert
        token = order // k
        counts = torch.bincount(flat, minlength=self.num_experts)
        xs = x[token]  # [N·k, H], grouped by expert
        h = grouped_matmul(xs, self.gate_up_proj, counts)  # [N·k, 2I]
        gate, up = h.chunk(2, dim=-1)
        y = grouped_matmul(F.silu(gate) * up, self.down_proj, counts)  # [N·k, H]
        y = y * weights.reshape(-1)[order, None].to(y.dtype)
        return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))


def _grouped_mm_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """``torch._grouped_mm`` wants 16-byte-aligned strides; bf16 on CUDA, fp32/bf16 on CPU."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != w.dtype:
        return False
    align = 16 // x.element_size()
    return x.shape[-1] % align == 0 and w.shape[1] % align == 0 and x.device.type in ("cpu", "cuda")


#: Below this many rows per expert on average, a loop over the *non-empty* experts beats a grouped kernel that
#: visits every expert (decode steps route a handful of rows to a few of E experts).
GROUPED_MM_MIN_ROWS_PER_EXPERT = 2


def grouped_matmul(xs: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Rows of ``xs`` grouped by expert (``counts[e]`` rows each) times ``w[e]ᵀ``: [Σ counts, in] → [Σ counts, out].

    Autocast does not cover ``torch._grouped_mm``: under bf16 autocast both operands are cast here, so the experts
    compute in bf16 like every other matmul (fp32 operands would take a slow per-expert path on CUDA)."""
    device_type = xs.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        xs, w = xs.to(dtype), w.to(dtype)
    if xs.shape[0] >= GROUPED_MM_MIN_ROWS_PER_EXPERT * w.shape[0] and _grouped_mm_ok(xs, w):
        offs = counts.cumsum(0).to(torch.int32)
        try:
            return torch._grouped_mm(xs, w.transpose(1, 2), offs=offs)
        except (RuntimeError, NotImplementedError):
            pass  # an unsupported layout on this backend: fall through to the per-expert loop
    out = xs.new_empty(xs.shape[0], w.shape[1])
    start = 0
    for e, n in enumerate(counts.tolist()):
        if n:
            out[start : start + n] = xs[start : start + n] @ w[e].T
        start += n
    return out


class MiMoMoE(nn.Module):
    """Router + experts; ``mlp.gate`` / ``mlp.experts`` as in transformers' state dict."""

    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        self.experts = Experts(cfg)  # registration order = transformers' state-dict order
        self.gate = TopkRouter(cfg)
        self.register_buffer("expert_load", torch.zeros(cfg.n_routed_experts), persistent=False)
        self.capture: list[torch.Tensor] | None = None  # routing capture: one [N, k] per forward
        self.replay: torch.Tensor | None = None  # routing replay: [tokens, k], consumed in order
        self.replay_offset = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        forced = None
        if self.replay is not None:
            n = x.shape[0]
            if self.replay_offset + n > self.replay.shape[0]:
                raise ValueError(f"routing replay ran out: {self.replay.shape[0]} tokens recorded, "
                                 f"{self.replay_offset + n} requested")
            forced = self.replay[self.replay_offset : self.replay_offset + n]
            self.replay_offset += n
        idx, weights = self.gate(x, forced)
        if self.capture is not None:
            self.capture.append(idx.detach())
        with torch.no_grad():
            self.expert_load += torch.bincount(idx.reshape(-1), minlength=self.expert_load.numel()).to(
                self.expert_load.dtype)
        return self.experts(x, idx, weights).reshape(shape)


def load_metrics(counts: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-layer load balance from token counts [layers, E] (Report §5.4).

    - ``cv`` = std / mean of the expert counts (population std);
    - ``max_mean`` = max / mean;
    - ``cold_share`` = share of experts below ``COLD_FRACTION`` × mean (10%).
    """
    counts = counts.float().reshape(-1, counts.shape[-1])
    mean = counts.mean(dim=-1).clamp_min(1e-12)
    return {"cv": counts.std(dim=-1, unbiased=False) / mean,
            "max_mean": counts.max(dim=-1).values / mean,
            "cold_share": (counts < COLD_FRACTION * mean[:, None]).float().mean(dim=-1)}
