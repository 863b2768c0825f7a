"""Where a launch-bound op call's host microseconds go: each torch.ops.hk op at a tiny size timed over many calls
(no synchronize inside: the host's time per call), beside the torch op it replaces, then the same calls under
cProfile (the top functions by own time), with op replay (runtime/opfast.py) and on the Python path, in three modes: `inference` (torch.inference_mode), `grad` (gradients on,
no input needing one) and `no_grad` (the weights need gradients, the call runs under torch.no_grad: a decode step
of a model being trained or served from its training module). On a GPU the launches are real; on a CPU machine the reference backend
runs them (its interpreter, not the launch path, is then what shows).

    python benchmarks/host_profile.py [--calls 2000] [--out host_profile.txt]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import sys
import time

import torch

from hk_portable.runtime import opfast

BF16 = torch.bfloat16


def calls(device: str, weights_need_grad: bool = False) -> dict:
    import torch.nn.functional as TF

    import hk_portable.nn  # noqa: F401
    from hk_portable.kernels.rotary import tables
    from hk_portable.nn import functional as F
    x, w = torch.randn(8, 256, device=device, dtype=BF16), torch.randn(256, 256, device=device, dtype=BF16)
    q, k = torch.randn(1, 8, 1, 128, device=device, dtype=BF16), torch.randn(1, 8, 256, 128, device=device, dtype=BF16)
    xn, wn = torch.randn(8, 1024, device=device, dtype=BF16), torch.randn(1024, device=device, dtype=BF16)
    xr = torch.randn(1, 8, 8, 128, device=device, dtype=BF16)
    cos, sin = tables(64, 128, device=device)
    if weights_need_grad:
        w.requires_grad_()
        wn.requires_grad_()
    return {
        "gemm": (lambda: F.linear(x, w), lambda: TF.linear(x, w)),
        "attention": (lambda: F.attention(q, k, k), lambda: TF.scaled_dot_product_attention(q, k, k)),
        "rms_norm": (lambda: F.rms_norm(xn, (1024,), wn), lambda: TF.rms_norm(xn, (1024,), wn)),
        "rotary": (lambda: F.rotary(xr, cos, sin), None),
    }


def per_call_us(fn, n: int, device: str) -> float:
    for _ in range(20):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.synchronize()
    return t / n * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--modes", nargs="+", default=["inference", "grad", "no_grad"],
                    choices=["inference", "grad", "no_grad"])
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        opfast.load()                               # built now, not in the background during the timing
    n = args.calls if device == "cuda" else 20
    report = io.StringIO()
    rows = []
    modes = {"inference": (torch.inference_mode, False), "grad": (torch.enable_grad, False),
             "no_grad": (torch.no_grad, True)}
    for mode in args.modes:
        context, weights_need_grad = modes[mode]
        for name, (ours, theirs) in calls(device, weights_need_grad).items():
            with context():
                hk_us = per_call_us(ours, n, device)
                opfast.block_opened(1)                  # the same calls on the Python path (no op replay)
                try:
                    py_us = per_call_us(ours, n, device)
                finally:
                    opfast.block_opened(-1)
                torch_us = per_call_us(theirs, n, device) if theirs else float("nan")
                rows.append((mode, name, hk_us, py_us, torch_us))
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(n):
                    ours()
                prof.disable()
            if device == "cuda":
                torch.cuda.synchronize()
            print(f"\n===== {mode} {name}: hk {hk_us:.1f} us/call, torch {torch_us:.1f} us/call", file=report)
            pstats.Stats(prof, stream=report).sort_stats("tottime").print_stats(18)
    text = report.getvalue()
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(f"op calls: {opfast.describe()}; {opfast.stats()}")
    for mode, name, hk_us, py_us, torch_us in rows:
        print(f"{mode:9} {name:10} hk {hk_us:7.1f} us/call (Python path {py_us:7.1f})   torch {torch_us:7.1f} us/call"
              f"   ratio {hk_us / torch_us:5.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "calls": n,
                       "op_calls": opfast.describe(), "rows": [
                           {"mode": m, "op": o, "hk_us": h, "hk_python_path_us": p, "torch_us": t,
                            "ratio": None if math.isnan(t) else h / t} for m, o, h, p, t in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
