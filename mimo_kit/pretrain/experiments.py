"""Chapter 3's experiments, registered for ``mimo-kit run`` (Report §3).

    mimo-kit run pretrain --preset tiny steps=300       # the pre-training loop (resumes from runs/pretrain)
    mimo-kit run optimizer-compare --preset tiny        # AdamW vs Muon vs Muown
    mimo-kit run optimizer-switch --preset tiny         # AdamW → Muown mid-run
    mimo-kit run ptq-vs-qat --preset tiny               # MXFP4 experts after training vs QAT
    mimo-kit run ch03-tables --preset tiny              # all three in one result (runs/ch03-tables/<time>/)
    mimo-kit results ch03-tables                        # publish it → data/pretrain/results_tiny.{md,json}
"""

from __future__ import annotations

import dataclasses
import json

from mimo_kit.config.base import Config, knob
from mimo_kit.experiments import Publication, experiment
from mimo_kit.pretrain.config import PretrainConfig
from mimo_kit.pretrain.loop import run_pretrain
from mimo_kit.pretrain.studies import (
    CompareConfig,
    QATConfig,
    SwitchConfig,
    compare_optimizers,
    optimizer_switch,
    ptq_vs_qat,
)
from mimo_kit.results import DATA_DIR

#: The committed chapter-3 results the notebook plots (written only by ``mimo-kit results ch03-tables``).
RESULTS_DIR = DATA_DIR / "pretrain"


@experiment("pretrain", PretrainConfig, chapter="ch03")
def pretrain(cfg: PretrainConfig) -> dict:
    """Pre-train the kit decoder on local text with checkpoints and exact resume; the run folder and log."""
    return run_pretrain(cfg).to_dict()


@experiment("optimizer-compare", CompareConfig, chapter="ch03")
def optimizer_compare(cfg: CompareConfig) -> dict:
    """AdamW vs Muon vs Muown on the hidden matrices: loss at equal steps and equal wall-clock."""
    return compare_optimizers(cfg)


@experiment("optimizer-switch", SwitchConfig, chapter="ch03")
def optimizer_switch_exp(cfg: SwitchConfig) -> dict:
    """The report's switch: AdamW, then the hidden matrices on Muown mid-run; does the loss spike?"""
    return optimizer_switch(cfg)


@experiment("ptq-vs-qat", QATConfig, chapter="ch03")
def ptq_vs_qat_exp(cfg: QATConfig) -> dict:
    """MXFP4 experts: post-training quantisation vs quantisation-aware training, eval-loss gap."""
    return ptq_vs_qat(cfg)


@dataclasses.dataclass
class TablesConfig(Config):
    compare: CompareConfig = dataclasses.field(default_factory=CompareConfig)
    switch: SwitchConfig = dataclasses.field(default_factory=SwitchConfig)
    qat: QATConfig = dataclasses.field(default_factory=QATConfig)
    preset_name: str = knob("tiny", "recorded in the result: which preset's runs these are")

    PRESETS = {"tiny": {}, "small": {"preset_name": "small"}}


def tables_markdown(results: dict) -> str:
    """The committed results page: one table per study, with the settings that produced it."""
    from mimo_kit.nb import markdown_table

    c, s, q = results["compare"], results["switch"], results["qat"]
    return "\n".join([
        f"# Chapter 3 results ({results['preset']} preset)", "",
        f"Produced by `mimo-kit run ch03-tables --preset {results['preset']}` and published with "
        "`mimo-kit results ch03-tables`; CPU, shared machine, so the "
        "wall-clock columns are indicative only (`benchmarks/RESULTS_optim.md` times the optimiser steps alone).",
        "", f"## AdamW vs Muon vs Muown ({c['steps']} steps, {c['tokens']:,} tokens, same init and batches)", "",
        markdown_table(c["rows"]), "",
        f"## The switch (AdamW until step {s['switch_at']}, then branches on the same batches; "
        f"window {s['window']} steps)", "", markdown_table(s["rows"]), "",
        f"## MXFP4 experts: PTQ vs QAT (QAT in the last {q['qat_steps']} of {q['steps']} steps)", "",
        markdown_table(q["rows"]), ""])


@experiment("ch03-tables", TablesConfig, chapter="ch03",
            publishes=(Publication("pretrain/results_{preset}.json"),
                       Publication("pretrain/results_{preset}.md", tables_markdown)))
def ch03_tables(cfg: TablesConfig) -> dict:
    """Run the three chapter-3 studies: one result with every table and log (published to data/pretrain/)."""
    return {"preset": cfg.preset_name, "compare": compare_optimizers(cfg.compare),
            "switch": optimizer_switch(cfg.switch), "qat": ptq_vs_qat(cfg.qat), "config": cfg.to_dict()}


def load_results(preset: str = "tiny") -> dict:
    """The committed results of ``ch03-tables`` for ``preset`` (logs included), as the notebook plots them."""
    path = RESULTS_DIR / f"results_{preset}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `mimo-kit run ch03-tables --preset {preset}`")
    return json.loads(path.read_text())
