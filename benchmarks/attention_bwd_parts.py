"""Where the attention backward's time goes on the GPU, kernel by kernel, and what the dQ reduction costs (issue 36).

For each case the backward's kernels are launched alone on the configuration the backend chooses and timed side by
side by both methods of hk_portable.bench (CUDA events per call, batch wall time), with SDPA's cuDNN backward and
the whole hk backward (atomic and deterministic) in the same run:

  preprocess           delta = rowsum(dO o O), the dQ accumulator zeroed
  dkdv atomic          the main kernel with tma_reduce=False: dK, dV and dQ's f32 adds by red.global per element
  dkdv tma reduce      the same with tma_reduce=True (the default): dQ by TMA reduce-add (backends/cuda/tma_writes.py)
  dkdv defer dK / all  that compiled with defer_wgmma "3" / "all" as well (backends/cuda/deferred.py)
  dkdv dq-store        the same kernel with dQ's adds made plain stores (wrong results: the adds' cost by difference)
  dkdv no-dq           the deterministic form's dK/dV kernel (no dSᵀ store, no dQ product, no adds)
  dq deterministic     the deterministic form's dQ kernel
  convert              the f32 accumulator rounded to dQ's dtype

    python benchmarks/attention_bwd_parts.py [--json parts.json] [--cases llama,d128]

Run on a GPU (benchmarks/attention_bwd_check.sh, step `parts`); the ncu step of that script profiles the same
launches (`--ncu`: each kernel launched three times, nothing timed).
"""
from __future__ import annotations

import argparse
import json
import math

import torch

import hk_portable as hk
from hk_portable.interface import GL
from hk_portable.bench import time_side_by_side
from hk_portable.kernels import attention_bwd as ab
from hk_portable.kernels.attention import TUNABLE, attention_fwd

CASES = {   # name: (B, Hq, Hkv, N, D, causal)
    "llama": (2, 16, 4, 4096, 128, True),
    "d128": (4, 16, 16, 4096, 128, False),
    "d128c": (4, 16, 16, 4096, 128, True),
    "d64": (16, 16, 16, 1024, 64, True),
}


@hk.kernel(num_warps=4, tunable=TUNABLE)
def dkdv_dq_store_kernel(q: GL[4], k: GL[4], v: GL[4], do: GL[4], lse: GL[3], delta: GL[3],
                         dk: GL[4], dv: GL[4], dq_acc: GL[4], scale: float, shift: int, left: int, right: int,
                         *, D: hk.const = 64, BM: hk.const = 64, BN: hk.const = 64, MASKED: hk.const = False,
                         ATOMIC_DQ: hk.const = True, STAGES: hk.const = 2, DQ_T: hk.const = False):
    """attention_bwd_dkdv_kernel with dQ's atomic adds traced as plain stores (timing only)."""
    atomic_add = hk.atomic_add
    hk.atomic_add = hk.store
    try:
        ab.dkdv_body(q, k, v, do, lse, delta, dk, dv, dq_acc, scale, shift, left, right, None, D=D, BM=BM, BN=BN,
                     MASKED=MASKED, ATOMIC_DQ=ATOMIC_DQ, STAGES=STAGES, DQ_T=DQ_T, SOFTCAP=False)
    finally:
        hk.atomic_add = atomic_add


def _dkdv_as(name: str, doc: str):
    """attention_bwd_dkdv_kernel's body as a kernel of its own name, which OPTIONS compiles with other options."""
    def body(q: GL[4], k: GL[4], v: GL[4], do: GL[4], lse: GL[3], delta: GL[3], dk: GL[4], dv: GL[4], dq_acc: GL[4],
             scale: float, shift: int, left: int, right: int, *, D: hk.const = 64, BM: hk.const = 64,
             BN: hk.const = 64, MASKED: hk.const = False, ATOMIC_DQ: hk.const = True, STAGES: hk.const = 2,
             DQ_T: hk.const = False):
        ab.dkdv_body(q, k, v, do, lse, delta, dk, dv, dq_acc, scale, shift, left, right, None, D=D, BM=BM, BN=BN,
                     MASKED=MASKED, ATOMIC_DQ=ATOMIC_DQ, STAGES=STAGES, DQ_T=DQ_T, SOFTCAP=False)
    body.__name__, body.__qualname__, body.__doc__ = name, name, doc
    return hk.kernel(num_warps=4, tunable=TUNABLE)(body)


