"""Backward of the fused dropout + residual + layernorm / RMSNorm (kernels/layernorm.py).

Forward: h = dropout(x, p) + residual, x̂ = (h - mean) · rstd (RMSNorm: x̂ = h · rstd), y = x̂ · w (+ b).
Given dy (and dh_in, an upstream gradient of the forward's h output, if it was used), with g = dy · w:
  dh  = rstd · (g - mean(g) - x̂ · mean(g · x̂)) + dh_in          (RMSNorm: no mean(g) term)
  dresidual = dh,   dx = dh / (1 - p) where the Philox mask kept x, else 0,
  dw = Σ_rows dy · x̂,   db = Σ_rows dy.
The statistics are recomputed in f32 from the saved h (the forward's output, in x's dtype), with the
forward's passes: layernorm sums h, then (h - mean)² together with Σg and Σg(h - mean), so no sum
cancels; RMSNorm sums h² and Σg·h in one pass. The dropout mask is regenerated from (p, seed, offset) with
the forward's counter index offset + row · d_model + col: never stored.
dw and db are summed in two deterministic steps: each block of BR rows writes its column sums to row
`block` of an f32 [num_blocks, d_model] buffer, then norm_bwd_reduce_kernel sums those rows in a fixed
order. No atomics: reruns are bitwise equal."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

from .layernorm import _words


@hk.kernel(num_warps=4)
def layernorm_bwd_kernel(h: GL[2], dy: GL[2], dh_in: GL[2], weight: GL[1], dx: GL[2], dres: GL[2],
                         dw_part: GL[2], db_part: GL[2], p: float, eps: float, seed_lo: int, seed_hi: int,
                         offset_lo: int, offset_hi: int, *, BR: hk.const = 64, BC: hk.const = 64,
                         DROPOUT: hk.const = True, RMS: hk.const = False, BIAS: hk.const = True,
                         DH_IN: hk.const = True):
    r = hk.block_idx(0)
    d = h.shape[1]
    n_tiles = hk.cdiv(d, BC)
    inv_d = 1.0 / d.to(f32)

    def h_tile(c):
        return hk.load(RT[f32, BR, BC], h, (r, c))          # padding rows and columns read 0

    def g_tile(c):
        """dy · w; 0 in padding rows and columns (both read 0)."""
        w = hk.load(RV[f32, BC], weight, (c,))
        return hk.load(RT[f32, BR, BC], dy, (r, c)) * w[None, :]

    zero = hk.zeros(RV[f32, BR])
    if RMS:
        mean = None

        def sums_pass(c, sum_sq, sum_gh):
            ht = h_tile(c)
            return sum_sq + hk.row_sum(ht * ht), sum_gh + hk.row_sum(g_tile(c) * ht)

        sum_sq, sum_gc = hk.fori_loop(0, n_tiles, sums_pass, (zero, zero))   # RMSNorm's centred h is h
        rstd = hk.rsqrt(sum_sq * inv_d + eps)
    else:
        mean = hk.fori_loop(0, n_tiles, lambda c, total: total + hk.row_sum(h_tile(c)), zero) * inv_d

        def sums_pass(c, var, sum_g, sum_gc):
            centred = h_tile(c) - mean[:, None]
            in_row = hk.bounds_mask(centred, 0, c * BC, BR, d)     # padding columns (centred = -mean) must not count
            g = g_tile(c)
            return (var + hk.row_sum(hk.where(in_row, centred * centred, 0.0)), sum_g + hk.row_sum(g),
                    sum_gc + hk.row_sum(g * centred))

        var, sum_g, sum_gc = hk.fori_loop(0, n_tiles, sums_pass, (zero, zero, zero))
        rstd = hk.rsqrt(var * inv_d + eps)
        mean_g = sum_g * inv_d
    mean_gx = sum_gc * rstd * inv_d                                  # mean(g · x̂)
    inv_keep = 1.0 / (1.0 - p)

    def out_pass(c, unused):
        w = hk.load(RV[f32, BC], weight, (c,))
        dyt = hk.load(RT[f32, BR, BC], dy, (r, c))
        xhat = (h_tile(c) if RMS else h_tile(c) - mean[:, None]) * rstd[:, None]
        hk.store(dw_part, hk.col_sum(dyt * xhat), (r, c))            # padding rows: dy = 0 adds nothing
        if BIAS:
            hk.store(db_part, hk.col_sum(dyt), (r, c))
        inner = dyt * w[None, :] - xhat * mean_gx[:, None]
        if not RMS:
            inner = inner - mean_g[:, None]
        dh = inner * rstd[:, None]
        if DH_IN:
            dh = dh + hk.load(RT[f32, BR, BC], dh_in, (r, c))
        hk.store(dres, dh.to(dres.dtype), (r, c))
        if DROPOUT:
            keep = hk.dropout_mask(dh, p, (seed_lo, seed_hi), (offset_lo, offset_hi), r * BR, c * BC, d)
            dh = hk.where(keep, dh * inv_keep, 0.0)
        hk.store(dx, dh.to(dx.dtype), (r, c))
        return unused

    hk.fori_loop(0, n_tiles, out_pass, zero)


@hk.kernel(num_warps=4)
def norm_bwd_reduce_kernel(part: GL[2], out: GL[1], *, BR: hk.const = 16, BC: hk.const = 128):
    """out[c] = Σ_rows part[:, c] in f32, rows in a fixed order (then rounded once to out's dtype)."""
    c = hk.block_idx(0)
    n_row_tiles = hk.cdiv(part.shape[0], BR)
    total = hk.fori_loop(0, n_row_tiles, lambda i, acc: acc + hk.col_sum(hk.load(RT[f32, BR, BC], part, (i, c))),
                         hk.zeros(RV[f32, BC]))
    hk.store(out, total, (c,))


# Column tiles of 64: with 128 the column vectors (w, the dweight/dbias sums) and the row tiles spilled on sm_80
# and sm_90a (255 registers and up to 300 bytes of stack at BR = 16..32); 64 x 64 needs ~170-220, no spills.
DEFAULT_CONFIG = dict(BR=64, BC=64)
REDUCE_CONFIG = dict(BR=16, BC=128)
FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def _shape_of(t) -> str:
    return f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check(fn, dy, h, weight, bias, dh, p, eps):
    if not isinstance(h, torch.Tensor) or h.dim() != 2 or h.dtype not in FLOATS:
        raise ArgumentError(f"{fn}: 'h' must be a 2-D bf16, f16 or f32 tensor [rows, d_model] (the forward's h), "
                            f"got {_shape_of(h)}")
    for name, t in (("dy", dy), ("dh", dh)):
        if t is None and name == "dh":
            continue
        if not isinstance(t, torch.Tensor) or t.shape != h.shape or t.dtype not in FLOATS:
            raise ArgumentError(f"{fn}: '{name}' must be a bf16, f16 or f32 tensor of h's shape {tuple(h.shape)}, "
                                f"got {_shape_of(t)}")
    d = h.shape[1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (d,) or t.dtype not in FLOATS:
            raise ArgumentError(f"{fn}: '{name}' must be a bf16, f16 or f32 tensor of shape ({d},), got "
                                f"{_shape_of(t)}")
    if not 0.0 <= p < 1.0:
        raise ArgumentError(f"{fn}: 'p' must be in [0, 1), got {p}")
    if not eps > 0:
        raise ArgumentError(f"{fn}: 'eps' must be > 0, got {eps}")


def _output(fn, name, t, shape, default_dtype, like):
    if t is None:
        return torch.empty(shape, dtype=default_dtype, device=like.device)
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape) or t.dtype not in FLOATS:
        raise ArgumentError(f"{fn}: '{name}' must be a bf16, f16 or f32 tensor of shape {tuple(shape)}, "
                            f"got {_shape_of(t)}")
    return t


def dropout_residual_layernorm_bwd(dy, h, weight, bias, *, dh=None, p: float = 0.0, seed: int = 0,
                                   offset: int = 0, eps: float = 1e-5, dx=None, dresidual=None, dweight=None,
                                   dbias=None, backend=None, **config):
    """Gradients (dx, dresidual, dweight, dbias) of dropout_residual_layernorm given dy (and dh, an upstream
    gradient of its h output, if any). h is the forward's h output; weight, bias (may be None), p, seed,
    offset and eps are the forward's. dx and dresidual default to h's dtype, dweight/dbias to the parameters'
    dtypes (dbias is None without a bias). Deterministic: reruns are bitwise equal."""
    return _backward("dropout_residual_layernorm_bwd", False, dy, h, weight, bias, dh, p, seed, offset, eps,
                     dict(dx=dx, dresidual=dresidual, dweight=dweight, dbias=dbias), backend, config)


def dropout_residual_rmsnorm_bwd(dy, h, weight, bias=None, *, dh=None, p: float = 0.0, seed: int = 0,
                                 offset: int = 0, eps: float = 1e-6, dx=None, dresidual=None, dweight=None,
                                 dbias=None, backend=None, **config):
    """Gradients (dx, dresidual, dweight, dbias) of dropout_residual_rmsnorm; arguments as
    dropout_residual_layernorm_bwd."""
    return _backward("dropout_residual_rmsnorm_bwd", True, dy, h, weight, bias, dh, p, seed, offset, eps,
                     dict(dx=dx, dresidual=dresidual, dweight=dweight, dbias=dbias), backend, config)


def _backward(fn, rms, dy, h, weight, bias, dh, p, seed, offset, eps, outs, backend, config):
    _check(fn, dy, h, weight, bias, dh, p, eps)
    rows, d = h.shape
    cfg = {**DEFAULT_CONFIG, **config, "DROPOUT": p > 0, "RMS": rms, "BIAS": bias is not None,
           "DH_IN": dh is not None}
    dx = _output(fn, "dx", outs["dx"], (rows, d), h.dtype, h)
    dres = _output(fn, "dresidual", outs["dresidual"], (rows, d), h.dtype, h)
    dw = _output(fn, "dweight", outs["dweight"], (d,), weight.dtype, h)
    db = None if bias is None else _output(fn, "dbias", outs["dbias"], (d,), bias.dtype, h)
    inputs = {"dy": dy, "h": h, "weight": weight, **({"dh": dh} if dh is not None else {})}
    check_no_overlap(fn, {"dx": dx, "dresidual": dres, "dweight": dw, **({"dbias": db} if db is not None else {})},
                     inputs)
    s_lo, s_hi = _words(seed, "seed", fn)
    o_lo, o_hi = _words(offset, "offset", fn)
    n_blocks = hk.cdiv(rows, cfg["BR"])
    dw_part = torch.empty(max(n_blocks, 1), d, device=h.device, dtype=torch.float32)
    db_part = torch.empty_like(dw_part) if bias is not None else dw_part
    if n_blocks == 0:                          # no rows: the parameters' gradients are sums of nothing
        dw_part.zero_()
        db_part.zero_()
    else:
        layernorm_bwd_kernel(h, dy, dy if dh is None else dh, weight, dx, dres, dw_part, db_part, float(p),
                             float(eps), s_lo, s_hi, o_lo, o_hi, grid=(n_blocks,), backend=backend, **cfg)
    grid = (hk.cdiv(d, REDUCE_CONFIG["BC"]),)
    norm_bwd_reduce_kernel(dw_part, dw, grid=grid, backend=backend, **REDUCE_CONFIG)
    if db is not None:
        norm_bwd_reduce_kernel(db_part, db, grid=grid, backend=backend, **REDUCE_CONFIG)
    return dx, dres, dw, db


def example_args(device="cpu", rows=100, d=1000, dtype=torch.bfloat16, p=0.1):
    """The main backward kernel: layernorm with bias, dropout and an upstream dh, on random inputs."""
    h, dy, dh = (torch.randn(rows, d, device=device, dtype=dtype) for _ in range(3))
    w = torch.randn(d, device=device, dtype=torch.float32)
    dx, dres = torch.empty_like(h), torch.empty_like(h)
    n_blocks = hk.cdiv(rows, DEFAULT_CONFIG["BR"])
    dw_part, db_part = (torch.empty(n_blocks, d, device=device, dtype=torch.float32) for _ in range(2))
    s_lo, s_hi = _words(1234, "seed")
    args = (h, dy, dh, w, dx, dres, dw_part, db_part, p, 1e-5, s_lo, s_hi, 0, 0)
    return args, {**DEFAULT_CONFIG, "DROPOUT": p > 0}
