"""Fused dropout + residual + layernorm or RMSNorm: h = dropout(x, p) + residual;
y = layernorm(h) * w + b, or y = h / sqrt(mean(h²) + eps) * w (+ b).

Without a residual (residual=None: RESIDUAL=False) none is read; where h is x itself (no residual, p = 0: a plain
norm) it is not written either (STORE_H=False) and the wrappers return x as h: a plain norm reads x once and
writes y, as torch's does.

Two shapes of the same math, chosen by the ONE_PASS const: where a block's rows fit one column tile
(BC >= d_model), h stays in registers and x and residual are read once; wider rows are swept in column
tiles, three passes for layernorm (mean, variance, output; two for RMSNorm) recomputing h from x and
residual in f32 rather than re-reading a rounded h. `candidates` offers the one-pass shapes first (a
backend whose layouts spread a row over a whole block takes them) and the swept one last. The dropout mask
is the interface's (docs/numerics.md): element index offset + row * d_model + col, one Philox4x32-10 call
per four consecutive indices, so every backend keeps the same elements bit for bit."""
from __future__ import annotations

import math

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

MASK32 = 0xFFFFFFFF


# Legal values of the tiles: BR rows by BC columns, BC whole 8-element chunks (16 bytes of a bf16 row: how the layouts
# deal a row to lanes), at most 16384 (the widest one-pass row, 16 warps of 64 lanes holding 16 each); block sizes
# the layouts deal over. ONE_PASS, a flag the candidates set where BC >= d, is the call's. No roles: not a GEMM's
# M/N/K tiles, so no backend proposes shapes for them.
TUNABLE = dict(BR=hk.tunable(range(1, 257)), BC=hk.tunable(range(8, 16385, 8)), num_warps=hk.tunable(1, 2, 4, 8, 16))


@hk.kernel(num_warps=4, tunable=TUNABLE)
def dropout_residual_layernorm_kernel(x: GL[2], residual: GL[2], weight: GL[1], bias: GL[1], y: GL[2],
                                      h_out: GL[2], p: float, eps: float, seed_lo: int, seed_hi: int,
                                      offset_lo: int, offset_hi: int, *, BR: hk.const = 64,
                                      BC: hk.const = 128, DROPOUT: hk.const = True, RMS: hk.const = False,
                                      BIAS: hk.const = True, ONE_PASS: hk.const = False,
                                      RESIDUAL: hk.const = True, STORE_H: hk.const = True):
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
        return xt + hk.load(RT[f32, BR, BC], residual, (r, c)) if RESIDUAL else xt

    def sum_pass(c, total):
        """h written out; its row sum (layernorm's mean) or sum of squares (RMSNorm's); padding is 0."""
        h = h_tile(c)
        if STORE_H:
            hk.store(h_out, h.to(h_out.dtype), (r, c))
        return total + hk.row_sum(h * h if RMS else h)

    def normalise(centred_of, rstd, c):
        """y of column tile c; the weight and bias are loaded before centred_of() builds the centred h (in
        the swept shape that recomputes h: fewer live registers)."""
        w = hk.load(RV[f32, BC], weight, (c,))
        b = hk.load(RV[f32, BC], bias, (c,)) if BIAS else None
        yt = centred_of() * rstd[:, None] * w[None, :]
        if BIAS:
            yt = yt + b[None, :]
        hk.store(y, yt.to(y.dtype), (r, c))

    if ONE_PASS:            # the whole row in one tile (BC >= d): h never leaves registers
        h = h_tile(0)
        if STORE_H:
            hk.store(h_out, h.to(h_out.dtype), (r, 0))
        if RMS:
            normalise(lambda: h, hk.rsqrt(hk.row_sum(h * h) * inv_d + eps), 0)
        else:
            in_row = hk.bounds_mask(h, 0, 0, BR, d)              # padding columns must not count
            centred = hk.where(in_row, h - (hk.row_sum(h) * inv_d)[:, None], 0.0)
            normalise(lambda: centred, hk.rsqrt(hk.row_sum(centred * centred) * inv_d + eps), 0)
        return

    if RMS:
        mean = None
        rstd = hk.rsqrt(hk.fori_loop(0, n_tiles, sum_pass, hk.zeros(RV[f32, BR])) * inv_d + eps)
    else:
        mean = hk.fori_loop(0, n_tiles, sum_pass, hk.zeros(RV[f32, BR])) * inv_d

        def var_pass(c, total):
            centred = h_tile(c) - mean[:, None]
            in_row = hk.bounds_mask(centred, 0, c * BC, BR, d)         # padding columns must not count
            return total + hk.row_sum(hk.where(in_row, centred * centred, 0.0))

        rstd = hk.rsqrt(hk.fori_loop(0, n_tiles, var_pass, hk.zeros(RV[f32, BR])) * inv_d + eps)

    def out_pass(c, unused):
        normalise(lambda: h_tile(c) if RMS else h_tile(c) - mean[:, None], rstd, c)
        return unused

    hk.fori_loop(0, n_tiles, out_pass, hk.zeros(RV[f32, BR]))


