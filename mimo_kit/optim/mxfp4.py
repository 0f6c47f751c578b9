"""MXFP4: 4-bit microscaling floats for expert weights, and QDQ with a straight-through estimator (Report §3).

The report trains the Flash/Pro experts with **MXFP4 quantisation-aware training** in mid-training, so the RL
rollout engine can serve FP4 experts that the trainer has already learned to live with. The format is the OCP
Microscaling (MX) spec v1.0, "MXFP4":

- a block of :data:`BLOCK` = 32 consecutive values along the *input* dimension (the last dim of a
  ``[out, in]`` Linear weight, of ``gate_up_proj [E, 2I, H]`` and of ``down_proj [E, H, I]``) shares one scale;
- the shared scale is an E8M0 power of two, :math:`X = 2^{\\lfloor \\log_2 \\max_i |V_i| \\rfloor - 2}`
  (the 2 is ``emax`` of E2M1: the largest element, 6 = 1.5·2², has exponent 2);
- each element is an E2M1 float :math:`P_i = \\operatorname{RNE}_{sat}(V_i / X)` on the grid
  ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}: round to nearest, ties to the even code, values beyond 6 saturate to ±6;
- the value is :math:`X \\cdot P_i`. A block of zeros gets the smallest scale 2^-127 and zero elements.

Storage: the 4-bit codes (sign bit 3, magnitude code 0..7 in bits 0-2) are packed two per byte, element ``2j`` in
the low nibble and ``2j+1`` in the high nibble; the scale is stored as its biased exponent ``e + 127`` in a byte.
That is 4.25 bits per weight (32 × 4 + 8 bits per block).

QAT (:func:`qdq_ste`): the forward uses the quantise-dequantised weight, the backward passes the gradient
straight through to the full-precision weight, :math:`\\partial L / \\partial W := \\partial L / \\partial Q(W)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.utils import parametrize

BLOCK = 32  #: OCP MX: 32 elements share one scale
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  #: magnitude of codes 0..7
E2M1_EMAX = 2  #: exponent of E2M1's largest normal value, 6 = 1.5 · 2^2
E8M0_BIAS, E8M0_MIN, E8M0_MAX = 127, -127, 127  #: 0xFF is NaN in E8M0, so exponents run -127..127
_MIDPOINTS = (E2M1_VALUES[1:] + E2M1_VALUES[:-1]) / 2  # [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def _check(x: torch.Tensor, where: str) -> None:
    if not x.is_floating_point():
        raise TypeError(f"{where}: expected a floating-point tensor, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{where}: expected at least one dimension, got a scalar")
    if not torch.isfinite(x).all():
        bad = x[~torch.isfinite(x)].flatten()[0].item()
        raise ValueError(f"{where}: MXFP4 has no encoding for non-finite values, got {bad}")


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """[..., n] → [..., ceil(n/32), 32] in fp32, zero-padded (zeros never change a block's amax)."""
    n = x.shape[-1]
    pad = (-n) % BLOCK
    xf = x.float()
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    return xf.reshape(*x.shape[:-1], (n + pad) // BLOCK, BLOCK)


def shared_exponent(blocks: torch.Tensor) -> torch.Tensor:
    """E8M0 exponent per block, ``floor(log2(amax)) − 2`` clamped to −127..127 (zero block → −127). [..., nb] int32.

    ``frexp`` writes amax = m · 2^e with m ∈ [0.5, 1), so floor(log2 amax) = e − 1 exactly (no float log2 error).
    """
    amax = blocks.abs().amax(dim=-1)
    _, e = torch.frexp(amax)
    exp = (e.to(torch.int32) - 1) - E2M1_EMAX
    exp = torch.where(amax > 0, exp, torch.full_like(exp, E8M0_MIN))
    return exp.clamp(E8M0_MIN, E8M0_MAX)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Scaled values → 4-bit codes (uint8, sign in bit 3): round to nearest, ties to even code, saturate at ±6."""
    a = v.abs()
    mids = _MIDPOINTS.to(a.device)
    code = torch.bucketize(a, mids, right=False)  # number of midpoints < a: ties land on the lower code
    tie_odd = (code < len(mids)) & (a == mids[code.clamp(max=len(mids) - 1)]) & (code % 2 == 1)
    code = code + tie_odd.to(code.dtype)  # a tie between codes k (odd) and k+1 goes to the even one
    sign = (v < 0) & (code > 0)  # -0 is stored as +0
    return (code | (sign.to(code.dtype) << 3)).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes → float32 values on ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}."""
    c = codes.long()
    mag = E2M1_VALUES.to(codes.device)[c & 7]
    return torch.where((c & 8) > 0, -mag, mag)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2k] uint8 codes (0..15) → [..., k] bytes: element 2j in the low nibble, 2j+1 in the high one."""
    if codes.dtype != torch.uint8 or codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles: expected uint8 codes with an even last dim, got {codes.dtype} "
                         f"{tuple(codes.shape)}")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"pack_nibbles: codes must be 0..15, got {int(codes.max())}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: [..., k] bytes → [..., 2k] codes."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"unpack_nibbles: expected uint8, got {packed.dtype}")
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


@dataclasses.dataclass
class MXFP4Tensor:
    """A tensor stored as MXFP4: ``packed`` [..., nb, 16] uint8, ``scales`` [..., nb] uint8 (biased E8M0)."""

    packed: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel()

    def dequantize(self) -> torch.Tensor:
        return dequantize_mxfp4(self)


def quantize_mxfp4(x: torch.Tensor) -> MXFP4Tensor:
    """Quantise along the last dim in blocks of 32 (zero-padded to a multiple of 32)."""
    _check(x, "quantize_mxfp4")
    blocks = _blocks(x)  # [..., nb, 32]
    exp = shared_exponent(blocks)  # [..., nb]
    scaled = blocks * torch.exp2(-exp.float())[..., None]  # V / X, exact: X is a power of two
    codes = e2m1_encode(scaled)
    return MXFP4Tensor(pack_nibbles(codes), (exp + E8M0_BIAS).to(torch.uint8), tuple(x.shape), x.dtype)


def dequantize_mxfp4(q: MXFP4Tensor) -> torch.Tensor:
    """X · P per element, cut back to the original shape and dtype."""
    codes = unpack_nibbles(q.packed)  # [..., nb, 32]
    scale = torch.exp2(q.scales.float() - E8M0_BIAS)  # [..., nb]
    values = (e2m1_decode(codes) * scale[..., None]).flatten(-2)
    return values[..., : q.shape[-1]].reshape(q.shape).to(q.dtype)


def qdq(x: torch.Tensor) -> torch.Tensor:
    """Quantise then dequantise (no packing): what an MXFP4 serving engine computes with."""
    _check(x, "qdq")
    blocks = _blocks(x)
    scale = torch.exp2(shared_exponent(blocks).float())[..., None]
    values = (e2m1_decode(e2m1_encode(blocks / scale)) * scale).flatten(-2)
    return values[..., : x.shape[-1]].reshape(x.shape).to(x.dtype)


def qdq_ste(x: torch.Tensor) -> torch.Tensor:
    """QDQ in the forward, identity in the backward (straight-through): x + (qdq(x) − x).detach()."""
    return x + (qdq(x.detach()) - x).detach()


# ---- QAT and PTQ of a model's experts -------------------------------------------------------------------------
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


class _QDQ(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return qdq_ste(w)


def _expert_modules(model: nn.Module) -> list[nn.Module]:
    mods = [m for m in model.modules() if all(hasattr(m, n) for n in EXPERT_WEIGHTS) and hasattr(m, "num_experts")]
    if not mods:
        raise ValueError(f"{type(model).__name__} has no MoE expert modules (gate_up_proj / down_proj)")
    return mods


@contextlib.contextmanager
def qat_experts(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block every expert weight is read through QDQ + STE (torch parametrize): QAT of the experts.

    The full-precision weights remain the trained parameters (the optimiser sees the same tensors); on exit the
    parametrisation is removed and the state-dict keys are the model's own again.
    """
    mods = _expert_modules(model)
    for m in mods:
        for n in EXPERT_WEIGHTS:
            parametrize.register_parametrization(m, n, _QDQ(), unsafe=True)
    try:
        yield model
    finally:
        for m in mods:
            for n in EXPERT_WEIGHTS:
                parametrize.remove_parametrizations(m, n, leave_parametrized=False)


@torch.no_grad()
def quantize_experts_(model: nn.Module) -> dict[str, int]:
    """Post-training quantisation in place: every expert weight becomes its MXFP4 QDQ. Returns storage bytes."""
    fp_bytes = q_bytes = 0
    for m in _expert_modules(model):
        for n in EXPERT_WEIGHTS:
            w = getattr(m, n)
            q = quantize_mxfp4(w)
            w.copy_(q.dequantize())
            fp_bytes += w.numel() * 2  # bf16, what a serving engine would otherwise hold
            q_bytes += q.nbytes
    return {"bf16_bytes": fp_bytes, "mxfp4_bytes": q_bytes}
