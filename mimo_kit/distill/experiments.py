"""Chapter 7's experiments, registered for ``mimo-kit run`` (Report §7).

    mimo-kit run distill-sft --preset tiny                          # SFT of a tiny Qwen3.5 on synthetic traces
    mimo-kit run distill-sft traces=[runs/make-traces/traces.jsonl] lora=true
    mimo-kit launch distill-sft --nnodes 4 --nproc-per-node 8 --dry-run model=/models/Qwen3.5-9B bf16=true
"""

from __future__ import annotations

from mimo_kit.distill.sft import DistillSFTConfig, run_distill_sft
from mimo_kit.experiments import experiment


@experiment("distill-sft", DistillSFTConfig, chapter="ch07")
def distill_sft(cfg: DistillSFTConfig) -> dict:
    """Trace SFT with TRL (assistant-only loss, optional LoRA): the student, its loss log and loss-token table."""
    return run_distill_sft(cfg)
