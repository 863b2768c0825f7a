# The frame of a device script (model_check.sh, attention_bwd_check.sh), sourced after the script sets its default
# STEPS: results under $OUT (log.txt, summary.txt), note/want/step, the install (device_install.sh) and the env step.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
export HK_CACHE_DIR=${HK_CACHE_DIR:-/tmp/hk-cache}
SUMMARY="$OUT/summary.txt"
LOG="$OUT/log.txt"
touch "$SUMMARY" "$LOG"

note() { echo "$*" | tee -a "$SUMMARY"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
step() {    # step NAME LIMIT CMD...: run with a time limit into log.txt; status and duration into the summary
    local name=$1 limit=$2; shift 2
    want "$name" || return 0
    local t0=$(date +%s)
    echo "=== $name (limit ${limit}s) ===" >> "$LOG"
    timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
    local rc=$?
    note "$(printf '%-12s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")"
}

source benchmarks/device_install.sh
if ! python3 -c 'import stevedore' 2>/dev/null; then     # the backend registry: nothing runs without it
    note "no stevedore on the device: run benchmarks/device_wheels.sh here first and carry .whl"; exit 1
fi
cat "$OUT/env.txt" >> "$LOG" && rm -f "$OUT/env.txt"     # 8 files come back at most

if want env; then
    { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
      python3 -c 'import torch, cupy; from hk_portable.backends.cuda import compiler
print("torch", torch.__version__, "cupy", cupy.__version__, "nvrtc", compiler.nvrtc_version(), torch.cuda.get_device_name())'
    } 2>&1 | tee -a "$SUMMARY"
fi
