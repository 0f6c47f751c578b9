"""Chapter 2.4: the DFlash-style block drafter and lossless speculative decoding (Report §2, §6)."""

from mimo_kit.speculative.decode import SpecResult, speculative_generate, verify_greedy, verify_sampling
from mimo_kit.speculative.drafter import BlockDrafter, DrafterConfig

__all__ = ["BlockDrafter", "DrafterConfig", "SpecResult", "speculative_generate", "verify_greedy",
           "verify_sampling"]
