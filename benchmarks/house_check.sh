#!/usr/bin/env bash
# Every GPU check on one NVIDIA GPU, in one device call (after a refactor of the lowering that must change no
# generated kernel, or of how the hk:: ops are registered or launched): the cuda conformance of every library kernel
# and the GPU tests of the Hopper schedules, the launch path and the torch layer (tests/cuda/,
# tests/test_gpu_torch.py), in parallel pytest workers (each test compiles its own variants). Logs and conformance
# JSON under $OUT. (It replaces torch_gpu_check.sh, a subset.)
#   run (device tool): carry [".whl"], command: bash benchmarks/house_check.sh
#   (.whl: benchmarks/device_wheels.sh, here first: stevedore, which the device image lacks, and pytest-xdist +
#   execnet. A cold H100 ran it in about 530 s, 2026-12-07: conformance 221 s, the tests then cut at 300 s; 420 now)
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
export HK_CACHE_DIR=${HK_CACHE_DIR:-/tmp/hk-cache}
note() { echo "$*"; }
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
# the conformance Programs compiled into the cache in parallel first (the run itself then hits the cache)
timeout 200 python3 -m hk_portable.conformance.offline_compile --arch sm_90a --workers 16 2>&1 | tail -2
timeout 240 $HK conformance --backend cuda -k "kernel/" --json "$OUT/conformance_kernels.json" 2>&1 | tail -4
echo "conformance: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 420 python3 -m pytest -q -rfE -p no:cacheprovider -p no:benchmark -n "${WORKERS:-12}" ${TESTS:-tests/cuda tests/test_gpu_torch.py} \
    2>&1 | tee "$OUT/pytest.log" | tail -30
echo "pytest: $(( $(date +%s) - t0 )) s"
