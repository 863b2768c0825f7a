"""Attention backward's dK/dV kernels for tile head dims above 128 (attention.TILE_HEAD_DIMS: 256), dense and varlen.

The dK/dV kernels of attention_bwd.py and attention_varlen.py hold two [BN, D] f32 accumulators. A register tile's
rows go to the warps in 16-row blocks with whole rows per warp (the fragment layout), so at D = 256 the two take at
least 2 * 16 * 256 / 32 = 256 registers a thread whatever the block: every configuration spilled on sm_80 (1.5-2 KB).
Here the head dim is cut in column parts of PART_COLS = 128: a launch computes dK, dV (and dQ's atomic adds) of one
part (the const PART), the accumulators [BN, 128] as at D = 128; the products that read every column (Sᵀ = k qᵀ and
dPᵀ = v dOᵀ) sum over the parts. The wrappers launch once per part: Sᵀ and dPᵀ are recomputed per part (twice the
work of those two products at D = 256), the price of no spills with the layouts there are.

The math, masks and orientation are attention_bwd.dkdv_body's and attention_varlen_bwd_dkdv_kernel's (their
docstrings); only the column split is new. Kernels of their own (not consts of the D <= 128 kernels) so that those
keep their signatures and generated code."""
from __future__ import annotations

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ST, f32

from .attention import LOG2E, TUNABLE
from .attention_bwd import INF, _band_keep_t, _probabilities_t
from .attention_varlen import _p, _varlen_keep, block_sequences, sequence_query_blocks

PART_COLS = 128         # the columns of dK, dV, dQ one launch computes


