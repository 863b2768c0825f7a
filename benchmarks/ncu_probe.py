"""A workload for Nsight Compute (`ncu`): the library's GEMM (8192³ bf16) and attention forward (B4 H16 N4096
D128, non-causal) launched a few times each, so ncu can profile one warm launch of each kernel. Run by
h200_cuda_check.sh's `ncu` step:

    ncu --clock-control none -k regex:'gemm|attention' --launch-skip 2 --launch-count 2 --section ... \\
        python3 benchmarks/ncu_probe.py

`--cublas` also launches torch.matmul on the same operands (profile it with a kernel regex such as
'gemm|xmma|cutlass').
"""
from __future__ import annotations

import sys

import torch

from hk_portable.kernels.attention import attention_fwd
from hk_portable.kernels.gemm import gemm


def main() -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        gemm(a, b)
    if "--cublas" in sys.argv:            # the baseline's kernel too (its tile, cluster and stall profile)
        for _ in range(3):
            torch.matmul(a, b)
    q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(3):
        attention_fwd(q, k, v)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
