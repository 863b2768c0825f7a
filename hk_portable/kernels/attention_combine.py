"""The combine step of split-KV attention (attention_kvcache.py): merges per-split partial outputs and
log-sum-exps into the output, with weights exp(lse_s - max_s lse_s)."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, f32

from .attention import normalised


@hk.kernel(num_warps=1)
def attention_combine_kernel(o_part: GL[3], lse_part: GL[2], o: GL[4], lse: GL[3], *, D: hk.const = 128,
                             BM: hk.const = 16):
    """Merges the splits of attention_kvcache_kernel: o_part [B·Hkv·S, R, D] f32, lse_part [B·Hkv·S, R] ->
    o [B, Hkv, R, D] (the input dtype), lse [B, Hkv, R] f32. A split that saw no key has lse = -inf and
    weight 0; a row whose every split saw none gets o = 0, lse = -inf."""
    m, h_kv, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    splits = o_part.shape[0] // (o.shape[0] * o.shape[1])
    base = (b * o.shape[1] + h_kv) * splits

    def merge(s, acc, row_m, row_l):
        part_lse = hk.load(RV[f32, BM], lse_part, (base + s, m), fill=float("-inf"))
        part_o = hk.load(RT[f32, BM, D], o_part, (base + s, m, 0))
        new_m = hk.maximum(row_m, part_lse)
        safe = hk.where(new_m == float("-inf"), 0.0, new_m)
        alpha = hk.exp(row_m - safe)
        w = hk.exp(part_lse - safe)
        return acc * alpha[:, None] + part_o * w[:, None], new_m, row_l * alpha + w

    carry = (hk.zeros(RT[f32, BM, D]), hk.neg_inf(RV[f32, BM]), hk.zeros(RV[f32, BM]))
    acc, row_m, row_l = hk.fori_loop(0, splits, merge, carry)
    row_l = hk.where(row_l == 0.0, 1.0, row_l)
    hk.store(o, normalised(acc, row_l).to(o.dtype), (b, h_kv, m, 0))
    hk.store(lse, row_m + hk.log(row_l), (b, h_kv, m))


def example_args(device="cpu", B=2, Hkv=2, R=4, D=128, splits=3, dtype=torch.bfloat16):
    bm, warps = (16, 1) if R <= 16 else (64, 4)
    o_part = torch.randn(B * Hkv * splits, R, D, device=device)
    lse_part = torch.randn(B * Hkv * splits, R, device=device)
    o = torch.empty(B, Hkv, R, D, device=device, dtype=dtype)
    lse = torch.empty(B, Hkv, R, device=device)
    return (o_part, lse_part, o, lse), dict(D=D, BM=bm, num_warps=warps)