DEFAULT_CONFIG = dict(BR=64, BC=128)
ONE_PASS_MAX_PER_LANE = 16      # f32 elements of one row tile per thread: x, residual and h stay in registers


def one_pass_shapes(d: int, max_per_lane: int) -> list[dict]:
    """One-row tiles holding a whole row of d features over 1 to 16 warps, at most max_per_lane f32 elements
    per thread, the fewest warps first: first with the row in whole 8-element chunks on every lane of warps
    of 32 lanes, then of 64 (a backend takes the first its layouts fit)."""
    out = []
    for lanes in (32, 64):
        for warps in (1, 2, 4, 8, 16):
            bc = hk.cdiv(d, 8 * lanes * warps) * 8 * lanes * warps
            shape = dict(BR=1, BC=bc, ONE_PASS=True, num_warps=warps)
            if bc // (lanes * warps) <= max_per_lane and shape not in out:
                out.append(shape)
    return out


def candidates(consts: dict, args: tuple) -> list[dict]:
    """For a call with these consts and kernel arguments (x first): the one-pass shapes for its rows, then the
    swept baseline, which every target takes."""
    shapes = one_pass_shapes(args[0].shape[1], ONE_PASS_MAX_PER_LANE)
    return [{**DEFAULT_CONFIG, **consts, **c} for c in shapes + [{}]]


def _words(value: int, what: str, fn: str = "dropout_residual_layernorm") -> tuple[int, int]:
    """A uint64 as two int32 bit patterns (the kernel's runtime seed/offset arguments)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ArgumentError(f"{fn}: '{what}' must be an int in [0, 2**64), got {value!r}")
    as_i32 = lambda w: w - 2**32 if w >= 2**31 else w  # noqa: E731
    return as_i32(value & MASK32), as_i32(value >> 32)


def _check(fn, x, residual, weight, bias, p, eps):
    for name, t in (("x", x), ("residual", x if residual is None else residual)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ArgumentError(f"{fn}: '{name}' must be a 2-D tensor [rows, d_model], got "
                                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ArgumentError(f"{fn}: '{name}' must be bf16, f16 or f32, got {t.dtype}")
    if residual is not None and residual.shape != x.shape:
        raise ArgumentError(f"{fn}: 'residual' must have the shape of 'x' {tuple(x.shape)}, "
                            f"got {tuple(residual.shape)}")
    d = x.shape[1]
    if d == 0:
        raise ArgumentError(f"{fn}: 'x' has no features (shape {tuple(x.shape)}); a norm over 0 values is undefined")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (d,):
            raise ArgumentError(f"{fn}: '{name}' must have shape ({d},), got "
                                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if not t.is_floating_point() or t.dtype == torch.float64:
            raise ArgumentError(f"{fn}: '{name}' must be bf16, f16 or f32, got {t.dtype}")
    if not 0.0 <= p < 1.0:
        raise ArgumentError(f"{fn}: 'p' must be in [0, 1), got {p}")
    if not 0 < eps < math.inf:
        raise ArgumentError(f"{fn}: 'eps' must be finite and > 0, got {eps}")


def dropout_residual_layernorm(x, residual, weight, bias, *, p: float = 0.0, seed: int = 0, offset: int = 0,
                               eps: float = 1e-5, out=None, h_out=None, backend=None, **config):
    """Returns (y, h): h = dropout(x, p) + residual, y = layernorm(h) * weight + bias (bias may be None),
    both in x's dtype. residual=None: no residual (h is x itself where p = 0)."""
    return _fused("dropout_residual_layernorm", False, x, residual, weight, bias, p, seed, offset, eps, out, h_out,
                  backend, config)


def dropout_residual_rmsnorm(x, residual, weight, bias=None, *, p: float = 0.0, seed: int = 0, offset: int = 0,
                             eps: float = 1e-6, out=None, h_out=None, backend=None, **config):
    """Returns (y, h): h = dropout(x, p) + residual, y = h / sqrt(mean(h²) + eps) * weight (+ bias), both in
    x's dtype. With p = 0 and a zero residual it is plain RMSNorm."""
    return _fused("dropout_residual_rmsnorm", True, x, residual, weight, bias, p, seed, offset, eps, out, h_out,
                  backend, config)