def parts(d: int, pc: int = PART_COLS) -> int:
    """The launches (column parts of pc) a tile head dim d takes."""
    return d // pc


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_bwd_dkdv_wide_kernel(q: GL[4], k: GL[4], v: GL[4], do: GL[4], lse: GL[3], delta: GL[3], dk: GL[4],
                                   dv: GL[4], dq_acc: GL[4], scale: float, shift: int, left: int, right: int,
                                   softcap: float, *, D: hk.const = 256, BM: hk.const = 32, BN: hk.const = 32,
                                   MASKED: hk.const = False, ATOMIC_DQ: hk.const = True, STAGES: hk.const = 1,
                                   SOFTCAP: hk.const = False, PART: hk.const = 0, PC: hk.const = PART_COLS):
    """attention_bwd_dkdv_kernel (and its softcap form, SOFTCAP) for D > 128: columns
    [PART * PC, (PART + 1) * PC) of dK, dV and dQ (atomic adds into dq_acc [B, Hq, N, D] f32)."""
    chunks = D // PC
    j, h_kv, b = hk.num_blocks(0) - 1 - hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    n_q = q.shape[2]
    group = q.shape[1] // k.shape[1]
    k_s = [hk.shared(ST[k.dtype, BN, PC]) for _ in range(chunks)]
    v_s = [hk.shared(ST[v.dtype, BN, PC]) for _ in range(chunks)]
    q_s = [hk.shared(ST[q.dtype, BM, PC], stages=STAGES) for _ in range(chunks)]
    do_s = [hk.shared(ST[do.dtype, BM, PC], stages=STAGES) for _ in range(chunks)]
    ds_s = hk.shared(ST[q.dtype, BN, BM]) if ATOMIC_DQ else None
    for c in range(chunks):                 # keys past Nkv and columns past D read 0
        hk.load(k_s[c], k, (b, h_kv, j, c))
        hk.load(v_s[c], v, (b, h_kv, j, c))
    scale_log2 = scale * LOG2E
    if SOFTCAP:
        cap_in, cap_out = scale / softcap, softcap * LOG2E

    first, n_blocks = 0, hk.cdiv(n_q, BM)
    if MASKED:
        first = hk.max((j * BN - shift - right) // BM, 0)
        last = hk.min(n_blocks, ((j + 1) * BN - 1 - shift + left) // BM + 1)
        n_blocks = hk.max(last - first, 0)
    per_head = hk.max(n_blocks, 1)

    def head_and_block(t):
        return h_kv * group + t // per_head, first + t % per_head

    def load(t, s):
        h, i = head_and_block(t)
        for c in range(chunks):
            hk.load(q_s[c][s], q, (b, h, i, c))
            hk.load(do_s[c][s], do, (b, h, i, c))

    def compute(t, s, dk_acc, dv_acc):
        h, i = head_and_block(t)
        lse_col = hk.load(RV[f32, BM], lse, (b, h, i), fill=INF)
        raw = hk.zeros(RT[f32, BN, BM])
        for c in range(chunks):
            raw = hk.mma_ABt(k_s[c], q_s[c][s], raw)
        if SOFTCAP:
            tanh_t = hk.tanh(raw * cap_in)
            scores_t = tanh_t * cap_out
        else:
            scores_t = raw * scale_log2
        keep_t = _band_keep_t(scores_t, j * BN, i * BM, shift, left, right) if MASKED else None
        p_t = _probabilities_t(scores_t, lse_col, keep_t)
        dv_acc = hk.mma(p_t.to(do.dtype), do_s[PART][s], dv_acc)
        delta_col = hk.load(RV[f32, BM], delta, (b, h, i))
        dp_t = hk.zeros(RT[f32, BN, BM])
        for c in range(chunks):
            dp_t = hk.mma_ABt(v_s[c], do_s[c][s], dp_t)
        ds_t = p_t * (dp_t - delta_col[None, :])
        if SOFTCAP:
            ds_t = ds_t * (1.0 - tanh_t * tanh_t)
        ds_t = ds_t.to(q.dtype)
        dk_acc = hk.mma(ds_t, q_s[PART][s], dk_acc)
        if ATOMIC_DQ:
            hk.store(ds_s, ds_t)
            hk.atomic_add(dq_acc, hk.mma_AtB(ds_s, k_s[PART], hk.zeros(RT[f32, BM, PC])) * scale,
                          (b, h, i, PART))
        return dk_acc, dv_acc

    init = (hk.zeros(RT[f32, BN, PC]), hk.zeros(RT[f32, BN, PC]))
    dk_acc, dv_acc = hk.pipeline(group * n_blocks, load, compute, carry=init, stages=STAGES)
    hk.store(dk, (dk_acc * scale).to(dk.dtype), (b, h_kv, j, PART))
    hk.store(dv, dv_acc.to(dv.dtype), (b, h_kv, j, PART))


@hk.kernel(num_warps=4, tunable=TUNABLE)
def attention_varlen_bwd_dkdv_wide_kernel(q: GL[3], k: GL[3], v: GL[3], do: GL[3], lse: GL[2], delta: GL[2],
                                          dk: GL[3], dv: GL[3], cu_q: GL[1], cu_k: GL[1], scale: float,
                                          bottom_right: int, left: int, right: int, steps: int, softcap: float, *,
                                          D: hk.const = 256, BM: hk.const = 16, BN: hk.const = 32,
                                          GROUP: hk.const = 1, MASKED: hk.const = False, STAGES: hk.const = 1,
                                          PART: hk.const = 0, PC: hk.const = PART_COLS, SOFTCAP: hk.const = False):
    """attention_varlen_bwd_dkdv_kernel (and its softcap form, SOFTCAP) for D > 128: columns
    [PART * PC, (PART + 1) * PC) of dK, dV. q, do [Hq, total_q, D]; k, v, dk, dv [Hkv, total_k, D]; lse, delta
    [Hq, total_q]."""
    chunks = D // PC
    j, h_kv = hk.block_idx(0), hk.block_idx(1)
    total_k = k.shape[1]
    n_seq = cu_k.shape[0] - 1
    k_s = [hk.shared(ST[k.dtype, BN, PC]) for _ in range(chunks)]
    v_s = [hk.shared(ST[v.dtype, BN, PC]) for _ in range(chunks)]
    q_s = [hk.shared(ST[q.dtype, BM, PC], stages=STAGES) for _ in range(chunks)]
    do_s = [hk.shared(ST[do.dtype, BM, PC], stages=STAGES) for _ in range(chunks)]
    for c in range(chunks):
        hk.load(k_s[c], k, (h_kv, j, c))
        hk.load(v_s[c], v, (h_kv, j, c))
    scale_log2 = scale * LOG2E
    if SOFTCAP:
        cap_in, cap_out = scale / softcap, softcap * LOG2E
    col0, col_end, first_seq, last_seq = block_sequences(cu_k, j, BN, total_k, steps, n_seq)

    def sequence(b, dk_acc, dv_acc):
        qs, ks, n_q, n_k, shift, first, n_blocks = sequence_query_blocks(cu_q, cu_k, b, col0, col_end, bottom_right,
                                                                         left, right, BM)

        def head_and_block(t):
            return h_kv * GROUP + t % GROUP, first + t // GROUP

        def load(t, s):
            h, i = head_and_block(t)
            for c in range(chunks):
                hk.load(q_s[c][s], q, (h, i, c))
                hk.load(do_s[c][s], do, (h, i, c))

        def compute(t, s, dk_acc, dv_acc):
            h, i = head_and_block(t)
            scores = hk.zeros(RT[f32, BM, BN])
            for c in range(chunks):
                scores = hk.mma_ABt(q_s[c][s], k_s[c], scores)
            if SOFTCAP:
                tanh_s = hk.tanh(scores * cap_in)
                scores = tanh_s * cap_out
            else:
                scores = scores * scale_log2
            keep = _varlen_keep(scores, i * BM, col0, qs, ks, n_q, n_k, shift, left, right, MASKED)
            p = _p(scores, hk.load(RV[f32, BM], lse, (h, i), fill=INF), keep)
            dv_acc = hk.mma_AtB(p.to(do.dtype), do_s[PART][s], dv_acc)
            dp = hk.zeros(RT[f32, BM, BN])
            for c in range(chunks):
                dp = hk.mma_ABt(do_s[c][s], v_s[c], dp)
            ds = p * (dp - hk.load(RV[f32, BM], delta, (h, i))[:, None])
            if SOFTCAP:
                ds = ds * (1.0 - tanh_s * tanh_s)
            return hk.mma_AtB(ds.to(q.dtype), q_s[PART][s], dk_acc), dv_acc

        return hk.pipeline(GROUP * n_blocks, load, compute, carry=(dk_acc, dv_acc), stages=STAGES)

    init = (hk.zeros(RT[f32, BN, PC]), hk.zeros(RT[f32, BN, PC]))
    dk_acc, dv_acc = hk.fori_loop(first_seq, last_seq, sequence, init)
    hk.store(dk, (dk_acc * scale).to(dk.dtype), (h_kv, j, PART))
    hk.store(dv, dv_acc.to(dv.dtype), (h_kv, j, PART))


def config_for(d: int) -> dict:
    """Tiles within every target's shared memory (gfx942: 64 KiB): k, v [32, 256] and q, dO [16, 256] in one
    stage, 48 KiB at D = 256; the accumulators [32, 128] f32 as D = 128's dK/dV kernel's."""
    return dict(D=d, BM=16, BN=32, STAGES=1)


def varlen_config_for(d: int) -> dict:
    """The varlen kernel's tiles: key blocks of 16 (its loop over sequences holds more scalars: with 32 it spilled 8
    bytes on sm_80, NVRTC 13.0; 240-242 registers with 16, bf16 and f16), 40 KiB at D = 256."""
    return dict(D=d, BM=16, BN=16, STAGES=1)


SMALLER = dict(BM=16, BN=16, STAGES=1)     # where a target's build of the baseline is rejected (cuda: spills; 236-254
                                           # registers at the baseline on sm_80 under NVRTC 13.0, none spilled)


def candidates(consts: dict, args: tuple = ()) -> list[dict]:
    """The legal configurations, the portable baseline config_for(D) last: 32 query rows where shared memory
    takes them (64 KiB at D = 256: not gfx942's, with its scratch)."""
    base = {**config_for(consts["D"]), **consts}
    return [{**base, "BM": 32}, base]


def dkdv_config(args: tuple, flags: dict, softcap: bool, backend=None) -> dict:
    """The wide dK/dV kernel's configuration for a call with these arguments (attention_bwd_dkdv_wide_kernel's; the
    last is the softcap, unused without SOFTCAP) and flags (MASKED, ATOMIC_DQ): Kernel.choose_config over
    candidates()."""
    from .attention import tile_dim
    consts = dict(D=tile_dim(args[0].shape[-1], args[2].shape[-1]), **flags, SOFTCAP=softcap)
    return attention_bwd_dkdv_wide_kernel.choose_config(lambda: candidates(consts), *args, backend=backend,
                                                        key=tuple(consts.items()), fallbacks=[{**consts, **SMALLER}])


def launch_dkdv(args: tuple, softcap: bool, config: dict | None, flags: dict, backend=None) -> None:
    """attention_bwd's dK/dV step for D > 128: the configuration (`config` as given, else dkdv_config's), then one
    launch per column part. args: attention_bwd_dkdv_kernel's, then the softcap (any float without one)."""
    fixed = dict(flags, SOFTCAP=softcap)
    cfg = {**config, **fixed} if config else dkdv_config(args, flags, softcap, backend)
    grid = (hk.cdiv(args[1].shape[2], cfg["BN"]), args[1].shape[1], args[0].shape[0])
    for part in range(parts(cfg["D"], cfg.get("PC", PART_COLS))):
        attention_bwd_dkdv_wide_kernel(*args, grid=grid, backend=backend, **cfg, PART=part)


def example_args(device="cpu", B=1, Hq=4, Hkv=2, N=200, D=256, causal=True, dtype=None):
    """The wide dK/dV kernel with atomic dQ, causal, on random inputs (attention_bwd.example_args' tensors)."""
    import torch
    from .attention_bwd import example_args as dense_args
    args, _ = dense_args(device, B=B, Hq=Hq, Hkv=Hkv, N=N, D=D, causal=causal, dtype=dtype or torch.bfloat16)
    return (*args, 1.0), {**config_for(256), "MASKED": causal, "ATOMIC_DQ": True}
