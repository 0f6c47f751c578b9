"""The pre-training run's knobs: model shape, optimiser, data, length, evaluation, checkpoints (Report §3)."""

from __future__ import annotations

import dataclasses

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.dist import check_device_knobs
from mimo_kit.model.config import MiMoConfig
from mimo_kit.optim.config import OptimConfig


@dataclasses.dataclass
class PretrainConfig(Config):
    model: MiMoConfig = dataclasses.field(default_factory=MiMoConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    steps: int = knob(300, "tiny: ~300K tokens, enough for the optimisers' curves to separate on 2 CPU cores", min=1)
    quick_steps: int = knob(12, "quick mode: a smoke run", min=1)
    quick: bool = knob(False, "use quick_steps (notebooks set it from MIMO_KIT_QUICK)")
    batch: int = knob(8, "sequences per step", min=1)
    seq_len: int = knob(128, "tiny: 8 SWA windows of 16, so the GA layers matter", min=2)
    eval_every: int = knob(50, "steps between validation losses", min=1)
    eval_batches: int = knob(4, "validation batches per evaluation (the same windows every time)", min=1)
    checkpoint_every: int = knob(100, "steps between checkpoints (0 = only at the end)", min=0)
    keep_checkpoints: int = knob(2, "most recent checkpoints kept on disk", min=1)
    out_dir: str = knob("runs/pretrain", "run folder: checkpoints, final model, tokenizer, log")
    corpus_bytes: int | None = knob(None, "None = the whole corpus (stdlib sources + kit text, ~4.7 MB)")
    val_fraction: float = knob(0.05, "share of documents held out (by a hash of their names)", min=0.0, max=0.5)
    tokenizer_min_frequency: int = knob(2, "BPE merges seen fewer times than this are not learned", min=1)
    qat: bool = knob(False, "train the experts through MXFP4 QDQ + straight-through estimator (Report §3)")
    seed: int = knob(0, "model init and data order; CPU runs are bit-reproducible", min=0)
    device: str = knob("auto", "auto = cuda when available, else cpu; also cpu, cuda, cuda:N")
    precision: str = knob("auto", "compute dtype: auto = bf16 on cuda, fp32 on cpu; weights and optimiser state stay "
                          "fp32 (Report §3)")
    activation_checkpointing: bool = knob(False, "recompute each layer's activations in the backward: memory of "
                                          "one layer instead of all, ~1/3 more compute")
    fsdp: str = knob("auto", "FSDP2: auto = shard when torchrun starts > 1 process; on = shard even in one; off")

    PRESETS = {
        "tiny": {},
        # small: a 29M-parameter model, vocabulary 8192; CPU-hours, GPU-minutes
        "small": {"steps": 2000, "batch": 16, "seq_len": 512, "eval_every": 200, "checkpoint_every": 500},
    }

    @property
    def total_steps(self) -> int:
        """Steps this config trains for (quick mode shrinks them)."""
        return self.quick_steps if self.quick else self.steps

    def check(self) -> None:
        check_device_knobs("PretrainConfig", self.device, self.precision, self.fsdp)
        if self.seq_len > self.model.max_position_embeddings:
            raise ConfigError(f"PretrainConfig.seq_len: {self.seq_len} exceeds model.max_position_embeddings="
                              f"{self.model.max_position_embeddings}")
