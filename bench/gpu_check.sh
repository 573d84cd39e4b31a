#!/usr/bin/env bash
# bench/gpu_check.sh [--rehearse] OUT_DIR: the project's single GPU entry point.
#
# Runs every GPU-marked test and every GPU benchmark, each step under `timeout`, carries on past a
# failing step, writes logs/junit/reports into OUT_DIR (each step writes its rows as it goes, so a
# timeout keeps what was measured), prints a summary table last (per step: status, seconds, what it
# proved) and exits non-zero if any step failed. A GPU is lent for about 15 minutes, machine start
# included, so the run gets one try: GPU_CHECK_BUDGET_S (default 480) caps the total, and a step never
# gets more than what is left. The tl.dot kernels (decode_attention, linear, extend_attention) go first
# inside each step.
#
# --rehearse: on a machine without a GPU (CI runs it), every step's own Python path on CPU with tiny
# shapes and Triton's interpreter (each bench takes --rehearse), under a 420 s budget, so a step that
# would crash on the GPU crashes here first. Compiling every kernel for sm90 is CI's separate
# `python -m bench.compile_targets --check` (see .ci/run).
#
# Use another interpreter with PYTHON=.venv/bin/python bench/gpu_check.sh OUT_DIR; run some steps only
# with GPU_CHECK_STEPS=NAME,NAME (the summary lists the steps that ran).
# To add a step, append one line to the STEPS section:  step NAME TIMEOUT_S "WHAT IT PROVES" CMD [ARGS...]
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
BUDGET_S=${GPU_CHECK_BUDGET_S:-480}
export PYTHONUNBUFFERED=1
START=$(date +%s)

# ---- preflight: a GPU must be visible, to nvidia-smi and to torch -------------------------------
if ((REHEARSE)); then
    BUDGET_S=${GPU_CHECK_BUDGET_S:-420}
    export TRITON_INTERPRET=1
    echo "gpu_check: rehearsal on CPU, Triton interpreted, tiny shapes (nothing here runs on or times a GPU)"
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
PROVED=()
FAILED=0

ONLY=",${GPU_CHECK_STEPS:-},"  # GPU_CHECK_STEPS=sandbox-gpu,tune-gpu: only these steps (a short lease)

step() {  # step NAME TIMEOUT_S "WHAT IT PROVES" CMD [ARGS...]
    local name=$1 limit=$2 proves=$3
    shift 3
    [[ $ONLY == ",," || $ONLY == *",$name,"* ]] || return 0
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
    if [[ $status == ok ]]; then PROVED+=("$proves"); else PROVED+=("not proved"); fi
}

# ---- steps: one line each; the real run's timeouts sum to the 480 s budget ---------------------------
R=()  # the benches' rehearsal flag
((REHEARSE)) && R=(--rehearse)
step preflight 30 "every package and project module the steps import is there (versions printed)" \
    "$PYTHON" -m bench.preflight
if ((REHEARSE)); then
    step pytest-gpu-collect 60 "every gpu-marked test imports and collects" \
        env KERNELLOOP_GPU_TESTS=1 "$PYTHON" -m pytest -m gpu --collect-only -q -p no:cacheprovider
else
    step pytest-gpu 100 "gpu tests: baselines match references at engine shapes, CUDA timing, confined CUDA children, engine" \
        env KERNELLOOP_GPU_TESTS=1 "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT_DIR/pytest-gpu.xml"
fi
# baselines on the GPU: bfloat16; linear (20 rows) and extend_attention (6) at Llama-3-8B shapes, 4
# engine shapes of every other op: 46 rows, ~36 kernel compiles (~20 s), inputs drawn ahead by worker
# threads (6e9 values: ~50 s on one thread). Decode rows first, so the 40 s budget cuts prefill rows.
BASELINES=(--dtypes bfloat16 --max-shapes-per-op 4 --time-budget-s 40)
((REHEARSE)) && BASELINES=()
step baselines 60 "every baseline kernel runs and matches its reference; linear vs cuBLAS and extend_attention vs SDPA at Llama-3-8B shapes; % of roofline (bytes or FLOPs)" \
    "$PYTHON" -m bench.baselines "${R[@]}" "${BASELINES[@]}" --strict --out-dir "$OUT_DIR"
step sandbox-cuda 60 "CUDA initialises and runs in a process confined as a candidate's is (else: which layer breaks it)" \
    "$PYTHON" -m kernelloop.sandbox.judge.cuda_check --layers "${R[@]}"
SANDBOX_S=80
((REHEARSE)) && SANDBOX_S=140  # the interpreter judges the exploits' batteries (~1 min on 2 cores)
step sandbox-gpu "$SANDBOX_S" "the confined sandbox judges honest variants correct and times them; no exploit accepted" \
    "$PYTHON" -m bench.sandbox_gpu "${R[@]}" --out-dir "$OUT_DIR"
step engine-decode 70 "the engine serves an 8B-shaped model on Triton kernels (no fallback); tokens/s vs bound" \
    "$PYTHON" -m bench.engine_gpu "${R[@]}" --out-dir "$OUT_DIR"
QUANT_S=45  # SmolLM2-shaped, batch 1: 3 rounds of 128 tokens per side, each after a reload and graph capture
((REHEARSE)) && QUANT_S=60
step quantize-decode "$QUANT_S" "a quantization selection committed as scoped registry entries serves: decode tok/s at batch 1 vs unquantized" \
    "$PYTHON" -m bench.quantize_decode "${R[@]}" --out-dir "$OUT_DIR"

step profile-gpu 60 "the profiler's op table from device times; ncu where it works" \
    "$PYTHON" -m bench.profile_gpu "${R[@]}" --out-dir "$OUT_DIR"
TUNE_S=100  # the gate's runaway check adds ~10 s on a GPU; the interpreter needs longer for two candidates of the tiny model
((REHEARSE)) && TUNE_S=150
step tune-gpu "$TUNE_S" "the whole loop: profile, search, sandbox, commit, reload, gate; a correct candidate at least" \
    "$PYTHON" -m bench.tune_gpu "${R[@]}" --out-dir "$OUT_DIR"

CLUSTER_S=30  # skipped at once where Ray is not installed (the H200 image has none)
((REHEARSE)) && CLUSTER_S=90
step cluster-gpu "$CLUSTER_S" "the judge as Ray actors, one per GPU: candidates per minute against the local judge" \
    "$PYTHON" -m bench.cluster_throughput "${R[@]}" --device cuda --candidates 6 --out-dir "$OUT_DIR"

# ---- collect reports written during this run, then the summary (printed last) ---------------------
if [[ -d docs/benchmarks ]]; then
    find docs/benchmarks -maxdepth 1 -name '*.md' -newer "$STAMP" -exec cp {} "$OUT_DIR/" \;
fi
rm -f "$STAMP"
{
    echo
    echo "== gpu_check summary ($(($(date +%s) - START))s total, results in $OUT_DIR)"
    ((REHEARSE)) && echo "(rehearsal: each step's CPU path at tiny shapes; nothing is proved about a GPU)"
    printf '%-20s %-20s %8s  %s\n' step status seconds proved
    for i in "${!NAMES[@]}"; do
        printf '%-20s %-20s %8s  %s\n' "${NAMES[$i]}" "${STATUSES[$i]}" "${TIMES[$i]}" "${PROVED[$i]}"
    done
} | tee "$OUT_DIR/summary.txt"
exit "$FAILED"
