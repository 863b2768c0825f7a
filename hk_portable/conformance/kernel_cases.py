"""Kernel cases: every kernel in hk_portable.kernels through its public wrapper, against float64 math.

A kernel whose module is not installed yet is reported as skipped ("kernel module not present"),
never dropped silently.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math

import torch

from .cases import TORCH, Case, Check, Setup, f64, poisoned, rand_float, round_to
from .tolerances import bound_for

NOT_PRESENT = "kernel module not present"


def _module_missing(module: str) -> str | None:
    """The skip reason if hk_portable.kernels.<module> does not exist (an import error is not a skip)."""
    return None if importlib.util.find_spec(f"hk_portable.kernels.{module}") is not None else NOT_PRESENT


def _kernel_case(kernel: str, variant: str, make, module: str) -> Case:
    return Case(id=f"kernel/{kernel}/{variant}", kind="kernel", name=kernel, make=make,
                missing=_module_missing(module))


def _wrapper(module: str, name: str):
    return getattr(importlib.import_module(f"hk_portable.kernels.{module}"), name)


# ============================================================================================== gemm
GEMM_SHAPES = ((1, 1, 1), (17, 33, 65), (100, 70, 130), (256, 256, 256))
# the operand layouts a Linear layer produces (A then B; t: a transposed view, as x.t() or W.t() give)
GEMM_LAYOUT_SHAPES = ((17, 33, 65), (100, 70, 130), (256, 256, 256))


def _gemm_case(dtype: str, out_dtype: str, shape, layout: str = "nn") -> Case:
    M, N, K = shape

    def make(gen):
        a = rand_float(gen, (K, M), dtype, 0.1, 2.0).t() if layout[0] == "t" else rand_float(gen, (M, K), dtype, 0.1, 2.0)
        b = rand_float(gen, (N, K), dtype, 0.1, 2.0).t() if layout[1] == "t" else rand_float(gen, (K, N), dtype, 0.1, 2.0)
        value = f64(a) @ f64(b)
        scale = f64(a).abs() @ f64(b).abs()
        gemm = _wrapper("gemm", "gemm")
        return Setup({"a": a, "b": b}, {"c": poisoned((M, N), out_dtype)},
                     lambda t, be: gemm(t["a"], t["b"], t["c"], backend=be),
                     [Check("c = a @ b", "c", value, bound_for("gemm", out_dtype), scale=scale, k=K)])
    suffix = "" if layout == "nn" else f"_{layout}"
    return _kernel_case("gemm", f"{dtype}-{out_dtype}/{M}x{N}x{K}{suffix}", make, "gemm")


def gemm_cases() -> list[Case]:
    return ([_gemm_case(dt, out, s) for dt in ("bf16", "f16") for out in ("f32", dt) for s in GEMM_SHAPES]
            + [_gemm_case(dt, dt, s, lay) for dt in ("bf16", "f16") for s in GEMM_LAYOUT_SHAPES
               for lay in ("nt", "tn", "tt")])


# ========================================================================================== gemm_fp8
# (format of a, format of b, out dtype, (M, N, K), b column-major, scales per row/column)
FP8_PAIRS = (("fp8e4m3", "fp8e4m3"), ("fp8e5m2", "fp8e5m2"), ("fp8e4m3", "fp8e5m2"))
GEMM_FP8_CONFIGS = tuple((da, db, out, s, True, False) for da, db in FP8_PAIRS for out in ("f32", "bf16")
                         for s in ((1, 1, 1), (100, 70, 130), (256, 256, 256))) + (
    ("fp8e4m3", "fp8e4m3", "bf16", (100, 70, 130), False, True),
    ("fp8e5m2", "fp8e4m3", "f32", (64, 96, 256), True, True),
    ("fp8e4m3", "fp8e4m3", "f16", (33, 17, 64), False, False))


def _gemm_fp8_case(da: str, db: str, out_dtype: str, shape, b_colmajor: bool, rowwise: bool) -> Case:
    from .op_cases import fp8_codes
    M, N, K = shape

    def make(gen):
        a = fp8_codes(gen, (M, K), da)
        b = fp8_codes(gen, (N, K), db).t() if b_colmajor else fp8_codes(gen, (K, N), db)
        lo, hi = (0.005, 0.01) if out_dtype == "f16" else (0.5, 2.0)     # f16: K * 448^2 would overflow
        sa = rand_float(gen, (M if rowwise else 1,), "f32", lo, hi, signed=False)
        sb = rand_float(gen, (N if rowwise else 1,), "f32", lo, hi, signed=False)
        col_a, row_b = f64(sa).reshape(-1, 1), f64(sb).reshape(1, -1)
        value = (f64(a) @ f64(b)) * col_a * row_b
        scale = (f64(a).abs() @ f64(b).abs()) * col_a * row_b
        gemm_fp8 = _wrapper("gemm_fp8", "gemm_fp8")
        return Setup({"a": a, "b": b, "sa": sa, "sb": sb}, {"c": poisoned((M, N), out_dtype)},
                     lambda t, be: gemm_fp8(t["a"], t["b"], t["sa"], t["sb"], t["c"], backend=be),
                     [Check("c = a @ b * sa * sb", "c", value, bound_for("gemm_fp8", out_dtype), scale=scale, k=K)])
    variant = (f"{da}x{db}-{out_dtype}/{M}x{N}x{K}_{'bcol' if b_colmajor else 'brow'}"
               f"_{'rowwise' if rowwise else 'tensorwise'}")
    return _kernel_case("gemm_fp8", variant, make, "gemm_fp8")


def gemm_fp8_cases() -> list[Case]:
    return [_gemm_fp8_case(*c) for c in GEMM_FP8_CONFIGS]


# ========================================================================================= attention
# (B, Hq, Hkv, N, Nkv, D, causal, window, align): one query row; a ragged causal sequence; GQA with D=128; a
# long-ish row; then the serving shapes: causal with N != Nkv in both alignments (bottom-right with N > Nkv
# leaves rows that see no key: o = 0, lse = -inf), and a sliding window.
ATTENTION_CONFIGS = ((1, 2, 2, 1, 1, 64, False, None, None), (1, 2, 1, 77, 77, 64, True, None, None),
                     (2, 4, 2, 130, 130, 128, False, None, None), (1, 2, 2, 200, 200, 64, True, None, None),
                     (1, 2, 1, 113, 203, 64, True, None, "bottom_right"),
                     (1, 2, 1, 113, 203, 64, True, None, "top_left"),
                     (1, 2, 2, 150, 70, 64, True, None, "bottom_right"),
                     (1, 4, 2, 130, 130, 128, False, (33, 7), None),
                     # head dims past 64 and 128 (issue 40): tiles of 128 at D=80, of 256 at D=256
                     (1, 2, 1, 77, 77, 80, True, None, None),
                     (1, 4, 2, 70, 90, 256, True, None, "bottom_right"),
                     # v's head dim != q's (DeepSeek's MLA prefill, 192/128): D given as (D, Dv)
                     (1, 4, 2, 77, 77, (192, 128), True, None, None))


# softcap and attention sinks (issue 40): (B, Hq, Hkv, N, Nkv, D, causal, window, align, softcap, sinks): sinks
# drawn per head in [-3, 3] (some above every logit of a row, some below); the last leaves rows that see no key
# (o = 0, lse = the sink).
ATTENTION_EXT_CONFIGS = ((1, 2, 1, 77, 77, 64, True, None, None, 30.0, False),
                         (2, 4, 2, 130, 130, 128, False, None, None, None, True),
                         (1, 4, 2, 130, 130, 64, False, (33, 7), None, 5.0, True),
                         (1, 2, 2, 150, 70, 64, True, None, "bottom_right", 50.0, True),
                         (1, 2, 1, 60, 60, 256, True, None, None, 30.0, True))


def attention_math(q, k, v, causal: bool, scale: float, window=None, align=None, softcap=None, sinks=None):
    """float64 (o, lse, sum_j softmax_j |v_j|) with GQA. Query i sees key j iff i + shift - left <= j <=
    i + shift + right, shift = Nkv - N when bottom-right aligned, else 0; causal: right = 0. A row that sees
    no key: o = 0, lse = -inf. softcap c: s -> c tanh(s / c) on the scaled logits, before the mask; sinks [Hq]:
    one more logit per row in the softmax whose probability is dropped (lse includes it; a row that sees no
    key: o = 0, lse = the sink)."""
    g = q.shape[1] // k.shape[1]
    kd, vd = f64(k).repeat_interleave(g, dim=1), f64(v).repeat_interleave(g, dim=1)
    s = (f64(q) @ kd.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    n, nk = q.shape[2], k.shape[2]
    if causal or window is not None:
        left, right = window if window is not None else (None, None)
        left, right = (n + nk if left is None else left), (n + nk if right is None else right)
        right = min(right, 0) if causal else right
        i = torch.arange(n).view(-1, 1) + (nk - n if align == "bottom_right" else 0)
        j = torch.arange(nk).view(1, -1)
        s = s.masked_fill((j > i + right) | (j < i - left), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, f64(sinks).view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
        p = torch.softmax(s, -1)[..., :-1]
    else:
        p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ vd, torch.logsumexp(s, -1), p @ vd.abs()


def _head_dims(D) -> tuple[int, int, str]:
    """A config's head dim D, or (D, Dv) where v's differs: (D, Dv, the variant's name for them)."""
    D, Dv = D if isinstance(D, tuple) else (D, D)
    return D, Dv, f"D{D}" + (f"v{Dv}" if Dv != D else "")


def _attention_case(dtype: str, config) -> Case:
    B, Hq, Hkv, N, Nkv, D, causal, window, align, softcap, with_sinks = (*config, None, False)[:11]
    D, Dv, dims = _head_dims(D)
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]

    def make(gen):
        q = rand_float(gen, (B, Hq, N, D), dtype, 0.05, 2.0)
        k = rand_float(gen, (B, Hkv, Nkv, D), dtype, 0.05, 2.0)
        v = rand_float(gen, (B, Hkv, Nkv, Dv), dtype, 0.05, 2.0)
        sinks = rand_float(gen, (Hq,), "f32", 0.05, 3.0) if with_sinks else None
        scale = 1.0 / math.sqrt(D)
        o_val, lse_val, o_scale = attention_math(q, k, v, causal, scale, window, align, softcap, sinks)
        attention_fwd = _wrapper("attention", "attention_fwd")
        extra = {} if softcap is None else {"softcap": softcap}

        def launch(t, be):
            attention_fwd(t["q"], t["k"], t["v"], causal=causal, window=window, align=align, scale=scale,
                          out=t["o"], lse=t["lse"], backend=be, sinks=t.get("sinks"), **extra)
        inputs = {"q": q, "k": k, "v": v, **({"sinks": sinks} if with_sinks else {})}
        lse_bound = "attention_fwd.softcap.lse" if softcap is not None else "attention_fwd.lse"
        return Setup(inputs, {"o": poisoned((B, Hq, N, Dv), tdt), "lse": poisoned((B, Hq, N), "f32")},
                     launch,
                     [Check("o", "o", o_val, bound_for("attention_fwd.o", dtype), scale=o_scale),
                      Check("lse", "lse", lse_val, bound_for(lse_bound, "f32"), k=Nkv)])
    mask = ("causal" if causal else "full") + (f"_win{window[0]}-{window[1]}" if window else "") + \
        (f"_{align}" if align else "")
    kv = f"_Nkv{Nkv}" if Nkv != N else ""
    ext = (f"_softcap{softcap:g}" if softcap is not None else "") + ("_sinks" if with_sinks else "")
    variant = f"{dtype}/B{B}_Hq{Hq}_Hkv{Hkv}_N{N}{kv}_{dims}_{mask}{ext}"
    return _kernel_case("attention_fwd", variant, make, "attention")


