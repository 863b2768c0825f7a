#!/usr/bin/env bash
# "Fast in a model" on one NVIDIA GPU, in one or two device calls (STEPS picks): install, hk.precompile of what
# the model benchmarks launch (cold cache, in parallel), GPU correctness of the GEMM layouts and the block
# (benchmarks/layout_check.py), the cuda conformance cases of the GEMM, `hk bench` over the GEMM layouts, the ops'
# host time, GEMM tile configurations per operand layout (benchmarks/gemm_configs.py, step gemmcfg, not in the
# default STEPS), the first call in a new process (benchmarks/first_call.py), the Llama block against torch and
# torch.compile, the tunable tutorial kernel against torch.compile (step tunable; tunableauto with HK_AUTOTUNE=1), decode attention against cuDNN
# (step decode), and transformers' generate with hk attention against SDPA (benchmarks/generate_tokens.py; needs
# the transformers wheels in .whl/hf, see below). Results under $OUT (8 files at most); a summary last.
#
#   run (device tool): carry [".whl"], command: STEPS="env precompile correct conformance gemm host" bash benchmarks/model_check.sh
#   then (same warm machine, the cache kept in /tmp): STEPS="first block" bash benchmarks/model_check.sh
#   (.whl holds the stevedore wheel the device image lacks, as for benchmarks/h200_cuda_check.sh; .whl/hf the
#   wheels of transformers 5.25.0 and its dependencies but numpy, filelock, fsspec and typing_extensions, which the
#   image has: pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64
#   --platform manylinux_2_17_x86_64 -d .whl/hf transformers==5.25.0, then delete those four)
STEPS=${STEPS:-"env precompile correct conformance gemm host hostprof first block generate genprof"}
source benchmarks/device_steps.sh
step precompile 300 python3 benchmarks/model_precompile.py --json "$OUT/precompile.json"
step correct 300 python3 benchmarks/layout_check.py --json "$OUT/layout_check.json"
step conformance 300 $HK conformance --backend cuda -k "${CONFORMANCE_K:-kernel/gemm/}" --json "$OUT/conformance_gemm.json"
step gemm 420 $HK bench -k "gemm bf16" --json "$OUT/bench_gemm.json"
step gemmcfg 420 python3 benchmarks/gemm_configs.py --sizes 0 --layouts nn nt tn --shapes ${GEMM_SHAPES:-8192x5632x2048} \
    --json "$OUT/gemm_configs.json"
step host 200 $HK bench -k "op call" --json "$OUT/bench_host.json"
step hostprof 200 python3 benchmarks/host_profile.py --out "$OUT/host_profile.txt" --json "$OUT/host_profile.json"
step first 300 python3 benchmarks/first_call.py --repeats 2 --json "$OUT/first_call.json"
step block 560 $HK bench -k "llama block" --json "$OUT/bench_block.json"
# issue 42: the README's tunable kernel against torch.compile (its tiles the backend's choice)
step tunable 300 $HK bench -k "tunable" --json "$OUT/bench_tunable.json"
# the same with the autotuner on (HK_AUTOTUNE=1: each shape's candidates timed on the device on its first call)
HK_AUTOTUNE=1 step tunableauto 400 $HK bench -k "tunable" --json "$OUT/bench_tunable_autotune.json"
# decode attention at generate's sizes: attention_kvcache's forms against cuDNN (benchmarks/decode_attention.py)
step decode 300 python3 benchmarks/decode_attention.py --json "$OUT/decode.json"
if (want generate || want genprof) && ls .whl/hf/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-hf .whl/hf/*.whl >> "$LOG" 2>&1
    PYTHONPATH=${PYTHONPATH:-}:/tmp/site-hf step generate 300 python3 benchmarks/generate_tokens.py --json "$OUT/generate.json"
    PYTHONPATH=${PYTHONPATH:-}:/tmp/site-hf step genprof 200 python3 benchmarks/generate_profile.py --out "$OUT/generate_profile.txt"
fi

# the tables (the reply carries the end of the output)
grep -E "layout_check:|model_precompile:|CONFORMS|FAILED| us/call |^generate B|^\{'BM'" "$LOG" | tail -24
grep -E "^B[0-9]+ ctx|  hk auto |  hk 1 split s3 |  hk 16 splits |  cuDNN |kernels hk auto" "$LOG" | tail -60
for f in bench_gemm bench_host bench_block bench_tunable bench_tunable_autotune; do
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
