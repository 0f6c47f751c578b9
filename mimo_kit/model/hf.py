"""transformers interop: config and checkpoint conversion to and from ``MiMoV2FlashForCausalLM``.

The kit's state-dict keys are transformers' keys, so a checkpoint converts by renaming nothing. What differs:
- transformers fixes SWA KV heads at 2 × GA KV heads; a kit config that departs from that cannot be exported;
- the report's checkpoints carry multi-token-prediction (drafter) weights under ``model.mtp.layers.{i}.*``; the
  backbone loader sets them aside (:func:`split_mtp`, the second value :func:`load_checkpoint` returns) and
  :func:`mimo_kit.speculative.mtp.load_mtp` builds the chapter-2.4 MTP drafter from them
  (:func:`~mimo_kit.speculative.mtp.mtp_to_hub` writes one back in that layout).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from mimo_kit.config.base import ConfigError
from mimo_kit.model.config import FULL, SLIDING, MiMoConfig

MTP_PREFIX = "model.mtp."


def to_hf(cfg: MiMoConfig):
    """The equivalent ``transformers.MiMoV2FlashConfig``."""
    from transformers import MiMoV2FlashConfig

    if cfg.swa_num_key_value_heads != 2 * cfg.num_key_value_heads:
        raise ConfigError(f"to_hf: transformers fixes SWA KV heads at 2 × GA KV heads; this config has "
                          f"{cfg.swa_num_key_value_heads} SWA and {cfg.num_key_value_heads} GA KV heads")
    if cfg.tie_word_embeddings:
        raise ConfigError("to_hf: tie_word_embeddings=True is not supported by the export")
    return MiMoV2FlashConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, v_head_dim=cfg.v_head_dim,
        moe_intermediate_size=cfg.moe_intermediate_size, n_routed_experts=cfg.n_routed_experts,
        num_experts_per_tok=cfg.num_experts_per_tok, sliding_window=cfg.sliding_window,
        layer_types=cfg.layer_types, mlp_layer_types=cfg.mlp_layer_types,
        rope_parameters={
            FULL: {"rope_type": "default", "rope_theta": cfg.rope_theta,
                   "partial_rotary_factor": cfg.partial_rotary_factor},
            SLIDING: {"rope_type": "default", "rope_theta": cfg.swa_rope_theta,
                      "partial_rotary_factor": cfg.partial_rotary_factor}},
        attention_value_scale=cfg.attention_value_scale, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings, norm_topk_prob=cfg.norm_topk_prob,
        routed_scaling_factor=cfg.routed_scaling_factor, tie_word_embeddings=False,
        initializer_range=cfg.initializer_range, n_group=1, topk_group=1)


def from_hf(hf) -> MiMoConfig:
    """A kit config from a ``MiMoV2FlashConfig`` (or its ``config.json`` as a dict)."""
    get = (lambda k, d=None: hf.get(k, d)) if isinstance(hf, dict) else (lambda k, d=None: getattr(hf, k, d))
    if get("model_type", "mimo_v2_flash") != "mimo_v2_flash":
        raise ConfigError(f"from_hf: model_type {get('model_type')!r}, expected 'mimo_v2_flash'")
    if (get("n_group") or 1) != 1 or get("attention_bias"):
        raise ConfigError("from_hf: grouped routing (n_group > 1) and attention biases are not in the kit's model")
    n = get("num_hidden_layers")
    layer_types = get("layer_types") or [FULL if (i == 0 or (i + 1) % 6 == 0) else SLIDING for i in range(n)]
    mlp_types = get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
    for name, types in (("layer_types", layer_types), ("mlp_layer_types", mlp_types)):
        if len(types) != n:
            raise ConfigError(f"from_hf: {name} has {len(types)} entries, expected num_hidden_layers={n}")
    rope = get("rope_parameters") or {}
    ga, swa = rope.get(FULL, {}), rope.get(SLIDING, {})
    window = get("sliding_window")
    if get("sliding_window_size") is not None:  # the hub's config.json: previous tokens, without the query
        window = get("sliding_window_size") + 1
    return MiMoConfig(
        vocab_size=get("vocab_size"), hidden_size=get("hidden_size"), num_hidden_layers=n,
        num_attention_heads=get("num_attention_heads"), num_key_value_heads=get("num_key_value_heads"),
        swa_num_key_value_heads=2 * get("num_key_value_heads"), head_dim=get("head_dim"),
        v_head_dim=get("v_head_dim"), intermediate_size=get("intermediate_size"),
        moe_intermediate_size=get("moe_intermediate_size"), n_routed_experts=get("n_routed_experts"),
        num_experts_per_tok=get("num_experts_per_tok"), sliding_window=window or 129,
        global_layers=tuple(i for i, t in enumerate(layer_types) if t == FULL),
        dense_layers=tuple(i for i, t in enumerate(mlp_types) if t == "dense"),
        rope_theta=ga.get("rope_theta", 5e6), swa_rope_theta=swa.get("rope_theta", 1e4),
        partial_rotary_factor=ga.get("partial_rotary_factor", 0.334),
        attention_value_scale=get("attention_value_scale") if get("attention_value_scale") is not None else 1.0,
        rms_norm_eps=get("rms_norm_eps"), max_position_embeddings=get("max_position_embeddings"),
        norm_topk_prob=get("norm_topk_prob", True), routed_scaling_factor=get("routed_scaling_factor") or 1.0,
        tie_word_embeddings=bool(get("tie_word_embeddings", False)),
        initializer_range=get("initializer_range", 0.02))


def split_mtp(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(backbone weights, multi-token-prediction weights) of a checkpoint."""
    backbone = {k: v for k, v in state_dict.items() if not k.startswith(MTP_PREFIX)}
    mtp = {k: v for k, v in state_dict.items() if k.startswith(MTP_PREFIX)}
    return backbone, mtp