def attention_cases() -> list[Case]:
    return ([_attention_case(dt, c) for dt in ("bf16", "f16") for c in ATTENTION_CONFIGS]
            + [_attention_case(dt, c) for dt in ("bf16", "f16") for c in ATTENTION_EXT_CONFIGS])


# ==================================================================== attention on variable-length batches
# (lens_q, lens_k, Hq, Hkv, D, causal, window, align): one cu_seqlens for q and k (no alignment named); FlashAttention
# grid lengths with an empty sequence, bottom-right (rows that see no key); a window with D=128; no mask.
VARLEN_CONFIGS = (((37, 100, 1, 64), None, 4, 2, 64, True, None, None),
                  ((113, 0, 50), (203, 5, 20), 2, 1, 64, True, None, "bottom_right"),
                  ((70, 130), (128, 30), 4, 2, 128, False, (33, 7), "top_left"),
                  ((20, 5, 9), (40, 8, 1), 2, 2, 64, False, None, None),
                  ((37, 1, 20), None, 4, 2, 96, True, None, None),
                  ((37, 1, 20), None, 4, 2, (192, 128), True, None, None))
# softcap and sinks (issue 40): (..., softcap, sinks): bottom-right with an empty sequence and rows that see no key
# (o = 0, lse = the sink), a window with softcap alone, sinks alone at D=128
VARLEN_EXT_CONFIGS = (((113, 0, 50), (203, 5, 20), 2, 1, 64, True, None, "bottom_right", 30.0, True),
                      ((70, 130), (128, 30), 4, 2, 64, False, (33, 7), "top_left", 5.0, False),
                      ((37, 1, 20), None, 4, 2, 128, True, None, None, None, True))