# kernel name -> the cuda options it compiles with (the options enter the cache key)
OPTIONS = {"dkdv_atomic_kernel": {"tma_reduce": False},
           "dkdv_tma_reduce_kernel": {"tma_reduce": True},
           "dkdv_defer3_kernel": {"defer_wgmma": "3", "tma_reduce": True},
           "dkdv_defer_all_kernel": {"defer_wgmma": "all", "tma_reduce": True}}
dkdv_atomic_kernel = _dkdv_as("dkdv_atomic_kernel", "dQ added by one red.global per element and thread")
dkdv_tma_reduce_kernel = _dkdv_as("dkdv_tma_reduce_kernel", "dQ added by TMA reduce-add (Plan.tma_reduces), not one "
                                  "red.global per element and thread")
dkdv_defer3_kernel = _dkdv_as("dkdv_defer3_kernel", "dK's wgmma left in flight over dSᵀ's store and dQ (deferred.py)")
dkdv_defer_all_kernel = _dkdv_as("dkdv_defer_all_kernel", "every staged wgmma left in flight, dPᵀ issued beside Sᵀ "
                                 "(deferred.py; spills 84-92 bytes at D128 under NVRTC 13.0)")


def with_options() -> None:
    """The kernels OPTIONS names compile with their options."""
    from hk_portable.runtime import cache
    inner = cache.compile_cached

    def compile_cached(backend, program, target, options=None):
        if backend.name == "cuda" and program.name in OPTIONS:
            options = {**(options or {}), **OPTIONS[program.name]}
        return inner(backend, program, target, options)
    cache.compile_cached = compile_cached


def launches(B, Hq, Hkv, N, D, causal):
    """{part: fn(i)} over two input sets, and the FLOPs of the backward (2.5x the forward's)."""
    sets = []
    for _ in range(2):
        q, k, v = (torch.randn(B, h, N, D, device="cuda", dtype=torch.bfloat16) for h in (Hq, Hkv, Hkv))
        o, lse = attention_fwd(q, k, v, causal=causal)
        sets.append((q, k, v, o, lse, torch.randn_like(o)))
    mask = ab.band(N, N, causal, None, None)
    shift, left, right = mask or (0, 0, 0)
    scale = 1.0 / math.sqrt(D)
    delta = torch.zeros(B, Hq, N, device="cuda", dtype=torch.float32)
    dq_acc = torch.zeros(B, Hq, N, D, device="cuda", dtype=torch.float32)
    dq = torch.empty(B, Hq, N, D, device="cuda", dtype=torch.bfloat16)
    dk, dv = (torch.empty(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rows = ab.config_for(D)["BM"]
    q_grid = (hk.cdiv(N, rows), Hq, B)

    def dkdv_args(i, deterministic):
        q, k, v, o, lse, do = sets[i]
        acc = delta.view(B, Hq, N, 1) if deterministic else dq_acc
        return (q, k, v, do, lse, delta, dk, dv, acc, scale, shift, left, right)

    cfg = ab.dkdv_config(dkdv_args(0, False), mask is not None, False)
    cfg_det = ab.dkdv_config(dkdv_args(0, True), mask is not None, True)
    dq_args = lambda i: (*sets[i][:3], sets[i][5], sets[i][4], delta, dq, scale, shift, left, right)
    dq_cfg = ab.dq_config(dq_args(0), mask is not None)

    def dkdv(kernel, c, deterministic):
        def go(i):
            args = dkdv_args(i, deterministic)
            if c.get("DQ_T"):
                args = args[:8] + (dq_acc.transpose(-1, -2),) + args[9:]
            kernel(*args, grid=(hk.cdiv(N, c["BN"]), Hkv, B), **c)
        return go

    parts = {
        "preprocess": lambda i: ab.attention_bwd_preprocess_kernel(sets[i][3], sets[i][5], delta, dq_acc, grid=q_grid,
                                                                    D=D, BM=rows, ZERO_DQ=True),
        "dkdv atomic": dkdv(dkdv_atomic_kernel, cfg, False),
        "dkdv tma reduce": dkdv(dkdv_tma_reduce_kernel, cfg, False),
        "dkdv defer dK": dkdv(dkdv_defer3_kernel, cfg, False),
        "dkdv defer all": dkdv(dkdv_defer_all_kernel, cfg, False),
        "dkdv dq-store": dkdv(dkdv_dq_store_kernel, cfg, False),
        "dkdv no-dq": dkdv(ab.attention_bwd_dkdv_kernel, cfg_det, True),
        "dq deterministic": lambda i: ab.attention_bwd_dq_kernel(*dq_args(i), grid=(hk.cdiv(N, dq_cfg["BM"]), Hq, B),
                                                                 **dq_cfg),
        "convert": lambda i: ab.attention_bwd_dq_convert_kernel(dq_acc, dq, grid=q_grid, D=D, BM=rows),
        "hk backward": lambda i: ab.attention_bwd(*sets[i], causal=causal),
        "hk backward deterministic": lambda i: ab.attention_bwd(*sets[i], causal=causal, deterministic=True),
    }
    from torch.nn.attention import SDPBackend, sdpa_kernel
    graphs = []
    for q, k, v, _, _, do in sets:
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=Hq != Hkv)
        graphs.append((out, (qq, kk, vv), do))
    parts["cuDNN backward"] = lambda i: torch.autograd.grad(graphs[i][0], graphs[i][1], graphs[i][2], retain_graph=True)
    flops = 2.5 * 4.0 * B * Hq * N * N * D / (2 if causal else 1)
    def check_tma_reduce() -> None:
        """dQ, dK, dV of the TMA reduce-add build (preprocess, dkdv_tma_reduce_kernel, convert on set 0, outputs
        poisoned) against the deterministic backward's on the same inputs."""
        for t in (dq, dk, dv):
            t.fill_(float("nan"))
        for part in ("preprocess", "dkdv tma reduce", "convert"):
            parts[part](0)
        got = (dq.clone(), dk.clone(), dv.clone())
        det = ab.attention_bwd(*sets[0], causal=causal, deterministic=True)
        rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())
        print("  check tma reduce vs deterministic: " + ", ".join(f"{n} {rel(g, d):.2e}" for n, g, d in
                                                                   zip(("dq", "dk", "dv"), got, det)))
    check_tma_reduce()
    return parts, flops, dict(dkdv=cfg, dkdv_det=cfg_det, dq=dq_cfg)


