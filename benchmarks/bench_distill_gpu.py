"""The distill path on one GPU: Qwen3.5 SFT through distill-sft's own Trainer arguments, beside the memory plan.

Report §7 distils into Qwen3.5-9B. Two cases, each in a process of its own (clean peak-memory counters), built from
the config with random weights (nothing downloaded) and trained on random token sequences whose second half carries
the loss (``assistant_masks``), through ``mimo_kit.distill.sft._sft_args`` (the arguments ``distill-sft`` trains with:
bf16 on fp32 master weights, activation checkpointing, TRL's fused chunked LM head, FSDP2 through accelerate):

- **LoRA**: Qwen3.5-9B's text model, the base frozen in bf16, adapters on both layer kinds' projections;
- **FSDP**: a ≥ 0.5B Qwen3.5 (the 9B's vocabulary and layer pattern, narrower and shallower), full fine-tune,
  ``fsdp=full_shard`` under a one-process torch.distributed group (what torchrun sets).

Each row: tokens per second (median step after the first), the peak of ``torch.cuda.max_memory_allocated``, the
plan's tensors for the same shape (``mimo_kit.infra.plan``, without the CUDA context and margin, which the
allocator does not count), their ratio, and whether the Trainer ran FSDP. ``--shape tiny`` runs the same code at
toy size on a CPU (no peak memory there).

    python benchmarks/bench_distill_gpu.py [--shape issue|tiny] [--steps 4] [--out benchmarks/RESULTS_distill_gpu.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: a ≥ 0.5B Qwen3.5 for the FSDP case: the 9B's vocabulary (2 × 248K × 1024 embedding and head) and layer pattern,
#: 1024 wide and 8 layers deep (~0.6B)
MID = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8, "num_attention_heads": 8,
       "num_key_value_heads": 2, "head_dim": 128, "linear_num_key_heads": 8, "linear_num_value_heads": 16,
       "linear_key_head_dim": 128, "linear_value_head_dim": 128,
       "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
SHAPES = {"issue": {"seq_len": 4096, "lora_model": "9b", "fsdp_model": "mid"},
          "tiny": {"seq_len": 256, "lora_model": "tiny", "fsdp_model": "tiny"}}


def text_config(name: str):
    from transformers import Qwen3_5TextConfig

    from mimo_kit.distill.sft import TINY_QWEN35
    from mimo_kit.model.qwen import qwen35_9b_config

    if name == "9b":
        return qwen35_9b_config().text_config
    base = qwen35_9b_config().text_config.to_dict()
    if name == "mid":
        return Qwen3_5TextConfig(**{**base, **MID})
    return Qwen3_5TextConfig(**{**TINY_QWEN35, "vocab_size": 512})


def run_case(case: str, shape: str, steps: int) -> dict:
    """One case in this process → its row (see the module docstring)."""
    import torch
    from datasets import Dataset
    from transformers import Qwen3_5ForCausalLM, TrainerCallback
    from trl import SFTTrainer

    from mimo_kit.distill.sft import DistillSFTConfig, _sft_args, trace_tokenizer
    from mimo_kit.infra.plan import GIB, PlanConfig, plan_memory

    cuda = torch.cuda.is_available()
    T = SHAPES[shape]["seq_len"]
    tc = text_config(SHAPES[shape][f"{case}_model"])
    lora = case == "lora"
    if case == "fsdp":  # a one-process group, as torchrun --nproc-per-node 1 sets it up
        from mimo_kit.dist import free_port

        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    torch.manual_seed(0)
    dtype = torch.bfloat16 if (lora and cuda) else torch.float32  # distill-sft's load_student: a LoRA base in bf16
    with torch.device("cuda" if cuda else "cpu"):
        model = Qwen3_5ForCausalLM(tc).to(dtype)
    out = Path(tempfile.mkdtemp(prefix=f"bench-distill-{case}-"))
    cfg = DistillSFTConfig(steps=steps, batch_size=1, max_length=T, lora=lora, bf16=cuda, lr=1e-5,
                           gradient_checkpointing=True, fsdp="full_shard" if case == "fsdp" else "off",
                           out_dir=str(out))
    args = _sft_args(cfg, out)
    args.report_to = []
    args.assistant_only_loss = False  # pre-tokenized rows: their assistant_masks column sets the loss tokens
    g = torch.Generator().manual_seed(1)
    rows = [{"input_ids": torch.randint(0, tc.vocab_size, (T,), generator=g).tolist(),
             "assistant_masks": [0] * (T // 2) + [1] * (T - T // 2)} for _ in range(steps)]
    peft = None
    if lora:
        from mimo_kit.optim.lora import lora_config

        peft = lora_config(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, "bench")
    tok = trace_tokenizer([{"domain": "code", "messages": [{"role": "user", "content": "bench"}]}], 300)
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)

    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                         peft_config=peft, callbacks=[Clock()])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = torch.cuda.max_memory_allocated() if cuda else None
    trained = trainer.model
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in trained.parameters() if p.requires_grad})
    plan = plan_memory(PlanConfig(model="qwen3.5-9b", gpus_per_node=1, fsdp=case == "fsdp", lora=lora,
                                  precision="bf16" if cuda else "fp32", micro_batch=1, seq_len=T,
                                  checkpointing=True), tc)
    tensors = plan.total - plan.cuda_context - plan.margin
    step = statistics.median(times[1:] or times)
    n = sum(p.numel() for p in trained.parameters())
    return {"case": case, "model": f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M",
            "tokens": T, "steps": len(times), "tokens/s": round(T / step, 1),
            "peak GiB": round(peak / GIB, 2) if peak is not None else None,
            "planned tensors GiB": round(tensors / GIB, 2),
            "planned / peak": round(tensors / peak, 3) if peak else None,
            "FSDP": bool(getattr(trainer, "is_fsdp_enabled", False)), "trained dtypes": ",".join(dtypes),
            "device": torch.cuda.get_device_name() if cuda else "cpu"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="issue on a GPU, tiny on a CPU (default)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--case", choices=("lora", "fsdp"), default=None, help="run one case here, print its row")
    ap.add_argument("--out", default=None, help="markdown file (default: benchmarks/RESULTS_distill_gpu.md for "
                    "the issue shape, none for tiny)")
    args = ap.parse_args(argv)
    import torch

    shape = args.shape or ("issue" if torch.cuda.is_available() else "tiny")
    if args.case:
        print("ROW " + json.dumps(run_case(args.case, shape, args.steps)), flush=True)
        return 0
    rows = []
    for case in ("lora", "fsdp"):  # each in its own process: its own peak, its own process group
        proc = subprocess.run([sys.executable, __file__, "--case", case, "--shape", shape, "--steps", str(args.steps)],
                              capture_output=True, text=True)
        got = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
        if proc.returncode != 0 or not got:
            print(f"{case}: FAILED (rc {proc.returncode})\n{proc.stderr[-3000:]}", file=sys.stderr)
            rows.append({"case": case, "error": f"rc {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"})
            continue
        rows.append(json.loads(got[-1][4:]))
    from mimo_kit.nb import markdown_table

    text = "\n".join(["# The distill path on a GPU", "",
                      f"`python benchmarks/bench_distill_gpu.py --shape {shape} --steps {args.steps}` · "
                      f"torch {torch.__version__} · {time.strftime('%Y-%m-%d')}", "",
                      __doc__.split("\n\n")[1].replace("\n", " "), "", markdown_table(rows), ""])
    print(text)
    out = args.out or ("benchmarks/RESULTS_distill_gpu.md" if shape == "issue" else None)
    if out:
        Path(out).write_text(text)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
