"""Thread-block clusters on the H200, side by side: the same compiled kernels launched as pairs of
x-neighbour blocks (multicast TMA loads) and as single blocks (HK_CUDA_CLUSTERS=0 does the latter for a
whole process), alternating rounds in one process so clock drift hits both alike.

    python benchmarks/cluster_ab.py --json cluster_ab.json [--rounds 5] [--budget 0.2]

Each figure is the median over rounds of hk.bench.time_fn's CUDA-event median (whose batch timing must
agree); the ratio is clusters / single blocks."""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from hk_portable import bench
from hk_portable.kernels import attention, gemm, gemm_fp8


def _plans(kernels):
    """Every cuda LaunchPlan of these kernels' compiled artifacts that was built for clusters."""
    out = []
    for k in kernels:
        for art in list(k._artifacts.values()):
            for plan in (art.payload or {}).values() if isinstance(art.payload, dict) else ():
                if getattr(plan, "launch_cluster", None) is not None:
                    out.append(plan)
    return out


def _set_clusters(plans, on: bool) -> None:
    """A plan launches clusters while its cluster_x is set (driver.LaunchPlan.launch)."""
    for p in plans:
        p.cluster_x = p.launch_cluster and 2 if on else 0


CASES = [bench.gemm_case(4096, 4096, 4096), bench.gemm_case(8192, 8192, 8192), bench.gemm_case(16384, 4096, 14336),
         bench.gemm_case(16384, 14336, 4096), bench.gemm_case(4000, 4000, 4000),
         bench.gemm_fp8_case(8192, 8192, 8192), bench.gemm_fp8_case(16384, 4096, 14336),
         bench.attention_case(4, 16, 16, 4096, 128, False), bench.attention_case(4, 16, 16, 4096, 64, False),
         bench.attention_case(16, 16, 16, 1024, 128, False)]
KERNELS = (gemm.gemm_kernel, gemm_fp8.gemm_fp8_kernel, attention.attention_fwd_kernel)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for case in CASES:
        b = case.make("cuda")
        for i in range(b.n_sets):
            b.hk(i)
        torch.cuda.synchronize()
        plans = _plans(KERNELS)
        ms = {True: [], False: []}
        for _ in range(args.rounds):
            for on in (True, False):
                _set_clusters(plans, on)
                t = bench.time_fn(b.hk, b.n_sets, "cuda", args.budget)
                if t.agree:
                    ms[on].append(t.ms)
        _set_clusters(plans, True)
        on, off = (statistics.median(ms[k]) if ms[k] else float("nan") for k in (True, False))
        row = {"case": case.name, "cluster_plans": len(plans), "ms_clusters": on, "ms_single": off,
               "rate_clusters": case.work / on / 1e9, "rate_single": case.work / off / 1e9, "ratio": off / on,
               "rounds_agreeing": [len(ms[True]), len(ms[False])], "rel_err": b.check()}
        rows.append(row)
        print(f"{case.name:45s} plans {len(plans)}  clusters {row['rate_clusters']:8.1f}  single "
              f"{row['rate_single']:8.1f} {case.unit}  speedup {row['ratio']:.3f}", flush=True)
    if args.json:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
