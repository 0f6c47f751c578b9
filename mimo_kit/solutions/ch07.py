"""Chapter 7's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations


def solution(n: int):
    """Reference answers, computed by the kit's own functions (the notebook checks against them)."""
    if n == 1:  # Report §7: 77.4B tokens, 27.2B of them with loss: the loss share, 3 decimals
        return 27.2 / 77.4
    if n == 2:  # bf16 weights of Qwen3.5-9B's text model in GiB (2 bytes per parameter), 2 decimals
        from mimo_kit.model.qwen import qwen35_9b_parameters

        return qwen35_9b_parameters()["text"] * 2 / 2**30
    if n == 3:  # prompt-mean weight of one token of the 40-token completion in a group of 10, 10, 20, 40 tokens
        import torch

        from mimo_kit.rl.aggregation import token_weights

        lengths = torch.tensor([10, 10, 20, 40])
        mask = torch.arange(40)[None, :] < lengths[:, None]  # [4, 40]
        return float(token_weights(mask, torch.zeros(4, dtype=torch.long), "prompt-mean")[3, 0])
    if n == 4:  # GiB of the full fp32 logits (loss=logits: 3 buffers) for Qwen3.5-9B at 1 × 16,384 tokens
        from mimo_kit.infra.plan import PlanConfig, plan_memory

        return plan_memory(PlanConfig(model="qwen3.5-9b", seq_len=16384, micro_batch=1, loss="logits")).logits / 2**30
    if n == 5:  # LoRA adapter parameters of Qwen3.5-9B at the kit's rank 8 on the kit's target linears, in millions
        from mimo_kit.infra.plan import PlanConfig, plan_memory

        return plan_memory(PlanConfig(model="qwen3.5-9b", lora=True, lora_rank=8)).trainable / 1e6
    raise ValueError(f"chapter 7 has exercises 1-5, not {n!r}")
