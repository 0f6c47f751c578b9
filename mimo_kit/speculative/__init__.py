"""Chapter 2.4: the DFlash-style block drafter, the MTP drafter and lossless speculative decoding (Report §2, §6)."""

from mimo_kit.speculative.decode import Drafter, SpecResult, speculative_generate, verify_greedy, verify_sampling
from mimo_kit.speculative.drafter import BlockDrafter, DrafterConfig
from mimo_kit.speculative.mtp import MTPConfig, MTPDrafter

__all__ = ["BlockDrafter", "Drafter", "DrafterConfig", "MTPConfig", "MTPDrafter", "SpecResult",
           "speculative_generate", "verify_greedy", "verify_sampling"]
