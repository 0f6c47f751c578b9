"""Which optimiser owns which parameter: hidden matrices to Muown/Muon, everything else to AdamW (Report §3).

Report §3: the hidden weight matrices move to Muown; "embeddings, LM head and MoE router stay on AdamW". The kit
adds the parameters the report does not mention but that orthogonalised updates do not suit: RMSNorm weights,
attention sinks and biases (vectors, not matrices). The rules, in order (first match wins):

=====================================  =========  ==========================================================
parameter                              group      why
=====================================  =========  ==========================================================
``model.embed_tokens.weight``          adamw      Report §3: embeddings stay on AdamW (a lookup table, not a map)
``lm_head.weight``                     adamw      Report §3: LM head stays on AdamW
``…mlp.gate.weight``                   adamw      Report §3: the MoE router stays on AdamW
``…norm.weight``, ``…sinks``, 1-D      adamw      vectors: nothing to orthogonalise
other 2-D (q/k/v/o, dense FFN)         matrix     Report §3: hidden weight matrices
3-D ``experts.gate_up_proj/down_proj`` matrix     one [m, n] matrix per expert
=====================================  =========  ==========================================================

A name that matches no rule raises, so a new kind of parameter can never slip silently into the wrong group.
"""

from __future__ import annotations

import re

from torch import nn

MATRIX, ADAMW = "matrix", "adamw"


def _plain_name(name: str) -> str:
    """``…experts.parametrizations.gate_up_proj.original`` (under QAT) → ``…experts.gate_up_proj``."""
    return re.sub(r"parametrizations\.([^.]+)\.original\d*$", r"\1", name)


def classify(name: str, param: nn.Parameter) -> tuple[str, str]:
    """(group, reason) of one named parameter; see the module docstring for the rules."""
    name = _plain_name(name)
    if name.endswith("embed_tokens.weight"):
        return ADAMW, "embedding"
    if name.startswith("lm_head.") or name.endswith(".lm_head.weight"):
        return ADAMW, "LM head"
    if name.endswith("mlp.gate.weight"):
        return ADAMW, "MoE router"
    if name.endswith("norm.weight"):
        return ADAMW, "norm"
    if name.endswith("sinks"):
        return ADAMW, "attention sink"
    if param.dim() <= 1:
        return ADAMW, "bias / vector"
    if param.dim() == 2:
        return MATRIX, "hidden matrix"
    if param.dim() == 3 and name.split(".")[-1] in ("gate_up_proj", "down_proj"):
        return MATRIX, "expert matrices (one per expert)"
    raise ValueError(f"no optimiser group for parameter {name!r} of shape {tuple(param.shape)}; "
                     "extend mimo_kit.optim.grouping.classify")


def group_parameters(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """``{"matrix": [(name, p), ...], "adamw": [...]}``: every parameter of ``model`` in exactly one group.

    Tied parameters (one tensor under two names) appear once, under their first name.
    """
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {MATRIX: [], ADAMW: []}
    for name, p in model.named_parameters():  # named_parameters() yields a shared tensor once
        groups[classify(name, p)[0]].append((name, p))
    return groups


def grouping_table(model: nn.Module) -> list[dict]:
    """Rows {parameter, shape, group, why} with layer indices folded (``layers.*``), for the notebook."""
    rows: dict[str, dict] = {}
    for name, p in model.named_parameters():
        group, why = classify(name, p)
        key = re.sub(r"layers\.\d+\.", "layers.*.", _plain_name(name))
        row = rows.setdefault(key, {"parameter": key, "shape": str(tuple(p.shape)), "group": group, "why": why,
                                    "tensors": 0})
        row["tensors"] += 1
    return list(rows.values())
