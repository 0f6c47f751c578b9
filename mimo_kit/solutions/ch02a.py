"""Chapter 2a's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations


def solution(n: int):
    from mimo_kit.model.config import MiMoConfig
    from mimo_kit.model.inspect import kv_cache_bytes
    from mimo_kit.model.params import count_parameters

    if n == 1:
        return kv_cache_bytes(MiMoConfig.preset("flash"), 256 * 1024)["total"] / 2**30
    if n == 2:
        return count_parameters(MiMoConfig.preset("flash", num_experts_per_tok=4))["active"] / 1e9
    if n == 3:
        return 39 * (129 - 1) + 1
    if n == 4:  # the sink's share of one query: scores (0, 0.5, 1, 2), sink logit 1; values of 1 give 1 - pi
        import torch

        from mimo_kit.model.attention import sink_attention

        q = torch.ones(1, 1, 1, 1, 1, dtype=torch.float64)  # [B, KV, G, Lq, D]: D = 1, scale 1: s_j = k_j
        k = torch.tensor([0.0, 0.5, 1.0, 2.0], dtype=torch.float64).view(1, 1, 4, 1)
        out = sink_attention(q, k, torch.ones_like(k), None, torch.tensor([[1.0]], dtype=torch.float64), 1.0)
        return 1 - out.item()
    if n == 5:  # top-2 of 4 experts: router logits (2, 0.5, 0, 1), correction bias (-0.4, 0.05, 0.35, 0)
        import torch

        from mimo_kit.model.moe import TopkRouter

        cfg = MiMoConfig.preset("tiny", n_routed_experts=4)
        router = TopkRouter(cfg)
        with torch.no_grad():
            router.weight.zero_()
            router.weight[:, :4] = torch.eye(4)  # W x = the first 4 entries of x
            router.e_score_correction_bias.copy_(torch.tensor([-0.4, 0.05, 0.35, 0.0]))
        x = torch.zeros(1, cfg.hidden_size)
        x[0, :4] = torch.tensor([2.0, 0.5, 0.0, 1.0])
        idx, weights = router(x)
        per_expert = [0.0] * 4  # an expert the token does not go to weighs 0
        for e, w in zip(idx[0].tolist(), weights[0].tolist()):
            per_expert[e] = w
        return per_expert
    raise ValueError(f"chapter 2 has exercises 1-5, not {n!r}")
