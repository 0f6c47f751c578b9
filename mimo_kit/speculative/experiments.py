"""Chapter 2.4's experiments, registered for ``mimo-kit run``."""

from __future__ import annotations

import dataclasses

from mimo_kit.config.base import Config, knob
from mimo_kit.experiments import experiment
from mimo_kit.speculative.bench import (
    DrafterRefreshConfig,
    SpecBenchConfig,
    backbone_and_streams,
    mtp_train_config,
    run_drafter_refresh,
    run_spec_bench,
)
from mimo_kit.speculative.train import train_drafter, train_mtp


@dataclasses.dataclass
class DrafterRunConfig(Config):
    bench: SpecBenchConfig = dataclasses.field(default_factory=SpecBenchConfig)
    out: str = knob("runs/ch02b/drafter", "checkpoint folder; a rerun resumes from it")

    PRESETS = {"tiny": {}, "small": {}}


@experiment("drafter-train", DrafterRunConfig, chapter="ch02b")
def drafter_train(cfg: DrafterRunConfig) -> dict:
    """Train the block drafter on the tiny pre-trained backbone (checkpointed, resumable)."""
    backbone, _, streams = backbone_and_streams(cfg.bench)
    log = train_drafter(backbone, streams["train"].long(), cfg.bench.train, out_dir=cfg.out)["log"]
    return {"final_loss": log["loss"][-1], "final_acc_by_position": log["acc"][-1], "steps": log["step"][-1]}


@dataclasses.dataclass
class MTPRunConfig(Config):
    bench: SpecBenchConfig = dataclasses.field(default_factory=SpecBenchConfig)
    block: int = knob(6, "anchor + k drafts: the MTP chain's depth is block − 1", min=2)
    out: str = knob("runs/ch02b/mtp", "checkpoint folder; a rerun resumes from it")

    PRESETS = {"tiny": {}, "small": {}, "pays": {"bench": SpecBenchConfig.PRESETS["pays"]}}


@experiment("mtp-train", MTPRunConfig, chapter="ch02b")
def mtp_train(cfg: MTPRunConfig) -> dict:
    """Train the MTP drafter (MiMo-V2-Flash's checkpoint layout) on the pre-trained backbone (resumable)."""
    backbone, _, streams = backbone_and_streams(cfg.bench)
    log = train_mtp(backbone, streams["train"].long(), mtp_train_config(cfg.bench, cfg.block), out_dir=cfg.out)["log"]
    return {"final_loss": log["loss"][-1], "final_acc_by_depth": log["acc"][-1], "steps": log["step"][-1]}


@experiment("bench-spec", SpecBenchConfig, chapter="ch02b")
def bench_spec(cfg: SpecBenchConfig) -> dict:
    """Accepted length and speedup of speculative decoding (Report §2, §6): block drafter per block size vs the MTP
    module, ``seeds`` drafters each (accepted length mean ± sd over seeds; tok/s and speedup median and min–max
    over seeds × alternated rounds), and the cost of a decode step vs verifying a block."""
    result = run_spec_bench(cfg)
    return {"rows": result["rows"], "seed_rows": result["seed_rows"], "costs": result["costs"]}


@experiment("drafter-refresh", DrafterRefreshConfig, chapter="ch02b")
def drafter_refresh(cfg: DrafterRefreshConfig) -> dict:
    """Acceptance of a stale drafter after a policy update, and after retraining it on the policy's own text."""
    return run_drafter_refresh(cfg)
