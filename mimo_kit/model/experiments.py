"""Chapter 2's experiments, registered for ``mimo-kit run``."""

from __future__ import annotations

import dataclasses

from mimo_kit.config.base import knob
from mimo_kit.experiments import experiment
from mimo_kit.model.bench import BenchDecoderConfig, run_bench_decoder
from mimo_kit.model.hybrid import HybridVsGlobalConfig, run_hybrid_vs_global
from mimo_kit.model.params import count_parameters
from mimo_kit.spread import spread

__all__ = ["HybridSeedsConfig", "bench_decoder", "count_parameters", "hybrid_vs_global", "run_hybrid_seeds"]


TWINS = ("hybrid", "all-GA")


@experiment("bench-decoder", BenchDecoderConfig, chapter="ch02a")
def bench_decoder(cfg: BenchDecoderConfig) -> dict:
    """Kit decoder vs transformers eager on the same weights: prefill, decode and KV-cache bytes."""
    return run_bench_decoder(cfg, progress=print)


@dataclasses.dataclass
class HybridSeedsConfig(HybridVsGlobalConfig):
    """The hybrid-vs-all-GA twins (Report §2) trained once per seed: ``seed``, ``seed + 1``, …"""

    seeds: int = knob(5, "independent seeds (init and data order): the fewest at which the paired rule's sign test "
                         "can reach p <= 0.05 (5 of 5: 1/32)", min=1)
    margin: float = knob(0.05, "nats/byte: 'learns as well as all-GA' means a final validation loss at most this "
                               "far above the twin's (~2% of the tiny run's final loss)", min=0.0)


def run_hybrid_seeds(cfg: HybridSeedsConfig, return_models: bool = False) -> dict:
    """Train the twins once per seed (:func:`run_hybrid_vs_global`), then summarise each twin's final validation
    loss and training seconds (mean ± sd, min–max) and the per-seed gap hybrid − all-GA.

    ``runs`` holds every seed's logs; ``models`` (with ``return_models``) the first seed's trained twins.
    """
    runs = []
    for s in range(cfg.seeds):
        one = run_hybrid_vs_global(dataclasses.replace(cfg, seed=cfg.seed + s), return_models=return_models and s == 0)
        runs.append(one)
    summary = {n: {"val_loss": spread([r[n]["val_loss"][-1] for r in runs], with_values=True),
                   "seconds": spread([r[n]["seconds"][-1] for r in runs], with_values=True)} for n in TWINS}
    gaps = [r["hybrid"]["val_loss"][-1] - r["all-GA"]["val_loss"][-1] for r in runs]
    time_ratio = [r["hybrid"]["seconds"][-1] / r["all-GA"]["seconds"][-1] for r in runs]
    out = {"seeds": [cfg.seed + s for s in range(cfg.seeds)], "runs": [{n: r[n] for n in TWINS} for r in runs],
           "summary": summary, "gap": spread(gaps, with_values=True),
           "time_ratio": spread(time_ratio, with_values=True),
           "within_margin": sum(g <= cfg.margin for g in gaps), "margin": cfg.margin,
           "layer_types": runs[0]["layer_types"]}
    if return_models:
        out["models"] = runs[0]["models"]
    return out


@experiment("hybrid-vs-global", HybridSeedsConfig, chapter="ch02a")
def hybrid_vs_global(cfg: HybridSeedsConfig) -> dict:
    """Train the hybrid SWA/GA model and an all-GA twin on the same toy corpus, once per seed: final validation
    loss and wall-clock, mean ± sd over seeds."""
    return run_hybrid_seeds(cfg)


from mimo_kit.model import encoder_experiments  # noqa: E402,F401 - registers chapter 2c's vit-windows, rvq-levels
