"""benchmarks/bench_gpu.py on the CPU: its FLOP count, and a smoke run of the whole script (tiny shape)."""

import importlib.util
import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mimo_kit.model.config import FULL, MiMoConfig
from mimo_kit.model.params import count_parameters

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module  # dataclasses resolve the module's annotations through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_gpu", None)


def test_attention_pairs_count_the_causal_half_and_the_band(bench):
    for T in (1, 5, 16, 17, 100):
        assert bench.attention_pairs(T) == sum(i + 1 for i in range(T))  # GA: query i sees keys 0..i
        for W in (1, 4, 16, 128):
            assert bench.attention_pairs(T, W) == sum(min(i + 1, W) for i in range(T))  # SWA: the W most recent


def test_flops_follow_the_docstring_formula(bench):
    cfg = MiMoConfig.preset("tiny", **bench.ISSUE_MODEL)
    c = count_parameters(cfg)
    assert round(c["total"] / 1e9, 2) == 3.62 and round(c["active"] / 1e9, 2) == 0.71  # the issue's shape
    n = bench.matmul_params(cfg)
    sinks = cfg.num_attention_heads * sum(t != FULL for t in cfg.layer_types)
    assert n["head"] == cfg.vocab_size * cfg.hidden_size
    assert n["body"] + n["head"] == c["active"] - c["embeddings"] - c["norms"] - sinks
    T = 4096
    per_pair = 2 * 32 * (64 + 64)
    attn = per_pair * (3 * T * (T + 1) // 2 + 9 * (128 * 129 // 2 + (T - 128) * 128))  # 3 GA, 9 SWA layers
    fwd = bench.forward_flops(cfg, T)
    assert fwd["attention"] == attn and fwd["matmul"] == 2 * (n["body"] + n["head"]) * T
    assert bench.train_flops(cfg, T)["total"] == 3 * fwd["total"]  # 6·N·T + 3·attention
    pre = bench.forward_flops(cfg, T, logits=1)  # a prefill's LM head runs on the last position only
    assert pre["matmul"] == 2 * n["body"] * T + 2 * n["head"]
    assert 15e12 < bench.train_flops(cfg, T)["total"] < 18e12  # ≈ 6 · 0.64B · 4096 + 0.6 TFLOP of attention


def parse_table(text: str) -> dict[str, dict[str, str]]:
    """The first markdown table of ``text`` (its contiguous ``|`` lines): rows by their first cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    block = [line for line in itertools.takewhile(lambda x: x.startswith("|"), lines[start:])]
    head = [c.strip() for c in block[0].strip("|").split("|")]
    rows = {}
    for line in block[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head, cells))
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%"))


@pytest.mark.slow
@pytest.mark.outcome  # the script's training row steps AdamW (in the process it starts)
def test_cpu_smoke_run_writes_the_table(tmp_path):
    """The whole script on the tiny shape, as ``scripts/gpu_check.sh`` runs it on a GPU (~30 s on 2 cores)."""
    out = tmp_path / "RESULTS_gpu.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--shape", "tiny", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    text = out.read_text()
    assert "torch " in text and "CUDA none" in text and "6·(N + N_head)·T + 3·attn" in text
    rows = parse_table(text)
    expected = ["matmul bf16 256³", "matmul bf16 512³", "train 128 tok (fwd+bwd+AdamW), eager attention",
                "train 128 tok (fwd+bwd+AdamW), flex attention", "prefill 512 tok, eager attention",
                "prefill 512 tok, flex attention", "memory copy 64 MiB", "decode 1 row at 256 tokens, eager step",
                "decode 1 row at 256 tokens, compiled step", "prefill 128 tok, kit",
                "prefill 128 tok, transformers eager"]
    assert list(rows) == expected
    # FlexAttention trains on CUDA only: the one row a CPU skips, saying why
    assert rows.pop("train 128 tok (fwd+bwd+AdamW), flex attention")["note"].startswith("skipped: FlexAttention")
    flex = rows["prefill 512 tok, flex attention"]["note"]
    assert number(flex.split("by ")[1].split(" ")[0]) < 1e-2, flex  # bf16 weights: equal up to bf16 rounding
    for name, row in rows.items():
        assert not row["note"].startswith(("error", "skipped")), (name, row["note"])
        if name.startswith(("memory", "decode")):
            assert number(row["ms / iter"]) > 0
            continue
        cols = ["TFLOP / iter", "ms / iter", "TFLOP/s", "MFU (790 TFLOP/s)"]
        if not name.startswith("matmul"):
            cols += ["tokens/s", "MFU (measured peak)"]
        for col in cols:
            v = number(row[col])
            assert math.isfinite(v) and v > 0, (name, col, row[col])
    assert "kit speed" in rows["prefill 128 tok, transformers eager"]["note"]
    assert "ran in bf16" in text  # the autocast probe: the kit casts the experts' grouped GEMM operands itself
    decode = parse_table(text.split("Batch-1 decode against the HBM bound")[1])
    assert list(decode) == expected[7:9]
    for row in decode.values():  # a CPU step reads its bytes at some fraction of the copy bandwidth
        assert 0 < number(row["% of the bound (measured copy bandwidth)"]) and number(row["tokens/s"]) > 0


@pytest.mark.slow
@pytest.mark.outcome  # both cases train (in the process the test starts)
def test_the_distill_path_bench_runs_its_cases_on_the_tiny_shape(tmp_path):
    """benchmarks/bench_distill_gpu.py as gpu_check.sh runs it, at toy size on a CPU: both cases train through
    distill-sft's Trainer arguments (LoRA adapters only; the full fine-tune in fp32) and report tokens/s and the
    plan (a CPU has no peak counter, and accelerate shards on accelerators only)."""
    out = tmp_path / "RESULTS_distill_gpu.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_distill_gpu.py"), "--shape", "tiny",
                        "--steps", "2", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = parse_table(out.read_text())
    assert list(rows) == ["lora", "fsdp"]
    for row in rows.values():
        assert number(row["tokens/s"]) > 0 and number(row["planned tensors GiB"]) >= 0 and row["steps"] == "2"
        assert row["trained dtypes"] == "float32"  # adapters, or the full model's master weights
    assert number(rows["lora"]["model"].rstrip("MB")) > 0


@pytest.mark.slow
@pytest.mark.outcome  # its stages train (the benchmark's step, the drafters, the distill cases)
def test_gpu_check_dry_run_runs_every_stage_on_the_cpu(tmp_path):
    """scripts/gpu_check.sh --dry-run: every stage of the GPU check runs on the CPU at toy size, in the order of a
    GPU run (its timeouts × 4: a loaded CPU compiles slowly), and writes its three result files into $GPU_CHECK_OUT
    (the committed results are left alone)."""
    out = tmp_path / "results"
    committed = {p: p.read_bytes() for p in (ROOT / "benchmarks").glob("RESULTS_*.md")}
    env = {**os.environ, "GPU_CHECK_OUT": str(out), "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=1500)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    stages = [line.split("==== ")[1].split(" (")[0] for line in r.stdout.splitlines() if line.startswith("==== ")]
    assert stages == ["machine", "dependencies", "speculative round costs", "gpu tests", "benchmark",
                      "speculative rollouts", "distill path", "summary"]
    assert "all GPU checks passed" in r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["RESULTS_distill_gpu.md", "RESULTS_engine_cpu.md",
                                                     "RESULTS_gpu.md"]
    gpu = (out / "RESULTS_gpu.md").read_text()
    assert "decode 1 row at 256 tokens, compiled step" in gpu and "prefill 512 tok, flex attention" in gpu
    engine = parse_table((out / "RESULTS_engine_cpu.md").read_text())
    assert [k.split(",")[0] for k in engine] == ["plain", "plain", "speculative", "speculative"]
    assert {p: p.read_bytes() for p in (ROOT / "benchmarks").glob("RESULTS_*.md")} == committed


def test_gpu_check_refuses_an_unknown_argument():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--fast"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "usage: bash scripts/gpu_check.sh [--dry-run]" in r.stdout
