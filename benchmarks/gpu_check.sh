#!/usr/bin/env bash
# Everything mgpu measures on GPUs, in one command, into one results file (GPU machines are lent briefly):
#   1. the gpu-marked tests                              (at most 2 min)
#      (among them the step anatomy timed with real CUDA events: tests/unit/test_anatomy_events.py)
#   2. benchmarks/dp_vs_ddp.py: single GPU, dp, ddp      (at most 2.5 min)
#   3. benchmarks/overhead.py --gpus N: mgpu vs the hand-written DDP loop, 2 rounds per workload (at most 3 min)
#   4. the fit probe on charlm: peak GPU memory, step time, samples/s (at most 1 min)
#   5. benchmarks/audit_overhead.py --gpus N: the hand-written loop with and without mgpu launch --audit, one round
#      (at most 45 s)
# Each step has its own time limit, so the whole check ends within 9.5 minutes even if one step hangs. Where no CUDA
# GPU is visible every step says so and skips (the probe measures the CPU instead), and the script exits 0: it is
# safe to run anywhere.
#
#   benchmarks/gpu_check.sh [RESULTS_FILE]     (default: benchmarks/results/gpu-check-<host>-<time>.md)
#   PYTHON=/path/to/python benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${1:-benchmarks/results/gpu-check-$(hostname)-$STAMP.md}
mkdir -p "$(dirname "$OUT")"
JSON_DIR="${OUT%.md}"
mkdir -p "$JSON_DIR"
: > "$OUT"

say() { printf '%s\n' "$*" | tee -a "$OUT"; }
step() {  # step TITLE SECONDS COMMAND...: run with a hard time limit, output into the results file
  local title=$1 limit=$2; shift 2
  say ""; say "## $title"; say ""; say "\`$*\` (limit ${limit} s)"; say ""; say '```'
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$OUT"
  local rc=${PIPESTATUS[0]}
  say '```'
  say "exit code $rc after $((SECONDS - t0)) s$([ "$rc" = 124 ] && echo ' (time limit reached)')"
  return 0
}

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
say "# mgpu GPU check, $STAMP"
say ""
say "host $(hostname); $("$PY" -c 'import platform, torch; print(f"Python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {torch.cuda.nccl.version() if torch.cuda.is_available() else None}")' 2>&1)"
if command -v nvidia-smi >/dev/null 2>&1; then
  say ""; say '```'; nvidia-smi -L 2>&1 | tee -a "$OUT"; say '```'
fi
if [ "$GPUS" = 0 ]; then
  say ""; say "No CUDA GPU is visible: every GPU step below skips (the commands still run, to show they skip cleanly)."
fi
N=$([ "$GPUS" = 0 ] && echo 1 || echo "$GPUS")

step "gpu-marked tests" 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests
step "DataParallel vs DistributedDataParallel" 150 "$PY" benchmarks/dp_vs_ddp.py --gpus "$N" --timeout 45 \
  --json "$JSON_DIR/dp_vs_ddp.json"
step "mgpu vs the hand-written DDP loop on $GPUS GPU(s)" 180 "$PY" benchmarks/overhead.py --gpus "$N" --rounds 2 \
  --cli-repeats 5 --timeout 40 --json "$JSON_DIR/overhead.json"
DEVICES=$([ "$GPUS" = 0 ] && echo "--cpu --nproc 1" || echo "--gpus $N")
# shellcheck disable=SC2086  # DEVICES is two or three words on purpose
step "fit probe: mgpu launch $DEVICES charlm --probe" 60 "$PY" -m mgpucli launch $DEVICES charlm --probe --json
step "mgpu launch --audit on $GPUS GPU(s): a correct loop, no findings, the same weights" 45 "$PY" \
  benchmarks/audit_overhead.py --gpus "$N" --workload charlm --rounds 1 --timeout 20 --json "$JSON_DIR/audit_overhead.json"

say ""
say "results: $OUT (JSON in $JSON_DIR/)"
