"""Attention against a KV cache, paged or contiguous, for decode (split-KV) and prefill.

q [B, Nq, Hq, D] against k_cache, v_cache: paged, [num_pages, page_size, Hkv, D] addressed through
block_table [B, max_pages] int32 (vLLM's and FlashInfer's layout), or contiguous, [B, S, Hkv, D] (one page per
sequence). cache_seqlens [B] int32: sequence b has keys 0 .. L_b - 1, and its Nq queries are its last Nq
positions (with causal, bottom-right: query n sees keys j <= L_b - Nq + n). flash_attn_with_kvcache's
layouts, without its in-kernel append of new keys (write them to the cache first).

The query heads of a GQA group share their key/value head's loads: the wrapper packs q to [B, Hkv, R, D] with
row r = n·g + h_in_group (R = Nq·g), so one block computes every head of a group. The causal limit of row r,
L_b - Nq + r // g, is not linear in r: the kernel reads each row's query index from `row_pos` (int32 [R])
and each key column's offset from `iota` (int32 [BN]) and compares tiles. A key tile lies inside one page
(page_size a multiple of the tile); the load region reads the tile's page from the block table with
hk.load_scalar. Split-KV: grid axis 0 splits the key tiles of a sequence into `splits` ranges; each block
writes its partial o (f32, normalised) and lse, and attention_combine_kernel (attention_combine.py) merges
them, so one long sequence fills the device. Prefill against a cache is the same kernel with more row tiles.
A row that sees no key gives o = 0, lse = -inf."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ST, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

from .attention import (TUNABLE, LN2, LOG2E, check_head_dim, check_qkv, check_sinks, normalised, scale_value,
                        softcap_value, softmax_step, tile_dim, with_sink)
from .attention_combine import attention_combine_kernel, combine_grid, combine_views


def _fn_error(fn: str, msg: str) -> ArgumentError:
    return ArgumentError(f"{fn}: {msg}")


def _describe(t) -> str:
    return f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__




@hk.kernel(num_warps=1, tunable=TUNABLE)
def attention_kvcache_kernel(q: GL[4], k: GL[4], v: GL[4], o_part: GL[3], lse_part: GL[2], block_table: GL[2],
                             cache_seqlens: GL[1], row_pos: GL[1], iota: GL[1], scale: float, n_q: int,
                             row_tiles: int, *, D: hk.const = 128, BM: hk.const = 16, BN: hk.const = 32,
                             PAGED: hk.const = True, TPP: hk.const = 1, CAUSAL: hk.const = False,
                             STAGES: hk.const = 2):
    """q [B, Hkv, R, D] packed rows; k, v [num_pages, Hkv, page_size, D] views with page_size = TPP·BN (PAGED),
    or [B, Hkv, S, D] (contiguous; block_table unused); o_part [B·Hkv·splits, R, D] f32; lse_part
    [B·Hkv·splits, R] f32 (natural log). With one split, o_part may be the output itself (q's dtype): nothing
    is left to combine."""
    kvcache_body(q, k, v, o_part, lse_part, block_table, cache_seqlens, row_pos, iota, scale, n_q, row_tiles, None,
                 None, D=D, BM=BM, BN=BN, PAGED=PAGED, TPP=TPP, CAUSAL=CAUSAL, STAGES=STAGES, SOFTCAP=False,
                 SINKS=False)


@hk.kernel(num_warps=1, tunable=TUNABLE)
def attention_kvcache_ext_kernel(q: GL[4], k: GL[4], v: GL[4], o_part: GL[3], lse_part: GL[2], block_table: GL[2],
                                 cache_seqlens: GL[1], row_pos: GL[1], iota: GL[1], scale: float, n_q: int,
                                 row_tiles: int, softcap: float, sinks: GL[3], *, D: hk.const = 128,
                                 BM: hk.const = 16, BN: hk.const = 32, PAGED: hk.const = True, TPP: hk.const = 1,
                                 CAUSAL: hk.const = False, STAGES: hk.const = 2, SOFTCAP: hk.const = False,
                                 SINKS: hk.const = False):
    """attention_kvcache_kernel with softcap (SOFTCAP) and/or sinks (SINKS): sinks [splits, Hkv, R] f32, each packed
    row's head's sink logit in split 0 and NO_SINK in the others, so that the sink joins each row's denominator
    once and the combine step needs no change. A kernel of its own: the plain one keeps its code."""
    kvcache_body(q, k, v, o_part, lse_part, block_table, cache_seqlens, row_pos, iota, scale, n_q, row_tiles, softcap,
                 sinks, D=D, BM=BM, BN=BN, PAGED=PAGED, TPP=TPP, CAUSAL=CAUSAL, STAGES=STAGES, SOFTCAP=SOFTCAP,
                 SINKS=SINKS)


NO_SINK = -1e30     # a finite "no sink" (its exp2 is 0; -inf would make the max of a row with no key NaN)


def kvcache_body(q, k, v, o_part, lse_part, block_table, cache_seqlens, row_pos, iota, scale, n_q, row_tiles,
                 softcap, sinks, *, D, BM, BN, PAGED, TPP, CAUSAL, STAGES, SOFTCAP, SINKS):
    """The KV-cache kernel, written once; SOFTCAP and SINKS gate the two features as in attention.forward_body."""
    s, hm, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    splits = hk.num_blocks(0)
    h_kv, m = hm // row_tiles, hm % row_tiles
    part = (b * k.shape[1] + h_kv) * splits + s
    q_s = hk.shared(ST[q.dtype, BM, D])
    k_s = hk.shared(ST[k.dtype, BN, D], stages=STAGES)
    v_s = hk.shared(ST[v.dtype, BN, D], stages=STAGES)
    hk.load(q_s, q, (b, h_kv, m, 0))
    scale_log2 = scale * LOG2E
    if SOFTCAP:                             # c * tanh(scale * s / c), in base 2 (attention.forward_body)
        cap_in, cap_out = scale / softcap, softcap * LOG2E
    n_keys = hk.max(hk.load_scalar(cache_seqlens, b), 0)
    n_tiles = hk.cdiv(n_keys, BN)
    chunk = hk.cdiv(n_tiles, splits)
    lo = hk.min(s * chunk, n_tiles)
    hi = hk.min(lo + chunk, n_tiles)
    # tiles every row of the block sees whole: below L (and, causal, below the first row's limit)
    first_pos = hk.load_scalar(row_pos, m * BM, fill=0)
    full_hi = n_keys // BN
    if CAUSAL:
        full_hi = hk.min(full_hi, (n_keys - n_q + first_pos + 1) // BN)
    full_hi = hk.max(hk.min(full_hi, hi), lo)
    limit = hk.load(RV[hk.i32, BM], row_pos, (m,)) + (n_keys - n_q)           # each row's last visible key
    cols0 = hk.load(RV[hk.i32, BN], iota, (0,))

    def blocks(t_lo, t_hi, edge, carry):
        def load(i, st):
            jt = t_lo + i
            if PAGED:                       # the tile's page from the block table; a page id out of range reads 0
                page, tile = hk.load_scalar(block_table, (b, jt // TPP), fill=-1), jt % TPP
            else:
                page, tile = b, jt
            hk.load(k_s[st], k, (page, h_kv, tile, 0))
            hk.load(v_s[st], v, (page, h_kv, tile, 0))

        def compute(i, st, acc, row_m, row_l):
            jt = t_lo + i
            if SOFTCAP:
                scores = hk.tanh(hk.mma_ABt(q_s, k_s[st], hk.zeros(RT[f32, BM, BN])) * cap_in) * cap_out
            else:
                scores = hk.mma_ABt(q_s, k_s[st], hk.zeros(RT[f32, BM, BN])) * scale_log2
            if edge:
                cols = hk.zeros(RT[hk.i32, BM, BN]) + (cols0 + jt * BN)[None, :]
                keep = cols < n_keys
                if CAUSAL:
                    keep = keep & (cols <= limit[:, None])
                scores = hk.where(keep, scores, float("-inf"))
            return softmax_step(scores, v_s[st], v.dtype, acc, row_m, row_l, guard=edge)

        return hk.pipeline(t_hi - t_lo, load, compute, carry=carry, stages=STAGES)

    carry = (hk.zeros(RT[f32, BM, D]), hk.neg_inf(RV[f32, BM]), hk.zeros(RV[f32, BM]))
    carry = blocks(lo, full_hi, False, carry)
    acc, row_m, row_l = blocks(full_hi, hi, True, carry)
    if SINKS:                               # split 0's rows: the sink joins the denominator (others: NO_SINK, 0)
        out, row_m, row_l = with_sink(acc, row_m, row_l,
                                      hk.load(RV[f32, BM], sinks, (s, h_kv, m), fill=NO_SINK) * LOG2E)
        hk.store(o_part, out.to(o_part.dtype), (part, m, 0))
    else:
        row_l = hk.where(row_l == 0.0, 1.0, row_l)
        hk.store(o_part, normalised(acc, row_l).to(o_part.dtype), (part, m, 0))     # f32 parts, or the output
    hk.store(lse_part, (row_m + hk.log2(row_l)) * LN2, (part, m))


_IOTA: dict = {}


def _iota(n: int, device) -> torch.Tensor:
    key = (n, str(device))
    if key not in _IOTA:
        _IOTA[key] = hk.constant_table(torch.arange(n, dtype=torch.int32, device=device))
    return _IOTA[key]


def _row_pos(n_q: int, g: int, device) -> torch.Tensor:
    key = ("pos", n_q, g, str(device))
    if key not in _IOTA:
        _IOTA[key] = hk.constant_table((torch.arange(n_q * g, dtype=torch.int32, device=device) // g).to(torch.int32))
    return _IOTA[key]


BLOCKS_PER_UNIT = 1     # one-warp blocks a split-KV launch aims for per compute unit (SM / CU): a batch that fills the
                        # units already runs unsplit (B64 ctx4096: 1 split 0.97x cuDNN, 3 splits 0.78x; perf-notes)
TILES_PER_SPLIT = 8     # the fewest key tiles a split walks: each split costs the combine's launch (~6.5 us on the GPU)


def kvcache_config(D: int, R: int, page_size: int, paged: bool) -> dict:
    """Decode (R <= 16 packed rows): 16-row blocks of one warp; prefill: the dense kernel's 64-row blocks.
    Key tiles: 32 rows at D=128, 64 at D=64 (every target's shared memory), at most one page. D is a tile head dim
    (attention.tile_dim); D=256: key tiles of 16, prefill's in one stage (48 KiB)."""
    if D > 128:
        return dict(D=D, BM=16, BN=16, STAGES=2, num_warps=1) if R <= 16 else \
            dict(D=D, BM=64, BN=16, STAGES=1, num_warps=4)
    bn = 32 if D > 64 else 64
    if paged:
        bn = min(bn, page_size)
    if R <= 16:
        return dict(D=D, BM=16, BN=bn, STAGES=2, num_warps=1)
    return dict(D=D, BM=64, BN=bn, STAGES=2, num_warps=4)


def combine_config(cfg: dict) -> dict:
    """The combine kernel's configuration for a split kernel's: 16 splits a load, 64 columns a block, one warp."""
    return dict(D=min(cfg["D"], 64), BS=16, num_warps=1)


def attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=None, *, causal: bool = False,
                      scale: float | None = None, num_splits: int | None = None, softcap: float | None = None,
                      sinks=None, out=None, lse=None, backend=None, **config):
    """Attention of q [B, Nq, Hq, D] against a KV cache (flash_attn_with_kvcache's layouts): k_cache, v_cache
    [num_pages, page_size, Hkv, D] with block_table [B, max_pages] int32 (paged), or [B, S, Hkv, D] with
    block_table None (contiguous); cache_seqlens [B] int32, the keys of sequence b being 0 .. L_b - 1 (the new
    tokens' keys already written). causal: bottom-right, query n sees keys j <= L_b - Nq + n. The KV length is
    split across `num_splits` blocks (None: enough blocks for the device) and the splits are merged by a
    second kernel (one split of one query per sequence: the kernel writes the outputs itself). Returns (o [B, Nq, Hq, D], lse f32 [B, Hq, Nq]); a row that sees no key gives o = 0,
    lse = -inf (with sinks: the sink). Page ids outside [0, num_pages) read zeros (their keys are masked only by
    L_b: keep them valid). softcap, sinks: attention_fwd's."""
    fn = "attention_kvcache"
    T = torch.Tensor
    key = None
    if not config and softcap is None and sinks is None and isinstance(q, T) and isinstance(k_cache, T) and isinstance(v_cache, T) and \
            isinstance(cache_seqlens, T) and (block_table is None or isinstance(block_table, T)):
        # not a contiguous cache's length nor the caches' other strides: a decode loop whose cache grows by a
        # token a step (a new [B, S + 1, Hkv, D] view each step) keeps its plan; what depends on them is per call
        key = _PLANS.key(q.shape, q.stride(), q.dtype, q.device, k_cache.shape[0], k_cache.shape[2:],
                         k_cache.stride(-1), k_cache.dtype, k_cache.device, v_cache.shape[0], v_cache.shape[2:],
                         v_cache.stride(-1), v_cache.dtype, v_cache.device, None if block_table is None else
                         (k_cache.shape[1], block_table.shape, block_table.dtype, block_table.device),
                         cache_seqlens.shape, cache_seqlens.dtype, cache_seqlens.device,
                         causal, causal.__class__, scale, num_splits, num_splits.__class__, backend)
    plan = None if key is None else _PLANS.get(key)
    if plan is None or k_cache.shape[1] != v_cache.shape[1]:
        plan = _decide(fn, q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, config)
        if key is not None:
            _PLANS.put(key, plan)
    cfg, num_splits, scale, paged = plan
    cap = softcap_value(softcap, fn)
    if sinks is not None:
        check_sinks(sinks, q.transpose(1, 2), fn)      # [Hq]: q [B, Nq, Hq, D]
    B, Nq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    g = Hq // Hkv
    R = Nq * g
    BM, BN = cfg["BM"], cfg["BN"]
    row_tiles = hk.cdiv(R, BM)
    page_size = k_cache.shape[1]
    capacity = block_table.shape[1] * page_size if paged else page_size
    if capacity >= 2**30:
        raise _fn_error(fn, f"cache capacity must be < 2**30 keys, got {capacity}")
    if num_splits is None:
        num_splits = _splits(B * Hkv * row_tiles, capacity, BN, hk.compute_units(q.device))
    if cache_seqlens.device.type == "cpu" and cache_seqlens.numel() and \
            (int(cache_seqlens.min()) < 0 or int(cache_seqlens.max()) > capacity):
        raise _fn_error(fn, f"cache_seqlens must be in [0, {capacity}] (the cache's capacity), got "
                        f"{cache_seqlens.tolist()}")
    if out is not None or lse is not None:
        check_no_overlap(fn, {k: t for k, t in (("out", out), ("lse", lse)) if t is not None},
                         {"q": q, "k_cache": k_cache, "v_cache": v_cache})
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype:
        raise _fn_error(fn, f"'out' must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    if lse is None:
        lse = torch.empty(B, Hq, Nq, device=q.device, dtype=torch.float32)
    elif tuple(lse.shape) != (B, Hq, Nq) or lse.dtype != torch.float32:
        raise _fn_error(fn, f"'lse' must be {(B, Hq, Nq)} float32, got {tuple(lse.shape)} {lse.dtype}")
    dev = q.device
    # the query heads of a group as rows: [B, Hkv, Nq·g, D], row n·g + h_in_group
    q_rows = q.reshape(B, Nq, Hkv, g, D).permute(0, 2, 1, 3, 4).reshape(B, Hkv, R, D)
    table = block_table if paged else _row_pos(1, 1, dev).view(1, 1)     # contiguous: no table is read
    # one query per sequence: rows are the heads of a group, so the outputs' own memory has the rows' layout
    direct = Nq == 1 and out.is_contiguous() and lse.is_contiguous()
    if direct and num_splits == 1:      # a short cache's decode: the kernel writes o and lse, no combine launch
        o_part, lse_part = out.view(B * Hkv, R, D), lse.view(B * Hkv, R)
    else:
        o_part = torch.empty(B * Hkv * num_splits, R, D, device=dev, dtype=torch.float32)
        lse_part = torch.empty(B * Hkv * num_splits, R, device=dev, dtype=torch.float32)
    args = (q_rows, k_cache.permute(0, 2, 1, 3), v_cache.permute(0, 2, 1, 3), o_part, lse_part, table, cache_seqlens,
            _row_pos(Nq, g, dev), _iota(BN, dev), scale, Nq, row_tiles)
    launch = dict(grid=(num_splits, Hkv * row_tiles, B), backend=backend, PAGED=paged,
                  TPP=page_size // BN if paged else 1, **cfg)
    if cap is not None and cfg["BM"] > 16 and not config:   # prefill with softcap: one stage (with two, 1-2 SGPRs
        launch["STAGES"] = 1                                # spilled on gfx942 and gfx950, clang 22.1.8)
    if cap is None and sinks is None:
        attention_kvcache_kernel(*args, **launch)
    else:                   # without sinks the kernel reads none (SINKS False): lse_part stands in for the table
        table = lse_part.view(1, *lse_part.shape) if sinks is None else _sink_table(sinks, num_splits, Hkv, Nq, g)
        attention_kvcache_ext_kernel(*args, 1.0 if cap is None else cap, table, **launch, SOFTCAP=cap is not None,
                                     SINKS=sinks is not None)
    if direct and num_splits == 1:
        return out, lse
    o_rows = out.view(B, Hkv, R, D) if direct else torch.empty(B, Hkv, R, D, device=dev, dtype=q.dtype)
    lse_rows = lse.view(B, Hkv, R) if direct else torch.empty(B, Hkv, R, device=dev, dtype=torch.float32)
    comb = combine_config(cfg)
    attention_combine_kernel(*combine_views(o_part, lse_part, num_splits), o_rows, lse_rows.unsqueeze(-1),
                             grid=combine_grid(R, Hkv, B, D, comb), backend=backend, **comb)
    if not direct:
        out.copy_(o_rows.view(B, Hkv, Nq, g, D).permute(0, 2, 1, 3, 4).reshape(B, Nq, Hq, D))
        lse.copy_(lse_rows.view(B, Hkv, Nq, g).permute(0, 1, 3, 2).reshape(B, Hq, Nq))
    return out, lse


def _decide(fn, q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, config) -> tuple:
    """attention_kvcache's checks of everything but cache_seqlens' values, and its choices: (config, num_splits as
    given, scale, paged), decided once per call signature (the caches' length, and what depends on it, per call)."""
    check_qkv(fn, {"q": q, "k_cache": k_cache, "v_cache": v_cache}, 4, "4-D tensor", unit_last_stride=True)
    B, Nq, Hq, D = q.shape
    check_head_dim(fn, D)
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != D:
        raise _fn_error(fn, f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have one shape "
                        f"[..., Hkv, D={D}] (this path takes one head dim for q, k and v; attention_fwd and "
                        "attention_varlen take a v of its own)")
    Hkv = k_cache.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise _fn_error(fn, f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if Nq < 1 or B < 1:
        raise _fn_error(fn, f"q must have B >= 1 and Nq >= 1, got {tuple(q.shape)}")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 or \
            tuple(cache_seqlens.shape) != (B,) or cache_seqlens.device != q.device:
        raise _fn_error(fn, f"'cache_seqlens' must be int32 [B={B}] on {q.device}, got {_describe(cache_seqlens)}")
    paged = block_table is not None
    page_size = k_cache.shape[1]
    if paged:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2 \
                or block_table.shape[0] != B or block_table.device != q.device or block_table.shape[1] < 1:
            raise _fn_error(fn, f"'block_table' must be int32 [B={B}, max_pages >= 1] on {q.device}, got "
                            f"{_describe(block_table)}")
        if page_size % 16:
            raise _fn_error(fn, f"page_size must be a multiple of 16, got {page_size}")
    else:
        if k_cache.shape[0] != B:
            raise _fn_error(fn, f"a contiguous cache must be [B={B}, S, Hkv, D], got {tuple(k_cache.shape)}")
    if not isinstance(causal, bool):
        raise _fn_error(fn, f"'causal' must be a bool, got {causal!r}")
    scale = scale_value(scale, D, fn)
    g = Hq // Hkv
    R = Nq * g
    cfg = {**kvcache_config(tile_dim(D), R, page_size, paged), **config, "CAUSAL": causal}
    BN = cfg["BN"]
    if paged and page_size % BN:
        raise _fn_error(fn, f"page_size {page_size} must be a multiple of the key tile {BN}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise _fn_error(fn, f"'num_splits' must be an int >= 1 or None, got {num_splits!r}")
    return cfg, num_splits, scale, paged


def _sink_table(sinks, splits: int, hkv: int, nq: int, g: int) -> torch.Tensor:
    """[splits, Hkv, R] f32: packed row r = n·g + h_in_group of key/value head h_kv gets sinks[h_kv·g + h_in_group] in
    split 0, NO_SINK in the others (the sink counted once; attention_combine merges the splits unchanged)."""
    rows = sinks.detach().float().view(hkv, 1, g).expand(hkv, nq, g).reshape(hkv, nq * g)
    table = torch.full((splits, hkv, nq * g), NO_SINK, device=sinks.device, dtype=torch.float32)
    table[0] = rows
    return table


def _splits(blocks: int, capacity: int, bn: int, units: int) -> int:
    """The KV splits of a call with `blocks` blocks a split: enough for BLOCKS_PER_UNIT on each of the device's
    `units` compute units, at most one per TILES_PER_SPLIT key tiles of the cache's capacity."""
    return max(1, min(hk.cdiv(BLOCKS_PER_UNIT * units, blocks), hk.cdiv(capacity, TILES_PER_SPLIT * bn)))


_PLANS = hk.CallPlans()     # _decide's answer per call signature (less the caches' length)


def kvcache_reference(q, k_cache, v_cache, cache_seqlens, block_table=None, causal=False, scale=None, softcap=None,
                      sinks=None):
    """float64 math, one sequence at a time: gathers each sequence's keys from its pages."""
    B, Nq, Hq, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    g = Hq // k_cache.shape[2]
    o = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((B, Hq, Nq), float("-inf"), dtype=torch.float64)
    for b in range(B):
        L = int(cache_seqlens[b])
        if block_table is None:
            kb, vb = k_cache[b, :L], v_cache[b, :L]
        else:
            ps = k_cache.shape[1]
            pages = block_table[b, :-(-L // ps)].long()
            kb = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:L]
            vb = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:L]
        kd = kb.double().permute(1, 0, 2).repeat_interleave(g, 0)          # [Hq, L, D]
        vd = vb.double().permute(1, 0, 2).repeat_interleave(g, 0)
        s = (q[b].double().permute(1, 0, 2) @ kd.transpose(-1, -2)) * scale    # [Hq, Nq, L]
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        if causal:
            i = torch.arange(Nq).view(-1, 1) + (L - Nq)
            s = s.masked_fill(torch.arange(L).view(1, -1) > i, float("-inf"))
        if sinks is not None:               # one more logit per row whose probability is dropped
            full = torch.cat([s, sinks.double().view(-1, 1, 1).expand(Hq, Nq, 1)], -1)
            lse[b] = torch.logsumexp(full, -1)
            o[b] = (torch.softmax(full, -1)[..., :-1] @ vd).permute(1, 0, 2)
            continue
        lse[b] = torch.logsumexp(s, -1) if L else lse[b]
        p = torch.softmax(s, -1).nan_to_num(0.0) if L else s.new_zeros(s.shape)
        o[b] = (p @ vd).permute(1, 0, 2) if L else 0.0
    return o, lse


def example_args(device="cpu", B=2, Nq=1, Hq=8, Hkv=2, D=128, page=16, pages=4, R=None, causal=False,
                         dtype=torch.bfloat16, splits=2):
    """Arguments of attention_kvcache_kernel for a paged cache (R packed rows: Nq·Hq/Hkv unless given)."""
    g = Hq // Hkv
    R = Nq * g if R is None else R
    Nq = max(1, R // g)
    cfg = kvcache_config(tile_dim(D), R, page, True)
    cfg["CAUSAL"] = causal
    q = torch.randn(B, Hkv, R, D, device=device, dtype=dtype)
    kc = torch.randn(B * pages, page, Hkv, D, device=device, dtype=dtype)
    vc = torch.randn(B * pages, page, Hkv, D, device=device, dtype=dtype)
    table = torch.arange(B * pages, dtype=torch.int32, device=device).view(B, pages)
    seqlens = torch.full((B,), page * pages - 3, dtype=torch.int32, device=device)
    o_part = torch.empty(B * Hkv * splits, R, D, device=device)
    lse_part = torch.empty(B * Hkv * splits, R, device=device)
    pos = (torch.arange(R, dtype=torch.int32, device=device) // g).to(torch.int32)
    iota = torch.arange(cfg["BN"], dtype=torch.int32, device=device)
    return ((q, kc.permute(0, 2, 1, 3), vc.permute(0, 2, 1, 3), o_part, lse_part, table, seqlens, pos, iota,
             D ** -0.5, Nq, -(-R // cfg["BM"])), {**cfg, "PAGED": True, "TPP": page // cfg["BN"]})


def example_args_attention_kvcache_ext_kernel(device="cpu", softcap=30.0, splits=2, **kw):
    """example_args with softcap and a [splits, Hkv, R] sinks table (the softcap/sinks kernel's own arguments)."""
    args, cfg = example_args(device, splits=splits, **kw)
    q = args[0]
    sinks = torch.full((splits, q.shape[1], q.shape[2]), NO_SINK, device=device)
    sinks[0] = torch.randn(q.shape[1], q.shape[2], device=device)
    return (*args, softcap, sinks), {**cfg, "SOFTCAP": True, "SINKS": True}
