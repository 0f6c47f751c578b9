"""SGLangEngine pieces that need no server: the top-p candidate set rebuilt from top-k logprobs (Report §6.1)."""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mimo_kit.infra.sglang import decode_routed_experts, encode_routed_experts, topp_from_top_logprobs
from mimo_kit.model.generate import truncate_logits


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(2, 60), scale=st.floats(0.1, 8.0),
       T=st.floats(0.3, 2.0), top_p=st.floats(0.05, 1.0), top_k=st.integers(0, 70), K=st.integers(1, 30))
def test_rebuilt_topp_set_equals_the_exact_one_when_it_fits(seed, V, scale, T, top_p, top_k, K):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(V, generator=g, dtype=torch.float64) * scale
    scaled = z / T
    exact = set(torch.isfinite(truncate_logits(scaled[None], top_k, top_p))[0].nonzero()[:, 0].tolist())
    lsm = scaled.log_softmax(-1)
    p = lsm.exp()
    # away from the boundary: no cumulative mass within rounding of top_p · Z (either path may round either way)
    order = p.argsort(descending=True)
    kk = top_k if 0 < top_k < V else V
    z_k = p[order[:kk]].sum()
    before = torch.cat([torch.zeros(1, dtype=p.dtype), p[order[:kk]].cumsum(0)[:-1]])
    assume(bool(((before - top_p * z_k).abs() > 1e-9).all()))
    top = lsm.topk(min(K, V))
    rows = [(float(v), int(i)) for v, i in zip(top.values, top.indices)]
    got, ok = topp_from_top_logprobs(rows, top_p=top_p, top_k=top_k, vocab_size=V)
    if ok:
        assert set(got) == exact
    else:
        assert len(exact) > K or 0 < top_k < V and top_k > K  # flagged only when the set may not fit
    if len(exact) <= K and not (top_k > K and top_k < V):
        assert ok  # it fits and the normaliser is known: exact
    assert got and got[0] == rows[0][1] and set(got) <= {i for _, i in rows}


def test_rebuilt_set_edge_cases():
    rows = [(-0.1, 5), (-3.0, 2), (-4.0, 9)]
    assert topp_from_top_logprobs(rows, top_p=0.5) == ([5], True)  # p(5) = 0.90 ≥ 0.5: the top token alone
    assert topp_from_top_logprobs(rows, top_p=1.0, top_k=2) == ([5, 2], True)  # top-k inside K: exact
    ids, ok = topp_from_top_logprobs(rows, top_p=1.0, vocab_size=40)
    assert ids == [5, 2, 9] and not ok  # the set reaches past the K returned tokens: flagged
    with pytest.raises(ValueError, match="top_logprobs_num"):
        topp_from_top_logprobs([], top_p=0.9)


def test_routed_experts_base64_roundtrip():
    t = torch.randint(0, 8, (7, 3, 2), dtype=torch.int32)  # [tokens, layers, k]
    assert torch.equal(decode_routed_experts(encode_routed_experts(t), 7, 2), t)
