"""Decoder anchors (chapter 2, Report §2 / §6): one decode step four ways on the `small` model, each against this
machine's memory-bandwidth bound → the "Anchors" section of benchmarks/RESULTS.md.

    python benchmarks/bench_anchors.py          # batch 1 @ 4096 and batch 32 @ 256, best of 2 (~10 min on 2 cores)
    python benchmarks/bench_anchors.py tiny     # a smoke run on the tiny model, printed only
"""

import sys
from pathlib import Path

import torch

from mimo_kit.model.anchors import anchor_rows, anchors_markdown
from mimo_kit.model.bench import BenchDecoderConfig
from mimo_kit.model.decoder import MiMoForCausalLM

BEGIN, END = "<!-- anchors: bench_anchors.py -->", "<!-- /anchors -->"


def main(preset: str) -> str:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    cfg = BenchDecoderConfig.preset(preset if preset == "tiny" else "small")
    shapes = ((1, 128), (4, 64)) if preset == "tiny" else ((1, 4096), (32, 256))
    kit = MiMoForCausalLM(cfg.model).eval()
    from transformers import MiMoV2FlashForCausalLM

    from mimo_kit.model.hf import to_hf

    hf = MiMoV2FlashForCausalLM(to_hf(cfg.model)).eval()
    hf.config._attn_implementation = "eager"
    hf.load_state_dict(kit.state_dict())
    rows, bw = anchor_rows(kit, hf, shapes, tokens=16, repeats=2, progress=lambda s: print(s, flush=True))
    model = ", ".join(f"{k} {v}" for k, v in cfg.model.summary().items())
    return (f"## Anchors: one decode step four ways\n\nModel `{preset}`: {model}; float32, 2 CPU threads; per-step "
            "median of 16 decode steps, best of 2 rounds after a warm-up round that also compiles; the four paths "
            "alternate in every round. `python benchmarks/bench_anchors.py` (`mimo_kit.model.anchors`).\n\n"
            + anchors_markdown(rows, bw))


if __name__ == "__main__":
    preset = sys.argv[1] if len(sys.argv) > 1 else "small"
    section = main(preset)
    print(section)
    if preset != "tiny":
        out = Path(__file__).with_name("RESULTS.md")
        text = out.read_text()
        block = f"{BEGIN}\n{section}{END}"
        text = (text.split(BEGIN)[0] + block + text.split(END, 1)[1]) if BEGIN in text else text.rstrip() + "\n\n" \
            + block + "\n"
        out.write_text(text)
        print(f"→ {out}")
