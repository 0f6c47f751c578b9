"""Chapter 3's experiments, registered for ``mimo-kit run`` (Report §3).

    mimo-kit run pretrain --preset tiny steps=300       # the pre-training loop (resumes from runs/pretrain)
    mimo-kit run optimizer-compare --preset tiny        # AdamW vs Muon vs Muown, 3 seeds
    mimo-kit run optimizer-switch --preset tiny         # AdamW → Muown mid-run, 3 seeds
    mimo-kit run ptq-vs-qat --preset tiny               # MXFP4 experts after training vs QAT, 3 seeds
    mimo-kit results optimizer-compare optimizer-switch ptq-vs-qat   # → data/pretrain/<name>_tiny.{json,md}
    mimo-kit run ch03-tables --preset tiny              # all three studies in one run (not published)

Each study publishes its own files, so the three can run in parallel and be re-run one at a time.
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

#: The committed chapter-3 results the notebook plots (written only by ``mimo-kit results <study>``).
RESULTS_DIR = DATA_DIR / "pretrain"
#: study key in :func:`load_results` → the experiment that publishes it
STUDIES = {"compare": "optimizer-compare", "switch": "optimizer-switch", "qat": "ptq-vs-qat"}

HEADER = ("Produced by `mimo-kit run {name}` and published with `mimo-kit results {name}`; "
          "{seeds} seeds, mean ± sample sd over them. CPU, shared machine, so the wall-clock columns are indicative "
          "only (`benchmarks/RESULTS_optim.md` times the optimiser steps alone).")


def _page(name: str, title: str, result: dict, table_rows: list[dict]) -> str:
    from mimo_kit.nb import markdown_table

    agree = [f"- {k}: {v} seeds" for k, v in result["agree"].items()]
    return "\n".join([f"# Chapter 3 · {title}", "", HEADER.format(name=name, seeds=result["seeds"]),
                      "", markdown_table(table_rows), "", "Seeds agreeing with the report's direction:", "",
                      *agree, ""])


def compare_markdown(result: dict) -> str:
    title = (f"AdamW vs Muon vs Muown ({result['steps']} steps, {result['tokens']:,} tokens per run, same init and "
             f"batches within a seed; wall-clock from the end of step {result['warmup_steps_excluded']})")
    return _page("optimizer-compare", title, result, result["rows"])


def switch_markdown(result: dict) -> str:
    title = (f"the switch (AdamW until step {result['switch_at']}, then branches on the same batches; window "
             f"{result['window']} steps)")
    return _page("optimizer-switch", title, result, result["rows"])


def qat_markdown(result: dict) -> str:
    title = f"MXFP4 experts, PTQ vs QAT (QAT in the last {result['qat_steps']} of {result['steps']} steps)"
    return _page("ptq-vs-qat", title, result, result["rows"])


def _publications(name: str, render) -> tuple[Publication, ...]:
    return (Publication(f"pretrain/{name}_{{preset}}.json"), Publication(f"pretrain/{name}_{{preset}}.md", render))


@experiment("pretrain", PretrainConfig, chapter="ch03")
def pretrain(cfg: PretrainConfig) -> dict:
    """Pre-train the kit decoder on local text with checkpoints and exact resume; the run folder and log."""
    return run_pretrain(cfg).to_dict()


@experiment("optimizer-compare", CompareConfig, chapter="ch03",
            publishes=_publications("optimizer-compare", compare_markdown))
def optimizer_compare(cfg: CompareConfig) -> dict:
    """AdamW vs Muon vs Muown on the hidden matrices over seeds: loss at equal steps and equal wall-clock."""
    return {**compare_optimizers(cfg), "config": cfg.to_dict()}


@experiment("optimizer-switch", SwitchConfig, chapter="ch03",
            publishes=_publications("optimizer-switch", switch_markdown))
def optimizer_switch_exp(cfg: SwitchConfig) -> dict:
    """The report's switch over seeds: AdamW, then the hidden matrices on Muown mid-run; does the loss spike?"""
    return {**optimizer_switch(cfg), "config": cfg.to_dict()}


@experiment("ptq-vs-qat", QATConfig, chapter="ch03", publishes=_publications("ptq-vs-qat", qat_markdown))
def ptq_vs_qat_exp(cfg: QATConfig) -> dict:
    """MXFP4 experts over seeds: post-training quantisation vs quantisation-aware training, eval-loss gap."""
    return {**ptq_vs_qat(cfg), "config": cfg.to_dict()}


@dataclasses.dataclass
class TablesConfig(Config):
    compare: CompareConfig = dataclasses.field(default_factory=CompareConfig)
    switch: SwitchConfig = dataclasses.field(default_factory=SwitchConfig)
    qat: QATConfig = dataclasses.field(default_factory=QATConfig)
    preset_name: str = knob("tiny", "recorded in the result: which preset's runs these are")

    PRESETS = {"tiny": {}, "small": {"preset_name": "small"}}


@experiment("ch03-tables", TablesConfig, chapter="ch03")
def ch03_tables(cfg: TablesConfig) -> dict:
    """Run the three chapter-3 studies in one process, one after another (each also runs and publishes alone)."""
    return {"preset": cfg.preset_name, "compare": compare_optimizers(cfg.compare),
            "switch": optimizer_switch(cfg.switch), "qat": ptq_vs_qat(cfg.qat), "config": cfg.to_dict()}


def load_results(preset: str = "tiny") -> dict:
    """The committed results of the three studies for ``preset`` (logs included), keyed ``compare``, ``switch``,
    ``qat``, as the notebook plots them."""
    out = {"preset": preset}
    for key, name in STUDIES.items():
        path = RESULTS_DIR / f"{name}_{preset}.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing; run `mimo-kit run {name} --preset {preset}` and "
                                    f"`mimo-kit results {name}`")
        out[key] = json.loads(path.read_text())
    return out
