"""Chapter 7: the distillation path, a Qwen3.5-9B student trained on MiMo-style traces (SFT, then RL).

| file | idea |
|---|---|
| ``qwen`` | the published Qwen3.5-9B config as a transformers ``Qwen3_5Config``; parameters counted on meta |
| ``traces`` | the trace format (validated JSONL chat messages) and the per-domain teachers that write trace sets |
| ``sft`` | trace SFT with TRL (assistant-only loss, optional PEFT LoRA) and the per-domain loss-token table |
| ``rl`` | RL on the distilled student, Table 6's form: base / SFT / SFT + RL per domain (``distill-rl``) |
| ``exercises`` | chapter 7's exercise answers |

The student as the RL trainer's policy is :mod:`mimo_kit.rl.student`; MOPD² is :mod:`mimo_kit.rl.mopd` (chapter 5b).
``mimo-kit plan --preset qwen3.5-9b`` sizes the student's training memory. Notebook: ``ch07_open_foundations``.
"""

from mimo_kit.distill.qwen import QWEN35_9B, qwen35_9b_config, qwen35_9b_parameters

__all__ = ["QWEN35_9B", "qwen35_9b_config", "qwen35_9b_parameters"]
