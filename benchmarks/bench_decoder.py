"""Chapter-2 decoder benchmark: kit vs transformers eager, same weights, one process → benchmarks/RESULTS.md.

    python benchmarks/bench_decoder.py            # the `small` preset: the issue's bench config and lengths
    python benchmarks/bench_decoder.py tiny       # a smoke run
"""

import sys
from pathlib import Path

from mimo_kit.model.bench import BenchDecoderConfig, markdown, run_bench_decoder

if __name__ == "__main__":
    preset = sys.argv[1] if len(sys.argv) > 1 else "small"
    cfg = BenchDecoderConfig.preset(preset)
    result = run_bench_decoder(cfg, progress=lambda s: print(s, flush=True))
    table = markdown(result)
    print(table)
    if preset == "small":
        out = Path(__file__).with_name("RESULTS.md")
        model = ", ".join(f"{k} {v}" for k, v in result["model"].items())
        out.write_text(f"# Decoder benchmark (chapter 2)\n\nModel: {model}; float32, batch 1, "
                       f"{result['threads']} CPU threads, best of {cfg.repeats}. Regenerate with "
                       f"`python benchmarks/bench_decoder.py`.\n\n{table}")
        print(f"→ {out}")
