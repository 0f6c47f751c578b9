"""Chapter 2's experiments, registered for ``mimo-kit run``."""

from __future__ import annotations

from mimo_kit.experiments import experiment
from mimo_kit.model.bench import BenchDecoderConfig, run_bench_decoder
from mimo_kit.model.hybrid import HybridVsGlobalConfig, run_hybrid_vs_global
from mimo_kit.model.params import count_parameters

__all__ = ["bench_decoder", "count_parameters", "hybrid_vs_global"]


@experiment("bench-decoder", BenchDecoderConfig, chapter="ch02a")
def bench_decoder(cfg: BenchDecoderConfig) -> dict:
    """Kit decoder vs transformers eager on the same weights: prefill, decode and KV-cache bytes."""
    return run_bench_decoder(cfg, progress=print)


@experiment("hybrid-vs-global", HybridVsGlobalConfig, chapter="ch02a")
def hybrid_vs_global(cfg: HybridVsGlobalConfig) -> dict:
    """Train the hybrid SWA/GA model and an all-GA twin on the same toy corpus: loss vs tokens and wall-clock."""
    return run_hybrid_vs_global(cfg)
