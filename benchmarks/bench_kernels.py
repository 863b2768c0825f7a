"""Side-by-side kernel benchmarks on one GPU: hk_portable's generated kernels against vendor baselines
(torch.matmul -> cuBLAS, scaled_dot_product_attention -> cuDNN/flash, torch eager / torch.compile
layernorm). Baselines are oracles and yardsticks only, never the implementation.

    python benchmarks/bench_kernels.py --backend cuda --json out.json [--plot out.png] [--quick]

Each entry: median ms over many runs (CUDA events via triton.testing.do_bench when present), derived
TFLOP/s or GB/s, the ratio hk/baseline, and the max error against the baseline's output."""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time

import torch

import hk_portable as hk
from hk_portable.kernels.attention import attention_fwd
from hk_portable.kernels.gemm import gemm
from hk_portable.kernels.layernorm import dropout_residual_layernorm


def bench(fn, reps: int = 50) -> float:
    """Median milliseconds of fn() on the current device."""
    try:
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))
    except Exception:  # noqa: BLE001 - no triton: CUDA events by hand
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)


def gemm_cases(quick):
    sizes = [(4096, 4096, 4096)] if quick else [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)]
    for M, N, K in sizes:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        flops = 2 * M * N * K
        yield dict(name=f"gemm bf16 {M}x{N}x{K}", work=flops, unit="TFLOP/s",
                   hk=lambda: gemm(a, b), base=lambda: a @ b, base_name="torch.matmul (cuBLAS)")


def attention_cases(quick):
    F = torch.nn.functional
    for (B, H, N, D, causal) in ([(4, 16, 4096, 128, False)] if quick else
                                 [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (4, 16, 4096, 64, False)]):
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * H * N * N * D // (2 if causal else 1)
        yield dict(name=f"attention_fwd B{B} H{H} N{N} D{D}{' causal' if causal else ''}", work=flops,
                   unit="TFLOP/s", hk=lambda: attention_fwd(q, k, v, causal=causal)[0],
                   base=lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                   base_name="torch SDPA")


def layernorm_cases(quick):
    for rows, d in ([(16384, 2048)] if quick else [(16384, 2048), (8192, 8192)]):
        x = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
        r = torch.randn_like(x)
        w = torch.randn(d, device="cuda")
        b = torch.randn(d, device="cuda")
        nbytes = 4 * rows * d * 2 + 2 * d * 4       # read x, residual; write y, h

        def base():
            h = torch.nn.functional.dropout(x, 0.1) + r
            return torch.nn.functional.layer_norm(h.float(), (d,), w, b).to(x.dtype)

        yield dict(name=f"dropout+residual+layernorm {rows}x{d} p=0.1", work=nbytes, unit="GB/s",
                   hk=lambda: dropout_residual_layernorm(x, r, w, b, p=0.1, seed=1)[0], base=base,
                   base_name="torch eager", compare=False)


def run(backend: str, quick: bool) -> dict:
    results = []
    with hk.use_backend(backend):
        for case in [*gemm_cases(quick), *attention_cases(quick), *layernorm_cases(quick)]:
            entry = {"name": case["name"], "baseline": case["base_name"], "unit": case["unit"]}
            try:
                out_hk, out_base = case["hk"](), case["base"]()
                if case.get("compare", True):
                    entry["max_abs_diff_vs_baseline"] = float((out_hk.float() - out_base.float()).abs().max())
                t_hk, t_base = bench(case["hk"]), bench(case["base"])
                per_unit = 1e12 if case["unit"] == "TFLOP/s" else 1e9      # work per second -> TFLOP/s or GB/s
                rate = lambda ms: case["work"] / (ms * 1e-3) / per_unit     # noqa: E731
                entry.update(hk_ms=t_hk, baseline_ms=t_base, hk_rate=rate(t_hk), baseline_rate=rate(t_base),
                             speed_ratio_hk_over_baseline=t_base / t_hk)
            except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
                entry["error"] = f"{type(e).__name__}: {e}"
            print(json.dumps(entry), flush=True)
            results.append(entry)
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "hk_version": hk.__version__,
            "torch": torch.__version__, "device": torch.cuda.get_device_name(), "host": platform.node(),
            "backend": backend, "results": results}


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in report["results"] if "hk_ms" in r]
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(rows)))
    ax.barh([r["name"] for r in rows], [r["speed_ratio_hk_over_baseline"] for r in rows])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("speed relative to baseline (baseline time / hk time; >1 = hk faster)")
    ax.set_title(f"hk_portable {report['backend']} on {report['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--json", default="bench_kernels.json")
    ap.add_argument("--plot")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels needs a GPU (torch.cuda.is_available() is False)")
    report = run(args.backend, args.quick)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    if args.plot:
        plot(report, args.plot)


if __name__ == "__main__":
    main()
