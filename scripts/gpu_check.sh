#!/usr/bin/env bash
# GPU check for one CUDA machine, cheapest stage first, each under `timeout` (the whole under 8 minutes):
#
#   machine (~5 s)            nvidia-smi, torch / CUDA versions
#   dependencies (~0 s)       installs nothing when the kit and its test dependencies import; otherwise
#                             `pip install -e ".[dev]"` constrained to the torch already installed (never replaced)
#   round costs (≤ 25 s)      benchmarks/bench_engine.py --round-costs: a decode step, a verification of 4 tokens
#                             per row and each drafter's proposal, with the accepted length a drafter must reach
#   gpu tests (≤ 120 s)        tests marked gpu: the decoder against transformers in fp32 and bf16, training on
#                             CUDA, FSDP2, FlexAttention's logits and gradients against the eager kernels, compiled
#                             decode on CUDA graphs against the eager step, speculative rollouts lossless (χ²)
#   benchmark (≤ 140 s)       benchmarks/bench_gpu.py (issue shape, 100 s of measurements): MFU of the train step and
#                             the 16K prefill with the previous (eager) and fused (flex) attention kernels, batch-1
#                             decode at 8,192 tokens eager vs compiled against the HBM bound → RESULTS_gpu.md
#   speculative rollouts (≤ 85 s)  benchmarks/bench_engine.py --check: repo-world episodes end to end, plain eager,
#                             plain compiled and speculative compiled engines → RESULTS_engine_cuda.md
#   distill path (≤ 90 s)     benchmarks/bench_distill_gpu.py: Qwen3.5-9B LoRA SFT at 4K tokens and a 0.6B full SFT
#                             under FSDP through distill-sft's Trainer arguments, beside the plan
#                             → RESULTS_distill_gpu.md
#
# Every stage runs even when an earlier one failed; the exit status is non-zero when any did.
#
#     bash scripts/gpu_check.sh              # from any directory; interpreter: $PYTHON, else .venv/bin/python,
#                                            # else python3; results into benchmarks/ (or $GPU_CHECK_OUT)
#     bash scripts/gpu_check.sh --dry-run    # every stage on the CPU at toy size, results into a temporary folder
#                                            # (or $GPU_CHECK_OUT), timeouts × 4: the plumbing, no GPU figures
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

dry=0
if [[ "${1:-}" == "--dry-run" ]]; then
    dry=1
elif [[ -n "${1:-}" ]]; then
    echo "usage: bash scripts/gpu_check.sh [--dry-run]"; exit 2
fi
if ((dry)); then
    DEV=cpu
    OUT=${GPU_CHECK_OUT:-$(mktemp -d)}
    scale=4  # a CPU compiles the decode graphs in tens of seconds each: the dry run checks the plumbing, not time
else
    DEV=cuda
    OUT=${GPU_CHECK_OUT:-benchmarks}
    scale=1
fi
mkdir -p "$OUT"

stage "machine"
echo "python: $PY · device: $DEV · results: $OUT"
if ((dry)); then
    echo "dry run: every stage on the CPU at toy size"
else
    nvidia-smi || failed+=("nvidia-smi")
fi
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
if ((!dry)) && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "FAILED: torch does not import or sees no CUDA device; nothing to check here (try --dry-run)"
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

stage "speculative round costs"
timeout -k 5 $((25 * scale)) "$PY" benchmarks/bench_engine.py --round-costs "$DEV" \
    || failed+=("speculative round costs (rc $?)")

stage "gpu tests"
per_test=()
if "$PY" -c "import pytest_timeout" 2>/dev/null; then
    per_test=(--timeout 90)  # a hung test fails alone instead of taking the whole stage with it
fi
# only the files that hold gpu-marked tests: the others need the notebook stack, which a GPU image may lack
mapfile -t gpu_files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
collect=()
((dry)) && collect=(--collect-only)  # a CPU skips them: the dry run checks that they collect
timeout -k 10 $((120 * scale)) "$PY" -m pytest -m gpu -q ${per_test[@]+"${per_test[@]}"} ${collect[@]+"${collect[@]}"} \
    "${gpu_files[@]}" || failed+=("gpu tests (rc $?)")

stage "benchmark"
if ((dry)); then
    bench=(--device cpu --shape tiny --budget 60)
else
    bench=(--device cuda --shape issue --budget 100)
fi
timeout -k 10 $((140 * scale)) "$PY" benchmarks/bench_gpu.py "${bench[@]}" --no-compare --out "$OUT/RESULTS_gpu.md" \
    || failed+=("benchmark (rc $?)")

stage "speculative rollouts"
engine=(--check --device "$DEV" --out "$OUT/RESULTS_engine_$DEV.md")
((dry)) && engine+=(--untrained --quick)
timeout -k 10 $((85 * scale)) "$PY" benchmarks/bench_engine.py "${engine[@]}" \
    || failed+=("speculative rollouts (rc $?)")

stage "distill path"
if ((dry)); then
    distill=(--shape tiny --steps 2)
else
    distill=(--shape issue --steps 4)
fi
timeout -k 10 $((90 * scale)) "$PY" benchmarks/bench_distill_gpu.py "${distill[@]}" \
    --out "$OUT/RESULTS_distill_gpu.md" \
    || failed+=("distill path (rc $?)")

stage "summary"
if ((${#failed[@]})); then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "all GPU checks passed ($SECONDS s); results in $OUT:" \
    "RESULTS_gpu.md, RESULTS_engine_$DEV.md, RESULTS_distill_gpu.md"
