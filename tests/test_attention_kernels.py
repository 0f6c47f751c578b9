"""The FlexAttention kernel (``attention_kernel="flex"``) against the eager reference: kernels, gradients, decoder.

On the CPU torch's FlexAttention runs forward only (eager, dense maths); its backward runs on CUDA
(tests/test_gpu.py). The gradient of what the kit adds around the kernel (block masks, GQA layout, the sink through
the log-sum-exp) is checked here with a dense stand-in for the kernel that returns the same (out, lse).
"""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.model import attention
from mimo_kit.model.attention import flex_sink_attention, global_attention, sliding_window_attention
from mimo_kit.model.cache import KVCache
from mimo_kit.model.config import MiMoConfig
from mimo_kit.model.decoder import MiMoForCausalLM


def tensors(seed: int, B: int, KV: int, G: int, L: int, S: int, D: int, Dv: int, grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, KV, G, L, D, generator=g, requires_grad=grad)
    k = torch.randn(B, KV, S, D, generator=g, requires_grad=grad)
    v = torch.randn(B, KV, S, Dv, generator=g, requires_grad=grad)
    sinks = (2 * torch.randn(KV, G, generator=g)).requires_grad_(grad)
    return q, k, v, sinks


def reference(q, k, v, n_past, window, sinks, scale):
    if window is None:
        assert sinks is None  # GA layers have no sinks
        return global_attention(q, k, v, n_past, scale)
    return sliding_window_attention(q, k, v, n_past, window, sinks, scale)


shapes = st.fixed_dictionaries({
    "seed": st.integers(0, 2**16), "B": st.integers(1, 2), "KV": st.integers(1, 2), "G": st.sampled_from([1, 2, 3]),
    "L": st.integers(1, 70), "D": st.sampled_from([8, 16]), "Dv": st.sampled_from([8, 16]),
    "window": st.sampled_from([None, 1, 2, 5, 16, 33]), "past": st.integers(0, 40)})


@settings(deadline=None, max_examples=30)
@given(shapes)
def test_flex_equals_the_eager_kernels_forward(p):
    """Over random shapes, windows, sinks and cached prefixes (SWA: at most window − 1 cached keys, as the ring
    holds), the FlexAttention output equals the eager kernels' within float rounding."""
    window = p["window"]
    n_past = p["past"] if window is None else min(p["past"], window - 1)
    q, k, v, sinks = tensors(p["seed"], p["B"], p["KV"], p["G"], p["L"], n_past + p["L"], p["D"], p["Dv"])
    sinks = None if window is None else sinks
    scale = p["D"] ** -0.5
    with torch.no_grad():
        ref = reference(q, k, v, n_past, window, sinks, scale)
        out = flex_sink_attention(q, k, v, n_past, window, sinks, scale)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=2e-5)


def test_the_sink_takes_mass_only_through_the_log_sum_exp():
    """A sink far below every score changes nothing; a sink far above sends the output to zero: σ(ℓ − s)."""
    q, k, v, _ = tensors(0, 1, 1, 2, 9, 9, 8, 8)
    plain = flex_sink_attention(q, k, v, 0, 4, None, 0.3)
    low = flex_sink_attention(q, k, v, 0, 4, torch.full((1, 2), -60.0), 0.3)
    high = flex_sink_attention(q, k, v, 0, 4, torch.full((1, 2), 60.0), 0.3)
    torch.testing.assert_close(low, plain)
    assert high.abs().max() < 1e-12 < plain.abs().max()


