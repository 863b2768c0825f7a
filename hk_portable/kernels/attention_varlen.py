"""Attention over variable-length batches (FlashAttention's varlen API).

q [total_q, Hq, D], k and v [total_k, Hkv, D] hold the batch's sequences one after
another; sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] of q and cu_seqlens_k[b] .. cu_seqlens_k[b+1]
of k and v (int32 prefix sums, B + 1 entries). Outputs: o [total_q, Hq, D] and lse f32 [Hq, total_q] (natural
log), FlashAttention's layouts. Within a sequence the dense kernel's mask rule holds (kernels/attention.py):
query i sees key j iff i + shift - left <= j <= i + shift + right, with shift = Nk_b - Nq_b for
align="bottom_right" and 0 for "top_left"; a row that sees no key, and a row of q that no sequence covers,
gives o = 0 and lse = -inf.

How the kernel indexes: tiles are tiles of the packed tensors (a load's tile index is in tile units, so a
tile cannot start at an arbitrary row). Query block m is packed rows [m·BM, (m+1)·BM), which may hold the
end of one sequence and the start of others. The block finds the sequences its rows belong to (a binary
search of cu_seqlens_q with hk.load_scalar), and for each runs the online softmax over the packed key tiles
that hold that sequence's visible keys, with a mask that keeps only (row of this sequence, key of this
sequence, inside the band). Rows of the other sequences see only masked keys there, which leaves their
running max, sum and accumulator unchanged, so one accumulator serves every sequence of the block, and the
block stores its whole tile: every packed row is written by exactly one block. Key tiles every row of the
block sees whole (a block inside one sequence, a tile inside its keys and band) skip the masks.
Bad cu_seqlens values cannot read or write outside the tensors (every access is bounds-checked); they are
checked on the host only for CPU tensors (checking GPU tensors would synchronise)."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ST, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

from .attention import (
    TUNABLE, ALIGNS, LN2, LOG2E, SINK_ROW, _window, check_head_dim, check_qkv, check_sinks, config_for, normalised,
    output_like, scale_value, sink_rows, softcap_value, softmax_step, tile_dim, with_sink)

BIG = 2**31 - 1



def _upper_bound(cu, x, steps):
    """The number of entries of the nondecreasing int32 vector cu that are <= x (a binary search of `steps`
    = bit length of cu's size iterations; scalars have no select, so the branches are integer arithmetic)."""
    def step(_, lo, hi):
        mid = (lo + hi) // 2
        v = hk.load_scalar(cu, mid, fill=BIG)
        le = hk.min(hk.max(x - v + 1, 0), 1) * hk.min(hi - lo, 1)      # cu[mid] <= x, and the range not empty
        return lo + le * (mid + 1 - lo), hi - (1 - le) * (hi - mid) * hk.min(hi - lo, 1)
    lo, _ = hk.fori_loop(0, steps, step, (0, cu.shape[0]))
    return lo


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_varlen_kernel(q: GL[3], k: GL[3], v: GL[3], o: GL[3], lse: GL[2], cu_q: GL[1], cu_k: GL[1],
                            scale: float, bottom_right: int, left: int, right: int, steps: int, *,
                            D: hk.const = 64, BM: hk.const = 64, BN: hk.const = 64, MASKED: hk.const = False,
                            STAGES: hk.const = 2):
    """q, o: [Hq, total_q, D] views; k, v: [Hkv, total_k, D] views; lse [Hq, total_q]."""
    varlen_forward_body(q, k, v, o, lse, cu_q, cu_k, scale, bottom_right, left, right, steps, None, None, D=D, BM=BM,
                        BN=BN, MASKED=MASKED, STAGES=STAGES, SOFTCAP=False, SINKS=False)


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_varlen_ext_kernel(q: GL[3], k: GL[3], v: GL[3], o: GL[3], lse: GL[2], cu_q: GL[1], cu_k: GL[1],
                                scale: float, bottom_right: int, left: int, right: int, steps: int, softcap: float,
                                sinks: GL[2], *, D: hk.const = 64, BM: hk.const = 64, BN: hk.const = 64,
                                MASKED: hk.const = False, STAGES: hk.const = 2, SOFTCAP: hk.const = False,
                                SINKS: hk.const = False):
    """attention_varlen_kernel with softcap (SOFTCAP) and/or sinks (SINKS, a [Hq, SINK_ROW] f32 table: each head's
    logit along its row), attention.forward_body's definitions of both: a kernel of its own so that the plain one
    keeps its signature and generated code."""
    varlen_forward_body(q, k, v, o, lse, cu_q, cu_k, scale, bottom_right, left, right, steps, softcap, sinks, D=D,
                        BM=BM, BN=BN, MASKED=MASKED, STAGES=STAGES, SOFTCAP=SOFTCAP, SINKS=SINKS)


def varlen_forward_body(q, k, v, o, lse, cu_q, cu_k, scale, bottom_right, left, right, steps, softcap, sinks, *, D,
                        BM, BN, MASKED, STAGES, SOFTCAP, SINKS):
    """The varlen forward, written once (the module docstring); SOFTCAP and SINKS gate the two features as in the
    dense forward_body: with both False the Program is the plain kernel's."""
    m, h = hk.block_idx(0), hk.block_idx(1)
    h_kv = h // (q.shape[0] // k.shape[0])
    total_q = q.shape[1]
    n_seq = cu_q.shape[0] - 1
    q_s = hk.shared(ST[q.dtype, BM, D])
    k_s = hk.shared(ST[k.dtype, BN, D], stages=STAGES)
    v_s = hk.shared(ST[v.dtype, BN, D], stages=STAGES)
    hk.load(q_s, q, (h, m, 0))
    scale_log2 = scale * LOG2E
    if SOFTCAP:                                       # c * tanh(scale * s / c), in base 2 (attention.forward_body)
        cap_in, cap_out = scale / softcap, softcap * LOG2E
    row0, row_end, first_seq, last_seq = block_sequences(cu_q, m, BM, total_q, steps, n_seq)    # last exclusive

    def sequence(b, acc, row_m, row_l):
        qs, qe, ks, ke, n_q, n_k, shift = sequence_extent(cu_q, cu_k, b, bottom_right)
        r_lo = hk.max(row0, qs) - qs                      # this block's rows of sequence b, local numbering
        r_hi = hk.min(row_end, qe) - qs
        j_lo = hk.max(r_lo + shift - left, 0)              # the keys some of those rows see, local
        j_hi = hk.max(hk.min(n_k, r_hi + shift + right), j_lo)
        first = (ks + j_lo) // BN
        last = hk.max(hk.cdiv(ks + j_hi, BN), first)
        # key tiles every row of the block sees whole: the block inside the sequence, the tile inside its keys
        inside = hk.min(hk.max(row0 - qs + 1, 0), 1) * hk.min(hk.max(qe - row0 - BM + 1, 0), 1)
        full_lo = hk.min(hk.max(hk.cdiv(ks + hk.max(r_hi - 1 + shift - left, 0), BN), first), last)
        full_hi = hk.max(hk.min(hk.min((ks + hk.max(r_lo + shift + right + 1, 0)) // BN, ke // BN), last), full_lo)
        full_hi = full_lo + inside * (full_hi - full_lo)

        def blocks(lo, hi, edge, carry):
            def load(i, s):
                hk.load(k_s[s], k, (h_kv, lo + i, 0))
                hk.load(v_s[s], v, (h_kv, lo + i, 0))

            def compute(i, s, acc, row_m, row_l):
                j = lo + i
                if SOFTCAP:
                    scores = hk.tanh(hk.mma_ABt(q_s, k_s[s], hk.zeros(RT[f32, BM, BN])) * cap_in) * cap_out
                else:
                    scores = hk.mma_ABt(q_s, k_s[s], hk.zeros(RT[f32, BM, BN])) * scale_log2
                if edge:
                    keep = hk.bounds_mask(scores, row0 - qs, j * BN - ks, n_q, n_k)
                    if MASKED:
                        keep = keep & hk.causal_mask(scores, row0 - qs + shift + right, j * BN - ks)
                        keep = keep & ~hk.causal_mask(scores, row0 - qs + shift - left - 1, j * BN - ks)
                    scores = hk.where(keep, scores, float("-inf"))
                return softmax_step(scores, v_s[s], v.dtype, acc, row_m, row_l, guard=edge)

            return hk.pipeline(hi - lo, load, compute, carry=carry, stages=STAGES)

        carry = blocks(first, full_lo, True, (acc, row_m, row_l))
        carry = blocks(full_lo, full_hi, False, carry)
        return blocks(full_hi, last, True, carry)

    carry = (hk.zeros(RT[f32, BM, D]), hk.neg_inf(RV[f32, BM]), hk.zeros(RV[f32, BM]))
    acc, row_m, row_l = hk.fori_loop(first_seq, last_seq, sequence, carry)
    if SINKS:                                         # the sink joins every row's denominator (and max)
        out, row_m, row_l = with_sink(acc, row_m, row_l, hk.load(RV[f32, BM], sinks, (h, 0)) * LOG2E)
        hk.store(o, out.to(o.dtype), (h, m, 0))
    else:
        row_l = hk.where(row_l == 0.0, 1.0, row_l)       # a row that saw no key: o = 0, lse = -inf
        hk.store(o, normalised(acc, row_l).to(o.dtype), (h, m, 0))
    hk.store(lse, (row_m + hk.log2(row_l)) * LN2, (h, m))


def _fn_error(fn: str, msg: str) -> ArgumentError:
    return ArgumentError(f"{fn}: {msg}")


def _check_cu(fn: str, name: str, cu, total: int, device) -> int:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype != torch.int32:
        raise _fn_error(fn, f"'{name}' must be a 1-D int32 tensor of B + 1 prefix sums, got "
                        f"{(tuple(cu.shape), cu.dtype) if isinstance(cu, torch.Tensor) else type(cu).__name__}")
    if cu.numel() < 2:
        raise _fn_error(fn, f"'{name}' needs B + 1 >= 2 entries, got {cu.numel()}")
    if cu.device != device:
        raise _fn_error(fn, f"'{name}' is on {cu.device}, the tensors on {device}")
    if cu.device.type == "cpu":                       # checking a GPU tensor would synchronise
        if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) > total:
            raise _fn_error(fn, f"'{name}' must start at 0, never decrease and end at most at the packed length "
                            f"{total}, got {cu.tolist()}")
    return cu.numel() - 1


def _check_packed(fn: str, q, k, v):
    check_qkv(fn, {"q": q, "k": k, "v": v}, 3, "3-D packed tensor [total_tokens, H, D]", unit_last_stride=True)
    D = q.shape[2]
    check_head_dim(fn, D)
    check_head_dim(fn, v.shape[2], "v's head dim")
    if k.shape[:2] != v.shape[:2]:
        raise _fn_error(fn, f"'k' {tuple(k.shape)} and 'v' {tuple(v.shape)} must agree in [total_k, Hkv] (v's head "
                        "dim may differ from q's and k's)")
    if k.shape[2] != D:
        raise _fn_error(fn, f"'k' must be [total_k, Hkv, D={D}], got {tuple(k.shape)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise _fn_error(fn, f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")


def _max_seqlen(fn: str, name: str, x) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise _fn_error(fn, f"'{name}' must be an int >= 0, got {x!r}")
    return x


def varlen_band(fn: str, causal: bool, window, align, same_lengths: bool, reach: int):
    """(masked, bottom_right, left, right) for the kernels: the dense rule with per-sequence shifts."""
    if not isinstance(causal, bool):
        raise _fn_error(fn, f"'causal' must be a bool, got {causal!r}")
    if not causal and window is None:
        return False, 0, reach, reach
    left, right = (None, None) if window is None else _window(window)
    if align is None:
        if not same_lengths:
            raise _fn_error(fn, "a causal or window mask with cu_seqlens_q != cu_seqlens_k needs the alignment named: "
                            "align='bottom_right' (FlashAttention, KV caches: the last query sees the last key) or "
                            "'top_left' (torch SDPA's is_causal)")
        align = "top_left"
    if align not in ALIGNS:
        raise _fn_error(fn, f"align must be one of {ALIGNS}, got {align!r}")
    left = reach if left is None else min(left, reach)
    right = reach if right is None else min(right, reach)
    if causal:
        right = 0 if window is None else min(right, 0)
    return True, int(align == "bottom_right"), left, right


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                     causal: bool = False, window=None, align: str | None = None, scale: float | None = None,
                     softcap: float | None = None, sinks=None, out=None, lse=None, backend=None, **config):
    """FlashAttention's varlen forward: q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] packed (Dv may
    differ from D); cu_seqlens_q/_k int32 [B + 1]; returns (o [total_q, Hq, Dv], lse f32 [Hq, total_q]).
    causal/window/align as attention_fwd, per sequence (align may be left out only when cu_seqlens_q is
    cu_seqlens_k). max_seqlen_q/_k are taken for the API's sake and checked to be ints (the grid covers the packed
    tiles, so the kernel does not need them). softcap, sinks: attention_fwd's (a logit cap; a logit per query head in
    each row's softmax denominator, lse including it; rows no sequence covers get lse = the sink then)."""
    fn = "attention_varlen"
    _check_packed(fn, q, k, v)
    cap = softcap_value(softcap, fn)
    if sinks is not None:
        check_sinks(sinks, q, fn)                     # [Hq]: q [total_q, Hq, D] has its heads in dim 1
    total_q, Hq, D = q.shape
    total_k = k.shape[0]
    n_seq = _check_cu(fn, "cu_seqlens_q", cu_seqlens_q, total_q, q.device)
    if _check_cu(fn, "cu_seqlens_k", cu_seqlens_k, total_k, q.device) != n_seq:
        raise _fn_error(fn, f"cu_seqlens_q and cu_seqlens_k must have one length (B + 1), got {cu_seqlens_q.numel()} "
                        f"and {cu_seqlens_k.numel()}")
    _max_seqlen(fn, "max_seqlen_q", max_seqlen_q)
    _max_seqlen(fn, "max_seqlen_k", max_seqlen_k)
    if total_q >= 2**29 or total_k >= 2**29:
        raise _fn_error(fn, f"packed lengths must be < 2**29, got {total_q}, {total_k}")
    same = cu_seqlens_q is cu_seqlens_k
    masked, bottom, left, right = varlen_band(fn, causal, window, align, same, total_q + total_k)
    scale = scale_value(scale, D, fn)
    o_shape = (total_q, Hq, v.shape[2])               # v's head dim
    if out is None:
        out = output_like(q, v.shape[2])
    elif tuple(out.shape) != o_shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise _fn_error(fn, f"'out' must be {o_shape} {q.dtype} with a contiguous last dim, got "
                        f"{tuple(out.shape)} {out.dtype}")
    if lse is None:
        lse = torch.empty(Hq, total_q, device=q.device, dtype=torch.float32)
    elif tuple(lse.shape) != (Hq, total_q) or lse.dtype != torch.float32:
        raise _fn_error(fn, f"'lse' must be {(Hq, total_q)} float32, got {tuple(lse.shape)} {lse.dtype}")
    check_no_overlap(fn, {"out": out, "lse": lse},
                     {"q": q, "k": k, "v": v, **({} if sinks is None else {"sinks": sinks})})
    if total_q == 0:
        return out, lse
    cfg = {**config_for(tile_dim(D, v.shape[2])), **config, "MASKED": masked}
    steps = (n_seq + 1).bit_length()
    args = (q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), out.transpose(0, 1), lse, cu_seqlens_q,
            cu_seqlens_k, scale, bottom, left, right, steps)
    grid = (hk.cdiv(total_q, cfg["BM"]), Hq, 1)
    if cap is None and sinks is None:
        attention_varlen_kernel(*args, grid=grid, backend=backend, **cfg)
    else:                   # without sinks the kernel reads none (SINKS False): lse stands in for the table
        if cfg["BM"] > SINK_ROW:
            raise _fn_error(fn, f"sinks take query blocks of at most {SINK_ROW} rows, got BM={cfg['BM']}")
        table = lse if sinks is None else sink_rows(sinks)
        attention_varlen_ext_kernel(*args, 1.0 if cap is None else cap, table, grid=grid, backend=backend, **cfg,
                                    SOFTCAP=cap is not None, SINKS=sinks is not None)
    return out, lse


def varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, window=None, align=None, scale=None,
                     softcap=None, sinks=None):
    """float64, one sequence at a time through attention.reference: (o [total_q, Hq, Dv], lse [Hq, total_q]); a row
    that sees no key: o = 0, lse = -inf (with sinks: the sink)."""
    from .attention import reference
    o = torch.zeros((*q.shape[:2], v.shape[2]), dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    if sinks is not None:
        lse[:] = sinks.double().view(-1, 1)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        if cq[b + 1] == cq[b]:
            continue
        qb = q[cq[b]:cq[b + 1]].transpose(0, 1)[None]
        kb = k[ck[b]:ck[b + 1]].transpose(0, 1)[None]
        vb = v[ck[b]:ck[b + 1]].transpose(0, 1)[None]
        if kb.shape[2] == 0:
            continue                                   # no key: o = 0, lse = -inf
        masked = causal or window is not None
        ob, lb = reference(qb, kb, vb, causal=causal, scale=scale, window=window,
                           align=(align or "top_left") if masked else None, softcap=softcap, sinks=sinks)
        o[cq[b]:cq[b + 1]] = ob[0].transpose(0, 1)
        lse[:, cq[b]:cq[b + 1]] = lb[0]
    return o, lse


def example_args(device="cpu", lens=(37, 100, 1, 64), Hq=4, Hkv=2, D=64, causal=True, dtype=torch.bfloat16):
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
    T = int(cu[-1])
    q = torch.randn(Hq, T, D, device=device, dtype=dtype)
    k = torch.randn(Hkv, T, D, device=device, dtype=dtype)
    v = torch.randn(Hkv, T, D, device=device, dtype=dtype)
    o = torch.empty_like(q)
    lse = torch.empty(Hq, T, device=device, dtype=torch.float32)
    return ((q, k, v, o, lse, cu, cu, D ** -0.5, 1, 2 * T, 0, len(lens).bit_length() + 1),
            {**config_for(D), "MASKED": causal})


def example_args_attention_varlen_ext_kernel(device="cpu", softcap=30.0, **kw):
    """example_args with softcap and a [Hq, SINK_ROW] sinks table (the softcap/sinks kernel's own arguments)."""
    args, cfg = example_args(device, **kw)
    sinks = torch.randn(args[0].shape[0], 1, device=device).expand(-1, SINK_ROW).contiguous()
    return (*args, softcap, sinks), {**cfg, "SOFTCAP": True, "SINKS": True}


# ============================================================================================ backward
# The dense backward's structure (kernels/attention_bwd.py) on packed tiles: delta = rowsum(dO ∘ O) by the dense
# preprocessing kernel on [1, H, total, D] views; a dK/dV kernel over packed key tiles that finds the tile's
# sequences in cu_seqlens_k and, per sequence, loops over (query head of the group, packed query tile) pairs
# that can see its keys; a dQ kernel over packed query tiles that mirrors the forward. P is recomputed with the
# (row of the sequence, key of the sequence, band) mask, so rows and keys of other sequences contribute
# exactly 0. dQ is computed without atomics: reruns are bitwise equal.
INF = float("inf")


def _varlen_keep(like, row0, col0, qs, ks, n_q, n_k, shift, left, right, MASKED):
    keep = hk.bounds_mask(like, row0 - qs, col0 - ks, n_q, n_k)
    if MASKED:
        keep = keep & hk.causal_mask(like, row0 - qs + shift + right, col0 - ks)
        keep = keep & ~hk.causal_mask(like, row0 - qs + shift - left - 1, col0 - ks)
    return keep


def _p(scores, lse_row, keep):
    """P = exp2(scores - log2(e)·lse) with masked scores -inf; a row with lse = -inf (no key) uses +inf: P = 0."""
    lse_row = hk.where(lse_row == float("-inf"), INF, lse_row)
    return hk.exp2(hk.where(keep, scores, float("-inf")) - (lse_row * LOG2E)[:, None])


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_varlen_bwd_dkdv_kernel(q: GL[3], k: GL[3], v: GL[3], do: GL[3], lse: GL[2], delta: GL[2],
                                     dk: GL[3], dv: GL[3], cu_q: GL[1], cu_k: GL[1], scale: float,
                                     bottom_right: int, left: int, right: int, steps: int, *, D: hk.const = 64,
                                     BM: hk.const = 64, BN: hk.const = 64, GROUP: hk.const = 1,
                                     MASKED: hk.const = False, STAGES: hk.const = 2):
    """q, do [Hq, total_q, D]; k, v, dk, dv [Hkv, total_k, D]; lse, delta [Hq, total_q]; GROUP = Hq / Hkv (a
    constant: the step's (query block, head) split divides by it)."""
    varlen_dkdv_body(q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, scale, bottom_right, left, right, steps, None, D=D,
                     BM=BM, BN=BN, GROUP=GROUP, MASKED=MASKED, STAGES=STAGES, SOFTCAP=False)


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_varlen_bwd_dkdv_softcap_kernel(q: GL[3], k: GL[3], v: GL[3], do: GL[3], lse: GL[2], delta: GL[2],
                                             dk: GL[3], dv: GL[3], cu_q: GL[1], cu_k: GL[1], scale: float,
                                             bottom_right: int, left: int, right: int, steps: int, softcap: float, *,
                                             D: hk.const = 64, BM: hk.const = 64, BN: hk.const = 64,
                                             GROUP: hk.const = 1, MASKED: hk.const = False, STAGES: hk.const = 2):
    """attention_varlen_bwd_dkdv_kernel of a forward with softcap c (`softcap`): the same body."""
    varlen_dkdv_body(q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, scale, bottom_right, left, right, steps, softcap,
                     D=D, BM=BM, BN=BN, GROUP=GROUP, MASKED=MASKED, STAGES=STAGES, SOFTCAP=True)


def varlen_dkdv_body(q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, scale, bottom_right, left, right, steps, softcap, *,
                     D, BM, BN, GROUP, MASKED, STAGES, SOFTCAP):
    """The varlen dK/dV kernel, written once; SOFTCAP gates the softcap's recomputation and its derivative
    (attention_bwd.dkdv_body's)."""
    j, h_kv = hk.block_idx(0), hk.block_idx(1)
    total_k = k.shape[1]
    n_seq = cu_k.shape[0] - 1
    k_s = hk.shared(ST[k.dtype, BN, D])
    v_s = hk.shared(ST[v.dtype, BN, D])
    q_s = hk.shared(ST[q.dtype, BM, D], stages=STAGES)
    do_s = hk.shared(ST[do.dtype, BM, D], stages=STAGES)
    hk.load(k_s, k, (h_kv, j, 0))
    hk.load(v_s, v, (h_kv, j, 0))
    scale_log2 = scale * LOG2E
    if SOFTCAP:                                       # the forward's c * tanh(scale * s / c), base 2
        cap_in, cap_out = scale / softcap, softcap * LOG2E
    col0, col_end, first_seq, last_seq = block_sequences(cu_k, j, BN, total_k, steps, n_seq)

    def sequence(b, dk_acc, dv_acc):
        qs, ks, n_q, n_k, shift, first, n_blocks = sequence_query_blocks(cu_q, cu_k, b, col0, col_end, bottom_right,
                                                                         left, right, BM)

        def head_and_block(t):                         # step t: query block t // GROUP, head t % GROUP
            return h_kv * GROUP + t % GROUP, first + t // GROUP

        def load(t, s):
            h, i = head_and_block(t)
            hk.load(q_s[s], q, (h, i, 0))
            hk.load(do_s[s], do, (h, i, 0))

        def compute(t, s, dk_acc, dv_acc):
            h, i = head_and_block(t)
            if SOFTCAP:
                tanh_s = hk.tanh(hk.mma_ABt(q_s[s], k_s, hk.zeros(RT[f32, BM, BN])) * cap_in)
                scores = tanh_s * cap_out
            else:
                scores = hk.mma_ABt(q_s[s], k_s, hk.zeros(RT[f32, BM, BN])) * scale_log2
            keep = _varlen_keep(scores, i * BM, col0, qs, ks, n_q, n_k, shift, left, right, MASKED)
            p = _p(scores, hk.load(RV[f32, BM], lse, (h, i), fill=INF), keep)
            dv_acc = hk.mma_AtB(p.to(do.dtype), do_s[s], dv_acc)
            dp = hk.mma_ABt(do_s[s], v_s, hk.zeros(RT[f32, BM, BN]))
            ds = p * (dp - hk.load(RV[f32, BM], delta, (h, i))[:, None])
            if SOFTCAP:                               # d(c tanh(x / c)) / dx = 1 - tanh²
                ds = ds * (1.0 - tanh_s * tanh_s)
            return hk.mma_AtB(ds.to(q.dtype), q_s[s], dk_acc), dv_acc

        return hk.pipeline(GROUP * n_blocks, load, compute, carry=(dk_acc, dv_acc), stages=STAGES)

    init = (hk.zeros(RT[f32, BN, D]), hk.zeros(RT[f32, BN, D]))
    dk_acc, dv_acc = hk.fori_loop(first_seq, last_seq, sequence, init)
    hk.store(dk, (dk_acc * scale).to(dk.dtype), (h_kv, j, 0))
    hk.store(dv, dv_acc.to(dv.dtype), (h_kv, j, 0))


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_varlen_bwd_dq_kernel(q: GL[3], k: GL[3], v: GL[3], do: GL[3], lse: GL[2], delta: GL[2], dq: GL[3],
                                   cu_q: GL[1], cu_k: GL[1], scale: float, bottom_right: int, left: int, right: int,
                                   steps: int, *, D: hk.const = 64, BM: hk.const = 64, BN: hk.const = 64,
                                   MASKED: hk.const = False, STAGES: hk.const = 2):
    """dQ per packed query tile: the forward's loop over the tile's sequences and their key tiles."""
    varlen_dq_body(q, k, v, do, lse, delta, dq, cu_q, cu_k, scale, bottom_right, left, right, steps, None, D=D, BM=BM,
                   BN=BN, MASKED=MASKED, STAGES=STAGES, SOFTCAP=False)


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_varlen_bwd_dq_softcap_kernel(q: GL[3], k: GL[3], v: GL[3], do: GL[3], lse: GL[2], delta: GL[2],
                                           dq: GL[3], cu_q: GL[1], cu_k: GL[1], scale: float, bottom_right: int,
                                           left: int, right: int, steps: int, softcap: float, *, D: hk.const = 64,
                                           BM: hk.const = 64, BN: hk.const = 64, MASKED: hk.const = False,
                                           STAGES: hk.const = 2):
    """attention_varlen_bwd_dq_kernel of a forward with softcap c (`softcap`): the same body."""
    varlen_dq_body(q, k, v, do, lse, delta, dq, cu_q, cu_k, scale, bottom_right, left, right, steps, softcap, D=D,
                   BM=BM, BN=BN, MASKED=MASKED, STAGES=STAGES, SOFTCAP=True)


def varlen_dq_body(q, k, v, do, lse, delta, dq, cu_q, cu_k, scale, bottom_right, left, right, steps, softcap, *, D,
                   BM, BN, MASKED, STAGES, SOFTCAP):
    """The varlen dQ kernel, written once; SOFTCAP as in varlen_dkdv_body."""
    m, h = hk.block_idx(0), hk.block_idx(1)
    h_kv = h // (q.shape[0] // k.shape[0])
    total_q = q.shape[1]
    n_seq = cu_q.shape[0] - 1
    q_s = hk.shared(ST[q.dtype, BM, D])
    do_s = hk.shared(ST[do.dtype, BM, D])
    k_s = hk.shared(ST[k.dtype, BN, D], stages=STAGES)
    v_s = hk.shared(ST[v.dtype, BN, D], stages=STAGES)
    hk.load(q_s, q, (h, m, 0))
    hk.load(do_s, do, (h, m, 0))
    lse_row = hk.load(RV[f32, BM], lse, (h, m), fill=INF)
    delta_row = hk.load(RV[f32, BM], delta, (h, m))
    scale_log2 = scale * LOG2E
    if SOFTCAP:
        cap_in, cap_out = scale / softcap, softcap * LOG2E
    row0, row_end, first_seq, last_seq = block_sequences(cu_q, m, BM, total_q, steps, n_seq)

    def sequence(b, dq_acc):
        qs, qe, ks, ke, n_q, n_k, shift = sequence_extent(cu_q, cu_k, b, bottom_right)
        r_lo = hk.max(row0, qs) - qs
        r_hi = hk.min(row_end, qe) - qs
        j_lo = hk.max(r_lo + shift - left, 0)
        j_hi = hk.max(hk.min(n_k, r_hi + shift + right), j_lo)
        first = (ks + j_lo) // BN
        n_blocks = hk.max(hk.cdiv(ks + j_hi, BN) - first, 0)

        def load(i, s):
            hk.load(k_s[s], k, (h_kv, first + i, 0))
            hk.load(v_s[s], v, (h_kv, first + i, 0))

        def compute(i, s, dq_acc):
            if SOFTCAP:
                tanh_s = hk.tanh(hk.mma_ABt(q_s, k_s[s], hk.zeros(RT[f32, BM, BN])) * cap_in)
                scores = tanh_s * cap_out
            else:
                scores = hk.mma_ABt(q_s, k_s[s], hk.zeros(RT[f32, BM, BN])) * scale_log2
            keep = _varlen_keep(scores, row0, (first + i) * BN, qs, ks, n_q, n_k, shift, left, right, MASKED)
            p = _p(scores, lse_row, keep)
            dp = hk.mma_ABt(do_s, v_s[s], hk.zeros(RT[f32, BM, BN]))
            ds = p * (dp - delta_row[:, None])
            if SOFTCAP:
                ds = ds * (1.0 - tanh_s * tanh_s)
            return hk.mma(ds.to(q.dtype), k_s[s], dq_acc)

        return hk.pipeline(n_blocks, load, compute, carry=dq_acc, stages=STAGES)

    dq_acc = hk.fori_loop(first_seq, last_seq, sequence, hk.zeros(RT[f32, BM, D]))
    hk.store(dq, (dq_acc * scale).to(dq.dtype), (h, m, 0))


def attention_varlen_bwd(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                         causal: bool = False, window=None, align: str | None = None, scale: float | None = None,
                         dq=None, dk=None, dv=None, dlse=None, softcap: float | None = None, backend=None):
    """Gradients (dq, dk, dv) of attention_varlen given dO = `do` (packed like o), in the input dtype; o and
    lse [Hq, total_q] are the forward's outputs and the mask arguments, scale and softcap must be the forward's
    (with sinks, lse is the forward's, the sink included, and nothing else changes here). dk, dv are summed over
    each GQA group; no atomics (reruns are bitwise equal). dlse: an upstream gradient of lse."""
    from .attention_bwd import attention_bwd_preprocess_kernel, config_for as bwd_config, dq_config_for, fallbacks_for
    fn = "attention_varlen_bwd"
    _check_packed(fn, q, k, v)
    total_q, Hq, D = q.shape
    total_k = k.shape[0]
    n_seq = _check_cu(fn, "cu_seqlens_q", cu_seqlens_q, total_q, q.device)
    if _check_cu(fn, "cu_seqlens_k", cu_seqlens_k, total_k, q.device) != n_seq:
        raise _fn_error(fn, "cu_seqlens_q and cu_seqlens_k must have one length (B + 1)")
    o_shape = (total_q, Hq, v.shape[2])               # v's head dim
    for name, t in (("o", o), ("do", do)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != o_shape or t.dtype != q.dtype or t.stride(-1) != 1:
            raise _fn_error(fn, f"'{name}' must be {o_shape} {q.dtype} with a contiguous last dim")
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (Hq, total_q) or lse.dtype != torch.float32:
        raise _fn_error(fn, f"'lse' must be {(Hq, total_q)} float32")
    _max_seqlen(fn, "max_seqlen_q", max_seqlen_q)
    _max_seqlen(fn, "max_seqlen_k", max_seqlen_k)
    masked, bottom, left, right = varlen_band(fn, causal, window, align, cu_seqlens_q is cu_seqlens_k,
                                              total_q + total_k)
    scale = scale_value(scale, D, fn)
    cap = softcap_value(softcap, fn)
    capped = () if cap is None else (cap,)            # the softcap kernels' one more argument
    outs = {}
    for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if t is None:
            t = torch.empty_like(like)
        elif t.shape != like.shape or t.dtype != like.dtype or t.stride(-1) != 1:
            raise _fn_error(fn, f"'{name}' must be {tuple(like.shape)} {like.dtype} with a contiguous last dim")
        outs[name] = t
    check_no_overlap(fn, outs, {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do})
    if total_q == 0 or total_k == 0:
        for t in outs.values():
            t.zero_()
        return outs["dq"], outs["dk"], outs["dv"]
    tq = lambda t: t.transpose(0, 1)              # noqa: E731 - [total, H, D] -> [H, total, D] views
    delta = torch.empty(Hq, total_q, device=q.device, dtype=torch.float32)
    Dt = tile_dim(D, v.shape[2])                  # the kernels' tile head dim (columns past D, Dv read 0)
    cfg = bwd_config(Dt)
    attention_bwd_preprocess_kernel(tq(o)[None], tq(do)[None], delta[None], delta.view(1, Hq, total_q, 1),
                                    grid=(hk.cdiv(total_q, cfg["BM"]), Hq, 1), backend=backend, D=Dt, BM=cfg["BM"],
                                    ZERO_DQ=False)
    if dlse is not None:
        if tuple(dlse.shape) != (Hq, total_q) or dlse.dtype != torch.float32:
            raise _fn_error(fn, f"'dlse' must be {(Hq, total_q)} float32")
        delta.sub_(torch.where(torch.isfinite(lse), dlse, 0.0))
    steps = (n_seq + 1).bit_length()
    common = (cu_seqlens_q, cu_seqlens_k, scale, bottom, left, right, steps)
    dkdv_args = (tq(q), tq(k), tq(v), tq(do), lse, delta, tq(outs["dk"]), tq(outs["dv"]), *common)
    if Dt > 128:                                  # dK/dV in column parts of 128 (attention_bwd_wide.py)
        from .attention_bwd_wide import attention_varlen_bwd_dkdv_wide_kernel as wide, parts, varlen_config_for
        wcfg = varlen_config_for(Dt)
        for part in range(parts(Dt)):
            wide(*dkdv_args, 1.0 if cap is None else cap, grid=(hk.cdiv(total_k, wcfg["BN"]), k.shape[1], 1),
                 backend=backend, **wcfg, GROUP=Hq // k.shape[1], MASKED=masked, PART=part, SOFTCAP=cap is not None)
    else:
        flags = dict(GROUP=Hq // k.shape[1], MASKED=masked)
        dcfg = {**cfg, **flags}
        dkdv = attention_varlen_bwd_dkdv_kernel
        if cap is not None:     # tanh's tile beside the two accumulators: where a target's build spills (sm_80,
            # NVRTC 13.0: 8 bytes at D = 64), the dense kernel's smaller tiles (Kernel.choose_config's fallbacks)
            dkdv = attention_varlen_bwd_dkdv_softcap_kernel
            base = dcfg
            dcfg = dkdv.choose_config(lambda: [base], *dkdv_args, cap, backend=backend, key=(Dt, *flags.values()),
                                      fallbacks=[{**c, **flags} for c in fallbacks_for(Dt)], fixed=tuple(base))
        dkdv(*dkdv_args, *capped, grid=(hk.cdiv(total_k, dcfg["BN"]), k.shape[1], 1), backend=backend, **dcfg)
    # D = 64: key blocks of 32 (with 64 the dQ kernel's loop over sequences spilled scalar registers on gfx950)
    qcfg = dict(D=Dt, BM=64, BN=32, STAGES=2) if Dt <= 64 else dq_config_for(Dt)
    dq_kernel = attention_varlen_bwd_dq_kernel if cap is None else attention_varlen_bwd_dq_softcap_kernel
    dq_kernel(tq(q), tq(k), tq(v), tq(do), lse, delta, tq(outs["dq"]), *common, *capped,
              grid=(hk.cdiv(total_q, qcfg["BM"]), Hq, 1), backend=backend, **qcfg, MASKED=masked)
    return outs["dq"], outs["dk"], outs["dv"]


def sequence_query_blocks(cu_q, cu_k, b, col0, col_end, bottom_right, left, right, BM):
    """Of sequence b, for the key columns [col0, col_end) of the packed keys: its first query and key rows (qs, ks),
    lengths (n_q, n_k), mask shift, and the query blocks [first, first + n_blocks) whose rows see one of those keys
    (none where the columns hold no key of b). The dK/dV kernels' per-sequence bounds (this file's and
    attention_bwd_wide's)."""
    qs, qe, ks, ke, n_q, n_k, shift = sequence_extent(cu_q, cu_k, b, bottom_right)
    c_lo = hk.max(col0, ks) - ks                     # this tile's keys of sequence b, local numbering
    c_hi = hk.min(col_end, ke) - ks
    i_lo = hk.max(c_lo - shift - right, 0)            # the query rows that see some of them, local
    i_hi = hk.max(hk.min(n_q, c_hi - shift + left), i_lo)
    first = (qs + i_lo) // BM
    n_blocks = hk.max(hk.cdiv(qs + i_hi, BM) - first, 0)
    return qs, ks, n_q, n_k, shift, first, n_blocks * hk.min(hk.max(c_hi - c_lo, 0), 1)   # no key of b here: none


def block_sequences(cu, j, block, total, steps, n_seq):
    """Block j's span [start, end) of the packed rows (queries, with cu = cu_q, or keys, cu_k) and the sequences
    [first_seq, last_seq) with rows there: every varlen kernel's block bounds."""
    start = j * block
    end = hk.min(start + block, total)
    first_seq = hk.max(_upper_bound(cu, start, steps) - 1, 0)
    last_seq = hk.min(_upper_bound(cu, end - 1, steps), n_seq)
    return start, end, first_seq, last_seq


def sequence_extent(cu_q, cu_k, b, bottom_right):
    """Sequence b's query rows [qs, qe) and key rows [ks, ke) of the packed tensors, its lengths and its mask shift
    (bottom-right alignment: n_k - n_q)."""
    qs, qe = hk.load_scalar(cu_q, b), hk.load_scalar(cu_q, b + 1)
    ks, ke = hk.load_scalar(cu_k, b), hk.load_scalar(cu_k, b + 1)
    n_q, n_k = qe - qs, ke - ks
    return qs, qe, ks, ke, n_q, n_k, bottom_right * (n_k - n_q)
