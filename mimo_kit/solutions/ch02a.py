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
    raise ValueError(f"chapter 2 has exercises 1-3, not {n!r}")
