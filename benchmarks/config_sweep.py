"""Which tile configuration does each library kernel run best at on this GPU, with today's device library?
A measurement to seed each target's default configuration (and to check the autotuner's space), not a test.

    python benchmarks/config_sweep.py --json sweep.json [--workers 16]

Candidates are compiled first in parallel worker processes (each launches a tiny problem, which traces,
compiles and fills the shared compile cache), then timed one by one in this process with hk bench's two
timing methods on the benchmark shape. A candidate the backend refuses (shared memory, registers) is listed
with the reason."""
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import time

import torch

KERNELS = ("gemm", "attention_d128", "attention_d64", "layernorm")


def candidates(kernel: str) -> list[dict]:
    if kernel == "gemm":
        tiles = [(64, 64), (128, 64), (64, 128), (128, 128), (128, 256), (256, 128)]
        return [dict(BM=m, BN=n, BK=k, STAGES=s, warps=w) for (m, n), k, s, w
                in itertools.product(tiles, (32, 64), (2, 3, 4), (4, 8))]
    if kernel.startswith("attention"):
        d = int(kernel[-3:].lstrip("d"))
        return [dict(D=d, BM=m, BN=n, STAGES=s, warps=w) for m, n, s, w
                in itertools.product((64, 128), (32, 64, 128), (2, 3), (4, 8))]
    return [dict(BR=r, BC=c, warps=w) for r, c, w in itertools.product((16, 32, 64), (128, 256, 512), (1, 2, 4))
            if r >= 16 * w]


def _kernel_fn(kernel: str):
    if kernel == "gemm":
        from hk_portable.kernels.gemm import gemm_kernel as k
    elif kernel.startswith("attention"):
        from hk_portable.kernels.attention import attention_fwd_kernel as k
    else:
        from hk_portable.kernels.layernorm import dropout_residual_layernorm_kernel as k
    return k.fn


def make_call(kernel: str, cfg: dict, size: str):
    """A zero-argument call of the kernel at `cfg` on inputs of `size` ('tiny' or 'bench')."""
    import hk_portable as hk
    cfg = dict(cfg)
    kern = hk.kernel(_kernel_fn(kernel), num_warps=cfg.pop("warps"), name=f"{kernel}_sweep")
    dev, bf = "cuda", torch.bfloat16
    if kernel == "gemm":
        M = N = K = 256 if size == "tiny" else 8192
        a, b, c = torch.randn(M, K, device=dev, dtype=bf), torch.randn(K, N, device=dev, dtype=bf), \
            torch.empty(M, N, device=dev, dtype=bf)
        grid = (hk.cdiv(M, cfg["BM"]), hk.cdiv(N, cfg["BN"]))
        return (lambda: kern(a, b, c, grid=grid, **cfg)), 2.0 * M * N * K, "TFLOP/s"
    if kernel.startswith("attention"):
        B, H, N, D = (1, 2, 256, cfg["D"]) if size == "tiny" else (4, 16, 4096, cfg["D"])
        q, k, v, o = (torch.randn(B, H, N, D, device=dev, dtype=bf) for _ in range(4))
        lse = torch.empty(B, H, N, device=dev)
        grid = (hk.cdiv(N, cfg["BM"]), H, B)
        return (lambda: kern(q, k, v, o, lse, D ** -0.5, 0, 0, 0, grid=grid, MASKED=False, **cfg)), 4.0 * B * H * N * N * D, \
            "TFLOP/s"
    rows, d = (128, 4096) if size == "tiny" else (16384, 4096)
    x, r, y, h = (torch.randn(rows, d, device=dev, dtype=bf) for _ in range(4))
    w, bias = torch.randn(d, device=dev), torch.randn(d, device=dev)
    grid = (hk.cdiv(rows, cfg["BR"]),)
    return (lambda: kern(x, r, w, bias, y, h, 0.1, 1e-5, 1, 0, 0, 0, grid=grid, DROPOUT=True, **cfg)), \
        8.0 * rows * d, "GB/s"


def _compile_one(job) -> tuple[str, dict, str | None]:
    kernel, cfg = job
    try:
        call, _, _ = make_call(kernel, cfg, "tiny")
        call()
        torch.cuda.synchronize()
        return kernel, cfg, None
    except Exception as e:  # noqa: BLE001 - a refused candidate is a result
        return kernel, cfg, f"{type(e).__name__}: {str(e)[:300]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="config_sweep.json")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--budget", type=float, default=0.4)
    ap.add_argument("--deadline", type=float, default=420, help="seconds: past this, stop and write what is done")
    args = ap.parse_args()
    from hk_portable.bench import time_fn
    jobs = [(k, c) for k in args.kernels.split(",") for c in candidates(k)]
    t0 = time.time()
    compiled = []
    # the first H200 run (2026-12-01) printed nothing for 560 s and was killed: report as results arrive
    with mp.get_context("spawn").Pool(args.workers) as pool:
        for n, res in enumerate(pool.imap_unordered(_compile_one, jobs), 1):
            compiled.append(res)
            print(f"[{time.time() - t0:5.0f}s] compiled {n}/{len(jobs)} {res[0]} {res[1]}"
                  f"{' refused: ' + res[2][:80] if res[2] else ''}", flush=True)
            if time.time() - t0 > args.deadline / 2:
                print("compile phase past half the deadline: timing what is compiled", flush=True)
                pool.terminate()
                break
    t_compile = time.time() - t0
    rows = []
    for kernel, cfg, err in compiled:
        if time.time() - t0 > args.deadline:
            print("deadline reached: the remaining candidates are not timed", flush=True)
            break
        row = {"kernel": kernel, **cfg}
        if err is None:
            try:
                call, work, unit = make_call(kernel, cfg, "bench")
                t = time_fn(lambda i: call(), 1, "cuda", args.budget)
                row.update(ms=t.ms, ms_batch=t.ms_batch, agree=t.agree,
                           rate=work / (t.ms * 1e-3) / (1e12 if unit == "TFLOP/s" else 1e9), unit=unit)
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {str(e)[:300]}"
        if err:
            row["refused"] = err
        rows.append(row)
        print(f"[{time.time() - t0:5.0f}s] {row}", flush=True)
        torch.cuda.empty_cache()
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": torch.cuda.get_device_name(),
              "compile_seconds": t_compile, "rows": rows}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    for kernel in args.kernels.split(","):
        ok = sorted((r for r in rows if r["kernel"] == kernel and "rate" in r), key=lambda r: -r["rate"])
        print(f"== {kernel}: {len(ok)} ran, {sum(1 for r in rows if r['kernel'] == kernel and 'refused' in r)} "
              f"refused; best 5:")
        for r in ok[:5]:
            print("  ", {k: v for k, v in r.items() if k not in ("kernel", "ms_batch", "agree")})
        default = [r for r in ok if _is_default(kernel, r)]
        if default:
            print("   default:", round(default[0]["rate"], 1), default[0]["unit"])
    print(f"compile phase {t_compile:.0f} s for {len(jobs)} candidates")


def _is_default(kernel: str, r: dict) -> bool:
    if kernel == "gemm":
        return (r["BM"], r["BN"], r["BK"], r["STAGES"], r["warps"]) == (64, 64, 32, 2, 4)
    if kernel == "attention_d128":
        return (r["BM"], r["BN"], r["STAGES"], r["warps"]) == (64, 32, 2, 4)
    if kernel == "attention_d64":
        return (r["BM"], r["BN"], r["STAGES"], r["warps"]) == (64, 64, 2, 4)
    return (r["BR"], r["BC"], r["warps"]) == (64, 128, 4)


if __name__ == "__main__":
    main()
