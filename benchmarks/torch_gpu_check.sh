#!/usr/bin/env bash
# The torch integration on one NVIDIA GPU after a change to how the hk:: ops are registered or launched: the GPU
# tests of tests/test_gpu_torch.py and tests/cuda/test_cuda_gpu.py, and the cuda conformance cases of the kernels the
# torch ops call. Log and conformance JSON under $OUT.
#   run (device tool): carry [".whl"], command: bash benchmarks/torch_gpu_check.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
export HK_CACHE_DIR=${HK_CACHE_DIR:-/tmp/hk-cache}
note() { echo "$*"; }
source benchmarks/device_install.sh
timeout 330 python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu_torch.py tests/cuda/test_cuda_gpu.py 2>&1 | tee "$OUT/pytest.log" | tail -25
timeout 150 $HK conformance --backend cuda -k "kernel/layernorm,kernel/rotary,kernel/attention_fwd,kernel/dropout" \
    --json "$OUT/conformance_kernels.json" 2>&1 | tail -3
