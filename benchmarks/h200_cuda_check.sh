#!/usr/bin/env bash
# Everything the cuda backend's acceptance needs from a real NVIDIA GPU, in one command (one device call):
# install, environment, cache warm-up, `hk conformance --backend cuda` (JSON report), the GPU pytest tests
# (graph capture/replay, non-default stream ordering, ...), compute-sanitizer memcheck + racecheck on
# gemm/attention/layernorm incl. ragged shapes, and the launch-overhead benchmark. Results under $OUT
# (at most 8 files); a summary table is printed last.
#
#   run (device tool): carry [".whl"], command: bash benchmarks/h200_cuda_check.sh
#   (.whl holds the stevedore wheel, which the device image lacks:
#    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl stevedore==5.10.0;
#    with pytest-xdist and execnet there too, the GPU tests run on PYTEST_WORKERS (6) workers)
#
# PYTEST_K replaces the GPU tests' -k expression. STEPS (space-separated) picks steps: env precompile warmup conformance pytest memcheck racecheck synccheck initcheck
# overhead bench ncu serving decode (serving and decode are not in the default set: STEPS="env serving decode" runs them)
# (bench, `hk bench` over the issue's shapes, sweep, benchmarks/config_sweep.py, gemmcfg and attncfg,
#  benchmarks/{gemm,attention}_configs.py, and maskforms, benchmarks/attention_mask_forms.py, are not in the default
#  set: STEPS="... bench gemmcfg attncfg maskforms" adds them)
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
export HK_CACHE_DIR=${HK_CACHE_DIR:-/tmp/hk-cache}
STEPS=${STEPS:-"env precompile warmup conformance pytest memcheck racecheck synccheck initcheck overhead"}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
T_START=$(date +%s)

note() { echo "$*" | tee -a "$SUMMARY"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
# step NAME TIMEOUT LOG CMD...: run with a time limit, record status and duration in the summary
step() {
    local name=$1 limit=$2 log=$3; shift 3
    want "$name" || return 0
    local t0=$(date +%s)
    echo "=== $name (limit ${limit}s) ===" | tee -a "$log"
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    note "$(printf '%-12s rc=%-3s %4ss  (log %s)' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$(basename "$log")")"
    return $rc
}

# ---------------------------------------------------------------------------------------------- install
source benchmarks/device_install.sh
# the GPU tests on several workers where pytest-xdist is installed (.whl may carry it with execnet)
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${PYTEST_WORKERS:-6}")
# the sanitizers follow TMA's bulk copies too where this compute-sanitizer can (initcheck sees a tensor written by
# a TMA store as initialised only then)
SAN_FLAGS=$(compute-sanitizer --help 2>/dev/null | grep -q -- "--check-bulk-copy" && echo "--check-bulk-copy yes")

# ------------------------------------------------------------------------------------------------ steps
if want env; then
    {
        date -u +"date: %Y-%m-%dT%H:%M:%SZ"
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
        python3 - <<'PY'
import platform, torch, cupy
from cupy_backends.cuda.libs import nvrtc
import hk_portable as hk
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "cupy", cupy.__version__, "nvrtc", nvrtc.getVersion(), "hk_portable", hk.__version__)
print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
PY
        git log -1 --format="commit %H %s" 2>/dev/null || true
        COLUMNS=200 $HK backends
        which compute-sanitizer cuobjdump nvdisasm
    } >>"$OUT/env.txt" 2>&1
    note "env: $(grep -m1 '^device' "$OUT/env.txt")"
fi

# phase 1 (CPU-bound compiles): warm the cache for the suite, and run the sanitizer workload plainly once
# (a correctness check that also compiles its kernels outside the sanitizers)
step precompile 200 "$OUT/conformance.log" python3 -m hk_portable.conformance.offline_compile &
step warmup 150 "$OUT/sanitizer.log" python3 benchmarks/cuda_sanitize.py &
wait
# phase 2: independent of each other, side by side (the timing benchmark runs alone afterwards)
step conformance 280 "$OUT/conformance.log" $HK conformance --backend cuda --json "$OUT/conformance_cuda.json" \
    --problems-only --seed 20261130 &
