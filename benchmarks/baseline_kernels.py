"""Which kernels a baseline launches, with their launch shape: SDPA (cuDNN, flash) for attention cases, so a gap to it
can be read against its tiles (grid, block, registers, shared memory per block) rather than guessed.

    python benchmarks/baseline_kernels.py --cases 1024,64,c 1024,128 --json baseline_kernels.json
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch

BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION")
KEYS = ("grid", "block", "registers per thread", "shared memory", "blocks per SM", "warps per SM", "est. achieved occupancy %")


def kernels(fn) -> list[dict]:
    """The GPU kernels one call of fn launches (after a warm-up), from torch.profiler's trace."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
    return [{"name": e["name"][:160], "us": e.get("dur"), **{k: e["args"][k] for k in KEYS if k in e.get("args", {})}}
            for e in events if e.get("cat") == "kernel"]


def main():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["1024,64,c", "1024,64", "1024,128,c", "1024,128", "4096,128,c"],
                    help="N,D[,c] each (B * N = 16384 tokens, H16)")
    ap.add_argument("--json", default="baseline_kernels.json")
    args = ap.parse_args()
    rows = []
    for case in args.cases:
        n, d, *c = case.split(",")
        n, d, causal = int(n), int(d), bool(c)
        q, k, v = (torch.randn(16384 // n, 16, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for name in BACKENDS:
            def call():
                with sdpa_kernel(getattr(SDPBackend, name)):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            row = {"N": n, "D": d, "causal": causal, "baseline": name, "kernels": kernels(call)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
              open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
