"""Chapter 2: the hybrid SWA/GA MoE decoder (Report §2).

>>> from mimo_kit.model import MiMoConfig, MiMoForCausalLM, count_parameters
>>> model = MiMoForCausalLM(MiMoConfig.preset("tiny"))
>>> count_parameters(MiMoConfig.preset("flash"))["total"]
308778768832
"""

from mimo_kit.model.audio import AudioConfig, AudioPatchEncoder, AudioTokenizer, ResidualVQ
from mimo_kit.model.cache import KVCache
from mimo_kit.model.config import MiMoConfig
from mimo_kit.model.decoder import CausalLMOutput, MiMoForCausalLM
from mimo_kit.model.fast_decode import StaticKVCache, fast_generate
from mimo_kit.model.generate import Generation, generate, sample_next
from mimo_kit.model.hf import load_checkpoint
from mimo_kit.model.moe import load_metrics
from mimo_kit.model.multimodal import MiMoMultimodal, MultimodalConfig
from mimo_kit.model.params import count_parameters
from mimo_kit.model.vision import MiMoViT, ViTConfig

__all__ = ["CausalLMOutput", "Generation", "KVCache", "MiMoConfig", "MiMoForCausalLM", "StaticKVCache",
           "count_parameters", "fast_generate", "generate", "load_checkpoint", "load_metrics", "sample_next"]
__all__ += ["AudioConfig", "AudioPatchEncoder", "AudioTokenizer", "MiMoMultimodal", "MiMoViT", "MultimodalConfig",
            "ResidualVQ", "ViTConfig"]
