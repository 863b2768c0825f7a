"""Attention forward (FlashAttention-2 style online softmax, exp2 domain), GQA, causal, sliding-window.

q and k [B, Hq|Hkv, N|Nkv, D], v [B, Hkv, Nkv, Dv] with Hq a multiple of Hkv and D, Dv multiples of 8 from 32 to
256 (HEAD_DIMS; Dv may differ from D, as in MLA's prefill, 192/128; the kernel runs at tile_dim(D, Dv), see
TILE_HEAD_DIMS); returns o [B, Hq, N, Dv] and the
natural-log log-sum-exp per query row, f32 [B, Hq, N] (what the backward pass needs).

Masks are one rule: query row i sees key j iff  i + shift - left <= j <= i + shift + right.
  * causal: right = 0 and left unbounded; a window: (left, right) keys on each side.
  * the alignment names `shift` when N != Nkv: "top_left" (torch SDPA's is_causal) has shift = 0,
    "bottom_right" (FlashAttention >= 2.1, the KV-cache convention: the last query sees the last key) has
    shift = Nkv - N. Either must be named when N != Nkv and a mask is asked for.
A row that sees no key gets o = 0 and lse = -inf."""
from __future__ import annotations

import math

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ST, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
ALIGNS = ("top_left", "bottom_right")


# Legal values of the tiles (what fits is each target's check, what is fast its tuning table): query and key blocks of
# whole 16-row mma blocks, a key ring of 1-8 stages, block sizes the layouts deal over (12: FA3's three consumer
# warpgroups). No roles: these are not a GEMM's M/N/K tiles, so no backend proposes shapes for them.
TUNABLE = dict(BM=hk.tunable(range(16, 513, 16)), BN=hk.tunable(range(16, 513, 16)), STAGES=hk.tunable(range(1, 9)),
               num_warps=hk.tunable(1, 2, 4, 8, 12, 16))


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_fwd_kernel(q: GL[4], k: GL[4], v: GL[4], o: GL[4], lse: GL[3], scale: float, shift: int,
                         left: int, right: int, *, D: hk.const = 64, BM: hk.const = 64, BN: hk.const = 64,
                         MASKED: hk.const = False, STAGES: hk.const = 2, LEFT_BOUND: hk.const = True):
    forward_body(q, k, v, o, lse, scale, shift, left, right, None, None, D=D, BM=BM, BN=BN, MASKED=MASKED,
                 STAGES=STAGES, LEFT_BOUND=LEFT_BOUND, SOFTCAP=False, SINKS=False)


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_fwd_ext_kernel(q: GL[4], k: GL[4], v: GL[4], o: GL[4], lse: GL[3], scale: float, shift: int,
                             left: int, right: int, softcap: float, sinks: GL[2], *, D: hk.const = 64,
                             BM: hk.const = 64, BN: hk.const = 64, MASKED: hk.const = False, STAGES: hk.const = 2,
                             LEFT_BOUND: hk.const = True, SOFTCAP: hk.const = False, SINKS: hk.const = False):
    """attention_fwd_kernel with softcap (SOFTCAP: `softcap` > 0 is the cap c) and attention sinks (SINKS: `sinks`
    [Hq, >= BM] f32, each head's sink logit repeated along a row, read as one vector per block). The same body:
    a kernel of its own only because runtime parameters cannot be optional, and two more in the plain kernel's
    signature would change its generated code (its ABI) for every caller that uses neither."""
    forward_body(q, k, v, o, lse, scale, shift, left, right, softcap, sinks, D=D, BM=BM, BN=BN, MASKED=MASKED,
                 STAGES=STAGES, LEFT_BOUND=LEFT_BOUND, SOFTCAP=SOFTCAP, SINKS=SINKS)