step pytest 420 "$OUT/pytest.log" python3 -m pytest -q -rs -p no:cacheprovider $XDIST tests/cuda/test_cuda_gpu.py \
    tests/cuda/test_cuda_numerics.py tests/test_gpu_torch.py tests/cuda/test_cuda_hopper.py tests/test_clauncher.py \
    tests/hardening/test_hostile_names.py::test_a_hostile_name_runs_on_the_gpu tests/test_gpu_large_tensors.py \
    "tests/hardening/test_threads.py::test_eight_threads_with_different_shapes_and_dtypes[cuda]" \
    -k "${PYTEST_K:-not conformance_cases_on_cuda}" &
if command -v compute-sanitizer >/dev/null; then
    step memcheck 200 "$OUT/memcheck.log" compute-sanitizer --tool memcheck $SAN_FLAGS --error-exitcode 9 --print-limit 20 \
        python3 benchmarks/cuda_sanitize.py &
    step racecheck 200 "$OUT/racecheck.log" compute-sanitizer --tool racecheck $SAN_FLAGS --error-exitcode 9 --print-limit 20 \
        python3 benchmarks/cuda_sanitize.py &
    step synccheck 200 "$OUT/synccheck.log" compute-sanitizer --tool synccheck $SAN_FLAGS --error-exitcode 9 --print-limit 20 \
        python3 benchmarks/cuda_sanitize.py &
    # initcheck does not see a TMA store's writes: it runs the plain-store epilogue (cuda_sanitize.py says more)
    step initcheck 200 "$OUT/initcheck.log" env HK_SANITIZE_PLAIN_STORES=1 compute-sanitizer --tool initcheck $SAN_FLAGS --error-exitcode 9 --print-limit 20 \
        python3 benchmarks/cuda_sanitize.py &
else
    note "sanitizers: compute-sanitizer not on PATH"
fi
wait
cat "$OUT"/{memcheck,racecheck,synccheck,initcheck}.log >> "$OUT/sanitizer.log" 2>/dev/null
rm -f "$OUT"/{memcheck,racecheck,synccheck,initcheck}.log
# the report carries date and versions; add the GPU, driver and CUDA stack it ran on
[ -f "$OUT/conformance_cuda.json" ] && python3 - "$OUT/conformance_cuda.json" <<'PY' >>"$OUT/conformance.log" 2>&1
import json, subprocess, sys, torch, cupy
from cupy_backends.cuda.libs import nvrtc
import hk_portable as hk
path = sys.argv[1]
r = json.load(open(path))
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                     text=True).stdout.strip()
st = hk.get_backend("cuda").status()
r["environment"] = {"gpu": torch.cuda.get_device_name(), "nvidia_smi": smi, "torch_cuda": torch.version.cuda,
                    "cupy": cupy.__version__, "nvrtc": ".".join(map(str, nvrtc.getVersion())),
                    "backend_status": st.device or st.reason,
                    "numerics": {"ftz": False, "fmad": False, "prec_div": True, "prec_sqrt": True}}
json.dump(r, open(path, "w"), indent=1)
print("environment added to", path, r["environment"])
PY
step overhead 240 "$OUT/pytest.log" python3 benchmarks/launch_overhead.py --json "$OUT/launch_overhead.json" \
    --profile "$OUT/first_call_profile.txt"
# the device returns 8 files at most: the first call's profile travels inside pytest.log
[ -f "$OUT/first_call_profile.txt" ] && { echo "=== first call profile"; cat "$OUT/first_call_profile.txt"; } >> "$OUT/pytest.log" \
    && rm -f "$OUT/first_call_profile.txt"
