"""Chapter 7: the distillation path, a Qwen3.5-9B student trained on MiMo-style traces (SFT, then RL).

| file | idea |
|---|---|
| ``traces`` | the trace format (validated JSONL chat messages) and the per-domain teachers that write trace sets |
| ``sft`` | trace SFT with TRL (assistant-only loss, optional PEFT LoRA) and the per-domain loss-token table |
| ``rl`` | RL on the distilled student, Table 6's form: base / SFT / SFT + RL per domain (``distill-rl``) |

The student's published config is :mod:`mimo_kit.model.qwen` (re-exported here); the student as the RL trainer's
policy is :mod:`mimo_kit.train.student`; MOPD² is :mod:`mimo_kit.train.mopd` (chapter 5b).
``mimo-kit plan --preset qwen3.5-9b`` sizes the student's training memory. Notebook: ``ch07_open_foundations``.
"""

from mimo_kit.model.qwen import QWEN35_9B, qwen35_9b_config, qwen35_9b_parameters

__all__ = ["QWEN35_9B", "qwen35_9b_config", "qwen35_9b_parameters"]
