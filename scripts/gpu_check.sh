#!/usr/bin/env bash
# GPU check for one CUDA machine: prints the GPU (nvidia-smi) and the torch / CUDA versions, runs the `gpu` tests
# (tests/test_gpu.py: the decoder against transformers in fp32 and bf16, pre-training, an RL step, activation
# checkpointing and FSDP2 on the GPU), then the GPU benchmark (benchmarks/bench_gpu.py, issue shape), which writes
# benchmarks/RESULTS_gpu.md, then the distill path (benchmarks/bench_distill_gpu.py: Qwen3.5-9B LoRA SFT at 4K tokens
# and a 0.6B full SFT under FSDP through distill-sft's Trainer arguments, beside the memory plan), which writes
# benchmarks/RESULTS_distill_gpu.md, then the batched speculative engine's round costs (benchmarks/bench_engine.py
# --round-costs cuda: a decode step, a verification of 4 tokens per row and each drafter's proposal, printed with the
# accepted length a drafter must reach to pay).
#
# Time: about 5 minutes on one H200, never more than 8: every stage runs under `timeout` (tests 150 s, benchmark
# 150 s with a 100 s measurement budget, distill path 130 s, round costs 30 s), plus a few seconds of set-up.
# Installs nothing when the kit and its test dependencies import; otherwise `pip install -e ".[dev]"` constrained to
# the torch already installed (torch is never replaced; this path needs the package index and more time). The
# benchmark runs even when tests fail; the exit status is non-zero when any stage failed.
#
#     bash scripts/gpu_check.sh    # from any directory; the interpreter: $PYTHON, else .venv/bin/python, else python3
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
if [[ -n "${PYTHON:-}" ]]; then
    PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then
    PY=.venv/bin/python
else
    PY=$(command -v python3 || command -v python) || { echo "FAILED: no python found"; exit 1; }
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's kit, whatever else is installed
failed=()
stage() { printf '\n==== %s (%d s elapsed) ====\n' "$1" "$SECONDS"; }

stage "machine"
echo "python: $PY"
nvidia-smi || failed+=("nvidia-smi")
"$PY" - <<'PYEOF'
import torch

print(f"torch {torch.__version__} · CUDA {torch.version.cuda} · cuDNN {torch.backends.cudnn.version()} · "
      f"CUDA available: {torch.cuda.is_available()}")
try:
    import transformers

    print(f"transformers {transformers.__version__}")
except ImportError:
    print("transformers: not installed")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}")
PYEOF
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "FAILED: torch does not import or sees no CUDA device; nothing to check here"
    exit 1
fi

stage "dependencies"
if "$PY" -c "import mimo_kit, transformers, trl, pytest, hypothesis, scipy" 2>/dev/null; then
    echo "the kit and its test dependencies import: nothing to install"
else
    constraints=$(mktemp)
    "$PY" -c "import torch; print(f'torch=={torch.__version__}')" >"$constraints"  # keep this torch build
    echo "installing the kit (pip install -e .[dev], $(cat "$constraints"))"
    timeout -k 10 300 "$PY" -m pip install -q --disable-pip-version-check -e ".[dev]" -c "$constraints" \
        || failed+=("pip install (rc $?)")
    rm -f "$constraints"
fi

stage "gpu tests"
per_test=()
if "$PY" -c "import pytest_timeout" 2>/dev/null; then
    per_test=(--timeout 90)  # a hung test fails alone instead of taking the whole stage with it
fi
# only the files that hold gpu-marked tests: the others need the notebook stack, which a GPU image may lack
mapfile -t gpu_files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
timeout -k 10 150 "$PY" -m pytest -m gpu -q ${per_test[@]+"${per_test[@]}"} "${gpu_files[@]}" \
    || failed+=("gpu tests (rc $?)")

stage "benchmark"
timeout -k 10 150 "$PY" benchmarks/bench_gpu.py --device cuda --shape issue --budget 100 \
    --out benchmarks/RESULTS_gpu.md || failed+=("benchmark (rc $?)")

stage "distill path"
timeout -k 10 130 "$PY" benchmarks/bench_distill_gpu.py --shape issue --steps 4 \
    --out benchmarks/RESULTS_distill_gpu.md || failed+=("distill path (rc $?)")

stage "speculative round costs"
timeout -k 5 30 "$PY" benchmarks/bench_engine.py --round-costs cuda || failed+=("speculative round costs (rc $?)")

stage "summary"
if ((${#failed[@]})); then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "all GPU checks passed; results in benchmarks/RESULTS_gpu.md and benchmarks/RESULTS_distill_gpu.md"
