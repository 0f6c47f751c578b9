"""Parameter counting on the meta device: the report's 310B / 15B (Flash) and 1.02T / 42B (Pro) from the config.

Every parameter of the built model falls in one group; *active* parameters are those one token uses: everything
except the experts it was not routed to (k of E experts per MoE layer).
"""

from __future__ import annotations

from mimo_kit.model.config import MiMoConfig

GROUPS = ("embeddings", "attention GA", "attention SWA", "dense FFN", "experts", "router", "norms", "LM head")


def _group(name: str, layer_types: list[str]) -> str:
    if name.startswith("model.embed_tokens"):
        return "embeddings"
    if name.startswith("lm_head"):
        return "LM head"
    if "norm" in name:
        return "norms"
    if ".self_attn." in name:
        layer = int(name.split(".")[2])
        return "attention GA" if layer_types[layer] == "full_attention" else "attention SWA"
    if ".mlp.experts." in name:
        return "experts"
    if ".mlp.gate." in name:
        return "router"
    if ".mlp." in name:
        return "dense FFN"
    raise ValueError(f"parameter {name!r} fits no group")


def count_parameters(cfg: MiMoConfig) -> dict[str, int]:
    """``{"total", "active", <group>: count, ...}`` of the kit's model for ``cfg``, built on the meta device."""
    from mimo_kit.model.decoder import MiMoForCausalLM

    model = MiMoForCausalLM.on_meta(cfg)
    types = cfg.layer_types
    out = dict.fromkeys(GROUPS, 0)
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:  # tied embeddings count once
            continue
        seen.add(id(p))
        out[_group(name, types)] += p.numel()
    total = sum(out.values())
    active = total - out["experts"] + out["experts"] * cfg.num_experts_per_tok // cfg.n_routed_experts
    return {"total": total, "active": active, **out}


def parameter_table(names: tuple[str, ...] = ("tiny", "small", "flash", "pro")) -> list[dict]:
    """Rows of the breakdown per preset, in billions for the big ones (the notebook's table)."""
    rows = []
    for name in names:
        counts = count_parameters(MiMoConfig.preset(name))
        rows.append({"preset": name, **{k: f"{v / 1e9:.2f}B" if v >= 1e8 else f"{v:,}" for k, v in counts.items()}})
    return rows
