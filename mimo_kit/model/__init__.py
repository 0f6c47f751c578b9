"""Chapter 2: the hybrid SWA/GA MoE decoder (Report §2)."""

from mimo_kit.model.config import MiMoConfig

__all__ = ["MiMoConfig"]
