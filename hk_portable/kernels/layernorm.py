"""Fused dropout + residual + layernorm: h = dropout(x, p) + residual; y = layernorm(h) * w + b.

Rows of any width (tested to d_model 8192) are swept in column tiles, three passes (mean, variance,
output) recomputing h from x and residual in f32 rather than re-reading a rounded h. The dropout mask
comes from Philox4x32-10 with counter index offset + row * d_model + col, so every backend keeps the
same elements bit for bit."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

MASK32 = 0xFFFFFFFF


@hk.kernel(num_warps=4)
def dropout_residual_layernorm_kernel(x: GL[2], residual: GL[2], weight: GL[1], bias: GL[1], y: GL[2],
                                      h_out: GL[2], p: float, eps: float, seed_lo: int, seed_hi: int,
                                      offset_lo: int, offset_hi: int, *, BR: hk.const = 64,
                                      BC: hk.const = 128, DROPOUT: hk.const = True):
    r = hk.block_idx(0)
    d = x.shape[1]
    n_tiles = hk.cdiv(d, BC)
    inv_keep = 1.0 / (1.0 - p)
    inv_d = 1.0 / d.to(f32)

    def h_tile(c):
        """h for column tile c in f32; columns past d are 0 (loads fill 0)."""
        xt = hk.load(RT[f32, BR, BC], x, (r, c))
        if DROPOUT:
            keep = hk.dropout_mask(xt, p, (seed_lo, seed_hi), (offset_lo, offset_hi), r * BR, c * BC, d)
            xt = hk.where(keep, xt * inv_keep, 0.0)
        return xt + hk.load(RT[f32, BR, BC], residual, (r, c))

    def sum_pass(c, total):
        h = h_tile(c)
        hk.store(h_out, h.to(h_out.dtype), (r, c))
        return total + hk.row_sum(h)

    mean = hk.fori_loop(0, n_tiles, sum_pass, hk.zeros(RV[f32, BR])) * inv_d

    def var_pass(c, total):
        centred = h_tile(c) - mean[:, None]
        in_row = hk.bounds_mask(centred, 0, c * BC, BR, d)         # padding columns must not count
        return total + hk.row_sum(hk.where(in_row, centred * centred, 0.0))

    rstd = hk.rsqrt(hk.fori_loop(0, n_tiles, var_pass, hk.zeros(RV[f32, BR])) * inv_d + eps)

    def out_pass(c, unused):
        w = hk.load(RV[f32, BC], weight, (c,))
        b = hk.load(RV[f32, BC], bias, (c,))
        yt = (h_tile(c) - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
        hk.store(y, yt.to(y.dtype), (r, c))
        return unused

    hk.fori_loop(0, n_tiles, out_pass, hk.zeros(RV[f32, BR]))


DEFAULT_CONFIG = dict(BR=64, BC=128)


def _words(value: int, what: str) -> tuple[int, int]:
    """A uint64 as two int32 bit patterns (the kernel's runtime seed/offset arguments)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ArgumentError(f"dropout_residual_layernorm: '{what}' must be an int in [0, 2**64), got {value!r}")
    as_i32 = lambda w: w - 2**32 if w >= 2**31 else w  # noqa: E731
    return as_i32(value & MASK32), as_i32(value >> 32)


def _check(x, residual, weight, bias, p, eps):
    for name, t in (("x", x), ("residual", residual)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ArgumentError(f"dropout_residual_layernorm: '{name}' must be a 2-D tensor [rows, d_model], got "
                                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ArgumentError(f"dropout_residual_layernorm: '{name}' must be bf16, f16 or f32, got {t.dtype}")
    if residual.shape != x.shape:
        raise ArgumentError(f"dropout_residual_layernorm: 'residual' must have the shape of 'x' {tuple(x.shape)}, "
                            f"got {tuple(residual.shape)}")
    d = x.shape[1]
    for name, t in (("weight", weight), ("bias", bias)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (d,):
            raise ArgumentError(f"dropout_residual_layernorm: '{name}' must have shape ({d},), got "
                                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if not t.is_floating_point() or t.dtype == torch.float64:
            raise ArgumentError(f"dropout_residual_layernorm: '{name}' must be bf16, f16 or f32, got {t.dtype}")
    if not 0.0 <= p < 1.0:
        raise ArgumentError(f"dropout_residual_layernorm: 'p' must be in [0, 1), got {p}")
    if not eps > 0:
        raise ArgumentError(f"dropout_residual_layernorm: 'eps' must be > 0, got {eps}")


def dropout_residual_layernorm(x, residual, weight, bias, *, p: float = 0.0, seed: int = 0, offset: int = 0,
                               eps: float = 1e-5, out=None, h_out=None, backend=None, **config):
    """Returns (y, h): h = dropout(x, p) + residual, y = layernorm(h) * weight + bias, both in x's dtype."""
    _check(x, residual, weight, bias, p, eps)
    y = torch.empty_like(x) if out is None else out
    h = torch.empty_like(x) if h_out is None else h_out
    for name, t in (("out", y), ("h_out", h)):
        if t.shape != x.shape or not t.is_floating_point():
            raise ArgumentError(f"dropout_residual_layernorm: '{name}' must be a float tensor of shape "
                                f"{tuple(x.shape)}, got {tuple(t.shape)} {t.dtype}")
    check_no_overlap("dropout_residual_layernorm", {"out": y, "h_out": h},
                     {"x": x, "residual": residual, "weight": weight, "bias": bias})
    cfg = {**DEFAULT_CONFIG, **config, "DROPOUT": p > 0}
    s_lo, s_hi = _words(seed, "seed")
    o_lo, o_hi = _words(offset, "offset")
    grid = (hk.cdiv(x.shape[0], cfg["BR"]),)
    dropout_residual_layernorm_kernel(x, residual, weight, bias, y, h, float(p), float(eps), s_lo, s_hi, o_lo, o_hi,
                                      grid=grid, backend=backend, **cfg)
    return y, h


def reference(x, residual, weight, bias, p=0.0, seed=0, offset=0, eps=1e-5):
    """float64 math with the interface's Philox mask: (y, h)."""
    from hk_portable.interface.numerics import dropout_keep
    rows, d = x.shape
    xd = x.double()
    if p > 0:
        idx = offset + torch.arange(rows).view(-1, 1) * d + torch.arange(d).view(1, -1)
        keep = dropout_keep(p, seed, idx.to(torch.int64)).to(x.device)
        xd = torch.where(keep, xd / (1 - p), torch.zeros_like(xd))
    h = xd + residual.double()
    mean = h.mean(-1, keepdim=True)
    var = ((h - mean) ** 2).mean(-1, keepdim=True)
    return (h - mean) / torch.sqrt(var + eps) * weight.double() + bias.double(), h


def example_args(device="cpu", rows=100, d=1000, dtype=torch.bfloat16, p=0.1):
    x = torch.randn(rows, d, device=device, dtype=dtype)
    res = torch.randn(rows, d, device=device, dtype=dtype)
    w = torch.randn(d, device=device, dtype=torch.float32)
    b = torch.randn(d, device=device, dtype=torch.float32)
    y, h = torch.empty_like(x), torch.empty_like(x)
    s_lo, s_hi = _words(1234, "seed")
    return (x, res, w, b, y, h, p, 1e-5, s_lo, s_hi, 0, 0), {**DEFAULT_CONFIG, "DROPOUT": p > 0}
