"""GEMM tile configurations on this GPU: each checked against float64 on ragged shapes, then timed against
cuBLAS (torch.matmul) at the benchmark sizes with hk bench's two timing methods. A measurement that seeds
the cuda backend's per-target defaults and checks the schedule a config lowers to (wgmma on sm_90a). --layouts
times the operand layouts a model produces (nt: b = W.t(), nn.Linear's forward; tn: a = x.t(), its weight
gradient; tt) at --shapes MxNxK as well as the square --sizes.

    python benchmarks/gemm_configs.py --json gemm_configs.json [--sizes 4096,8192] [--layouts nn nt tn]
                                      [--shapes 8192x5632x2048]
"""
from __future__ import annotations

import argparse
import time

import torch

CONFIGS = [  # (BM, BN, BK, STAGES, warps); on sm_90a the 64-wide-K ones lower to TMA + wgmma
    (64, 64, 32, 2, 4),
    (128, 256, 64, 4, 8),
    (128, 256, 64, 3, 8),
    (256, 128, 64, 4, 8),
    (128, 128, 64, 5, 8),
    (128, 128, 64, 4, 4),
    (64, 256, 64, 4, 4),
    (128, 192, 64, 4, 8),
]
CHECK_SHAPES = [(300, 520, 256), (129, 257, 200), (1000, 1000, 1000)]


def _cfg(c):
    bm, bn, bk, s, w = c
    return dict(BM=bm, BN=bn, BK=bk, STAGES=s, num_warps=w)


def operand(rows: int, cols: int, transposed: bool) -> torch.Tensor:
    """A [rows, cols] bf16 operand, row-major or the transposed view of a row-major [cols, rows] (W.t())."""
    if transposed:
        return torch.randn(cols, rows, device="cuda", dtype=torch.bfloat16).t()
    return torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)


def check(cfg, dtype, out_dtype=torch.float32) -> float:
    from hk_portable.kernels.gemm import gemm
    worst = 0.0
    for M, N, K in CHECK_SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=dtype)
        b = torch.randn(K, N, device="cuda", dtype=dtype)
        ref = a.double() @ b.double()
        out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
        gemm(a, b, out, backend="cuda", **cfg)
        err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
        worst = max(worst, err if err == err else float("inf"))
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="gemm_configs.json")
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--layouts", nargs="+", default=["nn"], choices=["nn", "nt", "tn", "tt"],
                    help="a/b as given (n) or a transposed view of a row-major tensor (t)")
    ap.add_argument("--shapes", nargs="*", default=[], metavar="MxNxK")
    ap.add_argument("--only", nargs="+", default=None, metavar="BMxBNxBKsSwW", help="only these configs")
    args = ap.parse_args()
    from hk_portable.bench import time_side_by_side, to_json
    from hk_portable.kernels.gemm import gemm
    rows, t0 = [], time.time()
    names = {f"{c[0]}x{c[1]}x{c[2]}s{c[3]}w{c[4]}": c for c in CONFIGS}
    for c in CONFIGS if args.only is None else [names[n] for n in args.only]:
        cfg = _cfg(c)
        row = dict(cfg)
        try:
            tc = time.time()
            row["max_rel_err_bf16"] = check(cfg, torch.bfloat16)
            row["max_rel_err_f16"] = check(cfg, torch.float16)
            row["max_rel_err_bf16_out"] = check(cfg, torch.bfloat16, torch.bfloat16)    # 16-bit: the TMA store epilogue
            row["check_s"] = round(time.time() - tc, 1)
        except Exception as e:  # noqa: BLE001 - a refused config is a result
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            rows.append(row)
            print(row, flush=True)
            continue
        shapes = [(n, n, n) for n in map(int, args.sizes.split(",")) if n] + \
            [tuple(map(int, s.split("x"))) for s in args.shapes]
        for M, N, K in shapes:
            for lay in args.layouts:
                a = [operand(M, K, lay[0] == "t") for _ in range(2)]
                b = [operand(K, N, lay[1] == "t") for _ in range(2)]
                out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                t, tb = time_side_by_side({"hk": lambda i: gemm(a[i], b[i], out, backend="cuda", **cfg),
                                           "cublas": lambda i: torch.matmul(a[i], b[i], out=out)},
                                          2, "cuda", args.budget).values()
                fl = 2.0 * M * N * K
                tag = (f"{M}" if M == N == K else f"{M}x{N}x{K}") + ("" if lay == "nn" else f"_{lay}")
                row[f"tflops_{tag}"] = round(fl / t.ms / 1e9, 1)
                row[f"cublas_{tag}"] = round(fl / tb.ms / 1e9, 1)
                row[f"ratio_{tag}"] = round(tb.ms / t.ms, 3)
                row[f"agree_{tag}"] = bool(t.agree and tb.agree)
        rows.append(row)
        print(row, flush=True)
    to_json({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": torch.cuda.get_device_name(),
             "seconds": round(time.time() - t0, 1), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
