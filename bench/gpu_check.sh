#!/usr/bin/env bash
# bench/gpu_check.sh [--rehearse] OUT_DIR: the project's single GPU entry point.
#
# --rehearse: on a machine without a GPU (CI runs it), the parts of the run that can fail before any
# GPU time: every import the steps need (bench/preflight.py, versions printed), collection of every
# gpu-marked test, and every baseline and search-template kernel compiled for sm90 (bench.compile_targets
# --check). Still to come (issue #11): each step's own Python path on CPU with tiny shapes.
#
# Runs every GPU-marked test and every GPU benchmark, each step under `timeout`, carries on past a
# failing step, writes logs/junit/reports into OUT_DIR, prints a summary table last and exits
# non-zero if any step failed. The whole run must stay under 10 minutes on one H100/H200:
# GPU_CHECK_BUDGET_S (default 540) caps the total, and a step never gets more than what is left.
#
# Use another interpreter with PYTHON=.venv/bin/python bench/gpu_check.sh OUT_DIR.
# To add a step, append one line to the STEPS section:  step NAME TIMEOUT_S CMD [ARGS...]
# (NAME becomes OUT_DIR/NAME.log; a step that writes docs/benchmarks/*.md gets copied automatically).

set -uo pipefail

REHEARSE=0
if [[ "${1:-}" == "--rehearse" ]]; then
    REHEARSE=1
    shift
fi
if [[ $# -ne 1 ]]; then
    echo "usage: bench/gpu_check.sh [--rehearse] OUT_DIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUT_DIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
PYTHON=${PYTHON:-python}
BUDGET_S=${GPU_CHECK_BUDGET_S:-540}
export PYTHONUNBUFFERED=1
START=$(date +%s)

# ---- preflight: a GPU must be visible, to nvidia-smi and to torch -------------------------------
if ((REHEARSE)); then
    echo "gpu_check: rehearsal on CPU (nothing here runs on or times a GPU)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" | tee "$OUT_DIR/device.txt"
else
    if [[ -n "${TRITON_INTERPRET:-}" && "${TRITON_INTERPRET}" != "0" ]]; then
        echo "gpu_check: unsetting TRITON_INTERPRET=${TRITON_INTERPRET} (this run compiles kernels for the GPU)"
        unset TRITON_INTERPRET
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu_check: no GPU: nvidia-smi is missing or sees no device; nothing to check" >&2
        exit 1
    fi
    if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu_check: no GPU: torch.cuda.is_available() is False for $PYTHON; nothing to check" >&2
        exit 1
    fi
    {
        echo "== device facts"
        nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
            --format=csv
        "$PYTHON" - <<'EOF'
import platform, torch, triton
p = torch.cuda.get_device_properties(0)
print(f"torch {torch.__version__} (cuda {torch.version.cuda}), triton {triton.__version__}, python {platform.python_version()}")
print(f"{p.name}: sm{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB")
EOF
        echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ' + uncommitted changes')"
    } 2>&1 | tee "$OUT_DIR/device.txt"
fi

STAMP="$OUT_DIR/.gpu_check_started"  # reports newer than this were written by this run
touch "$STAMP"

# ---- steps ----------------------------------------------------------------------------------------
NAMES=()
STATUSES=()
TIMES=()
FAILED=0

step() {  # step NAME TIMEOUT_S CMD [ARGS...]
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET_S - ($(date +%s) - START)))
    local status t0 rc
    t0=$(date +%s)
    if ((left < 20)); then
        status="SKIPPED (budget)"
        FAILED=1
        echo "=== [$name] skipped: only ${left}s of the ${BUDGET_S}s budget left"
    else
        ((limit > left)) && limit=$left
        echo "=== [$name] (timeout ${limit}s) $*"
        timeout --kill-after=15 "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
        rc=${PIPESTATUS[0]}
        case $rc in
            0) status="ok" ;;
            124 | 137) status="TIMEOUT (${limit}s)" ;;
            *) status="FAIL (rc $rc)" ;;
        esac
        ((rc != 0)) && FAILED=1
    fi
    NAMES+=("$name")
    STATUSES+=("$status")
    TIMES+=($(($(date +%s) - t0)))
}

# One line per step; keep the sum of timeouts under BUDGET_S.
step preflight 60 "$PYTHON" -m bench.preflight
if ((REHEARSE)); then
    step pytest-gpu-collect 120 env KERNELLOOP_GPU_TESTS=1 "$PYTHON" -m pytest -m gpu --collect-only -q -p no:cacheprovider
    step compile-sm90 420 "$PYTHON" -m bench.compile_targets --targets sm90 --check --out-dir "$OUT_DIR"
fi
((REHEARSE)) || step pytest-gpu 100 env KERNELLOOP_GPU_TESTS=1 "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT_DIR/pytest-gpu.xml"
((REHEARSE)) || step baselines 90 "$PYTHON" -m bench.baselines --device cuda --strict --time-budget-s 60 --out-dir "$OUT_DIR"
((REHEARSE)) || step engine-decode 100 "$PYTHON" -m bench.engine_gpu --out-dir "$OUT_DIR"
((REHEARSE)) || step sandbox-gpu 80 "$PYTHON" -m bench.sandbox_gpu --out-dir "$OUT_DIR"
((REHEARSE)) || step profile-gpu 80 "$PYTHON" -m bench.profile_gpu --out-dir "$OUT_DIR"
((REHEARSE)) || step tune-gpu 90 "$PYTHON" -m bench.tune_gpu --out-dir "$OUT_DIR"

# ---- collect reports written during this run, then the summary (printed last) ---------------------
if [[ -d docs/benchmarks ]]; then
    find docs/benchmarks -maxdepth 1 -name '*.md' -newer "$STAMP" -exec cp {} "$OUT_DIR/" \;
fi
rm -f "$STAMP"
{
    echo
    echo "== gpu_check summary ($(($(date +%s) - START))s total, results in $OUT_DIR)"
    printf '%-24s %-20s %8s\n' step status seconds
    for i in "${!NAMES[@]}"; do
        printf '%-24s %-20s %8s\n' "${NAMES[$i]}" "${STATUSES[$i]}" "${TIMES[$i]}"
    done
} | tee "$OUT_DIR/summary.txt"
exit "$FAILED"
