"""Chapter 1: the report's map, its three scaling axes, and the kit's scale knobs (Report §1).

The tables here are the report's numbers as data, so the introduction notebook, the CLI and the tests read one
copy. ``scale-knobs`` (:mod:`mimo_kit.intro.experiments`) is the chapter's experiment: the model shape of every
preset, side by side.
"""

from __future__ import annotations

#: Report §1: RL is scaled along three axes at once.
SCALING_AXES = {
    "training compute": "batch and throughput: 1,568 prompts × 16 rollouts per step, partial rollouts (§4.1)",
    "environments and harnesses": "task diversity (code, general, cyber, visual) × agent scaffolds (§4.2)",
    "grader compute": "finer reward signals: GRS rubrics offline, GAR group grading online (§4.3)",
}

#: Report chapters → the kit's notebooks and packages.
CHAPTERS = [
    {"chapter": "1 Introduction", "notebook": "ch01_introduction", "package": "mimo_kit.intro",
     "mechanisms": "three scaling axes, presets, config → command → torchrun / sbatch / Ray job, FSDP2 on 2 processes"},
    {"chapter": "2 Architecture", "notebook": "ch02a_architecture", "package": "mimo_kit.model",
     "mechanisms": "hybrid SWA/GA attention with sinks, sigmoid-router MoE, KV cache, parameter counts"},
    {"chapter": "2.4 Speculative decoder", "notebook": "ch02b_speculative_decoding", "package": "mimo_kit.speculative",
     "mechanisms": "DFlash block drafter, lossless speculative decoding"},
    {"chapter": "2.2–2.3 Encoders", "notebook": "ch02c_encoders", "package": "mimo_kit.model",
     "mechanisms": "MiMo-ViT (sink SWA, row/column alternation, periodic GA), RVQ audio tokenizer, patch encoder"},
    {"chapter": "3 Pre-/mid-training", "notebook": "ch03_pretraining", "package": "mimo_kit.optim, .pretrain",
     "mechanisms": "tokenizer, pre-training loop, Muown vs Muon vs AdamW, MXFP4 QAT"},
    {"chapter": "4.1 Scaling RL compute", "notebook": "ch04a_rl_at_scale", "package": "mimo_kit.rl, .train, .infra",
     "mechanisms": "the report's RL step, GRPO, partial rollouts, dynamic sampling"},
    {"chapter": "4.2 Environments and harnesses", "notebook": "ch04b_environments_and_harnesses",
     "package": "mimo_kit.envs, .harness, .grading",
     "mechanisms": "sandboxed code / general / cyber / visual tasks, mini-harnesses, hack suite"},
    {"chapter": "4.3 Groupwise agentic grading", "notebook": "ch04c_groupwise_grading", "package": "mimo_kit.rl",
     "mechanisms": "GRS, GAR, length and segment penalties, loss aggregation"},
    {"chapter": "5 Experiments", "notebook": "ch05a_rl_experiments", "package": "mimo_kit.train",
     "mechanisms": "GAR ablation, router freezing and the reset test, loss aggregation and dynamic sampling, "
                   "partial rollouts"},
    {"chapter": "5 MOPD²", "notebook": "ch05b_mopd2", "package": "mimo_kit.rl, .train",
     "mechanisms": "multi-teacher on-policy distillation: per-token reverse KL, routed teachers, prefix conditioning"},
    {"chapter": "6 Infrastructure", "notebook": "ch06_infrastructure", "package": "mimo_kit.infra",
     "mechanisms": "Sample Mixer, harness pool, payload porter, SGLang engine, consistency dashboard"},
    {"chapter": "7 Open foundations", "notebook": "ch07_open_foundations", "package": "mimo_kit.distill",
     "mechanisms": "Qwen 9B distill path: SFT with TRL + PEFT, then RL; multi-harness evaluation"},
    {"chapter": "8 What was reproduced", "notebook": "ch08_what_was_reproduced", "package": "mimo_kit.claims",
     "mechanisms": "every chapter's claim checks in one table: exact numbers, properties, experiments over seeds"},
]

def chapter_map() -> list[dict]:
    """:data:`CHAPTERS` with a ``status`` column: whether the chapter's notebook has landed in ``notebooks/``."""
    from mimo_kit.chapters import NOTEBOOK_DIR

    return [{**c, "status": "✓" if (NOTEBOOK_DIR / f"{c['notebook']}.ipynb").is_file() else "planned"}
            for c in CHAPTERS]


#: Report §4.1: the RL step of the report.
RL_STEP = {"prompt_batch": 1568, "rollouts_per_prompt": 16, "rollouts_per_step": 25088,
           "train_tokens_per_step": (2.7e9, 3.7e9), "tokens_per_sequence": (110e3, 150e3), "max_context": 2**20}

#: Report §4.1: RL cost (USD) and the Pro split.
RL_COST = {"pro_usd": 2.6e6, "flash_usd": 0.9e6, "pro_split": {"rollout": 43.8, "training": 43.5, "grader": 12.7}}

#: Report §1–2: headline sizes (total, active).
REPORTED_SIZES = {"flash": (310e9, 15e9), "pro": (1.02e12, 42e9)}
