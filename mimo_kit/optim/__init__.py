"""Chapter 3's optimisers: Muown (and Muon/AdamW baselines), parameter grouping, MXFP4 and QAT (Report §3).

>>> from mimo_kit.optim import Muown, build_optimizer, OptimConfig, qdq
>>> opt = build_optimizer(model, OptimConfig.preset("tiny", matrix_optimizer="muown"))
"""

from mimo_kit.optim.build import OptimizerSet, build_optimizer, lr_factor
from mimo_kit.optim.config import OptimConfig
from mimo_kit.optim.grouping import classify, group_parameters, grouping_table
from mimo_kit.optim.muown import Muon, Muown, muon_scale, newton_schulz
from mimo_kit.optim.mxfp4 import (
    MXFP4Tensor,
    dequantize_mxfp4,
    pack_nibbles,
    qat_experts,
    qdq,
    qdq_ste,
    quantize_experts_,
    quantize_mxfp4,
    unpack_nibbles,
)

__all__ = ["MXFP4Tensor", "Muon", "Muown", "OptimConfig", "OptimizerSet", "build_optimizer", "classify",
           "dequantize_mxfp4", "group_parameters", "grouping_table", "lr_factor", "muon_scale", "newton_schulz",
           "pack_nibbles", "qat_experts", "qdq", "qdq_ste", "quantize_experts_", "quantize_mxfp4", "unpack_nibbles"]
