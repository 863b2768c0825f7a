"""Attention forward (FlashAttention-2 style online softmax, exp2 domain), GQA, causal or not.

q [B, Hq, N, D], k and v [B, Hkv, Nkv, D] with Hq a multiple of Hkv; returns o [B, Hq, N, D] and the
natural-log log-sum-exp per query row, f32 [B, Hq, N] (what the backward pass needs)."""
from __future__ import annotations

import math

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ST, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@hk.kernel(num_warps=4)
def attention_fwd_kernel(q: GL[4], k: GL[4], v: GL[4], o: GL[4], lse: GL[3], scale: float, *,
                         D: hk.const = 64, BM: hk.const = 64, BN: hk.const = 64, CAUSAL: hk.const = False,
                         STAGES: hk.const = 2):
    m, h, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    n_q, n_kv = q.shape[2], k.shape[2]
    h_kv = h // (q.shape[1] // k.shape[1])          # GQA: query heads share a key/value head
    q_s = hk.shared(ST[q.dtype, BM, D])
    k_s = hk.shared(ST[k.dtype, BN, D], stages=STAGES)
    v_s = hk.shared(ST[v.dtype, BN, D], stages=STAGES)
    hk.load(q_s, q, (b, h, m, 0))
    scale_log2 = scale * LOG2E                       # softmax in base 2: exp2 is the hardware op

    n_blocks = hk.cdiv(n_kv, BN)
    if CAUSAL:                                       # query i sees keys j <= i: skip blocks past the diagonal
        n_blocks = hk.min(n_blocks, hk.cdiv((m + 1) * BM, BN))

    def load(j, s):
        hk.load(k_s[s], k, (b, h_kv, j, 0))
        hk.load(v_s[s], v, (b, h_kv, j, 0))

    def compute(j, s, acc, row_m, row_l):
        scores = hk.mma_ABt(q_s, k_s[s], hk.zeros(RT[f32, BM, BN])) * scale_log2
        keep = hk.bounds_mask(scores, 0, j * BN, BM, n_kv)          # key columns past the end
        if CAUSAL:
            keep = keep & hk.causal_mask(scores, m * BM, j * BN)
        scores = hk.where(keep, scores, float("-inf"))
        new_m = hk.maximum(row_m, hk.row_max(scores))               # finite: key 0 is always visible
        p = hk.exp2(scores - new_m[:, None])
        alpha = hk.exp2(row_m - new_m)                              # rescale of the old partial sums
        new_l = row_l * alpha + hk.row_sum(p)
        acc = hk.mma(p.to(v.dtype), v_s[s], acc * alpha[:, None])
        return acc, new_m, new_l

    init = (hk.zeros(RT[f32, BM, D]), hk.neg_inf(RV[f32, BM]), hk.zeros(RV[f32, BM]))
    acc, row_m, row_l = hk.pipeline(n_blocks, load, compute, carry=init, stages=STAGES)
    hk.store(o, (acc / row_l[:, None]).to(o.dtype), (b, h, m, 0))
    hk.store(lse, (row_m + hk.log2(row_l)) * LN2, (b, h, m))


def config_for(d: int) -> dict:
    """Tiles that fit every target's shared memory (gfx942: 64 KiB): 48 KiB at D=128, 40 KiB at D=64."""
    return dict(D=d, BM=64, BN=32 if d > 64 else 64, STAGES=2)


def _check(q, k, v, causal):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ArgumentError(f"attention_fwd: '{name}' must be a 4-D tensor [B, H, N, D], got "
                                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise ArgumentError(f"attention_fwd: '{name}' must be bfloat16 or float16, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ArgumentError(f"attention_fwd: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, Hq, N, D = q.shape
    if D not in (64, 128):
        raise ArgumentError(f"attention_fwd: head dim D must be 64 or 128, got {D}")
    if k.shape != v.shape:
        raise ArgumentError(f"attention_fwd: 'k' {tuple(k.shape)} and 'v' {tuple(v.shape)} must have one shape")
    if k.shape[0] != B or k.shape[3] != D:
        raise ArgumentError(f"attention_fwd: 'k' must be [B={B}, Hkv, Nkv, D={D}], got {tuple(k.shape)}")
    if k.shape[1] == 0 or Hq % k.shape[1]:
        raise ArgumentError(f"attention_fwd: query heads ({Hq}) must be a multiple of key/value heads "
                            f"({k.shape[1]})")
    if N < 1 or k.shape[2] < 1:
        raise ArgumentError(f"attention_fwd: sequence lengths must be >= 1, got N={N}, Nkv={k.shape[2]}")
    if causal and k.shape[2] != N:
        raise ArgumentError(f"attention_fwd: causal attention needs Nkv == N, got N={N}, Nkv={k.shape[2]}")


def attention_fwd(q, k, v, *, causal: bool = False, scale: float | None = None, out=None, lse=None,
                  backend=None, **config):
    """o = softmax(q kᵀ · scale [+ causal mask]) v per (batch, head), with GQA; returns (o, lse)."""
    _check(q, k, v, causal)
    B, Hq, N, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype:
        raise ArgumentError(f"attention_fwd: 'out' must be {tuple(q.shape)} {q.dtype}, got "
                            f"{tuple(out.shape)} {out.dtype}")
    if lse is None:
        lse = torch.empty(B, Hq, N, device=q.device, dtype=torch.float32)
    elif tuple(lse.shape) != (B, Hq, N) or lse.dtype != torch.float32:
        raise ArgumentError(f"attention_fwd: 'lse' must be {(B, Hq, N)} float32, got {tuple(lse.shape)} {lse.dtype}")
    check_no_overlap("attention_fwd", {"out": out, "lse": lse}, {"q": q, "k": k, "v": v})
    cfg = {**config_for(D), **config, "CAUSAL": bool(causal)}
    grid = (hk.cdiv(N, cfg["BM"]), Hq, B)
    attention_fwd_kernel(q, k, v, out, lse, scale, grid=grid, backend=backend, **cfg)
    return out, lse


def reference(q, k, v, causal=False, scale=None):
    """float64 math: (o, lse)."""
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    g = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(g, dim=1)
    vd = v.double().repeat_interleave(g, dim=1)
    s = (q.double() @ kd.transpose(-1, -2)) * scale
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ vd, torch.logsumexp(s, -1)


def example_args(device="cpu", B=1, Hq=4, Hkv=2, N=200, D=64, causal=True, dtype=torch.bfloat16):
    q = torch.randn(B, Hq, N, D, device=device, dtype=dtype)
    k = torch.randn(B, Hkv, N, D, device=device, dtype=dtype)
    v = torch.randn(B, Hkv, N, D, device=device, dtype=dtype)
    o = torch.empty_like(q)
    lse = torch.empty(B, Hq, N, device=device, dtype=torch.float32)
    return (q, k, v, o, lse, 1.0 / math.sqrt(D)), {**config_for(D), "CAUSAL": causal}
