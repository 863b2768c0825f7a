"""Decode attention at the sizes transformers' `generate` calls it (one query per sequence, GQA 16/4, D=128, a
contiguous cache of 128-16384 keys in transformers' [B, Hkv, S, D] layout, batch 1-64): hk's attention_kvcache in
the configurations that matter, against SDPA's cuDNN backend, side by side in one process.

  hk auto          what attention_kvcache chooses (kvcache_config, _splits; one split: the kernel writes o itself)
  hk 1 split sN    one split, N pipeline stages of key/value tiles (the serial chain a short cache walks)
  hk K splits      K splits (at most one per key tile) and the combine kernel
  hk ... bn64      key tiles of 64 rather than 32 (D=128): half the serial steps a split, twice the bytes a step

Outputs are checked against SDPA's first (relative Frobenius error, printed). Both timing methods of
hk_portable.bench (CUDA events per call, batch wall time; at these sizes the batch figure is the host's), and
torch.profiler's GPU time per kernel of "hk auto", "hk 16 splits" and cuDNN (the split kernel against the combine).

    python benchmarks/decode_attention.py [--json decode.json] [--ctx 128 1024 4096 16384] [--batch 1 8 64]
"""
from __future__ import annotations

import argparse
import json

import torch

from hk_portable.bench import time_side_by_side
from hk_portable.bench_model import _profile_table
from hk_portable.kernels.attention_kvcache import attention_kvcache

HQ, HKV, D = 16, 4, 128
VARIANTS = {"hk auto": {}, "hk 1 split s2": dict(num_splits=1, STAGES=2), "hk 1 split s3": dict(num_splits=1, STAGES=3),
            **{f"hk {n} splits": dict(num_splits=n) for n in (2, 4, 8, 16, 32, 64)},
            "hk auto bn64": dict(BN=64), "hk 1 split bn64": dict(num_splits=1, BN=64)}


def kernel_times(fn, calls: int = 20) -> dict:
    """GPU microseconds a call per kernel name (bench_model's profiler table): where a variant's time goes (split
    kernel, combine)."""
    table = _profile_table({"fn": fn}, steps=calls)["fn"]["kernels"]
    return {k["name"][:60]: round(k["ms_per_step"] * 1e3, 2) for k in table}


def case(B: int, ctx: int) -> dict:
    sets = []
    for _ in range(2):
        q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, HKV, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        sets.append((q, k, v))
    lens = torch.full((B,), ctx, device="cuda", dtype=torch.int32)

    def hk_fn(opts):
        return lambda i: attention_kvcache(sets[i][0].transpose(1, 2), sets[i][1].transpose(1, 2),
                                           sets[i][2].transpose(1, 2), lens, **opts)[0]

    def cudnn(i):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(*sets[i], enable_gqa=True).transpose(1, 2)

    fns = {name: hk_fn(opts) for name, opts in VARIANTS.items()}
    fns["cuDNN"] = cudnn
    ref = cudnn(0).double()
    errors = {name: float((fn(0).double() - ref).norm() / ref.norm()) for name, fn in fns.items()}
    t = time_side_by_side(fns, 2, "cuda", budget_s=0.3)
    row = {"B": B, "ctx": ctx, "variants": {},
           "kernels_us": {name: kernel_times(fns[name]) for name in ("hk auto", "hk 16 splits", "cuDNN")}}
    base = t["cuDNN"].ms
    print(f"B{B} ctx{ctx}")
    for name, tm in t.items():
        row["variants"][name] = {"ms": tm.ms, "ms_batch": tm.ms_batch, "agree": tm.agree, "rel_error": errors[name]}
        print(f"  {name:16} {tm.ms * 1e3:8.2f} us (batch {tm.ms_batch * 1e3:8.2f}, agree {tm.agree})  "
              f"cuDNN/this {base / tm.ms:5.2f}  err {errors[name]:.1e}")
    for name, ks in row["kernels_us"].items():
        print(f"  kernels {name:12} " + "  ".join(f"{k} {v:.1f} us" for k, v in ks.items()))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, nargs="+", default=[128, 1024, 4096, 16384])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [case(B, ctx) for B in args.batch for ctx in args.ctx]
    if args.json:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": rows},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
