"""LoRA, one definition: the rank, scale and target modules that the trace SFT (:mod:`mimo_kit.distill.sft`), the RL
student (:mod:`mimo_kit.train.student`) and the memory planner (:mod:`mimo_kit.infra.plan`) share, and the PEFT
config they train with.

LoRA (Hu et al., 2021) freezes a weight W and trains a low-rank update: W' = W + (α / r) · B A, with A [r, in] and
B [out, r], B = 0 at the start. The report does not publish its adapter settings (Report §7 trains full
fine-tunes); these are the kit's, named here once.
"""

from __future__ import annotations

from typing import Any

from mimo_kit.config.base import ConfigError

#: Adapter rank r: small, the toy students' hidden size is 64; the planner sizes the 9B with the same rank.
LORA_RANK = 8
#: LoRA's scale α = 2r, the common setting.
LORA_ALPHA = 16
#: The projections of both Qwen3.5 layer kinds: full attention (q/k/v/o) and Gated DeltaNet (in_proj_qkv, in_proj_z,
#: out_proj); the LoRA paper adapts attention. Add gate_proj/up_proj/down_proj for the dense FFNs.
LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj")


def lora_config(model: Any, rank: int, alpha: int, targets: tuple[str, ...], owner: str):
    """PEFT ``LoraConfig`` on the ``targets`` the model has (module-name suffixes); none present raises, naming
    ``owner``'s field and some of the model's module names."""
    from peft import LoraConfig

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    found = [t for t in targets if t in present]
    if not found:
        raise ConfigError(f"{owner}.lora_targets: none of {list(targets)} is a module of the model; it has e.g. "
                          f"{sorted(present)[:12]}")
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=found, task_type="CAUSAL_LM")
