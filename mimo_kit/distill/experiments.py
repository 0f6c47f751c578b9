"""Chapter 7's experiments for ``mimo-kit run`` (Report §7).

    mimo-kit run make-traces --preset tiny      # the four domains' trace sets, validated and graded
    mimo-kit results make-traces                # publish data/distill/traces_{code,cyber,general,visual}.jsonl
    mimo-kit run distill-sft --preset tiny      # SFT of a tiny Qwen3.5 on the shipped traces
    mimo-kit run distill-sft lora=true
    mimo-kit run distill-sft --out runs/sft     # the same line after a kill resumes from its last checkpoint
    # the 9B run on 1 or 4 nodes: the lines of recipe_9b_command(nnodes) (mimo_kit.distill.sft), docs/cluster.md
    mimo-kit run distill-rl --preset tiny       # Table 6's form: base / SFT / SFT + RL per domain, 3 RL seeds
    mimo-kit results distill-rl                 # publish data/distill/distill_rl_tiny.{json,md,png}

Result format of ``make-traces``: ``traces.<domain>`` the traces (the format of :mod:`mimo_kit.distill.traces`),
``summary.<domain>`` {n, available, passed, bytes, teachers, harnesses}.
"""

from __future__ import annotations

import collections
import dataclasses

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.distill.rl import DistillRLConfig, format_table, run_distill_rl
from mimo_kit.distill.sft import DistillSFTConfig, run_distill_sft
from mimo_kit.distill.traces import DOMAINS, available, dumps_traces, make_traces, validate_trace
from mimo_kit.experiments import Publication, experiment


@dataclasses.dataclass
class MakeTracesConfig(Config):
    """How many traces each domain's teacher makes (kit choices: small sets, under ~2 MB together)."""

    code: int = knob(100, "repo-world tasks are generated: any number; 100 cover 4 harnesses × 4 bug families",
                     min=0)
    cyber: int = knob(60, "5 shipped targets: at most 100 distinct (target, harness, variant) traces", min=0)
    general: int = knob(40, "4 shipped tasks: at most 40 distinct (task, harness, variant) traces", min=0)
    visual: int = knob(48, "3 shipped tasks: at most 48 distinct (task, harness, variant) traces", min=0)
    seed: int = knob(0, "task generation and variant order")
    code_mix: tuple[float, float, float] = knob((0.7, 0.3, 0.0), "the repo expert's clean / check / wrong styles: "
                                                "no wrong edits in distillation data")
    require_pass: bool = knob(True, "fail the run if any trace's episode did not pass its grader")

    PRESETS = {"tiny": {}, "smoke": {"code": 4, "cyber": 2, "general": 2, "visual": 2}}

    def check(self) -> None:
        if len(self.code_mix) != 3 or min(self.code_mix) < 0 or sum(self.code_mix) <= 0:
            raise ConfigError(f"MakeTracesConfig.code_mix={self.code_mix!r}: expected 3 weights >= 0 "
                              "(clean, check, wrong) with a positive sum")


def _render(domain: str):
    def render(result: dict) -> str:
        return dumps_traces(validate_trace(t, f"{domain} trace {i}") for i, t in enumerate(result["traces"][domain]))

    render.__name__ = f"render_{domain}"
    return render


@experiment("make-traces", MakeTracesConfig, chapter="ch07",
            publishes=tuple(Publication(f"distill/traces_{d}.jsonl", render=_render(d)) for d in DOMAINS))
def run_make_traces(cfg: MakeTracesConfig) -> dict:
    """Per-domain agent traces from the kit's teachers, validated and graded (Report §7's distillation data)."""
    cfg.check()
    traces, summary = {}, {}
    for d in DOMAINS:
        ts = make_traces(d, getattr(cfg, d), cfg.seed, code_mix=tuple(cfg.code_mix))
        failed = [t.id for t in ts if not t.meta.get("passed")]
        if failed and cfg.require_pass:
            raise RuntimeError(f"make-traces: {len(failed)} {d} trace(s) did not pass their grader: {failed[:5]}")
        traces[d] = [t.to_dict() for t in ts]
        summary[d] = {"n": len(ts), "available": available(d), "passed": len(ts) - len(failed),
                      "bytes": len(dumps_traces(ts).encode()),
                      "teachers": dict(collections.Counter(t.teacher for t in ts)),
                      "harnesses": dict(sorted(collections.Counter(t.harness for t in ts).items()))}
    return {"summary": summary, "traces": traces}


@experiment("distill-sft", DistillSFTConfig, chapter="ch07")
def distill_sft(cfg: DistillSFTConfig) -> dict:
    """Trace SFT with TRL (assistant-only loss, optional LoRA): the student, its loss log and loss-token table."""
    return run_distill_sft(cfg)


def _rl_figure(result: dict) -> bytes:
    """Held-out pass@1 per domain: base, SFT, SFT + RL (bars: mean; dots: seeds)."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=120)
    for i, r in enumerate(result["rows"]):
        for j, (key, label) in enumerate((("base", "base"), ("sft", "SFT"), ("rl", "SFT + RL"))):
            ax.bar(i * 4 + j, r[key], color=("#bbbbbb", "#6a8fc7", "#d9822b")[j], label=label if i == 0 else None)
        for k, key in ((1, "sft_per_seed"), (2, "rl_per_seed")):
            vals = list(r[key].values())
            ax.scatter([i * 4 + k] * len(vals), vals, color="black", s=10, zorder=3)
    ax.set_xticks([i * 4 + 1 for i in range(len(result["rows"]))], [r["domain"] for r in result["rows"]])
    ax.set_ylabel("held-out pass@1")
    ax.set_title(f"The distilled student per domain ({len(result['seeds'])} RL seeds)")
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    from mimo_kit.viz import png_bytes

    return png_bytes(fig, dpi=None)


@experiment("distill-rl", DistillRLConfig, chapter="ch07",
            publishes=(Publication("distill/distill_rl_{preset}.json"),
                       Publication("distill/distill_rl_{preset}.md", render=lambda r: format_table(r) + "\n"),
                       Publication("distill/distill_rl_{preset}.png", render=_rl_figure)))
def distill_rl(cfg: DistillRLConfig) -> dict:
    """Table 6's form: the distilled student's held-out pass@1, base / SFT / SFT + RL per domain."""
    return run_distill_rl(cfg)
