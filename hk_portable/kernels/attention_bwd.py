"""Attention backward (FlashAttention-2 structure): dQ, dK, dV from q, k, v, o, dO and the forward's lse.

Shapes and masks are the forward's (kernels/attention.py): q, o, dO [B, Hq, N, D]; k, v [B, Hkv, Nkv, D];
lse f32 [B, Hq, N] in natural log; query row i sees key j iff i + shift - left <= j <= i + shift + right.

With c = scale·log2(e), P = exp2(c·q kᵀ - log2(e)·lse) is recomputed per tile, and
  delta = rowsum(dO ∘ O)                       (a preprocessing kernel, f32 [B, Hq, N])
  dV = Pᵀ dO,   dP = dO vᵀ,   dS = P ∘ (dP - delta),   dK = scale · dSᵀ q,   dQ = scale · dS k.
One kernel runs over key blocks and loops over every (query head of the group, query block) pair that can
see the block, so dK and dV of a GQA key/value head are summed in registers, in a fixed order; it computes the
transposed products (keys as rows, FlashAttention-3's orientation), which every target's matrix unit can take. dQ is
either added into an f32 accumulator with atomic adds from that kernel (fast; the summation order of dQ is
unspecified) or, with deterministic=True, computed by a second kernel over query blocks that recomputes
P and dP (no atomics: reruns are bitwise equal). P and dS are rounded to the input dtype as mma operands.
Rows that see no key (lse = -inf) and padding rows past N use lse = +inf, so their P, and their
gradients, are exactly 0."""
from __future__ import annotations

import math

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ST, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

from .attention import TUNABLE, LOG2E, _check as _check_fwd, band as _band_fwd, scale_value, softcap_value, tile_dim

INF = float("inf")



@hk.kernel(num_warps=4)
def attention_bwd_preprocess_kernel(o: GL[4], do: GL[4], delta: GL[3], dq_acc: GL[4], *, D: hk.const = 64,
                                    BM: hk.const = 64, ZERO_DQ: hk.const = False):
    """delta = rowsum(dO ∘ O) in f32; with ZERO_DQ, also zeroes this block's rows of the dQ accumulator."""
    m, h, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    o_t = hk.load(RT[f32, BM, D], o, (b, h, m, 0))
    do_t = hk.load(RT[f32, BM, D], do, (b, h, m, 0))
    hk.store(delta, hk.row_sum(o_t * do_t), (b, h, m))
    if ZERO_DQ:
        hk.store(dq_acc, hk.zeros(RT[f32, BM, D]), (b, h, m, 0))


def _probabilities(scores, lse_row, keep):
    """P = exp2(scores - log2(e)·lse); masked scores are -inf, rows that see no key have lse = +inf: P = 0."""
    lse_row = hk.where(lse_row == float("-inf"), INF, lse_row)
    if keep is not None:
        scores = hk.where(keep, scores, float("-inf"))
    return hk.exp2(scores - (lse_row * LOG2E)[:, None])


def _probabilities_t(scores_t, lse_col, keep_t):
    """Pᵀ from Sᵀ (keys as rows, queries as columns): _probabilities with lse along the columns."""
    lse_col = hk.where(lse_col == float("-inf"), INF, lse_col)
    if keep_t is not None:
        scores_t = hk.where(keep_t, scores_t, float("-inf"))
    return hk.exp2(scores_t - (lse_col * LOG2E)[None, :])


def _band_keep(like, row0, col0, shift, left, right):
    """The forward's mask rule for a tile whose first query row is row0 and first key column col0."""
    keep = hk.causal_mask(like, row0 + shift + right, col0)                  # j <= i + shift + right
    return keep & ~hk.causal_mask(like, row0 + shift - left - 1, col0)       # j >= i + shift - left