def _fused(fn, rms, x, residual, weight, bias, p, seed, offset, eps, out, h_out, backend, config):
    T = torch.Tensor
    fresh = (out is None and h_out is None and not config and isinstance(x, T) and isinstance(weight, T)
             and (residual is None or isinstance(residual, T)) and (bias is None or isinstance(bias, T)))
    key = _plan_key(rms, x, residual, weight, bias, p, backend) if fresh else None
    plan = _PLANS.get(key) if fresh else None
    if plan is None or not 0.0 <= p < 1.0 or not 0 < eps < math.inf:     # a plan's key holds neither value
        _check(fn, x, residual, weight, bias, p, eps)
    store_h = residual is not None or p > 0 or h_out is not None
    y = torch.empty_like(x) if out is None else out
    h = h_out if h_out is not None else torch.empty_like(x) if store_h else x
    if seed.__class__ is int and offset.__class__ is int and not seed and not offset:   # the plain norm's
        s_lo = s_hi = o_lo = o_hi = 0
    else:
        s_lo, s_hi = _words(seed, "seed", fn)
        o_lo, o_hi = _words(offset, "offset", fn)
    args = (x, x if residual is None else residual, weight, weight if bias is None else bias, y, h, float(p),
            float(eps), s_lo, s_hi, o_lo, o_hi)
    if plan is not None:    # a call like the last with these shapes, dtypes and flags: the launch alone
        dropout_residual_layernorm_kernel(*args, grid=plan[0], backend=backend, **plan[1])
        return y, h
    for name, t in (("out", y), ("h_out", h)):
        if t.shape != x.shape or not t.is_floating_point():
            raise ArgumentError(f"{fn}: '{name}' must be a float tensor of shape {tuple(x.shape)}, got "
                                f"{tuple(t.shape)} {t.dtype}")
    if not fresh:
        inputs = {"x": x, **({"residual": residual} if residual is not None else {}), "weight": weight,
                  **({"bias": bias} if bias is not None else {})}
        check_no_overlap(fn, {"out": y, **({"h_out": h} if store_h else {})}, inputs)
    flags = {"DROPOUT": p > 0, "RMS": rms, "BIAS": bias is not None, "RESIDUAL": residual is not None,
             "STORE_H": store_h}

    def launch(cfg):
        dropout_residual_layernorm_kernel(*args, grid=(hk.cdiv(x.shape[0], cfg["BR"]),), backend=backend, **cfg)

    if not config:          # tuned per shape bucket where HK_AUTOTUNE is on, else the backend's choice
        config = dropout_residual_layernorm_kernel.choose_config(
            lambda: candidates(flags, args), *args, backend=backend, launch=launch,
            bucket=hk.shape_bucket(*x.shape), key=(tuple(flags.items()), x.shape[1]))
    cfg = {**DEFAULT_CONFIG, **config, **flags}
    if fresh:
        _PLANS.put(key, ((hk.cdiv(x.shape[0], cfg["BR"]),), cfg))
    launch(cfg)
    return y, h


_PLANS = hk.CallPlans()     # _fused's configuration and grid per _plan_key


def _plan_key(rms, x, residual, weight, bias, p, backend):
    """What _fused's checks and configuration choice depend on, besides p's and eps's values: a repeat call with
    the same key skips both (a call with outputs given or a config never uses a plan)."""
    return _PLANS.key(rms, x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.dtype, weight.device,
                      None if residual is None else (residual.shape, residual.dtype, residual.device),
                      None if bias is None else (bias.shape, bias.dtype, bias.device), p > 0, backend)


def reference(x, residual, weight, bias, p=0.0, seed=0, offset=0, eps=1e-5, rms=False):
    """float64 math with the interface's Philox mask: (y, h); RMSNorm when rms, no bias when bias is None."""
    from hk_portable.interface.numerics import dropout_keep
    rows, d = x.shape
    xd = x.double()
    if p > 0:
        idx = offset + torch.arange(rows).view(-1, 1) * d + torch.arange(d).view(1, -1)
        keep = dropout_keep(p, seed, idx.to(torch.int64)).to(x.device)
        xd = torch.where(keep, xd / (1 - p), torch.zeros_like(xd))
    h = xd if residual is None else xd + residual.double()
    centred = h if rms else h - h.mean(-1, keepdim=True)
    y = centred / torch.sqrt((centred ** 2).mean(-1, keepdim=True) + eps) * weight.double()
    return (y if bias is None else y + bias.double()), h


def example_args(device="cpu", rows=100, d=1000, dtype=torch.bfloat16, p=0.1):
    x = torch.randn(rows, d, device=device, dtype=dtype)
    res = torch.randn(rows, d, device=device, dtype=dtype)
    w = torch.randn(d, device=device, dtype=torch.float32)
    b = torch.randn(d, device=device, dtype=torch.float32)
    y, h = torch.empty_like(x), torch.empty_like(x)
    s_lo, s_hi = _words(1234, "seed")
    return (x, res, w, b, y, h, p, 1e-5, s_lo, s_hi, 0, 0), {**DEFAULT_CONFIG, "DROPOUT": p > 0}
