"""Where does a first launch stop? Python stacks after a timeout, for a raw cupy kernel and for hk."""
import faulthandler
import sys
import time

import torch

faulthandler.dump_traceback_later(25, exit=True)
which = sys.argv[1]
if which == "cupy":
    import cupy
    k = cupy.RawKernel(r'extern "C" __global__ void f(float* x){ x[threadIdx.x] += 1.f; }', "f")
    x = cupy.zeros(32, dtype=cupy.float32)
    k((1,), (32,), (x,))
    cupy.cuda.runtime.deviceSynchronize()
    print("cupy ok", float(x.sum()), flush=True)
else:
    import hk_portable as hk
    from hk_portable.kernels.gemm import gemm, gemm_kernel
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    c = torch.full((64, 64), float("nan"), device="cuda")
    be = hk.get_backend("cuda")
    prog = gemm_kernel.trace(a, b, c)
    t = time.time()
    art = gemm_kernel.compile_for(prog, be)
    print(f"compiled in {time.time() - t:.2f}s threads={art.launch.get('threads')} shared={art.launch.get('shared_bytes')} "
          f"fmt={art.launch.get('param_format')}", flush=True)
    print(art.resources, flush=True)
    be.launch(art, [a, b, c], (1, 1, 1))
    print("launch returned", flush=True)
    torch.cuda.synchronize()
    print("synchronized; err", (c.double() - a.double() @ b.double()).abs().max().item(), flush=True)
