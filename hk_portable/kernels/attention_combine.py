"""The combine step of split-KV attention (attention_kvcache.py): merges per-split partial outputs and
log-sum-exps into the output, with weights exp(lse_s - max_s lse_s).

The splits are the rows of the tiles it reads: one block per packed row (and 64 columns) loads the partial outputs
of BS splits as one [BS, 64] tile (and their lse as one vector) and reduces down the columns, so every split's bytes are in
flight at once. (It looped over the splits before, one dependent load a split: 2-4 splits cost the decode
~10 us more than one, perf-notes 2026-12-07.) More than BS splits merge BS at a time, online."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, f32


@hk.kernel(num_warps=1)
def attention_combine_kernel(o_part: GL[4], lse_part: GL[3], o: GL[4], lse: GL[4], *, D: hk.const = 64,
                             BS: hk.const = 16):
    """o_part [B·Hkv, R, S, Dv] f32 and lse_part [B·Hkv, R, S] f32 (views of attention_kvcache_kernel's
    [B·Hkv·S, R, Dv] and [B·Hkv·S, R] partials with the splits as rows) -> o [B, Hkv, R, Dv] (the input dtype),
    lse [B, Hkv, R, 1] f32. Block (r, h_kv·C + c, b) merges packed row r's columns c·D .. (c+1)·D - 1 (C = the
    column blocks of Dv: a [16, 128] f32 tile with its weights spills on one warp, sm_90a). A split that saw no key
    has lse = -inf and weight 0; a row whose every split saw none gets o = 0, lse = -inf."""
    r, hc, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    chunks = hk.cdiv(o.shape[3], D)
    h_kv, c = hc // chunks, hc % chunks
    bh = b * o.shape[1] + h_kv

    def merge(s, acc, col_m, col_l):
        part_lse = hk.load(RV[f32, BS], lse_part, (bh, r, s), fill=float("-inf"))
        part_o = hk.load(RT[f32, BS, D], o_part, (bh, r, s, c))
        lse_t = hk.zeros(RT[f32, BS, D]) + part_lse[:, None]      # each column holds every split's lse
        new_m = hk.maximum(col_m, hk.col_max(lse_t))
        safe = hk.where(new_m == float("-inf"), 0.0, new_m)
        alpha = hk.exp(col_m - safe)
        w = hk.exp(lse_t - safe[None, :])
        return acc * alpha + hk.col_sum(w * part_o), new_m, col_l * alpha + hk.col_sum(w)

    carry = (hk.zeros(RV[f32, D]), hk.neg_inf(RV[f32, D]), hk.zeros(RV[f32, D]))
    acc, col_m, col_l = hk.fori_loop(0, hk.cdiv(o_part.shape[2], BS), merge, carry)
    col_l = hk.where(col_l == 0.0, 1.0, col_l)
    hk.store(o, (acc / col_l).to(o.dtype), (b, h_kv, r, c))
    # lse has one column: block c = 0 writes it (its other columns, and every column of the others, fall outside)
    hk.store(lse, col_m + hk.log(col_l), (b, h_kv, r, c))


def combine_grid(R: int, hkv: int, B: int, dv: int, cfg: dict) -> tuple:
    """attention_combine_kernel's grid for packed rows R, Hkv heads, batch B, v's head dim dv."""
    return (R, hkv * hk.cdiv(dv, cfg["D"]), B)


def combine_views(o_part: torch.Tensor, lse_part: torch.Tensor, splits: int):
    """attention_kvcache_kernel's partials [B·Hkv·S, R, D] and [B·Hkv·S, R] as the combine reads them: the splits as
    rows, [B·Hkv, R, S, D] and [B·Hkv, R, S] (views, no copy)."""
    n, R, D = o_part.shape
    return (o_part.view(n // splits, splits, R, D).transpose(1, 2),
            lse_part.view(n // splits, splits, R).transpose(1, 2))


def example_args(device="cpu", B=2, Hkv=2, R=4, D=128, splits=3, dtype=torch.bfloat16):
    o_part = torch.randn(B * Hkv * splits, R, D, device=device)
    lse_part = torch.randn(B * Hkv * splits, R, device=device)
    o = torch.empty(B, Hkv, R, D, device=device, dtype=dtype)
    lse = torch.empty(B, Hkv, R, 1, device=device)
    return (*combine_views(o_part, lse_part, splits), o, lse), dict(D=min(D, 64), BS=16)