def _band_keep_t(like, key0, query0, shift, left, right):
    """The same rule for a transposed tile (first key row key0, first query column query0)."""
    keep = ~hk.causal_mask(like, key0 - shift - right - 1, query0)           # i >= j - shift - right
    return keep & hk.causal_mask(like, key0 - shift + left, query0)          # i <= j - shift + left


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_bwd_dkdv_kernel(q: GL[4], k: GL[4], v: GL[4], do: GL[4], lse: GL[3], delta: GL[3], dk: GL[4],
                              dv: GL[4], dq_acc: GL[4], scale: float, shift: int, left: int, right: int, *,
                              D: hk.const = 64, BM: hk.const = 64, BN: hk.const = 64, MASKED: hk.const = False,
                              ATOMIC_DQ: hk.const = True, STAGES: hk.const = 2, DQ_T: hk.const = False):
    dkdv_body(q, k, v, do, lse, delta, dk, dv, dq_acc, scale, shift, left, right, None, D=D, BM=BM, BN=BN,
              MASKED=MASKED, ATOMIC_DQ=ATOMIC_DQ, STAGES=STAGES, DQ_T=DQ_T, SOFTCAP=False)


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_bwd_dkdv_softcap_kernel(q: GL[4], k: GL[4], v: GL[4], do: GL[4], lse: GL[3], delta: GL[3], dk: GL[4],
                                      dv: GL[4], dq_acc: GL[4], scale: float, shift: int, left: int, right: int,
                                      softcap: float, *, D: hk.const = 64, BM: hk.const = 64, BN: hk.const = 64,
                                      MASKED: hk.const = False, ATOMIC_DQ: hk.const = True, STAGES: hk.const = 2,
                                      DQ_T: hk.const = False):
    """attention_bwd_dkdv_kernel of a forward with softcap c (`softcap`): the same body (a kernel of its own so
    that the plain kernel's signature and generated code stay as they were)."""
    dkdv_body(q, k, v, do, lse, delta, dk, dv, dq_acc, scale, shift, left, right, softcap, D=D, BM=BM, BN=BN,
              MASKED=MASKED, ATOMIC_DQ=ATOMIC_DQ, STAGES=STAGES, DQ_T=DQ_T, SOFTCAP=True)


