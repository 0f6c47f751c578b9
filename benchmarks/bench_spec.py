"""Chapter-2.4 benchmark: speculative vs plain decoding → benchmarks/RESULTS_spec.md.

    flock /tmp/bench.lock env OMP_NUM_THREADS=1 python benchmarks/bench_spec.py [preset]   # default: pays

Trains (or reuses, from runs/ch02b/full-<preset shape>) the backbone, one block drafter per block size and the
MTP module; then alternates plain and speculative decoding ``rounds`` times per setting.
"""

import sys
from pathlib import Path

import torch

from mimo_kit.speculative.bench import SpecBenchConfig, markdown, run_spec_bench

if __name__ == "__main__":
    preset = sys.argv[1] if len(sys.argv) > 1 else "pays"
    cfg = SpecBenchConfig.preset(preset)
    result = run_spec_bench(cfg)
    rows, costs = result["rows"], result["costs"]
    table = markdown(rows)
    per_pos = "\n".join(f"| {r['drafter']} | {r['block']} | {r['temperature']} | " + " · ".join(
        f"{a:.2f}" for a in r["acceptance_by_position"]) + " |" for r in rows)
    one = costs["backbone 1 token"]
    cost_rows = "\n".join(f"| {k} | {v:.2f} | {v / one:.2f}× |" for k, v in costs.items())
    bb = result["backbone"].config
    print(table)
    out = Path(__file__).with_name("RESULTS_spec.md")
    marker = "<!-- notes: kept by reruns -->"
    old = out.read_text() if out.exists() else ""
    notes = old[old.index(marker):] if marker in old else marker + "\n"
    out.write_text(
        "# Speculative decoding benchmark (chapter 2.4)\n\n"
        f"Preset `{preset}`: backbone shape `{cfg.backbone_shape}` (hidden {bb.hidden_size}, {bb.num_hidden_layers} "
        f"layers, {bb.n_routed_experts} experts top-{bb.num_experts_per_tok} in the MoE layers), "
        f"{cfg.backbone_steps} pre-training steps on the kit's corpus; one block drafter per block size "
        f"({cfg.train.drafter.num_layers} layer(s), {cfg.train.steps} steps) and one MTP module per MTP budget "
        f"({cfg.mtp_layers} layer reused at every depth, {cfg.mtp_steps or cfg.train.steps} steps). "
        f"{cfg.prompts} held-out prompts × {cfg.new_tokens} new tokens, batch 1. Machine: 2-core CPU shared with "
        f"another job, torch threads = {torch.get_num_threads()}. Each setting: {cfg.rounds} rounds, each decoding "
        "every prompt plainly (`mimo_kit.model.generate`) then speculatively; tok/s and speedup are the median "
        "over rounds, min–max in brackets. Regenerate with\n"
        "`flock /tmp/bench.lock env OMP_NUM_THREADS=1 python benchmarks/bench_spec.py " + preset + "`.\n\n"
        f"{table}\nAcceptance per block position (P(accept | reached)), first round:\n\n"
        f"| drafter | block B | temperature | positions 1 … B − 1 |\n|---|---|---|---|\n{per_pos}\n\n"
        "Cost of one call (median of 30, ms) after the first prompt; a round of speculative decoding costs one "
        "`propose` plus one backbone forward of B tokens:\n\n"
        f"| call | ms | × backbone 1-token step |\n|---|---|---|\n{cost_rows}\n\n{notes}")
    print(f"→ {out}")