_EXPERT_KEY = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def from_hub_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The on-disk layout (one ``experts.{e}.{gate,up,down}_proj.weight`` per expert, ``attention_sink_bias``)
    → the in-memory layout (fused ``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I], ``sinks``).
    Keys already in the in-memory layout pass through.
    """
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for key, value in state.items():
        m = _EXPERT_KEY.match(key)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = value
        else:
            out[key.replace("self_attn.attention_sink_bias", "self_attn.sinks")] = value
    for prefix, parts in experts.items():
        n = len(parts.get("down_proj", {}))
        if any(sorted(parts.get(p, {})) != list(range(n)) for p in ("gate_proj", "up_proj", "down_proj")):
            raise ValueError(f"{prefix}: expert weights are incomplete (expected gate/up/down for experts 0..{n - 1})")
        gate = torch.stack([parts["gate_proj"][e] for e in range(n)])  # [E, I, H]
        up = torch.stack([parts["up_proj"][e] for e in range(n)])
        out[f"{prefix}.gate_up_proj"] = torch.cat([gate, up], dim=1)  # [E, 2I, H]
        out[f"{prefix}.down_proj"] = torch.stack([parts["down_proj"][e] for e in range(n)])  # [E, H, I]
    return out


def read_checkpoint_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Every ``*.safetensors`` tensor of a checkpoint folder, in file-name order, with the hub's per-expert layout
    fused to the kit's (:func:`from_hub_layout`); a folder without one (or no folder) raises FileNotFoundError."""
    from safetensors.torch import load_file

    folder = Path(path)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return from_hub_layout(state)


def load_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32):
    """Load a transformers-format MiMo-V2 checkpoint folder (config.json + *.safetensors) into the kit's model.

    Returns ``(model, mtp_state_dict)``. Missing or unexpected backbone keys raise with their names.
    """
    from mimo_kit.model.decoder import MiMoForCausalLM

    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: no config.json (expected a transformers checkpoint folder)")
    cfg = from_hf(json.loads((folder / "config.json").read_text()))
    backbone, mtp = split_mtp(read_checkpoint_state(folder))
    model = MiMoForCausalLM.on_meta(cfg)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(backbone)), sorted(set(backbone) - expected)
    if missing or unexpected:
        raise ValueError(f"{folder}: checkpoint does not fit the config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.load_state_dict(backbone, assign=True)
    model.to(dtype)
    for m in model.moe_layers():  # router and its bias stay fp32, as in the checkpoint
        m.gate.float()
    # non-persistent buffers were created on meta: rebuild them on the CPU
    from mimo_kit.model.attention import rope_inv_freq

    model.model.ga_inv_freq = rope_inv_freq(cfg, cfg.rope_theta)
    model.model.swa_inv_freq = rope_inv_freq(cfg, cfg.swa_rope_theta)
    for m in model.moe_layers():
        m.expert_load = torch.zeros(cfg.n_routed_experts)
    return model, mtp
