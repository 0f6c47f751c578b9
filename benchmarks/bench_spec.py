"""Chapter-2.4 benchmark: speculative vs plain decoding → benchmarks/RESULTS_spec.md.

    flock /tmp/bench.lock env OMP_NUM_THREADS=1 python benchmarks/bench_spec.py [preset]   # default: deep

Trains (or reuses, from runs/ch02b/full-<preset shape>) the backbone, one block drafter per block size and the
MTP module; then alternates plain and speculative decoding ``rounds`` times per setting. Each preset writes its own
section of the results file; a rerun replaces that section and keeps the others and the notes.
"""

import re
import sys
from pathlib import Path

import torch

from mimo_kit.speculative.bench import SpecBenchConfig, markdown, run_spec_bench

TITLE = "# Speculative decoding benchmark (chapter 2.4)\n\n"
NOTES = "<!-- notes: kept by reruns -->"


def section(preset: str, cfg: SpecBenchConfig, result: dict) -> str:
    """The preset's tables: speedup per drafter and temperature, acceptance per block position, call costs."""
    rows, costs = result["rows"], result["costs"]
    per_pos = "\n".join(f"| {r['drafter']} | {r['block']} | {r['temperature']} | " + " · ".join(
        f"{a:.2f}" for a in r["acceptance_by_position"]) + " |" for r in rows)
    one = costs["backbone 1 token"]
    cost_rows = "\n".join(f"| {k} | {v:.2f} | {v / one:.2f}× |" for k, v in costs.items())
    bb, d = result["backbone"].config, cfg.train.drafter
    window = "" if d.context_window >= cfg.prompt_len + cfg.new_tokens else f", context window {d.context_window}"
    return (
        f"<!-- preset: {preset} -->\n## Preset `{preset}`\n\n"
        f"Backbone shape `{cfg.backbone_shape}` (hidden {bb.hidden_size}, {bb.num_hidden_layers} layers, "
        f"{bb.n_routed_experts} experts top-{bb.num_experts_per_tok} in the MoE layers), {cfg.backbone_steps} "
        f"pre-training steps on the kit's corpus; one block drafter per block size ({d.num_layers} layer(s){window}, "
        f"{cfg.train.steps} steps) and one MTP module per MTP budget ({cfg.mtp_layers} layer reused at every depth, "
        f"{cfg.mtp_steps or cfg.train.steps} steps). {cfg.prompts} held-out prompts × {cfg.new_tokens} new tokens, "
        f"batch 1, torch threads = {torch.get_num_threads()}. Each setting: {cfg.rounds} rounds, each decoding every "
        "prompt plainly (`mimo_kit.model.generate`) then speculatively; tok/s and speedup are the median over rounds, "
        "min–max in brackets. Regenerate with\n"
        f"`flock /tmp/bench.lock env OMP_NUM_THREADS=1 python benchmarks/bench_spec.py {preset}`.\n\n"
        f"{markdown(rows)}\nAcceptance per block position (P(accept | reached)), first round:\n\n"
        f"| drafter | block B | temperature | positions 1 … B − 1 |\n|---|---|---|---|\n{per_pos}\n\n"
        "Cost of one call (median of 30, ms) after the first prompt; a round of speculative decoding costs one "
        "`propose` plus one backbone forward of B tokens:\n\n"
        f"| call | ms | × backbone 1-token step |\n|---|---|---|\n{cost_rows}\n<!-- end: {preset} -->\n")


def merge(old: str, preset: str, new: str) -> str:
    """The results file with ``preset``'s section replaced (or added after the others), notes kept."""
    notes = old[old.index(NOTES):] if NOTES in old else NOTES + "\n"
    body = old[: old.index(NOTES)] if NOTES in old else ""
    sections = dict(re.findall(r"<!-- preset: (\S+) -->\n(.*?<!-- end: \1 -->\n)", body, flags=re.S))
    sections[preset] = new.split("\n", 1)[1]
    return TITLE + "".join(f"<!-- preset: {k} -->\n{v}\n" for k, v in sections.items()) + notes


if __name__ == "__main__":
    preset = sys.argv[1] if len(sys.argv) > 1 else "deep"
    cfg = SpecBenchConfig.preset(preset)
    result = run_spec_bench(cfg)
    print(markdown(result["rows"]))
    out = Path(__file__).with_name("RESULTS_spec.md")
    out.write_text(merge(out.read_text() if out.exists() else "", preset, section(preset, cfg, result)))
    print(f"→ {out}")
