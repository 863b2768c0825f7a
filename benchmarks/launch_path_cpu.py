"""Host cost of a cached kernel call through the cuda backend's launch path, on a machine without a GPU:
the public `Kernel.__call__` fast path, `backend.launch` and `LaunchPlan.launch`, with cuLaunchKernel
replaced by a compiled C stub of the same signature (it returns CUDA_SUCCESS and does nothing), in
microseconds per call. What it measures is everything hk does around the driver call: the fast key,
the checks, the parameter packing, the foreign call. The driver's own cost (about 2-3 us on an H200) and
torch's stream lookup are not in it; benchmarks/launch_overhead.py measures those on a GPU.

    python benchmarks/launch_path_cpu.py                 # the C launcher where it builds
    HK_C_LAUNCHER=0 python benchmarks/launch_path_cpu.py # the ctypes path
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, f32
from hk_portable.runtime import clauncher
# shared with tests/: in the package, not in tests/ (no package, not on a script's path), so scripts import it too
from hk_portable.testing import fake_cuda

STUB = "int hk_stub_launch(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g,\n" \
       "                   unsigned s, void *st, void **p, void **x) { return 0; }\n"


@hk.kernel(num_warps=4)
def add_kernel(x: GL[2], y: GL[2], z: GL[2], *, BM: hk.const = 64, BN: hk.const = 64):
    m, n = hk.block_idx(0), hk.block_idx(1)
    hk.store(z, hk.load(RT[f32, BM, BN], x, (m, n)) + hk.load(RT[f32, BM, BN], y, (m, n)), (m, n))


@hk.kernel(num_warps=4)
def scaled_kernel(x: GL[2], y: GL[2], n: int, s: float, *, BM: hk.const = 64, BN: hk.const = 64):
    m, c = hk.block_idx(0), hk.block_idx(1)
    t = hk.load(RT[f32, BM, BN], x, (m, c)) * s
    hk.store(y, t * n.to(f32), (m, c))


def install(tmp: str) -> fake_cuda.CpuCudaBackend:
    """The cuda backend's launch path on CPU tensors, cuLaunchKernel being STUB compiled into `tmp`."""
    cc = clauncher.compiler()
    if cc is None:
        raise SystemExit("launch_path_cpu: needs a host C compiler (cc, gcc or clang on PATH, or $CC) for its stub")
    stub = fake_cuda.build_stub(cc, STUB, tmp).hk_stub_launch
    # torch's own stream lookup where this torch has one (a CPU-only build has none)
    fake_cuda.install(fake_cuda.FakeCudrv(stub), raw_stream=getattr(torch._C, "_cuda_getCurrentRawStream", abs))
    return fake_cuda.CpuCudaBackend()


def per_call_us(fn, calls: int, repeats: int) -> dict:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return {"median_us": statistics.median(samples), "min_us": min(samples)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hk-launch-cpu-") as tmp:
        be = install(tmp)
        x, y, z = torch.randn(256, 256), torch.randn(256, 256), torch.empty(256, 256)
        grid = (4, 4)
        add_kernel(x, y, z, grid=grid, backend=be)
        scaled_kernel(x, z, 3, 0.5, grid=grid, backend=be)
        art = add_kernel.compile_for(add_kernel.trace(x, y, z), be)
        plan = art.payload[-1]
        rows = {
            "hk kernel call (3 tensors)": per_call_us(lambda: add_kernel(x, y, z, grid=grid, backend=be),
                                                      args.calls, args.repeats),
            "hk kernel call (2 tensors, i32, f32)": per_call_us(
                lambda: scaled_kernel(x, z, 3, 0.5, grid=grid, backend=be), args.calls, args.repeats),
            "backend.launch (3 tensors)": per_call_us(lambda: be.launch(art, (x, y, z), (4, 4, 1)),
                                                      args.calls, args.repeats),
            "LaunchPlan.launch (3 tensors)": per_call_us(lambda: plan.launch((x, y, z), (4, 4, 1), None, "k"),
                                                         args.calls, args.repeats),
        }
    launcher = "compiled C" if getattr(plan, "c_launch", None) is not None else "Python + ctypes"
    print(f"launcher: {launcher}")
    print(f"{'path (stubbed cuLaunchKernel)':40s} {'median us/call':>15s} {'min':>8s}")
    for name, r in rows.items():
        print(f"{name:40s} {r['median_us']:15.2f} {r['min_us']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"launcher": launcher, "python": sys.version.split()[0], "per_call": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
