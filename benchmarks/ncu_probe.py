"""A workload for Nsight Compute (`ncu`): the library's GEMM (8192³ bf16) and attention forward (B4 H16 N4096
D128, non-causal) launched a few times each, so ncu can profile one warm launch of each kernel. Run by
h200_cuda_check.sh's `ncu` step:

    ncu --clock-control none -k regex:'gemm|attention' --launch-skip 2 --launch-count 2 --section ... \\
        python3 benchmarks/ncu_probe.py

`--cublas` also launches torch.matmul on the same operands (profile it with a kernel regex such as
'gemm|xmma|cutlass'). `--attention N,D[,causal] ...` replaces the attention case by these (B*N = 16384 tokens,
16 heads), `--no-gemm` leaves the GEMM out: with `--launch-skip 2 --launch-count 1` per kernel name ncu then
profiles the third launch of each case (each case is launched three times in a row). `--config BMxBNsSwW` profiles
that attention tile instead of the library's choice (e.g. 128x128s2w8, FA3's block, where the library takes 64x64).
"""
from __future__ import annotations

import argparse

import torch

from hk_portable.kernels.attention import attention_fwd
from hk_portable.kernels.gemm import gemm

from attention_configs import _parse as tile_config  # this folder is on sys.path when run as a script
from attention_schedules import attention_case


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cublas", action="store_true")
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--attention", nargs="+", type=attention_case, default=[(4096, 128, False)])
    ap.add_argument("--config", type=tile_config, default={}, metavar="BMxBNsSwW",
                    help="the attention tile to profile (default: the library's choice)")
    args = ap.parse_args()
    if not args.no_gemm:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            gemm(a, b)
        if args.cublas:            # the baseline's kernel too (its tile, cluster and stall profile)
            for _ in range(3):
                torch.matmul(a, b)
    for n, d, causal in args.attention:
        q, k, v = (torch.randn(16384 // n, 16, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for _ in range(3):
            attention_fwd(q, k, v, causal=causal, **args.config)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