def _cu(lens) -> torch.Tensor:
    return torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)


def varlen_math(q, k, v, lens_q, lens_k, causal, scale, window, align, softcap=None, sinks=None):
    """attention_math one sequence at a time on packed [total, H, D] tensors: (o, lse [H, total_q], scale); a row
    that sees no key (or no sequence): o = 0, lse = -inf, or the sink with sinks."""
    o = torch.zeros((*q.shape[:2], v.shape[2]), dtype=torch.float64)
    o_scale = torch.zeros(o.shape, dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64)
    if sinks is not None:
        lse[:] = f64(sinks).view(-1, 1)
    cq, ck = _cu(lens_q).tolist(), _cu(lens_k).tolist()
    for b in range(len(lens_q)):
        if lens_q[b] == 0 or lens_k[b] == 0:
            continue
        qb, kb, vb = (t[c[b]:c[b + 1]].transpose(0, 1)[None] for t, c in ((q, cq), (k, ck), (v, ck)))
        ob, lb, sb = attention_math(qb, kb, vb, causal, scale, window, align, softcap, sinks)
        o[cq[b]:cq[b + 1]], o_scale[cq[b]:cq[b + 1]] = ob[0].transpose(0, 1), sb[0].transpose(0, 1)
        lse[:, cq[b]:cq[b + 1]] = lb[0]
    return o, lse, o_scale


def _varlen_case(dtype: str, config) -> Case:
    lens_q, lens_k, Hq, Hkv, D, causal, window, align, softcap, with_sinks = (*config, None, False)[:10]
    D, Dv, dims = _head_dims(D)
    same = lens_k is None
    lens_k = lens_q if same else lens_k
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    tq, tk = sum(lens_q), sum(lens_k)

    def make(gen):
        q = rand_float(gen, (tq, Hq, D), dtype, 0.05, 2.0)
        k = rand_float(gen, (tk, Hkv, D), dtype, 0.05, 2.0)
        v = rand_float(gen, (tk, Hkv, Dv), dtype, 0.05, 2.0)
        sinks = rand_float(gen, (Hq,), "f32", 0.05, 3.0) if with_sinks else None
        scale = 1.0 / math.sqrt(D)
        o_val, lse_val, o_scale = varlen_math(q, k, v, lens_q, lens_k, causal, scale, window, align, softcap, sinks)
        attention_varlen = _wrapper("attention_varlen", "attention_varlen")
        extra = {} if softcap is None else {"softcap": softcap}

        def launch(t, be):
            attention_varlen(t["q"], t["k"], t["v"], t["cu_q"], t["cu_q"] if same else t["cu_k"], max(lens_q),
                             max(lens_k), causal=causal, window=window, align=align, scale=scale, out=t["o"],
                             lse=t["lse"], backend=be, sinks=t.get("sinks"), **extra)
        inputs = {"q": q, "k": k, "v": v, "cu_q": _cu(lens_q), "cu_k": _cu(lens_k),
                  **({"sinks": sinks} if with_sinks else {})}
        lse_bound = "attention_fwd.softcap.lse" if softcap is not None else "attention_varlen.lse"
        return Setup(inputs, {"o": poisoned((tq, Hq, Dv), tdt), "lse": poisoned((Hq, tq), "f32")}, launch,
                     [Check("o", "o", o_val, bound_for("attention_varlen.o", dtype), scale=o_scale),
                      Check("lse", "lse", lse_val, bound_for(lse_bound, "f32"), k=max(lens_k))])
    mask = ("causal" if causal else "full") + (f"_win{window[0]}-{window[1]}" if window else "") + \
        (f"_{align}" if align else "")
    ext = (f"_softcap{softcap:g}" if softcap is not None else "") + ("_sinks" if with_sinks else "")
    variant = (f"{dtype}/q{'-'.join(map(str, lens_q))}_k{'-'.join(map(str, lens_k))}_Hq{Hq}_Hkv{Hkv}_{dims}_{mask}"
               f"{ext}")
    return _kernel_case("attention_varlen", variant, make, "attention_varlen")


def varlen_cases() -> list[Case]:
    return [_varlen_case(dt, c) for dt in ("bf16", "f16") for c in VARLEN_CONFIGS + VARLEN_EXT_CONFIGS]


# =================================================================== attention against a KV cache (split-KV)
# (cache lengths, Nq, Hq, Hkv, D, page size (None: contiguous), causal, splits): decode on 16-token pages with
# 3 splits; 4 queries on 256-token pages; 16 queries against a contiguous cache with an empty sequence
# (o = 0, lse = -inf); prefill against 32-token pages (rows before every key); one query per sequence in one
# split (the kernel writes o and lse, no combine) with an empty sequence.
KVCACHE_CONFIGS = (((1, 77, 300), 1, 8, 2, 128, 16, False, 3),
                   ((300, 40), 4, 8, 2, 64, 256, True, 2),
                   ((50, 0), 16, 4, 1, 64, None, True, None),
                   ((130, 20), 40, 4, 2, 64, 32, True, 1),
                   ((77, 40), 1, 8, 2, 256, 16, True, 2),
                   ((50, 33), 20, 4, 2, 80, None, True, None),
                   ((200, 0, 5), 1, 16, 4, 128, None, False, None),     # one split: the kernel writes o and lse
                   # softcap and sinks (issue 40), (..., softcap, sinks): decode in 3 splits (the sink counted once,
                   # in split 0) with an empty sequence (o = 0, lse = the sink); one split (the kernel writes o, lse);
                   # prefill with softcap alone
                   ((1, 77, 0), 1, 8, 2, 64, 16, True, 3, 30.0, True),
                   ((200, 5), 1, 16, 4, 128, None, False, 1, None, True),
                   ((130, 20), 40, 4, 2, 64, 32, True, 1, 5.0, False))