def dense_flex(query, key, value, *, block_mask, scale, enable_gqa, return_aux=None):
    """FlexAttention's contract written densely and differentiably: the mask from the block mask's own mask_mod,
    GQA by repeating keys, (out, aux.lse) when asked."""
    from torch.nn.attention.flex_attention import create_mask

    B, H, L, _ = query.shape
    S = key.shape[2]
    allowed = create_mask(block_mask.mask_mod, None, None, L, S, device=query.device)  # [1, 1, L, S]
    if enable_gqa:
        key = key.repeat_interleave(H // key.shape[1], dim=1)
        value = value.repeat_interleave(H // value.shape[1], dim=1)
    scores = (query @ key.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ value
    if return_aux is None:
        return out
    return out, type("Aux", (), {"lse": lse})()


@pytest.mark.parametrize("window, n_past", [(5, 0), (5, 4), (1, 0), (None, 0), (None, 7)])
def test_gradients_through_the_sink_correction_equal_the_eager_path(monkeypatch, window, n_past):
    """d/d(q, k, v, sinks) of the flex path (kernel: its dense contract) equal the eager kernels' gradients."""
    monkeypatch.setattr(attention, "_flex_kernel", lambda device: dense_flex)
    L = 23
    q, k, v, sinks = tensors(3, 2, 2, 2, L, n_past + L, 16, 8, grad=True)
    s = sinks if window is not None else None
    w = torch.randn(2, 2, 2, L, 8, generator=torch.Generator().manual_seed(4))
    grads = []
    for fn in (reference, flex_sink_attention):
        loss = (fn(q, k, v, n_past, window, s, 0.25) * w).sum()
        inputs = [q, k, v] + ([sinks] if s is not None else [])
        grads.append(torch.autograd.grad(loss, inputs))
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def model_pair(seed: int, **shape) -> tuple[MiMoForCausalLM, MiMoForCausalLM]:
    cfg = dataclasses.replace(MiMoConfig.preset("tiny"), **shape)
    torch.manual_seed(seed)
    eager = MiMoForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in eager.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0, 1.5)
    flex = MiMoForCausalLM(dataclasses.replace(cfg, attention_kernel="flex")).eval()
    flex.load_state_dict(eager.state_dict())
    return eager, flex


@pytest.mark.parametrize("shape", [{}, {"sliding_window": 3, "num_key_value_heads": 2, "swa_num_key_value_heads": 4},
                                   {"head_dim": 16, "v_head_dim": 16, "global_layers": (1,)}])
def test_decoder_logits_and_chunked_prefill_equal_the_eager_decoder(shape):
    eager, flex = model_pair(0, **shape)
    ids = torch.randint(0, eager.config.vocab_size, (2, 57), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = eager(ids).logits
        torch.testing.assert_close(flex(ids).logits, ref, atol=1e-5, rtol=1e-4)
        cache = KVCache(flex.config)  # prefill in chunks: n_past > 0 for GA, a partial ring for SWA
        parts = [flex(ids[:, a:b], cache).logits for a, b in [(0, 20), (20, 21), (21, 57)]]
    torch.testing.assert_close(torch.cat(parts, dim=1), ref, atol=1e-5, rtol=1e-4)


def test_under_autocast_the_kernel_gets_one_dtype_and_the_logits_match(monkeypatch):
    """Under bf16 autocast the roped queries and keys come out in fp32 and the values in bf16: the fused kernel
    (which wants one dtype) gets all three in bf16, and the logits stay within bf16 rounding of the eager path."""
    seen = []

    def checked(q, k, v, **kw):
        seen.append({q.dtype, k.dtype, v.dtype})
        return attention._eager_flex(q, k, v, **kw)

    monkeypatch.setattr(attention, "_flex_kernel", lambda device: checked)
    eager, flex = model_pair(2)
    ids = torch.randint(0, eager.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref, out = eager(ids).logits.float(), flex(ids).logits.float()
    assert seen and all(d == {torch.bfloat16} for d in seen), seen
    assert float((out - ref).norm() / ref.norm()) < 2e-2


def test_training_with_flex_on_the_cpu_is_refused_by_name():
    _, flex = model_pair(0)
    ids = torch.randint(0, flex.config.vocab_size, (1, 9))
    with pytest.raises(RuntimeError, match="attention_kernel='flex'.*no backward on the CPU"):
        flex(ids).logits.sum().backward()


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(Exception, match="attention_kernel: got 'sdpa', expected one of 'eager', 'flex'"):
        MiMoConfig(attention_kernel="sdpa")