def check(B, Hq, Hkv, N, D, causal) -> None:
    """The backward's gradients (dQ by the TMA adds on sm_90a) against the deterministic form's (no adds) and SDPA's
    cuDNN backward's, on fresh inputs with poisoned outputs: printed as relative errors (Frobenius)."""
    q, k, v = (torch.randn(B, h, N, D, device="cuda", dtype=torch.bfloat16) for h in (Hq, Hkv, Hkv))
    o, lse = attention_fwd(q, k, v, causal=causal)
    do = torch.randn_like(o)
    outs = [tuple(torch.full_like(t, float("nan")) for t in (q, k, v)) for _ in range(2)]
    got = ab.attention_bwd(q, k, v, o, lse, do, causal=causal, dq=outs[0][0], dk=outs[0][1], dv=outs[0][2])
    det = ab.attention_bwd(q, k, v, o, lse, do, causal=causal, deterministic=True, dq=outs[1][0], dk=outs[1][1],
                           dv=outs[1][2])
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=Hq != Hkv)
    ref = torch.autograd.grad(out, (qq, kk, vv), do)
    rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())
    for n, g, d, r in zip(("dq", "dk", "dv"), got, det, ref):
        print(f"  check {n}: atomic vs deterministic {rel(g, d):.2e}, atomic vs cuDNN {rel(g, r):.2e}, "
              f"deterministic vs cuDNN {rel(d, r):.2e}, finite {bool(torch.isfinite(g).all())}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="llama,d128")
    ap.add_argument("--json")
    ap.add_argument("--ncu", action="store_true", help="launch each part three times for ncu, time nothing")
    args = ap.parse_args()
    with_options()
    results = []
    for name in args.cases.split(","):
        parts, flops, cfgs = launches(*CASES[name])
        if args.ncu:
            for fn in parts.values():
                for _ in range(3):
                    fn(0)
            torch.cuda.synchronize()
            continue
        check(*CASES[name])
        t = time_side_by_side(parts, 2, "cuda", budget_s=0.3)
        row = {"case": name, "shape": CASES[name], "configs": {k: {c: v for c, v in d.items()} for k, d in cfgs.items()},
               "flops": flops, "parts": {}}
        print(f"{name} {CASES[name]} dkdv {cfgs['dkdv']}")
        for part, tm in t.items():
            row["parts"][part] = {"ms": tm.ms, "ms_batch": tm.ms_batch, "agree": tm.agree}
            print(f"  {part:28} {tm.ms:8.3f} ms (batch {tm.ms_batch:8.3f}, agree {tm.agree})"
                  f"  {flops / tm.ms / 1e9:7.1f} TFLOP/s-equiv")
        results.append(row)
    if args.json:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