def cached_sequence(kc, vc, table, b: int, L: int):
    """Sequence b's first L keys and values [L, Hkv, D] from a cache: contiguous [B, S, Hkv, D] (table None)
    or paged [num_pages, page_size, Hkv, D] with its block table [B, max_pages]."""
    if table is None:
        return kc[b, :L], vc[b, :L]
    pages = table[b, :-(-L // kc.shape[1])].long()
    return tuple(c[pages].reshape(-1, *c.shape[2:])[:L] for c in (kc, vc))


def kvcache_math(q, kc, vc, lens, table, causal, scale, softcap=None, sinks=None):
    """float64 (o [B, Nq, Hq, D], lse [B, Hq, Nq], sum softmax |v|), one sequence at a time; a sequence with no key:
    o = 0, lse = -inf (with sinks: the sink)."""
    B, Nq, Hq, D = q.shape
    o = torch.zeros(q.shape, dtype=torch.float64)
    o_scale = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((B, Hq, Nq), float("-inf"), dtype=torch.float64)
    if sinks is not None:
        lse[:] = f64(sinks).view(1, -1, 1)
    for b, L in enumerate(lens):
        if L == 0:
            continue
        kb, vb = cached_sequence(kc, vc, table, b, L)
        ob, lb, sb = attention_math(q[b].transpose(0, 1)[None], kb.transpose(0, 1)[None], vb.transpose(0, 1)[None],
                                    causal, scale, None, "bottom_right", softcap, sinks)
        o[b], o_scale[b], lse[b] = ob[0].transpose(0, 1), sb[0].transpose(0, 1), lb[0]
    return o, lse, o_scale


def _kvcache_case(dtype: str, config) -> Case:
    lens, Nq, Hq, Hkv, D, page, causal, splits, softcap, with_sinks = (*config, None, False)[:10]
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    B = len(lens)

    def make(gen):
        if page:
            max_pages = -(-max(lens) // page) + 1
            num_pages = B * max_pages + 3
            table = torch.randperm(num_pages, generator=gen)[:B * max_pages].view(B, max_pages).to(torch.int32)
            shape = (num_pages, page, Hkv, D)
        else:
            table, shape = None, (B, max(lens) + 7, Hkv, D)
        kc, vc = (rand_float(gen, shape, dtype, 0.05, 2.0) for _ in range(2))
        q = rand_float(gen, (B, Nq, Hq, D), dtype, 0.05, 2.0)
        sinks = rand_float(gen, (Hq,), "f32", 0.05, 3.0) if with_sinks else None
        scale = 1.0 / math.sqrt(D)
        o_val, lse_val, o_scale = kvcache_math(q, kc, vc, lens, table, causal, scale, softcap, sinks)
        attention_kvcache = _wrapper("attention_kvcache", "attention_kvcache")
        inputs = {"q": q, "k_cache": kc, "v_cache": vc, "cache_seqlens": torch.tensor(lens, dtype=torch.int32),
                  **({"sinks": sinks} if with_sinks else {})}
        if table is not None:
            inputs["block_table"] = table
        extra = {} if softcap is None else {"softcap": softcap}

        def launch(t, be):
            attention_kvcache(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"], t.get("block_table"),
                              causal=causal, scale=scale, num_splits=splits, out=t["o"], lse=t["lse"], backend=be,
                              sinks=t.get("sinks"), **extra)
        lse_bound = "attention_fwd.softcap.lse" if softcap is not None else "attention_kvcache.lse"
        return Setup(inputs, {"o": poisoned((B, Nq, Hq, D), tdt), "lse": poisoned((B, Hq, Nq), "f32")}, launch,
                     [Check("o", "o", o_val, bound_for("attention_kvcache.o", dtype), scale=o_scale),
                      Check("lse", "lse", lse_val, bound_for(lse_bound, "f32"), k=max(lens))])
    ext = (f"_softcap{softcap:g}" if softcap is not None else "") + ("_sinks" if with_sinks else "")
    variant = (f"{dtype}/L{'-'.join(map(str, lens))}_Nq{Nq}_Hq{Hq}_Hkv{Hkv}_D{D}_"
               f"{f'page{page}' if page else 'contiguous'}{'_causal' if causal else ''}_splits{splits or 'auto'}"
               f"{ext}")
    return _kernel_case("attention_kvcache", variant, make, "attention_kvcache")


def kvcache_cases() -> list[Case]:
    return [_kvcache_case(dt, c) for dt in ("bf16", "f16") for c in KVCACHE_CONFIGS]


# ================================================================================ attention backward
# (B, Hq, Hkv, N, Nkv, D, causal, window, align, deterministic): one query row; a ragged causal GQA sequence
# (atomic dQ, then the deterministic two-kernel form); GQA with D=128; bottom-right causal with N < Nkv and
# with N > Nkv (rows that see no key: zero gradients), top-left with N < Nkv (keys no query sees: dk = dv = 0);
# a sliding window.
ATTENTION_BWD_CONFIGS = ((1, 2, 2, 1, 1, 64, False, None, None, False),
                         (1, 2, 1, 77, 77, 64, True, None, None, False),
                         (1, 2, 1, 77, 77, 64, True, None, None, True),
                         (2, 4, 2, 130, 130, 128, False, None, None, False),
                         (1, 2, 1, 113, 203, 64, True, None, "bottom_right", False),
                         (1, 2, 2, 150, 70, 64, True, None, "bottom_right", True),
                         (1, 2, 1, 113, 203, 64, True, None, "top_left", False),
                         (1, 4, 2, 130, 130, 128, False, (33, 7), None, True),
                         # head dims past 64 and 128 (issue 40); D=256's dK/dV in column parts (attention_bwd_wide)
                         (1, 2, 1, 77, 77, 32, True, None, None, False),
                         (1, 4, 2, 70, 90, 256, True, None, "bottom_right", False),
                         (1, 2, 1, 60, 60, 256, False, None, None, True),
                         (1, 4, 2, 70, 70, (192, 128), True, None, None, False),
                         (1, 2, 1, 50, 50, (64, 128), False, None, None, True))
# softcap and sinks (issue 40), (..., softcap, sinks): the wrapper takes the forward's lse (the sink included) and
# softcap; the sinks' own gradient is torch_ops' (tests/test_attention_softcap_sinks.py)
ATTENTION_BWD_EXT_CONFIGS = ((1, 2, 1, 77, 77, 64, True, None, None, False, 30.0, True),
                             (1, 2, 2, 150, 70, 64, True, None, "bottom_right", True, 5.0, True),
                             (2, 4, 2, 130, 130, 128, False, None, None, False, 5.0, False),
                             (1, 2, 1, 60, 60, 256, True, None, None, False, 30.0, False))


def _attention_keep(n: int, nk: int, causal: bool, window, align) -> torch.Tensor | None:
    """[n, nk] keep-mask of the rule in attention_math's docstring; None for no mask."""
    if not causal and window is None:
        return None
    left, right = window if window is not None else (None, None)
    left, right = (n + nk if left is None else left), (n + nk if right is None else right)
    right = min(right, 0) if causal else right
    i = torch.arange(n).view(-1, 1) + (nk - n if align == "bottom_right" else 0)
    j = torch.arange(nk).view(1, -1)
    return (j <= i + right) & (j >= i - left)


def attention_bwd_math(q, k, v, do, causal: bool, scale: float, window=None, align=None, softcap=None, sinks=None):
    """float64 autograd of attention with an explicit mask: {name: (gradient, magnitude)} for dq, dk, dv.

    P = softmax of the masked scores (a row that sees no key: P = 0, so its gradients are 0). Magnitudes the
    bounds are relative to (GQA sums over each group): dv: sum_i P_ij |dO_i|; with
    T_ij = P_ij (sum_d |dO_id V_jd| + sum_d |dO_id O_id|), which bounds |dS_ij| and its rounding errors,
    dk: scale sum_i T_ij |q_i| and dq: scale sum_j T_ij |k_j|. softcap: s -> c tanh(s / c) (its derivative,
    1 - tanh^2 <= 1, only shrinks dS: the magnitudes still bound it); sinks: one more column of the softmax,
    dropped from P (attention_math's)."""
    g = q.shape[1] // k.shape[1]
    qd, kd, vd = (f64(t).requires_grad_() for t in (q, k, v))
    s = (qd @ kd.repeat_interleave(g, dim=1).transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    keep = _attention_keep(q.shape[2], k.shape[2], causal, window, align)
    if sinks is not None:
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        s = torch.cat([s, f64(sinks).view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
        p = torch.softmax(s, -1)[..., :-1]
    elif keep is not None:
        sees = keep.any(-1, keepdim=True)
        p = torch.softmax(s.masked_fill(~keep, float("-inf")).masked_fill(~sees, 0.0), -1) * sees
    else:
        p = torch.softmax(s, -1)
    o = p @ vd.repeat_interleave(g, dim=1)
    o.backward(f64(do))
    p, o = p.detach(), o.detach()
    ad, aq = f64(do).abs(), f64(q).abs()
    ak, av = (f64(t).abs().repeat_interleave(g, dim=1) for t in (k, v))
    t = p * (ad @ av.transpose(-1, -2) + (ad * o.abs()).sum(-1, keepdim=True))

    def per_kv_head(x):                    # [B, Hq, Nkv, D] -> summed over each group: [B, Hkv, Nkv, D]
        return x.view(x.shape[0], k.shape[1], g, *x.shape[2:]).sum(2)
    return {"dq": (qd.grad, scale * (t @ ak)),
            "dk": (kd.grad, per_kv_head(scale * (t.transpose(-1, -2) @ aq))),
            "dv": (vd.grad, per_kv_head(p.transpose(-1, -2) @ ad))}


def _attention_bwd_case(dtype: str, config) -> Case:
    B, Hq, Hkv, N, Nkv, D, causal, window, align, deterministic, softcap, with_sinks = (*config, None, False)[:12]
    D, Dv, dims = _head_dims(D)
    tdt = TORCH[dtype]

    def make(gen):
        q = rand_float(gen, (B, Hq, N, D), dtype, 0.05, 2.0)
        k = rand_float(gen, (B, Hkv, Nkv, D), dtype, 0.05, 2.0)
        v = rand_float(gen, (B, Hkv, Nkv, Dv), dtype, 0.05, 2.0)
        do = rand_float(gen, (B, Hq, N, Dv), dtype, 0.05, 2.0)
        sinks = rand_float(gen, (Hq,), "f32", 0.05, 3.0) if with_sinks else None
        scale = 1.0 / math.sqrt(D)
        o_val, lse_val, _ = attention_math(q, k, v, causal, scale, window, align, softcap, sinks)
        o, lse = round_to(o_val, tdt), lse_val.to(torch.float32)      # the forward's outputs, rounded once
        grads = attention_bwd_math(q, k, v, do, causal, scale, window, align, softcap, sinks)
        attention_bwd = _wrapper("attention_bwd", "attention_bwd")
        extra = {} if softcap is None else {"softcap": softcap}

        def launch(t, be):
            attention_bwd(t["q"], t["k"], t["v"], t["o"], t["lse"], t["do"], causal=causal, window=window,
                          align=align, scale=scale, deterministic=deterministic, dq=t["dq"], dk=t["dk"],
                          dv=t["dv"], backend=be, **extra)
        dots = max(D, Dv)                   # the longest dot product in S = q kᵀ (D) and dP = dO vᵀ (Dv)
        terms = {"dq": Nkv + dots, "dk": (Hq // Hkv) * N + dots, "dv": (Hq // Hkv) * N}
        checks = [Check(name, name, value, bound_for(f"attention_bwd.{'dv' if name == 'dv' else 'dq_dk'}", dtype),
                        scale=mag, k=terms[name]) for name, (value, mag) in grads.items()]
        outputs = {"dq": poisoned((B, Hq, N, D), tdt), "dk": poisoned((B, Hkv, Nkv, D), tdt),
                   "dv": poisoned((B, Hkv, Nkv, Dv), tdt)}
        return Setup({"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}, outputs, launch, checks)
    mask = ("causal" if causal else "full") + (f"_win{window[0]}-{window[1]}" if window else "") + \
        (f"_{align}" if align else "")
    kv = f"_Nkv{Nkv}" if Nkv != N else ""
    ext = (f"_softcap{softcap:g}" if softcap is not None else "") + ("_sinks" if with_sinks else "")
    variant = f"{dtype}/B{B}_Hq{Hq}_Hkv{Hkv}_N{N}{kv}_{dims}_{mask}{ext}" + ("_deterministic" if deterministic else "")
    case = _kernel_case("attention_bwd", variant, make, "attention_bwd")
    # the atomic dQ sums key blocks in an unspecified order: only the deterministic form must rerun bitwise
    return dataclasses.replace(case, deterministic=deterministic)


# varlen backward: (lens_q, lens_k, Hq, Hkv, D, causal, window, align)
VARLEN_BWD_CONFIGS = (((113, 0, 50), (203, 5, 20), 2, 1, 64, True, None, "bottom_right"),
                      ((70, 30), (40, 130), 4, 2, 128, False, (33, 7), "top_left"),
                      ((37, 0, 20), (50, 5, 17), 2, 1, 256, True, None, "bottom_right"),
                      ((37, 0, 20), (50, 5, 17), 4, 2, (192, 128), True, None, "bottom_right"),
                      # softcap (issue 40): the varlen backward's softcap kernels, D=64 and the wide D=256 parts
                      ((113, 0, 50), (203, 5, 20), 2, 1, 64, True, None, "bottom_right", 20.0),
                      ((37, 0, 20), (50, 5, 17), 2, 1, 256, False, (9, 4), "top_left", 5.0))


def varlen_bwd_math(q, k, v, do, lens_q, lens_k, causal, scale, window, align, softcap=None):
    """attention_bwd_math one sequence at a time on packed tensors: {name: (gradient, magnitude)}."""
    out = {n: [torch.zeros(t.shape, dtype=torch.float64) for _ in range(2)] for n, t in (("dq", q), ("dk", k),
                                                                                         ("dv", v))}
    cq, ck = _cu(lens_q).tolist(), _cu(lens_k).tolist()
    for b in range(len(lens_q)):
        if lens_q[b] == 0 or lens_k[b] == 0:
            continue
        sl = {"dq": slice(cq[b], cq[b + 1]), "dk": slice(ck[b], ck[b + 1]), "dv": slice(ck[b], ck[b + 1])}
        seq = [t[sl[n]].transpose(0, 1)[None] for t, n in ((q, "dq"), (k, "dk"), (v, "dv"), (do, "dq"))]
        for name, (g, mag) in attention_bwd_math(*seq, causal, scale, window, align, softcap).items():
            out[name][0][sl[name]], out[name][1][sl[name]] = g[0].transpose(0, 1), mag[0].transpose(0, 1)
    return {n: tuple(v) for n, v in out.items()}


def _varlen_bwd_case(dtype: str, config) -> Case:
    lens_q, lens_k, Hq, Hkv, D, causal, window, align, softcap = (*config, None)[:9]
    D, Dv, dims = _head_dims(D)
    tdt = TORCH[dtype]
    tq, tk = sum(lens_q), sum(lens_k)

    def make(gen):
        q = rand_float(gen, (tq, Hq, D), dtype, 0.05, 2.0)
        k = rand_float(gen, (tk, Hkv, D), dtype, 0.05, 2.0)
        v = rand_float(gen, (tk, Hkv, Dv), dtype, 0.05, 2.0)
        do = rand_float(gen, (tq, Hq, Dv), dtype, 0.05, 2.0)
        scale = 1.0 / math.sqrt(D)
        o_val, lse_val, _ = varlen_math(q, k, v, lens_q, lens_k, causal, scale, window, align, softcap)
        o, lse = round_to(o_val, tdt), lse_val.to(torch.float32)
        grads = varlen_bwd_math(q, k, v, do, lens_q, lens_k, causal, scale, window, align, softcap)
        bwd = _wrapper("attention_varlen", "attention_varlen_bwd")
        extra = {} if softcap is None else {"softcap": softcap}

        def launch(t, be):
            bwd(t["q"], t["k"], t["v"], t["o"], t["lse"], t["do"], t["cu_q"], t["cu_k"], max(lens_q), max(lens_k),
                causal=causal, window=window, align=align, scale=scale, dq=t["dq"], dk=t["dk"], dv=t["dv"],
                backend=be, **extra)
        dots = max(D, Dv)                   # the longest dot product in S = q kᵀ (D) and dP = dO vᵀ (Dv)
        terms = {"dq": max(lens_k) + dots, "dk": (Hq // Hkv) * max(lens_q) + dots, "dv": (Hq // Hkv) * max(lens_q)}
        checks = [Check(name, name, value,
                        bound_for(f"attention_varlen_bwd.{'dv' if name == 'dv' else 'dq_dk'}", dtype),
                        scale=mag, k=terms[name]) for name, (value, mag) in grads.items()]
        outputs = {"dq": poisoned((tq, Hq, D), tdt), "dk": poisoned((tk, Hkv, D), tdt),
                   "dv": poisoned((tk, Hkv, Dv), tdt)}
        inputs = {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do, "cu_q": _cu(lens_q), "cu_k": _cu(lens_k)}
        return Setup(inputs, outputs, launch, checks)
    mask = ("causal" if causal else "full") + (f"_win{window[0]}-{window[1]}" if window else "") + f"_{align}"
    cap = f"_softcap{softcap:g}" if softcap is not None else ""
    variant = f"{dtype}/q{'-'.join(map(str, lens_q))}_k{'-'.join(map(str, lens_k))}_Hq{Hq}_Hkv{Hkv}_{dims}_{mask}{cap}"
    return _kernel_case("attention_varlen_bwd", variant, make, "attention_varlen")


def varlen_bwd_cases() -> list[Case]:
    return [_varlen_bwd_case(dt, c) for dt in ("bf16", "f16") for c in VARLEN_BWD_CONFIGS]


def attention_bwd_cases() -> list[Case]:
    return ([_attention_bwd_case(dt, c) for dt in ("bf16", "f16") for c in ATTENTION_BWD_CONFIGS]
            + [_attention_bwd_case(dt, c) for dt in ("bf16", "f16") for c in ATTENTION_BWD_EXT_CONFIGS])


# ========================================================================================= layernorm
# (rows, d_model, p): the p = 0 path, ragged rows, and a row of 8192.
LAYERNORM_CONFIGS = ((7, 256, 0.0), (33, 1000, 0.1), (4, 8192, 0.5))
LN_SEED, LN_OFFSET, LN_EPS = 0x0123456789ABCDEF, 2**32 - 5000, 1e-5


def layernorm_math(x, residual, weight, bias, p: float, seed: int, offset: int, eps: float):
    """float64 (y, h, keep, y_scale, h_scale) with the keep mask from the interface's Philox definition."""
    from hk_portable.interface.numerics import dropout_keep
    rows, d = x.shape
    index = offset + torch.arange(rows).view(-1, 1) * d + torch.arange(d).view(1, -1)
    keep = dropout_keep(p, seed, index)
    scaled = torch.where(keep, f64(x) / (1.0 - p), 0.0)
    h = scaled + f64(residual)
    mean = h.mean(-1, keepdim=True)
    rstd = 1.0 / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + eps)
    y = (h - mean) * rstd * f64(weight) + f64(bias)
    # h is a sum of two terms: its error is relative to their magnitudes, not to |h| (which may cancel)
    h_scale = scaled.abs() + f64(residual).abs()
    y_scale = rstd * f64(weight).abs() * (h_scale + h.abs().mean(-1, keepdim=True) + (h - mean).abs()) \
        + f64(bias).abs() + y.abs()
    return y, h, keep, y_scale, h_scale


def _layernorm_case(dtype: str, config, weight_dtype: str = "f32") -> Case:
    rows, d, p = config

    def make(gen):
        x, residual = (rand_float(gen, (rows, d), dtype, 0.05, 3.0) for _ in range(2))
        weight = rand_float(gen, (d,), weight_dtype, 0.5, 1.5)
        bias = rand_float(gen, (d,), weight_dtype, 0.05, 0.5)
        y_val, h_val, keep, y_scale, h_scale = layernorm_math(x, residual, weight, bias, p, LN_SEED, LN_OFFSET,
                                                              LN_EPS)
        fn = _wrapper("layernorm", "dropout_residual_layernorm")

        def launch(t, be):
            fn(t["x"], t["residual"], t["weight"], t["bias"], p=p, seed=LN_SEED, offset=LN_OFFSET, eps=LN_EPS,
               out=t["y"], h_out=t["h"], backend=be)
        checks = [Check("y", "y", y_val, bound_for("dropout_residual_layernorm.y", dtype), scale=y_scale, k=d),
                  Check("h", "h", h_val, bound_for("dropout_residual_layernorm.h", dtype), scale=h_scale)]
        if p > 0:   # dropped elements are exactly the residual: the Philox mask matches bit for bit
            checks.append(Check("h = residual where dropped (the Philox mask)", "h", residual,
                                bound_for("dropout_mask", "*"), select=~keep))
        return Setup({"x": x, "residual": residual, "weight": weight, "bias": bias},
                     {"y": poisoned((rows, d), dtype), "h": poisoned((rows, d), dtype)}, launch, checks)
    variant = f"{dtype}/{rows}x{d}_p{p:g}" + (f"_w{weight_dtype}" if weight_dtype != "f32" else "")
    return _kernel_case("dropout_residual_layernorm", variant, make, "layernorm")


def layernorm_cases() -> list[Case]:
    out = [_layernorm_case(dt, c) for dt in ("bf16", "f16") for c in LAYERNORM_CONFIGS]
    return out + [_layernorm_case("f32", LAYERNORM_CONFIGS[1]), _layernorm_case("bf16", LAYERNORM_CONFIGS[1], "bf16")]


# =========================================================================================== rmsnorm
# (rows, d_model, p, bias): plain RMSNorm after a residual add, dropout, a bias, a row of 8192.
RMSNORM_CONFIGS = ((7, 256, 0.0, False), (33, 1000, 0.1, False), (5, 8192, 0.25, True))


def rmsnorm_math(x, residual, weight, bias, p: float, seed: int, offset: int, eps: float):
    """float64 (y, h, y_scale, h_scale): the keep mask from Philox, then h / rms(h) * w (+ b)."""
    from hk_portable.interface.numerics import dropout_keep
    rows, d = x.shape
    index = offset + torch.arange(rows).view(-1, 1) * d + torch.arange(d).view(1, -1)
    scaled = torch.where(dropout_keep(p, seed, index), f64(x) / (1.0 - p), 0.0)
    h = scaled + f64(residual)
    rstd = 1.0 / torch.sqrt((h * h).mean(-1, keepdim=True) + eps)
    y = h * rstd * f64(weight) + (f64(bias) if bias is not None else 0.0)
    h_scale = scaled.abs() + f64(residual).abs()
    y_scale = rstd * f64(weight).abs() * (h_scale + h.abs()) + (f64(bias).abs() if bias is not None else 0.0) + y.abs()
    return y, h, y_scale, h_scale


def _rmsnorm_case(dtype: str, config) -> Case:
    rows, d, p, with_bias = config

    def make(gen):
        x, residual = (rand_float(gen, (rows, d), dtype, 0.05, 3.0) for _ in range(2))
        weight = rand_float(gen, (d,), "f32", 0.5, 1.5)
        bias = rand_float(gen, (d,), "f32", 0.05, 0.5) if with_bias else None
        y_val, h_val, y_scale, h_scale = rmsnorm_math(x, residual, weight, bias, p, LN_SEED, LN_OFFSET, LN_EPS)
        fn = _wrapper("layernorm", "dropout_residual_rmsnorm")
        inputs = {"x": x, "residual": residual, "weight": weight, **({"bias": bias} if with_bias else {})}

        def launch(t, be):
            fn(t["x"], t["residual"], t["weight"], t.get("bias"), p=p, seed=LN_SEED, offset=LN_OFFSET, eps=LN_EPS,
               out=t["y"], h_out=t["h"], backend=be)
        return Setup(inputs, {"y": poisoned((rows, d), dtype), "h": poisoned((rows, d), dtype)}, launch,
                     [Check("y", "y", y_val, bound_for("dropout_residual_rmsnorm.y", dtype), scale=y_scale, k=d),
                      Check("h", "h", h_val, bound_for("dropout_residual_layernorm.h", dtype), scale=h_scale)])
    variant = f"{dtype}/{rows}x{d}_p{p:g}" + ("_bias" if with_bias else "")
    return _kernel_case("dropout_residual_rmsnorm", variant, make, "layernorm")


def rmsnorm_cases() -> list[Case]:
    return [_rmsnorm_case(dt, c) for dt in ("bf16", "f16") for c in RMSNORM_CONFIGS] + \
        [_rmsnorm_case("f32", RMSNORM_CONFIGS[1])]


# ==================================================================================== norm backward
# (rms, rows, d_model, p, bias, dh_in): the p = 0 path; ragged rows (33: part of a block) with a d_model that
# is not a multiple of the column tile, dropout and an upstream dh; 1100 rows (18 blocks of 64 rows: the
# dweight/dbias reduction takes two tiles of 16 partial rows); a row of 8192. RMSNorm likewise.
NORM_BWD_CONFIGS = ((False, 7, 256, 0.0, True, False), (False, 33, 1000, 0.1, True, True),
                    (False, 1100, 96, 0.25, False, True), (False, 4, 8192, 0.5, True, False),
                    (True, 7, 256, 0.0, False, False), (True, 33, 1000, 0.1, True, True),
                    (True, 5, 8192, 0.25, False, True))


def norm_bwd_math(h, dy, dh_in, weight, with_bias: bool, rms: bool, p: float, seed: int, offset: int, eps: float):
    """float64 autograd of y = x̂ w (+ b) at the given h, then dh (+ dh_in) through the Philox keep mask:
    {name: (gradient, magnitude)} for dx, dresidual, dweight, dbias, and the keep mask. Magnitudes as in the
    tolerance table's layernorm_bwd entries."""
    from hk_portable.interface.numerics import dropout_keep
    rows, d = h.shape
    hd, wd = f64(h).requires_grad_(), f64(weight).requires_grad_()
    bd = torch.zeros(d, dtype=torch.float64, requires_grad=True)
    centred = hd if rms else hd - hd.mean(-1, keepdim=True)
    rstd = 1.0 / torch.sqrt((centred * centred).mean(-1, keepdim=True) + eps)
    xhat = centred * rstd
    (xhat * wd + bd).backward(f64(dy))
    dh = hd.grad + (f64(dh_in) if dh_in is not None else 0.0)
    index = offset + torch.arange(rows).view(-1, 1) * d + torch.arange(d).view(1, -1)
    keep = dropout_keep(p, seed, index)
    rstd, xhat, ady = rstd.detach(), xhat.detach(), f64(dy).abs()
    g = ady * f64(weight).abs()
    shift = torch.zeros_like(rstd) if rms else rstd * f64(h).abs().mean(-1, keepdim=True)   # rstd mean|h|
    dh_scale = rstd * (g + g.mean(-1, keepdim=True) * (1 + shift) + (xhat.abs() + shift) * (g * xhat.abs()).mean(
        -1, keepdim=True)) + (f64(dh_in).abs() if dh_in is not None else 0.0)
    out = {"dx": (torch.where(keep, dh / (1.0 - p), 0.0), torch.where(keep, dh_scale / (1.0 - p), 0.0)),
           "dresidual": (dh, dh_scale),
           "dweight": (wd.grad, (ady * (xhat.abs() + shift)).sum(0))}
    if with_bias:
        out["dbias"] = (bd.grad, ady.sum(0))
    return out, keep


def _norm_bwd_case(dtype: str, config, weight_dtype: str = "f32") -> Case:
    rms, rows, d, p, with_bias, with_dh = config
    tdt = TORCH[dtype]

    def make(gen):
        h, dy = (rand_float(gen, (rows, d), dtype, 0.05, 3.0) for _ in range(2))
        dh_in = rand_float(gen, (rows, d), dtype, 0.05, 3.0) if with_dh else None
        weight = rand_float(gen, (d,), weight_dtype, 0.5, 1.5)
        bias = rand_float(gen, (d,), weight_dtype, 0.05, 0.5) if with_bias else None
        grads, keep = norm_bwd_math(h, dy, dh_in, weight, with_bias, rms, p, LN_SEED, LN_OFFSET, LN_EPS)
        fn = _wrapper("layernorm_bwd", "dropout_residual_rmsnorm_bwd" if rms else "dropout_residual_layernorm_bwd")
        inputs = {"h": h, "dy": dy, "weight": weight, **({"dh": dh_in} if with_dh else {}),
                  **({"bias": bias} if with_bias else {})}
        outputs = {"dx": poisoned((rows, d), tdt), "dresidual": poisoned((rows, d), tdt),
                   "dweight": poisoned((d,), weight_dtype), **({"dbias": poisoned((d,), weight_dtype)} if with_bias
                                                               else {})}

        def launch(t, be):
            fn(t["dy"], t["h"], t["weight"], t.get("bias"), dh=t.get("dh"), p=p, seed=LN_SEED, offset=LN_OFFSET,
               eps=LN_EPS, dx=t["dx"], dresidual=t["dresidual"], dweight=t["dweight"], dbias=t.get("dbias"),
               backend=be)
        terms = {"dx": d, "dresidual": d, "dweight": rows + d, "dbias": rows}
        bounds = {"dx": ("layernorm_bwd.dh", dtype), "dresidual": ("layernorm_bwd.dh", dtype),
                  "dweight": ("layernorm_bwd.dweight", weight_dtype), "dbias": ("layernorm_bwd.dbias", weight_dtype)}
        checks = [Check(name, name, value, bound_for(*bounds[name]), scale=mag, k=terms[name])
                  for name, (value, mag) in grads.items()]
        if p > 0:   # dropped elements get exactly 0: the Philox mask regenerated bit for bit
            checks.append(Check("dx = 0 where dropped (the Philox mask)", "dx", torch.zeros(rows, d, dtype=tdt),
                                bound_for("dropout_mask", "*"), select=~keep))
        return Setup(inputs, outputs, launch, checks)
    variant = (f"{dtype}/{'rms' if rms else 'ln'}_{rows}x{d}_p{p:g}{'_bias' if with_bias else ''}"
               f"{'_dh' if with_dh else ''}" + (f"_w{weight_dtype}" if weight_dtype != "f32" else ""))
    return _kernel_case("layernorm_bwd", variant, make, "layernorm_bwd")


def norm_bwd_cases() -> list[Case]:
    out = [_norm_bwd_case(dt, c) for dt in ("bf16", "f16") for c in NORM_BWD_CONFIGS]
    return out + [_norm_bwd_case("f32", c) for c in (NORM_BWD_CONFIGS[1], NORM_BWD_CONFIGS[5])] + \
        [_norm_bwd_case("bf16", NORM_BWD_CONFIGS[1], "bf16")]


# ============================================================================================ rotary
# (B, N, H, D, layout, heads_first, inverse, offset): both pair layouts, both axis orders, the backward
# (inverse rotation), a position offset into the tables, a ragged N; the last two have heads enough for the
# shapes whose tiles are heads at one position (rotary.heads_shapes; a ragged N in positions per block).
ROTARY_CONFIGS = ((2, 37, 3, 64, "neox", False, False, 3), (2, 37, 3, 64, "gptj", False, False, 3),
                  (1, 70, 2, 128, "neox", True, True, 0), (1, 70, 2, 128, "gptj", True, True, 11),
                  (2, 9, 32, 64, "neox", False, False, 3), (1, 11, 16, 128, "gptj", True, True, 2))


def rotary_math(x, cos, sin, layout: str, heads_first: bool, inverse: bool, offset: int):
    """float64 (y, |x1 cos| + |x2 sin| per output element) of the rotation in kernels/rotary.py's docstring."""
    xd = f64(x) if heads_first else f64(x).transpose(1, 2)
    n, half = xd.shape[2], xd.shape[3] // 2
    c, s = f64(cos[offset:offset + n]), f64(sin[offset:offset + n]) * (-1.0 if inverse else 1.0)
    first, second = (slice(0, half), slice(half, None)) if layout == "neox" else (slice(0, None, 2), slice(1, None, 2))
    x1, x2 = xd[..., first], xd[..., second]
    y, scale = torch.empty_like(xd), torch.empty_like(xd)
    y[..., first], y[..., second] = x1 * c - x2 * s, x2 * c + x1 * s
    scale[..., first] = scale[..., second] = (x1 * c).abs() + (x2 * s).abs() + (x2 * c).abs() + (x1 * s).abs()
    return (y, scale) if heads_first else (y.transpose(1, 2), scale.transpose(1, 2))


def _rotary_case(dtype: str, config) -> Case:
    B, N, H, D, layout, heads_first, inverse, offset = config
    shape = (B, H, N, D) if heads_first else (B, N, H, D)

    def make(gen):
        x = rand_float(gen, shape, dtype, 0.05, 3.0)
        ang = rand_float(gen, (N + offset, D // 2), "f32", 0.0, 6.0)
        cos, sin = ang.double().cos().float(), ang.double().sin().float()
        y_val, scale = rotary_math(x, cos, sin, layout, heads_first, inverse, offset)
        fn = _wrapper("rotary", "rotary")

        def launch(t, be):
            fn(t["x"], t["cos"], t["sin"], layout=layout, offset=offset, heads_first=heads_first, inverse=inverse,
               out=t["y"], backend=be)
        return Setup({"x": x, "cos": cos, "sin": sin}, {"y": poisoned(shape, dtype)}, launch,
                     [Check("y", "y", y_val, bound_for("rotary", dtype), scale=scale)])
    variant = (f"{dtype}/{layout}/{'BHND' if heads_first else 'BNHD'}_{'x'.join(map(str, shape))}"
               f"_off{offset}{'_inverse' if inverse else ''}")
    return _kernel_case("rotary", variant, make, "rotary")


def rotary_cases() -> list[Case]:
    return [_rotary_case(dt, c) for dt in ("bf16", "f16", "f32") for c in ROTARY_CONFIGS]


def cases() -> list[Case]:
    return (gemm_cases() + gemm_fp8_cases() + attention_cases() + varlen_cases() + kvcache_cases() + attention_bwd_cases()
            + varlen_bwd_cases() + layernorm_cases() + rmsnorm_cases() + norm_bwd_cases() + rotary_cases())
