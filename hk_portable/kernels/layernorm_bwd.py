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
dw and db are summed in two deterministic steps: each block writes its column sums to row `block` of an f32
[num_blocks, d_model] buffer, then norm_bwd_reduce_kernel sums those rows in a fixed order. No atomics:
reruns are bitwise equal.
Two shapes, as in the forward: ONE_PASS (a row fits one column tile, BC >= d_model): each of a grid of at most
BLOCKS_PER_UNIT blocks per compute unit (the wrapper sizes the grid and the partial sums with it) walks the row tiles block,
block + num_blocks, ... with the row in registers, reading h and dy once and carrying its dw/db partial sums
across its rows; otherwise one block per BR rows sweeps column tiles (three passes for layernorm, two for
RMSNorm)."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

from .layernorm import TUNABLE, _words, one_pass_shapes

ONE_PASS_MAX_PER_LANE = 8   # f32 elements of one row tile per thread: h, dy, g, x̂ and dh stay in registers
# One-pass grids: two blocks per compute unit, one wave of these 4-16-warp blocks, and the fewest rows of f32
# partial sums for the reduction (a call's config may name ROW_BLOCKS; docs/perf-notes.md has the sweep).
BLOCKS_PER_UNIT = 2


@hk.kernel(num_warps=4, tunable=TUNABLE)      # the forward's legal tiles (layernorm.py), no roles
def layernorm_bwd_kernel(h: GL[2], dy: GL[2], dh_in: GL[2], weight: GL[1], dx: GL[2], dres: GL[2],
                         dw_part: GL[2], db_part: GL[2], p: float, eps: float, seed_lo: int, seed_hi: int,
                         offset_lo: int, offset_hi: int, *, BR: hk.const = 64, BC: hk.const = 64,
                         DROPOUT: hk.const = True, RMS: hk.const = False, BIAS: hk.const = True,
                         DH_IN: hk.const = True, ONE_PASS: hk.const = False):
    r = hk.block_idx(0)
    d = h.shape[1]
    n_tiles = hk.cdiv(d, BC)
    inv_d = 1.0 / d.to(f32)
    inv_keep = 1.0 / (1.0 - p)

    def grads(i, c, dyt, w, xhat, rstd, mean_g, mean_gx):
        """dres and dx of row tile i, column tile c, from x̂ and the row statistics."""
        inner = dyt * w[None, :] - xhat * mean_gx[:, None]
        if not RMS:
            inner = inner - mean_g[:, None]
        dh = inner * rstd[:, None]
        if DH_IN:
            dh = dh + hk.load(RT[f32, BR, BC], dh_in, (i, c))
        hk.store(dres, dh.to(dres.dtype), (i, c))
        if DROPOUT:
            keep = hk.dropout_mask(dh, p, (seed_lo, seed_hi), (offset_lo, offset_hi), i * BR, c * BC, d)
            dh = hk.where(keep, dh * inv_keep, 0.0)
        hk.store(dx, dh.to(dx.dtype), (i, c))

    if ONE_PASS:
        w = hk.load(RV[f32, BC], weight, (0,))
        blocks = hk.num_blocks(0)

        def row_tile(j, dw, db):
            i = r + j * blocks
            ht = hk.load(RT[f32, BR, BC], h, (i, 0))
            dyt = hk.load(RT[f32, BR, BC], dy, (i, 0))
            g = dyt * w[None, :]
            if RMS:
                rstd = hk.rsqrt(hk.row_sum(ht * ht) * inv_d + eps)
                centred, mean_g = ht, None
            else:
                in_row = hk.bounds_mask(ht, 0, 0, BR, d)          # padding columns must not count
                centred = hk.where(in_row, ht - (hk.row_sum(ht) * inv_d)[:, None], 0.0)
                rstd = hk.rsqrt(hk.row_sum(centred * centred) * inv_d + eps)
                mean_g = hk.row_sum(g) * inv_d
            xhat = centred * rstd[:, None]
            grads(i, 0, dyt, w, xhat, rstd, mean_g, hk.row_sum(g * centred) * rstd * inv_d)
            return dw + hk.col_sum(dyt * xhat), db + hk.col_sum(dyt)    # padding rows: dy = 0 adds nothing

        mine = hk.cdiv(hk.cdiv(h.shape[0], BR) - r, blocks)          # row tiles r, r + blocks, ...
        dw, db = hk.fori_loop(0, mine, row_tile, (hk.zeros(RV[f32, BC]), hk.zeros(RV[f32, BC])))
        hk.store(dw_part, dw, (r, 0))
        if BIAS:
            hk.store(db_part, db, (r, 0))
        return

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

    def out_pass(c, unused):
        w = hk.load(RV[f32, BC], weight, (c,))
        dyt = hk.load(RT[f32, BR, BC], dy, (r, c))
        ht = h_tile(c)
        xhat = (ht if RMS else ht - mean[:, None]) * rstd[:, None]
        hk.store(dw_part, hk.col_sum(dyt * xhat), (r, c))            # padding rows: dy = 0 adds nothing
        if BIAS:
            hk.store(db_part, hk.col_sum(dyt), (r, c))
        grads(r, c, dyt, w, xhat, rstd, None if RMS else mean_g, mean_gx)
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
# The partial sums are a few hundred rows (the one-pass grid) by d_model: tall, narrow tiles take them in two or
# three row steps and still give d_model / 32 blocks.
REDUCE_CONFIG = dict(BR=128, BC=32)


