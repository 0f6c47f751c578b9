"""Chapter-2.4 benchmark: speculative vs plain decoding on the trained tiny backbone → benchmarks/RESULTS_spec.md.

    python benchmarks/bench_spec.py          # trains (or reuses, from runs/ch02b/full) the backbone and drafters
"""

from pathlib import Path

from mimo_kit.speculative.bench import SpecBenchConfig, markdown, run_spec_bench

if __name__ == "__main__":
    cfg = SpecBenchConfig.preset("tiny")
    result = run_spec_bench(cfg)
    table = markdown(result["rows"])
    per_pos = "\n".join(f"| {r['block']} | {r['temperature']} | " + " · ".join(f"{a:.2f}" for a in
                        r["acceptance_by_position"]) + " |" for r in result["rows"])
    print(table)
    out = Path(__file__).with_name("RESULTS_spec.md")
    out.write_text(
        "# Speculative decoding benchmark (chapter 2.4)\n\n"
        f"Tiny backbone ({cfg.backbone_steps} pre-training steps), one drafter per block size "
        f"({cfg.train.steps} steps), {cfg.prompts} held-out prompts × {cfg.new_tokens} new tokens, batch 1, CPU; "
        "plain and speculative decoding in the same process. Regenerate with `python benchmarks/bench_spec.py`.\n\n"
        f"{table}\nAcceptance per block position (P(accept | reached)):\n\n"
        f"| block B | temperature | positions 1 … B − 1 |\n|---|---|---|\n{per_pos}\n")
    print(f"→ {out}")