# the side-by-side benchmark runs alone (timings); its plots travel as one tar (the device returns 8 files at most)
if want bench; then
    mkdir -p /tmp/hk-plots
    step bench 420 "$OUT/bench.log" $HK bench ${BENCH_ARGS:-} --json "$OUT/bench.json" --plot /tmp/hk-plots/bench
    tar -C /tmp/hk-plots -cf "$OUT/bench_plots.tar" . 2>/dev/null
fi

# hardware counters of one warm gemm and one warm attention launch (stall reasons, pipe use, memory)
if want ncu && command -v ncu >/dev/null; then
    # NCU_KERNELS / NCU_PROBE_ARGS / NCU_EXTRA narrow it (e.g. 'gemm', '--cublas', '--section SourceCounters')
    step ncu 240 "$OUT/ncu.log" ncu --clock-control none -k "regex:${NCU_KERNELS:-gemm|attention}" --launch-skip 2 \
        --launch-count ${NCU_COUNT:-2} --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
        --section LaunchStats --section MemoryWorkloadAnalysis ${NCU_EXTRA:-} python3 benchmarks/ncu_probe.py \
        ${NCU_PROBE_ARGS:-}
fi
# serving attention (varlen, KV caches): the tests' kernels on the GPU against CPU float64; decode bandwidth
# (its log goes to pytest.log: the device returns 8 files at most)
step serving 400 "$OUT/pytest.log" env HK_SERVING_TEST_DEVICE=cuda python3 -m pytest -q -rs -p no:cacheprovider \
    tests/test_attention_varlen.py tests/test_attention_kvcache.py tests/test_scalar_load.py
step decode 560 "$OUT/pytest.log" python3 benchmarks/decode_bandwidth.py --json "$OUT/decode_bandwidth.json" \
    --splits ${DECODE_SPLITS:-1,2,4,8}
step sweep 560 "$OUT/sweep.log" python3 benchmarks/config_sweep.py --json "$OUT/config_sweep.json"
step gemmcfg 300 "$OUT/gemmcfg.log" python3 benchmarks/gemm_configs.py --json "$OUT/gemm_configs.json"
step normcfg 300 "$OUT/gemmcfg.log" python3 benchmarks/norm_bwd_configs.py --json "$OUT/norm_bwd_configs.json"
step attncfg 300 "$OUT/gemmcfg.log" python3 benchmarks/attention_configs.py --json "$OUT/attention_configs.json"
step maskforms 200 "$OUT/gemmcfg.log" python3 benchmarks/attention_mask_forms.py --json "$OUT/attention_mask_forms.json"

# ---------------------------------------------------------------------------------------------- summary
echo
echo "================ summary ($(( $(date +%s) - T_START ))s) ================"
cat "$SUMMARY"
[ -f "$OUT/conformance_cuda.json" ] && python3 - "$OUT/conformance_cuda.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r.get("summary", {})
print("conformance:", s)
bad = [c for c in r.get("cases", []) if c.get("status") == "failed"]
for c in bad[:25]:
    print("  FAILED", c["id"], (c.get("reason") or "")[:300])
PY
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|FAILED|all sanitizer|=== " "$OUT/sanitizer.log" 2>/dev/null | head -30
grep -E "passed|failed|skipped|error" "$OUT/pytest.log" 2>/dev/null | tail -5
grep -B1 -A10 "launch path" "$OUT/pytest.log" 2>/dev/null
[ -f "$OUT/gemmcfg.log" ] && grep -vE "^=== (gemmcfg|attncfg|normcfg|maskforms)" "$OUT/gemmcfg.log" | tail -40
[ -f "$OUT/sweep.log" ] && grep -vE "^=== sweep" "$OUT/sweep.log" | tail -40
[ -f "$OUT/bench.log" ] && grep -vE "^(=== bench|wrote )" "$OUT/bench.log" | tail -40