def forward_body(q, k, v, o, lse, scale, shift, left, right, softcap, sinks, *, D, BM, BN, MASKED, STAGES,
                 LEFT_BOUND, SOFTCAP, SINKS):
    """The dense forward, written once. SOFTCAP and SINKS (consts) gate the two features; with both False the
    traced Program is the plain kernel's, op for op.

    softcap (FlashAttention's definition, flash_attn/flash_api.cpp `set_params_fprop`: params.softcap =
    softmax_scale / softcap, scale_softmax = softcap, so s = c * tanh(softmax_scale * q.k / c); Gemma 2's
    attn_logit_softcapping): the scale enters inside the tanh, the cap applies before the mask.
    sinks (GPT-OSS, transformers' gpt_oss eager_attention_forward: the head's sink logit is concatenated to each
    row's logits before the softmax and its probability dropped): o_i = sum_j exp(s_ij - m) v_j /
    (sum_j exp(s_ij - m) + exp(sink_h - m)), m = max(max_j s_ij, sink_h); lse includes the sink."""
    m, h, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    n_kv = k.shape[2]
    h_kv = h // (q.shape[1] // k.shape[1])          # GQA: query heads share a key/value head
    q_s = hk.shared(ST[q.dtype, BM, D])
    k_s = hk.shared(ST[k.dtype, BN, D], stages=STAGES)
    v_s = hk.shared(ST[v.dtype, BN, D], stages=STAGES)
    hk.load(q_s, q, (b, h, m, 0))
    scale_log2 = scale * LOG2E                       # softmax in base 2: exp2 is the hardware op
    if SOFTCAP:                                      # c * tanh(scale * s / c), in base 2: scale/c in, c * log2(e) out
        cap_in, cap_out = scale / softcap, softcap * LOG2E

    # Key blocks [first, last) hold every key some row of this block may see. Inside them, [full_lo, full_hi)
    # are blocks every row sees whole (no mask, no bounds check): only the edge blocks pay for masks.
    first, last = 0, hk.cdiv(n_kv, BN)
    full_lo, full_hi = 0, n_kv // BN
    if MASKED:
        first = hk.max((m * BM + shift - left) // BN, 0)
        last = hk.max(hk.min(last, hk.cdiv((m + 1) * BM + shift + right, BN)), first)
        # whole for every row i of the block: j*BN >= i + shift - left and (j+1)*BN - 1 <= i + shift + right
        full_lo = hk.min(hk.max(hk.cdiv((m + 1) * BM - 1 + shift - left, BN), first), last)
        full_hi = hk.max(hk.min(hk.min((m * BM + shift + right + 1) // BN, n_kv // BN), last), full_lo)
    # LEFT_BOUND False (a causal mask: `left` unbounded): no key lies left of the band, so the edge blocks skip
    # that compare (the diagonal block's masks cost as much as an unmasked block's softmax). The leading blocks
    # are none then, but their pipeline stays, with a trip count known at run time: without it NVRTC 13.0's
    # ptxas spills at D=128 on sm_90a (and serialised every wgmma, 30 % slower on the H200, before wgmma.cuh
    # packed A's fragments ahead of the fence).
    windowed = MASKED and LEFT_BOUND

    def blocks(lo, hi, edge, carry):
        """The online softmax over key blocks [lo, hi); `edge` blocks apply the masks."""
        def load(i, s):
            hk.load(k_s[s], k, (b, h_kv, lo + i, 0))
            hk.load(v_s[s], v, (b, h_kv, lo + i, 0))

        def compute(i, s, acc, row_m, row_l):
            j = lo + i
            if SOFTCAP:
                scores = hk.tanh(hk.mma_ABt(q_s, k_s[s], hk.zeros(RT[f32, BM, BN])) * cap_in) * cap_out
            else:
                scores = hk.mma_ABt(q_s, k_s[s], hk.zeros(RT[f32, BM, BN])) * scale_log2
            if edge:
                keep = hk.bounds_mask(scores, 0, j * BN, BM, n_kv)           # key columns past the end
                if MASKED:
                    keep = keep & hk.causal_mask(scores, m * BM + shift + right, j * BN)       # j <= i + shift + right
                if windowed:
                    keep = keep & ~hk.causal_mask(scores, m * BM + shift - left - 1, j * BN)  # j >= i + shift - left
                scores = hk.where(keep, scores, float("-inf"))
            return softmax_step(scores, v_s[s], v.dtype, acc, row_m, row_l, guard=edge and MASKED)

        return hk.pipeline(hi - lo, load, compute, carry=carry, stages=STAGES)

    carry = (hk.zeros(RT[f32, BM, D]), hk.neg_inf(RV[f32, BM]), hk.zeros(RV[f32, BM]))
    if MASKED:
        carry = blocks(first, full_lo, True, carry)
    carry = blocks(full_lo, full_hi, False, carry)
    acc, row_m, row_l = blocks(full_hi, last, True, carry)
    if SINKS:                                        # the sink joins the denominator (and the max) of every row
        out, row_m, row_l = with_sink(acc, row_m, row_l, hk.load(RV[f32, BM], sinks, (h, 0)) * LOG2E)
        hk.store(o, out.to(o.dtype), (b, h, m, 0))
    else:
        if MASKED:                                   # a row that saw no key: o = 0, lse = -inf
            row_l = hk.where(row_l == 0.0, 1.0, row_l)     # acc is 0 there; row_m stays -inf
        hk.store(o, normalised(acc, row_l).to(o.dtype), (b, h, m, 0))
    hk.store(lse, (row_m + hk.log2(row_l)) * LN2, (b, h, m))


def with_sink(acc, row_m, row_l, sink):
    """A sink logit per row (log2 domain) joined to the online softmax's max and denominator: (the normalised
    output, row_m, row_l). The max stays finite, so a row that saw no key gets o = 0 and lse = the sink. Shared by
    every forward that takes sinks (dense, varlen, KV cache)."""
    sink_m = hk.maximum(row_m, sink)
    alpha = hk.exp2(row_m - sink_m)
    row_l = row_l * alpha + hk.exp2(sink - sink_m)
    return acc * (alpha * (1.0 / row_l))[:, None], sink_m, row_l


def normalised(acc, row_l):
    """acc / row_l per row, as one reciprocal per row and a multiply per element: the epilogue of every
    block, where D IEEE divisions per row cost more than the last key block's softmax (within one ulp of the
    quotient; every backend's conformance tolerance holds it)."""
    return acc * (1.0 / row_l)[:, None]


def softmax_step(scores, v_tile, v_dtype, acc, row_m, row_l, guard: bool):
    """One key block of online softmax (log2 domain): the new running max and sum, and acc rescaled plus
    P @ V. guard: a row may have seen no key yet (its max still -inf), so subtract 0 there, not -inf; without
    it every row sees a key of this block and the max is finite. Shared by every attention forward."""
    new_m = hk.maximum(row_m, hk.row_max(scores))
    new_m_safe = hk.where(new_m == float("-inf"), 0.0, new_m) if guard else new_m
    p = hk.exp2(scores - new_m_safe[:, None])
    alpha = hk.exp2(row_m - new_m_safe)                         # rescale of the old partial sums
    new_l = row_l * alpha + hk.row_sum(p)
    return hk.mma(p.to(v_dtype), v_tile, acc * alpha[:, None]), new_m, new_l


# The head dims every attention entry point takes (q, k and v alike): multiples of 8 (16-byte rows, what TMA and the
# 16-byte loads need of a row stride) from 32 to 256. The kernels are built for a few tile head dims (the const D);
# a call runs the smallest at least its head dim: the tile's columns past it read 0 (loads are bounds-checked; TMA
# zero-fills), so they add nothing to q kᵀ, and the output's columns past it are dropped on store. The softmax
# scale is the true head dim's (1/sqrt(d)), computed by the wrappers.
HEAD_DIMS = tuple(range(32, 257, 8))
TILE_HEAD_DIMS = (64, 128, 256)


def check_head_dim(fn: str, d, what: str = "head dim D") -> None:
    """An ArgumentError naming `what` unless d is a head dim the attention kernels take (HEAD_DIMS)."""
    if isinstance(d, bool) or not isinstance(d, int) or d not in HEAD_DIMS:
        raise ArgumentError(f"{fn}: {what} must be a multiple of 8 from 32 to 256, got {d!r}")


def tile_dim(d: int, dv: int | None = None) -> int:
    """The tile head dim (the kernels' const D) a call with head dim d (q, k) and dv (v, o; None: d) runs: the
    smallest of TILE_HEAD_DIMS >= both. One const serves both: v's columns past dv read 0 like q's past d, and the
    stores of o (dv) drop the columns past it, so q/k and v may differ (DeepSeek's MLA prefill: 192 and 128) at the
    cost of the P V product running at the tile's width."""
    need = d if dv is None else max(d, dv)
    return next(t for t in TILE_HEAD_DIMS if t >= need)


def config_for(d: int) -> dict:
    """Tiles that fit every target's shared memory (gfx942: 64 KiB): 48 KiB at D=128, 40 KiB at D=64. d is a tile
    head dim (tile_dim). D=256: 64 query rows, key blocks of 16 in one stage (48 KiB; a [64, 256] f32 accumulator
    is 128 registers a thread on 4 warps)."""
    if d > 128:
        return dict(D=d, BM=64, BN=16, STAGES=1)
    return dict(D=d, BM=64, BN=32 if d > 64 else 64, STAGES=2)


def candidates(consts: dict, args: tuple = ()) -> list[dict]:
    """The legal candidate configurations for a call with these consts (D, MASKED), largest first, the portable
    baseline config_for(D) last. Which one runs is the backend's: its tuning table ranks them per target and shape
    (Backend.preferred; cuda's preferences.py holds the measured rules), its choose_config takes the first ranked
    on a fast path, and the autotuner, on with HK_AUTOTUNE=1, times them all on the device. D=128: 128x128 and
    128x64 blocks of 8 warps, and HipKittens' AMD shape, 256 query rows on 8 waves with K/V blocks of 64; D=64:
    FA3's 192-row block on three consumer warpgroups and the 128x128 block on two."""
    d = consts["D"]
    base = {**config_for(d), **consts}
    if d > 128:             # D=256: 128 query rows on two warpgroups where shared memory takes them (sm_90a)
        wide = [dict(BM=128, BN=64, STAGES=2, num_warps=8), dict(BM=128, BN=32, STAGES=2, num_warps=8),
                dict(BM=64, BN=32, STAGES=2, num_warps=4)]
    elif d > 64:
        wide = [dict(BM=128, BN=128, STAGES=2, num_warps=8), dict(BM=128, BN=64, STAGES=2, num_warps=8),
                dict(BM=256, BN=64, STAGES=2, num_warps=8)]
    else:
        wide = [dict(BM=192, BN=128, STAGES=2, num_warps=12), dict(BM=128, BN=128, STAGES=2, num_warps=8),
                dict(BM=256, BN=64, STAGES=2, num_warps=8)]
    return [{**base, **c} for c in wide] + [base]


def output_like(q: torch.Tensor, dv: int) -> torch.Tensor:
    """An uninitialised output of q's shape but its last dim dv, in q's memory layout (torch.empty_like's, which the
    ops' fake kernels give too: a compiled graph asserts that real and fake outputs have the same strides)."""
    if dv == q.shape[-1]:
        return torch.empty_like(q)
    order = sorted(range(q.dim()), key=lambda i: (-q.stride(i), i))       # outermost dim first
    return torch.empty_permuted((*q.shape[:-1], dv), order, dtype=q.dtype, device=q.device)


def check_qkv(fn: str, named: dict, ndim: int, what: str, unit_last_stride: bool = False) -> None:
    """What every attention entry point checks of its q/k/v-like tensors: `ndim` dims (`what` names the
    layout), bf16 or f16, one dtype, one device, and where the kernel needs it a unit-stride last dim."""
    first_name, first = next(iter(named.items()))
    for name, t in named.items():
        if not isinstance(t, torch.Tensor) or t.dim() != ndim:
            raise ArgumentError(f"{fn}: '{name}' must be a {what}, got "
                                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise ArgumentError(f"{fn}: '{name}' must be bfloat16 or float16, got {t.dtype}")
        if unit_last_stride and t.stride(-1) != 1:
            raise ArgumentError(f"{fn}: '{name}' must have a contiguous last dim (stride 1), got strides {t.stride()}")
        if t.dtype != first.dtype:
            raise ArgumentError(f"{fn}: {', '.join(named)} must share a dtype, got "
                                f"{', '.join(str(x.dtype) for x in named.values())}")
        if unit_last_stride and t.device != first.device:
            raise ArgumentError(f"{fn}: '{name}' is on {t.device}, '{first_name}' on {first.device}: one device")


def _check(q, k, v):
    check_qkv("attention_fwd", {"q": q, "k": k, "v": v}, 4, "4-D tensor [B, H, N, D]")
    B, Hq, N, D = q.shape
    check_head_dim("attention_fwd", D)
    check_head_dim("attention_fwd", v.shape[3], "v's head dim")
    if k.shape[:3] != v.shape[:3]:
        raise ArgumentError(f"attention_fwd: 'k' {tuple(k.shape)} and 'v' {tuple(v.shape)} must agree in [B, Hkv, "
                            "Nkv] (v's head dim may differ from q's and k's)")
    if k.shape[0] != B or k.shape[3] != D:
        raise ArgumentError(f"attention_fwd: 'k' must be [B={B}, Hkv, Nkv, D={D}], got {tuple(k.shape)}")
    if k.shape[1] == 0 or Hq % k.shape[1]:
        raise ArgumentError(f"attention_fwd: query heads ({Hq}) must be a multiple of key/value heads "
                            f"({k.shape[1]})")
    if N < 1 or k.shape[2] < 1:
        raise ArgumentError(f"attention_fwd: sequence lengths must be >= 1, got N={N}, Nkv={k.shape[2]}")


def band(n: int, n_kv: int, causal: bool, window, align: str | None) -> tuple[int, int, int] | None:
    """(shift, left, right) of the mask rule in the module docstring, or None for no mask. `window` is
    None or (left, right) with None (or -1, FlashAttention's spelling) for an unbounded side."""
    if not causal and window is None:
        return None
    left, right = (None, None) if window is None else _window(window)
    if align is None:
        if n != n_kv:
            raise ArgumentError(f"attention_fwd: N={n} != Nkv={n_kv} with a causal or window mask: name the "
                                "alignment, align='top_left' (torch SDPA's is_causal) or 'bottom_right' "
                                "(FlashAttention, KV caches: the last query sees the last key)")
        align = "top_left"
    if align not in ALIGNS:
        raise ArgumentError(f"attention_fwd: align must be one of {ALIGNS}, got {align!r}")
    unbounded = n + n_kv                              # wider than any reach: keeps int32 math in range
    left = unbounded if left is None else min(left, unbounded)
    right = unbounded if right is None else min(right, unbounded)
    if causal:
        right = 0 if window is None else min(right, 0)
    if n >= 2**30 or n_kv >= 2**30:
        raise ArgumentError(f"attention_fwd: masked attention takes N, Nkv < 2**30, got {n}, {n_kv}")
    return (n_kv - n if align == "bottom_right" else 0), left, right


def _window(window) -> tuple[int | None, int | None]:
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ArgumentError(f"attention_fwd: window must be (left, right), got {window!r}")
    out = []
    for name, w in zip(("left", "right"), window):
        if w is None or (isinstance(w, int) and not isinstance(w, bool) and w == -1):
            out.append(None)
        elif isinstance(w, int) and not isinstance(w, bool) and w >= 0:
            out.append(w)
        else:
            raise ArgumentError(f"attention_fwd: window {name} must be an int >= 0, or None / -1 for unbounded, "
                                f"got {w!r}")
    return out[0], out[1]


def scale_value(scale, d: int, fn: str = "attention_fwd") -> float:
    """The softmax scale: 1/sqrt(D) for None, else a finite real number (NaN or inf would poison every row)."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    try:
        value = float(scale)
    except (TypeError, ValueError, RuntimeError):
        value = math.nan
    if isinstance(scale, bool) or not math.isfinite(value):
        raise ArgumentError(f"{fn}: 'scale' must be a finite number or None, got {scale!r}")
    return value


def softcap_value(softcap, fn: str = "attention_fwd") -> float | None:
    """The softcap c: None (none), else a finite real number > 0."""
    if softcap is None:
        return None
    try:
        value = float(softcap)
    except (TypeError, ValueError, RuntimeError):
        value = math.nan
    if isinstance(softcap, bool) or not math.isfinite(value) or value <= 0.0:
        raise ArgumentError(f"{fn}: 'softcap' must be a finite number > 0 (the cap c of c * tanh(s / c)), or None "
                            f"for no softcap, got {softcap!r}")
    return value


def check_sinks(sinks, q, fn: str = "attention_fwd") -> None:
    """sinks: a float32 tensor [Hq] (one logit per query head) on q's device."""
    hq = q.shape[1]
    if not isinstance(sinks, torch.Tensor):
        raise ArgumentError(f"{fn}: 'sinks' must be a float32 tensor [Hq={hq}] or None, got {type(sinks).__name__}")
    if tuple(sinks.shape) != (hq,):
        raise ArgumentError(f"{fn}: 'sinks' must have shape [Hq={hq}] (one logit per query head), got "
                            f"{tuple(sinks.shape)}")
    if sinks.dtype != torch.float32:
        raise ArgumentError(f"{fn}: 'sinks' must be float32, got {sinks.dtype}")
    if sinks.device != q.device:
        raise ArgumentError(f"{fn}: 'sinks' is on {sinks.device}, 'q' on {q.device}: one device")


SINK_ROW = 256      # the widest query block of any candidate: the kernel reads a block's sinks as one [BM] vector


def sink_rows(sinks):
    """sinks [Hq] as the [Hq, SINK_ROW] f32 table attention_fwd_ext_kernel reads (each head's logit along a row)."""
    return sinks.detach().reshape(-1, 1).expand(-1, SINK_ROW).contiguous()


def attention_fwd(q, k, v, *, causal: bool = False, window=None, align: str | None = None,
                  scale: float | None = None, softcap: float | None = None, sinks=None, out=None, lse=None,
                  backend=None, **config):
    """o = softmax(q kᵀ · scale [+ mask]) v per (batch, head), with GQA; returns (o, lse).

    causal: key j <= query i (+ the alignment's shift); window=(left, right): keys within left before and
    right after the (shifted) diagonal; align: "top_left" | "bottom_right", needed when N != Nkv and a mask
    is asked for. Rows that see no key: o = 0, lse = -inf.
    softcap=c (> 0): each scaled logit s = scale * q.k becomes c * tanh(s / c) before the mask (FlashAttention,
    Gemma 2). sinks: f32 [Hq], a logit per query head joining each row's softmax denominator (GPT-OSS):
    o = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink - m)), m = max(max_j s_j, sink); lse includes
    the sink (a row that sees no key: o = 0, lse = sink)."""
    if softcap is not None or sinks is not None:
        return _attention_fwd_ext(q, k, v, causal, window, align, scale, softcap, sinks, out, lse, backend, config)
    fresh = out is None and lse is None and not config and all(isinstance(t, torch.Tensor) for t in (q, k, v))
    key = _PLANS.key(_kind(q), _kind(k), _kind(v), causal, None if window is None else tuple(window), align,
                     backend) if fresh else None
    plan = _PLANS.get(key) if fresh else None
    if plan is not None:    # a call like the last with these shapes, strides and mask: the launch alone
        mask, grid, cfg = plan
        B, Hq, N, D = q.shape
        out, lse = output_like(q, v.shape[3]), q.new_empty((B, Hq, N), dtype=torch.float32)
        shift, left, right = mask or (0, 0, 0)
        attention_fwd_kernel(q, k, v, out, lse, scale_value(scale, D), shift, left, right, grid=grid,
                             backend=backend, **cfg)
        return out, lse
    _check(q, k, v)
    mask = band(q.shape[2], k.shape[2], causal, window, align)
    B, Hq, N, D = q.shape
    scale = scale_value(scale, D)
    out, lse = _outputs(q, v, out, lse)
    if not fresh:           # fresh outputs overlap nothing: no check (host time)
        check_no_overlap("attention_fwd", {"out": out, "lse": lse}, {"q": q, "k": k, "v": v})
    shift, left, right = mask or (0, 0, 0)
    args = (q, k, v, out, lse, scale, shift, left, right)
    def launch(cfg):
        attention_fwd_kernel(*args, grid=(hk.cdiv(N, cfg["BM"]), Hq, B), backend=backend, **cfg)

    bounded = mask is not None and left < N + k.shape[2]            # band(): an unbounded side is N + Nkv
    if config:
        cfg = {**config_for(tile_dim(D, v.shape[3])), **config, "MASKED": mask is not None, "LEFT_BOUND": bounded}
    else:                   # tuned per shape bucket where HK_AUTOTUNE is on, else the backend's choice
        consts = {"D": tile_dim(D, v.shape[3]), "MASKED": mask is not None, "LEFT_BOUND": bounded}
        cfg = attention_fwd_kernel.choose_config(lambda: candidates(consts, args), *args, backend=backend,
                                                 launch=launch, bucket=hk.shape_bucket(B * Hq, N, k.shape[2], k.shape[1]),
                                                 key=(*consts.items(), N))     # the backend's ranking may read N
    if fresh:
        _PLANS.put(key, (mask, (hk.cdiv(N, cfg["BM"]), Hq, B), cfg))
    launch(cfg)
    return out, lse


_PLANS = hk.CallPlans()     # attention_fwd's checked mask, configuration and grid per call signature


def _outputs(q: torch.Tensor, v: torch.Tensor, out, lse) -> tuple[torch.Tensor, torch.Tensor]:
    """attention_fwd's out ([B, Hq, N, v's head dim], q's dtype) and lse ([B, Hq, N] float32): the caller's,
    checked, or new."""
    B, Hq, N, _ = q.shape
    shape = (B, Hq, N, v.shape[3])
    if out is None:
        out = output_like(q, v.shape[3])
    elif tuple(out.shape) != shape or out.dtype != q.dtype:
        raise ArgumentError(f"attention_fwd: 'out' must be {shape} {q.dtype}, got "
                            f"{tuple(out.shape)} {out.dtype}")
    if lse is None:
        lse = torch.empty(B, Hq, N, device=q.device, dtype=torch.float32)
    elif tuple(lse.shape) != (B, Hq, N) or lse.dtype != torch.float32:
        raise ArgumentError(f"attention_fwd: 'lse' must be {(B, Hq, N)} float32, got {tuple(lse.shape)} {lse.dtype}")
    return out, lse


def _attention_fwd_ext(q, k, v, causal, window, align, scale, softcap, sinks, out, lse, backend, config):
    """attention_fwd with softcap and/or sinks: attention_fwd_ext_kernel (no call plan yet: checks on every call)."""
    _check(q, k, v)
    cap = softcap_value(softcap)
    if sinks is not None:
        check_sinks(sinks, q)
    mask = band(q.shape[2], k.shape[2], causal, window, align)
    B, Hq, N, D = q.shape
    scale = scale_value(scale, D)
    out, lse = _outputs(q, v, out, lse)
    check_no_overlap("attention_fwd", {"out": out, "lse": lse},
                     {"q": q, "k": k, "v": v, **({} if sinks is None else {"sinks": sinks})})
    shift, left, right = mask or (0, 0, 0)
    # without sinks the kernel reads none (SINKS False): lse[0] stands in for the [Hq, *] table it never loads
    table = lse[0] if sinks is None else sink_rows(sinks)
    args = (q, k, v, out, lse, scale, shift, left, right, 1.0 if cap is None else cap, table)
    def launch(cfg):
        attention_fwd_ext_kernel(*args, grid=(hk.cdiv(N, cfg["BM"]), Hq, B), backend=backend, **cfg)

    bounded = mask is not None and left < N + k.shape[2]            # band(): an unbounded side is N + Nkv
    consts = {"D": tile_dim(D, v.shape[3]), "MASKED": mask is not None, "LEFT_BOUND": bounded,
              "SOFTCAP": cap is not None, "SINKS": sinks is not None}
    if config:
        cfg = {**config_for(consts["D"]), **config,
               **{c: consts[c] for c in ("MASKED", "LEFT_BOUND", "SOFTCAP", "SINKS")}}
    else:
        cfg = attention_fwd_ext_kernel.choose_config(lambda: candidates(consts, args), *args, backend=backend,
                                                     launch=launch,
                                                     bucket=hk.shape_bucket(B * Hq, N, k.shape[2], k.shape[1]),
                                                     key=(*consts.items(), N))
    if cfg["BM"] > SINK_ROW:
        raise ArgumentError(f"attention_fwd: sinks take query blocks of at most {SINK_ROW} rows, got BM={cfg['BM']}")
    launch(cfg)
    return out, lse


def _kind(t):
    """What attention_fwd's checks and choice read of a tensor argument (not its data)."""
    return type(t), t.shape, t.stride(), t.dtype, t.device


def reference(q, k, v, causal=False, scale=None, window=None, align=None, softcap=None, sinks=None):
    """float64 math: (o, lse); rows that see no key give o = 0, lse = -inf (with sinks: o = 0, lse = sink)."""
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    g = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(g, dim=1)
    vd = v.double().repeat_interleave(g, dim=1)
    s = (q.double() @ kd.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    mask = band(q.shape[2], k.shape[2], causal, window, align)
    if mask is not None:
        shift, left, right = mask
        i = torch.arange(q.shape[2], device=q.device).view(-1, 1) + shift
        j = torch.arange(k.shape[2], device=q.device).view(1, -1)
        s = s.masked_fill((j > i + right) | (j < i - left), float("-inf"))
    if sinks is not None:                             # the sink as one more logit per row, its probability dropped
        sink = sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        full = torch.cat([s, sink], -1)
        return torch.softmax(full, -1)[..., :-1] @ vd, torch.logsumexp(full, -1)
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)          # an all -inf row: softmax NaN -> 0
    return p @ vd, lse


def example_args(device="cpu", B=1, Hq=4, Hkv=2, N=200, D=64, causal=True, dtype=torch.bfloat16):
    q = torch.randn(B, Hq, N, D, device=device, dtype=dtype)
    k = torch.randn(B, Hkv, N, D, device=device, dtype=dtype)
    v = torch.randn(B, Hkv, N, D, device=device, dtype=dtype)
    o = torch.empty_like(q)
    lse = torch.empty(B, Hq, N, device=device, dtype=torch.float32)
    return (q, k, v, o, lse, 1.0 / math.sqrt(D), 0, N, 0), {**config_for(tile_dim(D)), "MASKED": causal}


def example_args_attention_fwd_ext_kernel(device="cpu", D=64, causal=True, softcap=30.0, **kw):
    """example_args with softcap and a [Hq, SINK_ROW] sinks table (the softcap/sinks kernel's own arguments)."""
    args, cfg = example_args(device, D=D, causal=causal, **kw)
    sinks = torch.randn(args[0].shape[1], 1, device=device).expand(-1, SINK_ROW).contiguous()
    return (*args, softcap, sinks), {**cfg, "SOFTCAP": True, "SINKS": True}


SERVING = {"attention_varlen": "attention_varlen", "varlen_reference": "attention_varlen",
           "attention_kvcache": "attention_kvcache", "kvcache_reference": "attention_kvcache"}


def __getattr__(name):
    """The serving entry points live in attention_varlen.py (variable-length batches) and attention_kvcache.py
    (KV caches, split-KV decode); they are reachable from here too, as hk_portable.kernels.attention.<name>."""
    if name in SERVING:
        import importlib
        return getattr(importlib.import_module(f"{__package__}.{SERVING[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