def candidates(consts: dict, args: tuple) -> list[dict]:
    """For a call with these consts and kernel arguments (h first): the one-pass shapes (layernorm.py's, with
    ONE_PASS_MAX_PER_LANE), then the swept baseline, which every target takes."""
    shapes = one_pass_shapes(args[0].shape[1], ONE_PASS_MAX_PER_LANE)
    return [{**DEFAULT_CONFIG, **consts, **c} for c in shapes + [{}]]


def _grid_rows(cfg: dict, rows: int, row_blocks: int) -> int:
    """Blocks of the main kernel, which is also the rows of the dw/db partial sums: one-pass grids walk the rows
    with at most row_blocks blocks."""
    tiles = hk.cdiv(rows, cfg["BR"])
    return min(tiles, row_blocks) if cfg.get("ONE_PASS") else tiles


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
    config = dict(config)
    row_blocks = config.pop("ROW_BLOCKS", None) or BLOCKS_PER_UNIT * hk.compute_units(h.device)
    rows, d = h.shape
    flags = {"DROPOUT": p > 0, "RMS": rms, "BIAS": bias is not None, "DH_IN": dh is not None}
    dx = _output(fn, "dx", outs["dx"], (rows, d), h.dtype, h)
    dres = _output(fn, "dresidual", outs["dresidual"], (rows, d), h.dtype, h)
    dw = _output(fn, "dweight", outs["dweight"], (d,), weight.dtype, h)
    db = None if bias is None else _output(fn, "dbias", outs["dbias"], (d,), bias.dtype, h)
    inputs = {"dy": dy, "h": h, "weight": weight, **({"dh": dh} if dh is not None else {})}
    check_no_overlap(fn, {"dx": dx, "dresidual": dres, "dweight": dw, **({"dbias": db} if db is not None else {})},
                     inputs)
    s_lo, s_hi = _words(seed, "seed", fn)
    o_lo, o_hi = _words(offset, "offset", fn)

    def args(part_rows: int):
        dw_part = torch.empty(max(part_rows, 1), d, device=h.device, dtype=torch.float32)
        db_part = torch.empty_like(dw_part) if bias is not None else dw_part
        return (h, dy, dy if dh is None else dh, weight, dx, dres, dw_part, db_part, float(p), float(eps), s_lo, s_hi,
                o_lo, o_hi)

    if not config and rows:     # tuned per shape bucket where HK_AUTOTUNE is on, else the backend's choice
        def launch(c):
            blocks = _grid_rows(c, rows, row_blocks)
            layernorm_bwd_kernel(*args(blocks), grid=(blocks,), backend=backend, **c)
        example = args(1)
        config = layernorm_bwd_kernel.choose_config(lambda: candidates(flags, example), *example, backend=backend,
                                                    launch=launch, bucket=hk.shape_bucket(rows, d),
                                                    key=(tuple(flags.items()), d))
    cfg = {**DEFAULT_CONFIG, **config, **flags}
    n_blocks = _grid_rows(cfg, rows, row_blocks)
    kernel_args = args(n_blocks)
    dw_part, db_part = kernel_args[6], kernel_args[7]
    if n_blocks == 0:                          # no rows: the parameters' gradients are sums of nothing
        dw_part.zero_()
        db_part.zero_()
    else:
        layernorm_bwd_kernel(*kernel_args, grid=(n_blocks,), backend=backend, **cfg)
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
