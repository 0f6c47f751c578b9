"""Chapter-2 decoder benchmark: kit vs transformers eager, same weights, one process → benchmarks/RESULTS.md.

    python benchmarks/bench_decoder.py            # the `small` preset (the issue's bench shape and lengths), then
                                                  # the `narrow` preset (batch-32 decode on a narrow shape)
    python benchmarks/bench_decoder.py tiny       # a smoke run
"""

import sys
from pathlib import Path

from mimo_kit.model.bench import BenchDecoderConfig, markdown, run_bench_decoder


def section(preset: str) -> str:
    cfg = BenchDecoderConfig.preset(preset)
    result = run_bench_decoder(cfg, progress=lambda s: print(f"{preset}: {s}", flush=True))
    table = markdown(result)
    print(table)
    model = ", ".join(f"{k} {v}" for k, v in result["model"].items())
    return (f"## Preset `{preset}`\n\nModel: {model}; float32, {result['threads']} CPU threads, best of "
            f"{cfg.repeats}.\n\n{table}")


if __name__ == "__main__":
    preset = sys.argv[1] if len(sys.argv) > 1 else "small"
    if preset != "small":
        section(preset)
    else:
        parts = [section("small"), section("narrow")]
        out = Path(__file__).with_name("RESULTS.md")
        notes = ""
        marker = "<!-- notes: kept by reruns -->"
        if out.exists() and marker in out.read_text():
            notes = out.read_text().split(marker, 1)[1]
        out.write_text("# Decoder benchmark (chapter 2)\n\nThe kit's decoder against transformers' eager "
                       "`MiMoV2FlashForCausalLM` on the same weights, in one process, the two sides alternating. "
                       "Regenerate with `python benchmarks/bench_decoder.py`.\n\n" + "\n".join(parts)
                       + f"\n{marker}" + notes)
        print(f"→ {out}")
