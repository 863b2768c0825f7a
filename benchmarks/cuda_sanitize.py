"""A small workload for compute-sanitizer (memcheck, racecheck): every library kernel (gemm, attention
forward with its masks and backward in both dQ forms, varlen attention and its backward, paged/contiguous KV-cache
decode with split-KV, layernorm and rmsnorm, rotary) on aligned and ragged
shapes through the cuda backend, each result checked against float64 math.

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 benchmarks/cuda_sanitize.py

HK_SANITIZE_PLAIN_STORES=1 compiles the cuda kernels with tma_store=False: initcheck (compute-sanitizer 2025.3)
does not count a TMA store's write as initialising global memory and flags every read of such an output
(H200, 2026-12-04), so initcheck runs the plain-store epilogue; memcheck, racecheck and synccheck run the TMA stores,
and the GPU tests poison TMA-stored outputs with NaN before checking them in full.
"""
from __future__ import annotations

import os
import sys

import torch

from hk_portable.kernels import attention, attention_bwd, gemm, layernorm, rotary
from hk_portable.runtime import cache


def plain_stores() -> None:
    """Every cuda compile of this process with tma_store=False (the options enter the cache key)."""
    inner = cache.compile_cached

    def compile_cached(backend, program, target, options=None):
        if backend.name == "cuda":
            options = {**(options or {}), "tma_store": False}
        return inner(backend, program, target, options)
    cache.compile_cached = compile_cached


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def main() -> int:
    torch.manual_seed(0)
    dev, be = "cuda", "cuda"
    if os.environ.get("HK_SANITIZE_PLAIN_STORES"):
        plain_stores()
    if os.environ.get("HK_SANITIZE_EMULATE"):          # the same workload on the CPU emulation (no GPU)
        from hk_portable.backends.cuda import CudaBackend
        from hk_portable.conformance.runner import OnTarget
        cuda = CudaBackend()
        dev, be = "cpu", OnTarget(cuda, cuda.target("sm_80", emulated=True))
    failures = []

    def check(name, err, tol):
        ok = err <= tol
        print(f"{'ok ' if ok else 'BAD'} {name}: relative error {err:.2e} (tolerance {tol:.0e})", flush=True)
        if not ok:
            failures.append(name)

    for (m, n, k), dt in (((128, 128, 64), torch.bfloat16), ((100, 70, 90), torch.bfloat16),
                          ((65, 33, 17), torch.float16)):
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = torch.randn(k, n, device=dev, dtype=dt)
        c = gemm.gemm(a, b, out_dtype=torch.float32, backend=be)
        check(f"gemm {m}x{n}x{k} {dt}", rel_err(c, a.double() @ b.double()), 1e-5)
    for m, n, k in ((300, 520, 200), (2100, 1300, 128)):   # bf16 out: the TMA-store epilogue on sm_90a, ragged
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        c = gemm.gemm(a, b, out_dtype=torch.bfloat16, backend=be)
        check(f"gemm {m}x{n}x{k} bf16 out", rel_err(c, a.double() @ b.double()), 8e-3)

    for (B, hq, hkv, N, D, causal) in ((1, 2, 1, 128, 64, False), (1, 2, 2, 77, 64, True),
                                       (1, 2, 1, 130, 128, True), (2, 1, 1, 33, 128, False),
                                       (2, 8, 2, 2100, 128, True)):   # more tiles than SMs
        q = torch.randn(B, hq, N, D, device=dev, dtype=torch.bfloat16)
        kk = torch.randn(B, hkv, N, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, hkv, N, D, device=dev, dtype=torch.bfloat16)
        o, lse = attention.attention_fwd(q, kk, v, causal=causal, backend=be)
        ro, rl = attention.reference(q, kk, v, causal=causal)
        check(f"attention B{B} Hq{hq} Hkv{hkv} N{N} D{D} causal={causal} o", rel_err(o, ro), 2e-2)
        check(f"attention B{B} Hq{hq} Hkv{hkv} N{N} D{D} causal={causal} lse", rel_err(lse, rl), 1e-4)

    # the serving masks: causal with N != Nkv in both alignments (bottom-right with empty rows), a window
    for (N, Nkv, causal, window, align) in ((77, 130, True, None, "bottom_right"), (130, 60, True, None, "bottom_right"),
                                           (100, 150, True, None, "top_left"), (90, 90, False, (17, 3), None)):
        q = torch.randn(1, 2, N, 64, device=dev, dtype=torch.bfloat16)
        kk, v = (torch.randn(1, 1, Nkv, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
        o, lse = attention.attention_fwd(q, kk, v, causal=causal, window=window, align=align, backend=be)
        ro, rl = attention.reference(q, kk, v, causal=causal, window=window, align=align)
        check(f"attention N{N} Nkv{Nkv} causal={causal} window={window} {align} o", rel_err(o, ro), 2e-2)

    for (B, hq, hkv, N, D, causal, det) in ((1, 2, 1, 77, 64, True, False), (1, 2, 2, 100, 128, False, True),
                                            (1, 4, 2, 64, 64, True, True)):
        q, do = (torch.randn(B, hq, N, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
        kk, v = (torch.randn(B, hkv, N, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
        o, lse = attention.attention_fwd(q, kk, v, causal=causal, backend=be)
        grads = attention_bwd.attention_bwd(q, kk, v, o, lse, do, causal=causal, deterministic=det, backend=be)
        refs = attention_bwd.reference(q.cpu(), kk.cpu(), v.cpu(), do.cpu(), causal=causal)
        for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
            check(f"attention_bwd B{B} Hq{hq} Hkv{hkv} N{N} D{D} causal={causal} det={det} {name}",
                  rel_err(g.cpu(), r), 3e-2)

    # serving: variable-length batches (forward and backward) and a paged KV cache with split-KV decode
    from hk_portable.kernels import attention_kvcache, attention_varlen
    lq, lk = [37, 0, 100, 1], [50, 3, 90, 64]
    cq, ck = (torch.tensor([0] + torch.tensor(x).cumsum(0).tolist(), dtype=torch.int32, device=dev) for x in (lq, lk))
    q, do = (torch.randn(sum(lq), 4, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
    kk, v = (torch.randn(sum(lk), 2, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
    o, lse = attention_varlen.attention_varlen(q, kk, v, cq, ck, 100, 90, causal=True, align="bottom_right", backend=be)
    ro, _ = attention_varlen.varlen_reference(q.cpu(), kk.cpu(), v.cpu(), cq.cpu(), ck.cpu(), causal=True,
                                              align="bottom_right")
    check("attention_varlen causal bottom_right o", rel_err(o.cpu(), ro), 2e-2)
    attention_varlen.attention_varlen_bwd(q, kk, v, o, lse, do, cq, ck, 100, 90, causal=True, align="bottom_right",
                                          backend=be)
    for page, nq in ((16, 1), (256, 4), (None, 1)):
        lens = [1, 300, 77, 0]
        if page:
            table = torch.randperm(4 * (-(-300 // page)) + 2)[:4 * (-(-300 // page))].view(4, -1).to(torch.int32)
            kc, vc = (torch.randn(table.numel() + 2, page, 2, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
            table = table.to(dev)
        else:
            table = None
            kc, vc = (torch.randn(4, 300, 2, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
        qd = torch.randn(4, nq, 8, 128, device=dev, dtype=torch.bfloat16)
        lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
        o, _ = attention_kvcache.attention_kvcache(qd, kc, vc, lens_t, table, causal=nq > 1, num_splits=3, backend=be)
        ro, _ = attention_kvcache.kvcache_reference(qd.cpu(), kc.cpu(), vc.cpu(), lens_t.cpu(),
                                                    None if table is None else table.cpu(), causal=nq > 1)
        check(f"attention_kvcache page={page} Nq={nq} splits=3 o", rel_err(o.cpu(), ro), 2e-2)

    for layout, shape in (("neox", (2, 37, 3, 64)), ("gptj", (1, 70, 2, 128))):
        x = torch.randn(*shape, device=dev, dtype=torch.bfloat16)
        cos, sin = rotary.tables(shape[1] + 5, shape[-1], device=dev)
        y = rotary.rotary(x, cos, sin, layout=layout, offset=5, backend=be)
        check(f"rotary {layout} {shape}", rel_err(y.cpu(), rotary.reference(x.cpu(), cos.cpu(), sin.cpu(), layout, 5)),
              1e-2)

    for rows, d, p in ((64, 128, 0.0), (37, 300, 0.1)):
        x = torch.randn(rows, d, device=dev, dtype=torch.bfloat16)
        r = torch.randn(rows, d, device=dev, dtype=torch.bfloat16)
        w = torch.randn(d, device=dev)
        b = torch.randn(d, device=dev)
        y, h = layernorm.dropout_residual_layernorm(x, r, w, b, p=p, seed=7, backend=be)
        ry, rh = layernorm.reference(x.cpu(), r.cpu(), w.cpu(), b.cpu(), p=p, seed=7)
        check(f"layernorm {rows}x{d} p={p} h", rel_err(h.cpu(), rh), 1e-2)
        check(f"layernorm {rows}x{d} p={p} y", rel_err(y.cpu(), ry), 2e-2)
        y, h = layernorm.dropout_residual_rmsnorm(x, r, w, p=p, seed=7, backend=be)
        ry, rh = layernorm.reference(x.cpu(), r.cpu(), w.cpu(), None, p=p, seed=7, eps=1e-6, rms=True)
        check(f"rmsnorm {rows}x{d} p={p} y", rel_err(y.cpu(), ry), 2e-2)

    if dev == "cuda":
        torch.cuda.synchronize()
    print("FAILED: " + ", ".join(failures) if failures else "all sanitizer workloads correct")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
