"""hk.precompile on what the model benchmarks launch: the Llama block's training step, prefill and decode at the
bench's shapes and the GEMM in its four layouts, every build compiled in parallel into the cache (cold: the
cache directory starts empty). Prints the builds and the wall time; JSON with --json.

    python benchmarks/model_precompile.py [--json precompile.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import hk_portable as hk
from hk_portable.bench_model import LLAMA, _blocks

BF16 = torch.bfloat16


def steps(device: str):
    """Closures that launch what the block family and the GEMM layout rows launch."""
    ours, _ = _blocks(device, 4096, **LLAMA)
    x = torch.randn(2, 4096, LLAMA["dim"], device=device, dtype=BF16, requires_grad=True)
    xd = torch.randn(64, 1, LLAMA["dim"], device=device, dtype=BF16)
    cache = ours.new_cache(64, 4096, device=device, dtype=BF16)

    def train():
        ours(x).backward(torch.ones_like(x))

    def prefill():
        with torch.no_grad():
            ours(x)

    def decode():
        with torch.no_grad():
            ours.decode(xd, cache, 4095)

    def gemms():
        from hk_portable.kernels.gemm import gemm
        for ta in (False, True):
            for tb in (False, True):
                a = torch.empty((4096, 4096) if ta else (4096, 4096), device=device, dtype=BF16)
                b = torch.empty((4096, 4096), device=device, dtype=BF16)
                gemm(a.t() if ta else a, b.t() if tb else b)
    return [train, prefill, decode, gemms]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    import hk_portable.nn  # noqa: F401
    t0 = time.perf_counter()
    report = []
    for fn in steps("cuda"):
        report += hk.precompile(fn, workers=args.workers)
    wall = time.perf_counter() - t0
    for r in report:
        print(f"{r['kernel']:40} {r['target']:12} {r.get('seconds', 0):7.1f} s  {r['error'] or ''}")
    errors = [r for r in report if r["error"]]
    print(f"model_precompile: {len(report)} builds in {wall:.1f} s wall ({sum(r.get('seconds', 0) for r in report):.1f} s "
          f"of compiling), {len(errors)} errors")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"wall_s": wall, "builds": report}, f, indent=1)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
