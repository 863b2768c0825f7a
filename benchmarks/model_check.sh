#!/usr/bin/env bash
# "Fast in a model" on one NVIDIA GPU, in one or two device calls (STEPS picks): install, hk.precompile of what
# the model benchmarks launch (cold cache, in parallel), GPU correctness of the GEMM layouts and the block
# (benchmarks/layout_check.py), the cuda conformance cases of the GEMM, `hk bench` over the GEMM layouts, the ops'
# host time, the first call in a new process (benchmarks/first_call.py), and the Llama block against torch and
# torch.compile. Results under $OUT (8 files at most); a summary last.
#
#   run (device tool): carry [".whl"], command: STEPS="env precompile correct conformance gemm host" bash benchmarks/model_check.sh
#   then (same warm machine, the cache kept in /tmp): STEPS="first block" bash benchmarks/model_check.sh
#   (.whl holds the stevedore wheel the device image lacks, as for benchmarks/h200_cuda_check.sh)
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
export HK_CACHE_DIR=${HK_CACHE_DIR:-/tmp/hk-cache}
STEPS=${STEPS:-"env precompile correct conformance gemm host hostprof first block"}
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
cat "$OUT/env.txt" >> "$LOG" && rm -f "$OUT/env.txt"     # 8 files come back at most

if want env; then
    { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
      python3 -c 'import torch, cupy; from hk_portable.backends.cuda import compiler
print("torch", torch.__version__, "cupy", cupy.__version__, "nvrtc", compiler.nvrtc_version(), torch.cuda.get_device_name())'
    } 2>&1 | tee -a "$SUMMARY"
fi
step precompile 300 python3 benchmarks/model_precompile.py --json "$OUT/precompile.json"
step correct 300 python3 benchmarks/layout_check.py --json "$OUT/layout_check.json"
step conformance 300 $HK conformance --backend cuda -k kernel/gemm/ --json "$OUT/conformance_gemm.json"
step gemm 420 $HK bench -k "gemm bf16" --json "$OUT/bench_gemm.json"
step host 200 $HK bench -k "op call" --json "$OUT/bench_host.json"
step hostprof 150 python3 benchmarks/host_profile.py --out "$OUT/host_profile.txt"
step first 300 python3 benchmarks/first_call.py --repeats 2 --json "$OUT/first_call.json"
step block 560 $HK bench -k "llama block" --json "$OUT/bench_block.json"

# the tables (the reply carries the end of the output)
grep -E "layout_check:|model_precompile:|CONFORMS|FAILED| us/call " "$LOG" | tail -14
for f in bench_gemm bench_host bench_block; do
    [ -f "$OUT/$f.json" ] && python3 - "$OUT/$f.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for e in r["results"]:
    if "error" in e:
        print(f"{e['name']:44} ERROR {e['error'][:100]}"); continue
    ratios = " ".join(f"{v:5.2f}" for v in e.get("ratios_hk_over_each_baseline", {}).values())
    print(f"{e['name']:44} hk {e['hk']['rate']:8.4g} {e['unit']:8} x{ratios}  agree={e['hk']['agree']} "
          f"host_ms={e['hk']['host_ms_per_call']:.4f} err={e['rel_error']:.1e}")
PY
done
[ -f "$OUT/first_call.json" ] && sed -n '/op /,$p' "$LOG" | grep -A7 "warm first call" | tail -7
cat "$SUMMARY"