def dkdv_body(q, k, v, do, lse, delta, dk, dv, dq_acc, scale, shift, left, right, softcap, *, D, BM, BN, MASKED,
              ATOMIC_DQ, STAGES, DQ_T, SOFTCAP):
    """dK, dV of one key block (and dQ's atomic adds) in FlashAttention-3's orientation: the key block is the
    rows of every product (Sᵀ = k qᵀ, dPᵀ = v dOᵀ, dV += Pᵀ dO, dK += dSᵀ q), so no product reads a transposed
    register tile and each can run as a warpgroup mma with register A. dQ reads dSᵀ from shared memory:
    dQ = (dSᵀ)ᵀ k, or with DQ_T its transpose kᵀ dSᵀ into dq_acc passed as a [B, Hq, D, N] view (D rows: a
    128-row product where the query block has 64)."""
    # key blocks last to first: under a causal mask a key block's work shrinks with its index, and a backend's block
    # order assumes, as the forward's query blocks give it, that the work grows with the index (heaviest first)
    j, h_kv, b = hk.num_blocks(0) - 1 - hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    n_q = q.shape[2]
    group = q.shape[1] // k.shape[1]
    k_s = hk.shared(ST[k.dtype, BN, D])
    v_s = hk.shared(ST[v.dtype, BN, D])
    q_s = hk.shared(ST[q.dtype, BM, D], stages=STAGES)
    do_s = hk.shared(ST[do.dtype, BM, D], stages=STAGES)
    ds_s = hk.shared(ST[q.dtype, BN, BM]) if ATOMIC_DQ else None
    hk.load(k_s, k, (b, h_kv, j, 0))       # keys past Nkv read 0: their dQ terms are 0, their dK/dV rows dropped
    hk.load(v_s, v, (b, h_kv, j, 0))
    scale_log2 = scale * LOG2E
    if SOFTCAP:                            # the forward's c * tanh(scale * s / c) (kernels/attention.py), base 2
        cap_in, cap_out = scale / softcap, softcap * LOG2E

    first, n_blocks = 0, hk.cdiv(n_q, BM)
    if MASKED:                             # only the query blocks some key of this block is seen by
        first = hk.max((j * BN - shift - right) // BM, 0)
        last = hk.min(n_blocks, ((j + 1) * BN - 1 - shift + left) // BM + 1)
        n_blocks = hk.max(last - first, 0)
    per_head = hk.max(n_blocks, 1)         # iteration t -> (head of the group, query block)

    def head_and_block(t):
        return h_kv * group + t // per_head, first + t % per_head

    def load(t, s):
        h, i = head_and_block(t)
        hk.load(q_s[s], q, (b, h, i, 0))
        hk.load(do_s[s], do, (b, h, i, 0))

    def compute(t, s, dk_acc, dv_acc):
        h, i = head_and_block(t)
        # each vector loaded ahead of the product it waits behind (lse: Sᵀ, delta: dPᵀ), in flight during it
        lse_col = hk.load(RV[f32, BM], lse, (b, h, i), fill=INF)
        if SOFTCAP:
            tanh_t = hk.tanh(hk.mma_ABt(k_s, q_s[s], hk.zeros(RT[f32, BN, BM])) * cap_in)
            scores_t = tanh_t * cap_out
        else:
            scores_t = hk.mma_ABt(k_s, q_s[s], hk.zeros(RT[f32, BN, BM])) * scale_log2
        keep_t = _band_keep_t(scores_t, j * BN, i * BM, shift, left, right) if MASKED else None
        p_t = _probabilities_t(scores_t, lse_col, keep_t)
        dv_acc = hk.mma(p_t.to(do.dtype), do_s[s], dv_acc)
        delta_col = hk.load(RV[f32, BM], delta, (b, h, i))
        dp_t = hk.mma_ABt(v_s, do_s[s], hk.zeros(RT[f32, BN, BM]))
        ds_t = p_t * (dp_t - delta_col[None, :])
        if SOFTCAP:                        # d(c tanh(x / c)) / dx = 1 - tanh²
            ds_t = ds_t * (1.0 - tanh_t * tanh_t)
        ds_t = ds_t.to(q.dtype)
        dk_acc = hk.mma(ds_t, q_s[s], dk_acc)
        if ATOMIC_DQ:
            hk.store(ds_s, ds_t)
            if DQ_T:
                hk.atomic_add(dq_acc, hk.mma_AtB(k_s, ds_s, hk.zeros(RT[f32, D, BM])) * scale, (b, h, 0, i))
            else:
                hk.atomic_add(dq_acc, hk.mma_AtB(ds_s, k_s, hk.zeros(RT[f32, BM, D])) * scale, (b, h, i, 0))
        return dk_acc, dv_acc

    init = (hk.zeros(RT[f32, BN, D]), hk.zeros(RT[f32, BN, D]))
    dk_acc, dv_acc = hk.pipeline(group * n_blocks, load, compute, carry=init, stages=STAGES)
    hk.store(dk, (dk_acc * scale).to(dk.dtype), (b, h_kv, j, 0))
    hk.store(dv, dv_acc.to(dv.dtype), (b, h_kv, j, 0))


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_bwd_dq_kernel(q: GL[4], k: GL[4], v: GL[4], do: GL[4], lse: GL[3], delta: GL[3], dq: GL[4],
                            scale: float, shift: int, left: int, right: int, *, D: hk.const = 64,
                            BM: hk.const = 64, BN: hk.const = 64, MASKED: hk.const = False,
                            STAGES: hk.const = 2):
    """dQ without atomics: one block per query block loops over the key blocks it sees (the forward's loop)."""
    dq_body(q, k, v, do, lse, delta, dq, scale, shift, left, right, None, D=D, BM=BM, BN=BN, MASKED=MASKED,
            STAGES=STAGES, SOFTCAP=False)


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_bwd_dq_softcap_kernel(q: GL[4], k: GL[4], v: GL[4], do: GL[4], lse: GL[3], delta: GL[3], dq: GL[4],
                                    scale: float, shift: int, left: int, right: int, softcap: float, *,
                                    D: hk.const = 64, BM: hk.const = 64, BN: hk.const = 64,
                                    MASKED: hk.const = False, STAGES: hk.const = 2):
    """attention_bwd_dq_kernel of a forward with softcap c (`softcap`): the same body."""
    dq_body(q, k, v, do, lse, delta, dq, scale, shift, left, right, softcap, D=D, BM=BM, BN=BN, MASKED=MASKED,
            STAGES=STAGES, SOFTCAP=True)


def dq_body(q, k, v, do, lse, delta, dq, scale, shift, left, right, softcap, *, D, BM, BN, MASKED, STAGES, SOFTCAP):
    """The deterministic dQ kernel, written once; SOFTCAP gates the softcap's recomputation and derivative."""
    m, h, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    n_kv = k.shape[2]
    h_kv = h // (q.shape[1] // k.shape[1])
    q_s = hk.shared(ST[q.dtype, BM, D])
    do_s = hk.shared(ST[do.dtype, BM, D])
    k_s = hk.shared(ST[k.dtype, BN, D], stages=STAGES)
    v_s = hk.shared(ST[v.dtype, BN, D], stages=STAGES)
    hk.load(q_s, q, (b, h, m, 0))
    hk.load(do_s, do, (b, h, m, 0))
    lse_row = hk.load(RV[f32, BM], lse, (b, h, m), fill=INF)
    delta_row = hk.load(RV[f32, BM], delta, (b, h, m))
    scale_log2 = scale * LOG2E
    if SOFTCAP:
        cap_in, cap_out = scale / softcap, softcap * LOG2E

    first, n_blocks = 0, hk.cdiv(n_kv, BN)
    if MASKED:
        first = hk.max((m * BM + shift - left) // BN, 0)
        n_blocks = hk.max(hk.min(n_blocks, hk.cdiv((m + 1) * BM + shift + right, BN)) - first, 0)

    def load(i, s):
        hk.load(k_s[s], k, (b, h_kv, first + i, 0))     # keys past Nkv read 0: k = v = 0 adds nothing to dQ
        hk.load(v_s[s], v, (b, h_kv, first + i, 0))

    def compute(i, s, dq_acc):
        if SOFTCAP:
            tanh_s = hk.tanh(hk.mma_ABt(q_s, k_s[s], hk.zeros(RT[f32, BM, BN])) * cap_in)
            scores = tanh_s * cap_out
        else:
            scores = hk.mma_ABt(q_s, k_s[s], hk.zeros(RT[f32, BM, BN])) * scale_log2
        keep = _band_keep(scores, m * BM, (first + i) * BN, shift, left, right) if MASKED else None
        p = _probabilities(scores, lse_row, keep)
        dp = hk.mma_ABt(do_s, v_s[s], hk.zeros(RT[f32, BM, BN]))
        ds = p * (dp - delta_row[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - tanh_s * tanh_s)
        return hk.mma(ds.to(q.dtype), k_s[s], dq_acc)

    dq_acc = hk.pipeline(n_blocks, load, compute, carry=hk.zeros(RT[f32, BM, D]), stages=STAGES)
    hk.store(dq, (dq_acc * scale).to(dq.dtype), (b, h, m, 0))


@hk.kernel(num_warps=4)
def attention_bwd_dq_convert_kernel(dq_acc: GL[4], dq: GL[4], *, D: hk.const = 64, BM: hk.const = 64):
    """The atomic path's last step: the f32 dQ accumulator rounded once to dQ's dtype."""
    m, h, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    hk.store(dq, hk.load(RT[f32, BM, D], dq_acc, (b, h, m, 0)), (b, h, m, 0))


def config_for(d: int) -> dict:
    """dK/dV kernel tiles within every target's shared memory (gfx942: 64 KiB with the backend's scratch):
    48 KiB at D = 64 (k, v single-buffered, q, dO double-buffered). At D = 128 the two [BN, D] f32
    accumulators fill the registers: one stage keeps sm_90a free of spills (with two it spilled 8 bytes).
    d is a tile head dim (attention.tile_dim). D = 256's dK/dV runs in attention_bwd_wide.py (column parts); its
    BM here is the row kernels' block (preprocess, dQ convert)."""
    if d > 128:
        return dict(D=d, BM=32, BN=16, STAGES=1)
    return dict(D=d, BM=64, BN=64, STAGES=2) if d <= 64 else dict(D=d, BM=32, BN=32, STAGES=1)


def fallbacks_for(d: int) -> list[dict]:
    """Smaller dK/dV tiles, taken in order where a target's build of config_for(d) is rejected (cuda: it spills;
    NVRTC 13.0 spills the masked f16 D = 64 kernel on sm_80 by 8 bytes at 255 registers, 13.5 does not).
    One stage first (the same tiles: 243 registers there), then fewer query rows, then fewer keys."""
    base = config_for(d)
    smaller = [dict(base, STAGES=1), dict(base, BM=base["BM"] // 2), dict(base, BM=base["BM"] // 2, BN=base["BN"] // 2)]
    return [c for c in smaller if c != base and min(c["BM"], c["BN"]) >= 16]


def candidates(consts: dict, args: tuple = ()) -> list[dict]:
    """The dK/dV kernel's legal configurations for these consts (D, MASKED, ATOMIC_DQ), widest first, the portable
    baseline config_for(D) last; which one runs is the backend's (cuda on sm_90a: the first whose products all run
    as warpgroup mma on a TMA ring). FA3's blocks: 128 keys on two warpgroups (64 rows each) against 64 queries,
    dQ computed transposed (DQ_T: D = 128 rows where the query block has 64); at D = 64 also 128 queries with dQ
    as it is (with DQ_T there, D = 64 rows are one warpgroup's: the second would repeat dQ's products)."""
    d = consts["D"]
    base = {**config_for(d), **consts}
    wide = [dict(BM=64, BN=128, STAGES=2, num_warps=8, DQ_T=consts["ATOMIC_DQ"])]    # no dQ here: no DQ_T
    if d <= 64:
        wide.insert(0, dict(BM=128, BN=128, STAGES=2, num_warps=8))
    return [{**base, **c} for c in wide] + [base]


def dkdv_config(args: tuple, masked: bool, deterministic: bool, backend=None, kernel=None) -> dict:
    """The dK/dV kernel's configuration for a call with these arguments: the backend's choice among candidates(),
    or where the selected target rejects its build, the next it accepts, then fallbacks_for(D) (Kernel.choose_config).
    kernel: attention_bwd_dkdv_kernel, or its softcap form."""
    D = tile_dim(args[0].shape[-1], args[2].shape[-1])            # q's and v's head dims
    flags = dict(MASKED=masked, ATOMIC_DQ=not deterministic)
    return (kernel or attention_bwd_dkdv_kernel).choose_config(
        lambda: candidates(dict(D=D, **flags)), *args, backend=backend, key=(D, masked, deterministic),
        fallbacks=[{**c, **flags} for c in fallbacks_for(D)])


def dq_config_for(d: int) -> dict:
    """The deterministic dQ kernel's tiles: q, dO single-buffered, k, v double-buffered; 48 KiB at D = 64.
    At D = 128 key blocks of 16 (32 KiB): with 32 the masked bf16 kernel spilled 68 registers on sm_80."""
    if d > 128:             # D = 256 (a tile head dim): one stage, 48 KiB
        return dict(D=d, BM=32, BN=16, STAGES=1)
    return dict(D=d, BM=64, BN=64, STAGES=2) if d <= 64 else dict(D=d, BM=32, BN=16, STAGES=2)


def dq_candidates(consts: dict) -> list[dict]:
    """The deterministic dQ kernel's legal configurations, the baseline dq_config_for(D) last: the forward's
    128-row blocks on two warpgroups (its loop: two products into registers, one accumulating)."""
    base = {**dq_config_for(consts["D"]), **consts}
    return [{**base, **dict(BM=128, BN=64, STAGES=2, num_warps=8)}, base]


def dq_config(args: tuple, masked: bool, backend=None, kernel=None) -> dict:
    """The deterministic dQ kernel's configuration for a call (Kernel.choose_config over dq_candidates)."""
    D = tile_dim(args[0].shape[-1], args[2].shape[-1])            # q's and v's head dims
    return (kernel or attention_bwd_dq_kernel).choose_config(lambda: dq_candidates(dict(D=D, MASKED=masked)), *args,
                                                 backend=backend, key=(D, masked))


def _named(fn, *args):
    """The forward's argument checks, reported under this function's name."""
    try:
        return fn(*args)
    except ArgumentError as e:
        raise ArgumentError(str(e).replace("attention_fwd", "attention_bwd", 1)) from None


def _check_like(name: str, t, shape, dtype) -> None:
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ArgumentError(f"attention_bwd: '{name}' must be {tuple(shape)} {dtype}, got {got}")


def _outputs(q, k, v, dq, dk, dv):
    out = {}
    for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if t is None:
            t = torch.empty_like(like)
        else:
            _check_like(name, t, like.shape, like.dtype)
        out[name] = t
    return out


def attention_bwd(q, k, v, o, lse, do, *, causal: bool = False, window=None, align: str | None = None,
                  scale: float | None = None, deterministic: bool = False, dq=None, dk=None, dv=None,
                  dlse=None, softcap: float | None = None, backend=None, config: dict | None = None,
                  dq_tiles: dict | None = None):
    """Gradients (dq, dk, dv) of o = attention_fwd(q, k, v, ...) given dO = `do`, in the input dtype.

    o and lse are the forward's outputs (lse: f32 [B, Hq, N], natural log); the mask arguments and scale
    must be the forward's. dk, dv are summed over each GQA group of query heads. deterministic=True computes
    dQ without atomic adds (a second kernel): reruns are bitwise equal. Rows that see no key: gradients 0.
    dlse: an upstream gradient of lse (f32 [B, Hq, N]), if the caller used it: d lse / d s = P, so it
    enters as delta - dlse. config / dq_tiles: the dK/dV kernel's configuration (one of candidates(); for D > 128
    one of attention_bwd_wide.candidates()) and the deterministic dQ kernel's (one of dq_candidates()) instead of
    the backend's choice (tests, benchmarks).
    softcap: the forward's (c * tanh(scale * s / c)): dS is multiplied by 1 - tanh² before dQ and dK. With sinks,
    lse is the forward's (the sink included) and nothing else changes here (the sinks' own gradient is the
    caller's: torch_ops)."""
    _named(_check_fwd, q, k, v)
    cap = softcap_value(softcap, "attention_bwd")
    B, Hq, N, D = q.shape
    _check_like("o", o, (B, Hq, N, v.shape[3]), q.dtype)       # v's head dim, which may differ from q's
    _check_like("do", do, (B, Hq, N, v.shape[3]), q.dtype)
    _check_like("lse", lse, (B, Hq, N), torch.float32)
    mask = _named(_band_fwd, N, k.shape[2], causal, window, align)
    scale = scale_value(scale, D, "attention_bwd")
    outs = _outputs(q, k, v, dq, dk, dv)
    check_no_overlap("attention_bwd", outs, {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do})
    shift, left, right = mask or (0, 0, 0)
    masked = mask is not None

    delta = torch.empty(B, Hq, N, device=q.device, dtype=torch.float32)
    unused = delta.view(B, Hq, N, 1)        # the dQ accumulator argument when no kernel touches it
    dq_acc = unused if deterministic else torch.empty(B, Hq, N, D, device=q.device, dtype=torch.float32)
    Dt = tile_dim(D, v.shape[3])            # the kernels' tile head dim: columns past D (Dv) read 0, stores drop them
    rows = config_for(Dt)["BM"]             # the row kernels' block; the dK/dV kernel's tiles may be smaller
    q_grid = (hk.cdiv(N, rows), Hq, B)
    attention_bwd_preprocess_kernel(o, do, delta, dq_acc, grid=q_grid, backend=backend,
                                    D=Dt, BM=rows, ZERO_DQ=not deterministic)
    if dlse is not None:
        _check_like("dlse", dlse, (B, Hq, N), torch.float32)
        delta.sub_(torch.where(torch.isfinite(lse), dlse, 0.0))    # [B, Hq, N]: rows with no key stay inert
    capped = () if cap is None else (cap,)  # the softcap kernels' one more argument
    dkdv_kernel = attention_bwd_dkdv_kernel if cap is None else attention_bwd_dkdv_softcap_kernel
    dq_kernel = attention_bwd_dq_kernel if cap is None else attention_bwd_dq_softcap_kernel
    args = (q, k, v, do, lse, delta, outs["dk"], outs["dv"], dq_acc, scale, shift, left, right, *capped)
    flags = dict(MASKED=masked, ATOMIC_DQ=not deterministic)
    if Dt > 128:                            # dK/dV in column parts of 128 (attention_bwd_wide.py)
        from .attention_bwd_wide import launch_dkdv
        launch_dkdv(args[:13] + (1.0 if cap is None else cap,), cap is not None, config, flags, backend)
    else:
        cfg = {**config, **flags} if config else dkdv_config(args, masked, deterministic, backend, dkdv_kernel)
        if cfg.get("DQ_T"):                 # the kernel adds dQᵀ tiles: the accumulator viewed [B, Hq, D, N]
            args = args[:8] + (dq_acc.transpose(-1, -2),) + args[9:]
        dkdv_kernel(*args, grid=(hk.cdiv(k.shape[2], cfg["BN"]), k.shape[1], B), backend=backend, **cfg)
    if deterministic:
        dq_args = (q, k, v, do, lse, delta, outs["dq"], scale, shift, left, right, *capped)
        dq_cfg = {**dq_tiles, "MASKED": masked} if dq_tiles else dq_config(dq_args, masked, backend, dq_kernel)
        dq_kernel(*dq_args, grid=(hk.cdiv(N, dq_cfg["BM"]), Hq, B), backend=backend, **dq_cfg)
    else:
        attention_bwd_dq_convert_kernel(dq_acc, outs["dq"], grid=q_grid, backend=backend, D=Dt, BM=rows)
    return outs["dq"], outs["dk"], outs["dv"]


def reference(q, k, v, do, causal=False, scale=None, window=None, align=None):
    """float64 autograd of the forward's math: (dq, dk, dv); rows that see no key contribute nothing."""
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    g = q.shape[1] // k.shape[1]
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = (qd @ kd.repeat_interleave(g, dim=1).transpose(-1, -2)) * scale
    mask = band(q.shape[2], k.shape[2], causal, window, align)
    if mask is not None:
        shift, left, right = mask
        i = torch.arange(q.shape[2], device=q.device).view(-1, 1) + shift
        j = torch.arange(k.shape[2], device=q.device).view(1, -1)
        keep = (j <= i + right) & (j >= i - left)
        sees = keep.any(-1, keepdim=True)
        p = torch.softmax(s.masked_fill(~keep, float("-inf")).masked_fill(~sees, 0.0), -1) * sees
    else:
        p = torch.softmax(s, -1)
    (p @ vd.repeat_interleave(g, dim=1)).backward(do.double())
    return qd.grad, kd.grad, vd.grad


def band(n, n_kv, causal, window, align):
    return _named(_band_fwd, n, n_kv, causal, window, align)


def example_args(device="cpu", B=1, Hq=4, Hkv=2, N=200, D=64, causal=True, dtype=torch.bfloat16):
    """The dK/dV kernel (the backward's main loop) with atomic dQ, causal, on random inputs."""
    q, do = (torch.randn(B, Hq, N, D, device=device, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(B, Hkv, N, D, device=device, dtype=dtype) for _ in range(2))
    lse = torch.randn(B, Hq, N, device=device, dtype=torch.float32)
    delta = torch.randn(B, Hq, N, device=device, dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq_acc = torch.zeros(B, Hq, N, D, device=device, dtype=torch.float32)
    args = (q, k, v, do, lse, delta, dk, dv, dq_acc, 1.0 / math.sqrt(D), 0, N, 0)
    return args, {**config_for(tile_dim(D)), "MASKED": causal, "ATOMIC_DQ": True}
