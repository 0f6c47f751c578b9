"""Chapter 2c's exercises: the reference answers, computed by the kit's own functions (:mod:`mimo_kit.exercises`
checks a notebook's answers against them)."""

from __future__ import annotations

from mimo_kit.model.audio import token_rates
from mimo_kit.model.vision import ViTConfig


def solution(n: int):
    """Reference answers of chapter 2c's exercises (``mimo_kit.exercises``)."""
    if n == 1:  # backbone positions per minute of audio: 60 s × 25 Hz / 4 frames
        return round(60 * token_rates()["positions_per_s"])
    if n == 2:  # fixed 8 × 8-patch tiles of a 448 × 448 image at patch 14
        vit = ViTConfig.preset("report")
        return (vit.grid // vit.tile) ** 2
    if n == 3:  # RVQ tokens of 30 s of audio: 30 s × 25 Hz × 20 levels
        return round(30 * token_rates()["tokens_per_s"])
    if n == 4:  # the report-shaped ViT's key-query pairs per image as a share of 28 full-attention layers'
        from mimo_kit.model.encoder_experiments import attention_pairs

        pairs = attention_pairs(ViTConfig.preset("report"))
        return pairs["pairs"] / pairs["full_pairs"]
    if n == 5:  # bits per second of the report-shaped tokenizer's codes: 500 tokens/s x log2(1024 codewords)
        import math

        from mimo_kit.model.audio import AudioConfig

        return round(token_rates()["tokens_per_s"] * math.log2(AudioConfig.preset("report").codebook_size))
    raise ValueError(f"ch02c has exercises 1–5, not {n}")
