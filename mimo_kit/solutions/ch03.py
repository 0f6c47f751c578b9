"""Chapter 3's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations


def solution(n: int):
    from mimo_kit.model.config import MiMoConfig
    from mimo_kit.model.params import count_parameters

    if n == 1:  # Flash: pre-training tokens (text + multimodal, Report §3) per *total* parameter
        return round(48e12 / count_parameters(MiMoConfig.preset("flash"))["total"])
    if n == 2:  # MXFP4's layout with blocks of 16: 16 × 4-bit elements + one 8-bit scale per block
        return (16 * 4 + 8) / 16
    if n == 3:  # MXFP4 value of 0.7 in a block whose largest magnitude is 3.0
        import torch

        from mimo_kit.optim.mxfp4 import qdq

        return qdq(torch.tensor([3.0, 0.7] + [0.0] * 30))[1].item()
    if n == 4:  # the tiny pre-training schedule's lr factor at step 200 of 300 (warm-up 20, cosine floor 0.1)
        from mimo_kit.optim import lr_factor
        from mimo_kit.pretrain import PretrainConfig

        cfg = PretrainConfig.preset("tiny")
        return lr_factor(200, cfg.steps, cfg.optim)
    if n == 5:  # Newton-Schulz (5 quintic steps) of G = diag(0.6, 0.08): the output's diagonal
        import torch

        from mimo_kit.optim import newton_schulz

        return newton_schulz(torch.diag(torch.tensor([0.6, 0.08], dtype=torch.float64)),
                             dtype=torch.float64).diagonal().tolist()
    raise ValueError(f"chapter 3 has exercises 1-5, not {n!r}")
