#!/usr/bin/env bash
# Issue 36 (attention backward at FlashAttention-3's level on Hopper) on one H100/H200, in one device call of about
# 8 minutes: install, the static figures of what sm_90a builds (benchmarks/attention_bwd_static.py: configuration,
# registers, spills, wgmma), the cuda conformance cases of attention_bwd (and attention_fwd's, as the device library
# changed under both), `hk bench` of the backward against SDPA's cuDNN and flash backwards side by side at the
# issue's shapes (two timing methods, `agree`), spot checks of what else the library change reaches (the forward at
# D64/D128 N4096 against cuDNN, the 8192^3 GEMM in four layouts against cuBLAS), and the Llama block's training step. Results under $OUT (8 files at most); a summary last.
#
#   run (device tool): carry [".whl"], command: bash benchmarks/attention_bwd_check.sh
#   STEPS picks steps (conformance: every attention case, forward, backward, varlen and KV cache) (default: env static conformance bwd fwd gemm block; the limits add up past the tool's 600 s,
#   the usual run should take 6-7 minutes: where it is cut, rerun the rest on the warm machine, e.g. STEPS="gemm block");
#   BWD_K narrows the backward cases (default "attention_bwd": all eleven).
STEPS=${STEPS:-"env static conformance bwd fwd gemm block"}
source benchmarks/device_steps.sh
step static 120 python3 benchmarks/attention_bwd_static.py --json "$OUT/static.json"
# the conformance cases as pytest tests in 16 workers (pytest-xdist from .whl), each compiling its own: serially the
# 88 attention cases took over 150 s on a cold cache (2026-12-07); CONFORMANCE_K is a pytest -k expression
step conformance 300 python3 -m pytest --pyargs hk_portable.conformance --hk-backend cuda --hk-seed random -n 16 -q -rfE \
    -p no:cacheprovider -k "${CONFORMANCE_K:-attention}" --junitxml "$OUT/conformance.xml"
step bwd 200 $HK bench -k "${BWD_K:-attention_bwd}" --budget 0.5 --json "$OUT/bench_bwd.json"
step fwd 60 $HK bench -k "attention_fwd B4 H16 N4096 D" --budget 0.5 --json "$OUT/bench_fwd.json"
step gemm 60 $HK bench -k "gemm bf16 8192x8192x8192" --budget 0.5 --json "$OUT/bench_gemm.json"
step block 120 $HK bench -k "llama block train" --json "$OUT/bench_block.json"
# the backward kernel by kernel, and what dQ's adds cost (benchmarks/attention_bwd_parts.py; not in the default STEPS)
step parts 200 python3 benchmarks/attention_bwd_parts.py --cases "${PARTS_CASES:-llama,d128}" --json "$OUT/parts.json"
# hardware counters of the main kernel (second and third atomic launch, first deterministic one) at the Llama shape:
# stall reasons per SASS instruction, grouped by execution count (benchmarks/ncu_regions.py)
if want ncu && command -v ncu >/dev/null; then
    step ncu 300 ncu --clock-control none -k "regex:attention_bwd_dkdv" --launch-skip 1 --launch-count 3 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section SourceCounters -f -o /tmp/dkdv \
        python3 benchmarks/attention_bwd_parts.py --ncu --cases llama
    ncu --import /tmp/dkdv.ncu-rep --page details --csv > "$OUT/ncu_details.csv" 2>> "$LOG"
    ncu --import /tmp/dkdv.ncu-rep --page source --csv --print-source sass > /tmp/dkdv_src.csv 2>> "$LOG"
    python3 benchmarks/ncu_regions.py /tmp/dkdv_src.csv --top 12 > "$OUT/ncu_regions.txt" 2>&1
    gzip -c /tmp/dkdv_src.csv > "$OUT/ncu_src.csv.gz"
fi

# the tables (the reply carries the end of the output)
grep -E "attention_bwd_static:|CONFORMS|FAILED|failed |passed" "$LOG" | tail -20
grep -E "^  [a-zA-Z]|dkdv \{" "$LOG" | tail -24
for f in bench_bwd bench_fwd bench_gemm bench_block; do
    [ -f "$OUT/$f.json" ] && python3 - "$OUT/$f.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for e in r["results"]:
    if "error" in e:
        print(f"{e['name']:52} ERROR {e['error'][:100]}"); continue
    ratios = " ".join(f"{k.split()[1] if len(k.split()) > 1 else k}={v:5.2f}"
                      for k, v in e.get("ratios_hk_over_each_baseline", {}).items())
    print(f"{e['name']:52} hk {e['hk']['rate']:8.4g} {e['unit']:8} x {ratios}  agree={e['hk']['agree']} "
          f"ms={e['hk'].get('ms', float('nan')):.3f} err={e['rel_error']:.1e}")
PY
done
cat "$SUMMARY"
