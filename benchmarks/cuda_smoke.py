"""A first look on a GPU: small and large gemm, attention and layernorm once each, timed, checked."""
import time

import torch

import hk_portable as hk
from hk_portable.kernels.attention import attention_fwd, reference as attn_ref
from hk_portable.kernels.gemm import gemm


def timed(label, fn):
    t = time.time()
    out = fn()
    torch.cuda.synchronize()
    print(f"{label}: {time.time() - t:.3f}s", flush=True)
    return out


with hk.use_backend("cuda"):
    for n in (64, 256, 1024, 4096):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        c = timed(f"gemm {n} first", lambda: gemm(a, b, out_dtype=torch.float32))
        timed(f"gemm {n} second", lambda: gemm(a, b, out_dtype=torch.float32))
        err = (c.double() - a.double() @ b.double()).abs().max().item()
        print(f"  gemm {n} max abs err {err:.3e}", flush=True)
    q, k, v = (torch.randn(1, 4, 1000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = timed("attention first", lambda: attention_fwd(q, k, v, causal=True))
    ro, rl = attn_ref(q, k, v, causal=True)
    print(f"  attention err o {(o.double() - ro).abs().max().item():.3e} lse {(lse.double() - rl).abs().max().item():.3e}")
