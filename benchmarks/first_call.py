"""The first call of each hk op in a new process: seconds beyond `import torch` + the device's init, with a warm
compile cache (median of --repeats processes) and with a cold one (a fresh HK_CACHE_DIR), and whether the call
imported torch._dynamo (it must not: nothing here compiles).

    python benchmarks/first_call.py [--device cuda] [--json first_call.json]

Each figure is one child process: t0 before `import torch`, t1 after the device is initialised (a tensor made
and synchronised), t2 after `import hk_portable.nn` and the inputs, t3 after the first op call and a synchronize.
first_call_s = t3 - t2, import_hk_s = t2 - t1 (inputs included: a few small tensors), torch_init_s = t1 - t0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
device = sys.argv[2]
torch.zeros(1, device=device)
if device == "cuda":
    torch.cuda.synchronize()
t1 = time.perf_counter()
import hk_portable.nn as hnn
from hk_portable.nn import functional as F
from hk_portable.kernels.rotary import tables
op = sys.argv[1]
bf16 = torch.bfloat16
if op == "block":
    from hk_portable.nn.blocks import LlamaBlock
    block = LlamaBlock(512, 4, 2, 1024, impl="hk", max_positions=256).to(device, bf16)
    x = torch.randn(2, 128, 512, device=device, dtype=bf16, requires_grad=True)
    call = lambda: block(x).float().square().mean().backward()
elif op == "gemm":
    x, w = torch.randn(64, 256, device=device, dtype=bf16), torch.randn(128, 256, device=device, dtype=bf16)
    call = lambda: F.linear(x, w)
elif op == "attention":
    q = torch.randn(1, 4, 128, 128, device=device, dtype=bf16)
    call = lambda: F.attention(q, q, q, causal=True)
elif op == "rms_norm":
    x, w = torch.randn(64, 1024, device=device, dtype=bf16), torch.ones(1024, device=device, dtype=bf16)
    call = lambda: F.rms_norm(x, (1024,), w)
elif op == "rotary":
    x = torch.randn(1, 64, 4, 128, device=device, dtype=bf16)
    cos, sin = tables(64, 128, device=device)
    call = lambda: F.rotary(x, cos, sin)
t2 = time.perf_counter()
call()
if device == "cuda":
    torch.cuda.synchronize()
t3 = time.perf_counter()
print(json.dumps({"torch_init_s": t1 - t0, "import_hk_s": t2 - t1, "first_call_s": t3 - t2,
                  "dynamo_imported": "torch._dynamo" in sys.modules, "modules": len(sys.modules)}))
"""

OPS = ("gemm", "attention", "rms_norm", "rotary", "block")


def child(op: str, device: str, cache_dir: str) -> dict:
    env = {**os.environ, "HK_CACHE_DIR": cache_dir}
    out = subprocess.run([sys.executable, "-c", CHILD, op, device], capture_output=True, text=True, env=env,
                         timeout=600)
    if out.returncode:
        return {"error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(op: str, device: str, warm_dir: str, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as cold_dir:
        cold = child(op, device, cold_dir)
    child(op, device, warm_dir)                      # fills the warm cache (and builds the C launcher there)
    warm = [child(op, device, warm_dir) for _ in range(repeats)]
    ok = [w for w in warm if "error" not in w]
    entry = {"op": op, "cold": cold, "warm_runs": warm}
    if ok:
        entry["warm_first_call_s"] = statistics.median(w["first_call_s"] for w in ok)
        entry["warm_import_hk_s"] = statistics.median(w["import_hk_s"] for w in ok)
        entry["torch_init_s"] = statistics.median(w["torch_init_s"] for w in ok)
        entry["dynamo_imported"] = any(w["dynamo_imported"] for w in ok)
    return entry


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as warm_dir:
        results = [measure(op, args.device, warm_dir, args.repeats) for op in args.ops.split(",")]
    print(f"{'op':10} {'warm first call s':>18} {'import hk s':>12} {'torch init s':>13} {'cold first call s':>18} dynamo")
    for r in results:
        cold = r["cold"].get("first_call_s", float("nan"))
        print(f"{r['op']:10} {r.get('warm_first_call_s', float('nan')):18.3f} {r.get('warm_import_hk_s', float('nan')):12.3f} "
              f"{r.get('torch_init_s', float('nan')):13.3f} {cold:18.3f} {r.get('dynamo_imported')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "results": results}, f, indent=1)
    return 0 if all("warm_first_call_s" in r and not r["dynamo_imported"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
