"""Chapter 7: the distillation path, a Qwen3.5-9B student trained on MiMo-style traces (SFT, then RL).

| file | idea |
|---|---|
| ``qwen`` | the published Qwen3.5-9B config as a transformers ``Qwen3_5Config``; parameters counted on meta |
| ``sft`` | trace SFT with TRL (assistant-only loss, optional PEFT LoRA) and the per-domain loss-token table |

Planned: trace SFT with TRL + PEFT, loss-token accounting, RL on the distilled model, multi-harness evaluation
(notebook ``ch07_distill``). ``mimo-kit plan --preset qwen3.5-9b`` already sizes the student's training memory.
"""

from mimo_kit.distill.qwen import QWEN35_9B, qwen35_9b_config, qwen35_9b_parameters

__all__ = ["QWEN35_9B", "qwen35_9b_config", "qwen35_9b_parameters"]
