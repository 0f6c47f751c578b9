"""Statistics over seeds (:mod:`mimo_kit.spread`) under the name the RL chapters import."""

from mimo_kit.spread import mean_sd, spread

__all__ = ["mean_sd", "spread"]
