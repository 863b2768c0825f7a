"""Rotary position embedding (RoPE), written once for both pair layouts.

Each position n rotates pairs (x1, x2) of a head's features by the angle whose cos/sin the tables hold:
    y1 = x1·cos − x2·sin,   y2 = x2·cos + x1·sin          (the backward, `inverse=True`, rotates by −angle)
The two layouts differ only in which features pair up, so the kernel takes the pair halves as tensor views:
  * "neox" (half rotation; GPT-NeoX, Llama in transformers): x1 = x[..., :D/2], x2 = x[..., D/2:]
  * "gptj" (interleaved; GPT-J, the original RoFormer): x1 = x[..., 0::2], x2 = x[..., 1::2]
cos/sin: f32 tables [positions, D/2]; rows `offset .. offset + N` are used (a KV cache's decode step passes
its position as `offset`).
"""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

LAYOUTS = ("neox", "gptj")
DEFAULT_CONFIG = dict(BN=32, BH=1, HEADS=False)


# Legal values of the tiles: BN positions (rows of a HEADS=False tile; unrolled tiles of a HEADS=True block) by BH
# heads, 1 to 256 each; block sizes the layouts deal over. HEADS, the view a candidate launches on, is the call's.
# No roles: not a GEMM's M/N/K tiles, so no backend proposes shapes for them.
TUNABLE = dict(BN=hk.tunable(range(1, 257)), BH=hk.tunable(range(1, 257)), num_warps=hk.tunable(1, 2, 4, 8, 16))


@hk.kernel(num_warps=4, tunable=TUNABLE)
def rotary_kernel(x1: GL[4], x2: GL[4], cos: GL[2], sin: GL[2], y1: GL[4], y2: GL[4], *,
                  HALF: hk.const = 32, BN: hk.const = 32, BH: hk.const = 1, HEADS: hk.const = False,
                  INVERSE: hk.const = False):
    """A block rotates BN positions x BH heads. Two shapes of one rotation (the wrapper passes the views):
    HEADS=False, views [B, H, N, HALF]: one tile of BN positions (rows) of one head (BH = 1), with the
    positions' rows of the tables as tiles. HEADS=True, views [B, N, H, HALF]: BN tiles of BH heads (rows)
    at one position each, that position's table row loaded once as a column vector and broadcast over
    the heads; every load of the block is issued before the first store (x and y may be one tensor)."""
    nb, hb, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    if not HEADS:
        a = hk.load(RT[f32, BN, HALF], x1, (b, hb, nb, 0))
        c = hk.load(RT[f32, BN, HALF], x2, (b, hb, nb, 0))
        cs = hk.load(RT[f32, BN, HALF], cos, (nb, 0))
        sn = hk.load(RT[f32, BN, HALF], sin, (nb, 0))
        if INVERSE:
            sn = -sn
        hk.store(y1, (a * cs - c * sn).to(y1.dtype), (b, hb, nb, 0))
        hk.store(y2, (c * cs + a * sn).to(y2.dtype), (b, hb, nb, 0))
        return
    tiles = []
    for p in range(BN):                     # unrolled: BN positions' loads in flight together
        n = nb * BN + p
        tiles.append((n, hk.load(RT[f32, BH, HALF], x1, (b, n, hb, 0)), hk.load(RT[f32, BH, HALF], x2, (b, n, hb, 0)),
                      hk.load(RV[f32, HALF], cos, (n, 0)), hk.load(RV[f32, HALF], sin, (n, 0))))
    for n, a, c, cs, sn in tiles:
        if INVERSE:
            sn = -sn
        hk.store(y1, (a * cs[None, :] - c * sn[None, :]).to(y1.dtype), (b, n, hb, 0))
        hk.store(y2, (c * cs[None, :] + a * sn[None, :]).to(y2.dtype), (b, n, hb, 0))


LANES = 32                  # lanes across which a narrow strip deals a half row (a backend with other warps
HEADS_REGS = 64             # takes the baseline); the raw registers (loaded words) a thread may hold for one
HEADS_MAX_ROWS = 64         # block's loads: cuda's branch-free loads cost about twice that in registers
                            # (sm_90a, D=128 bf16: 166 at BN=2, 255 and spills at BN=4)


def heads_shapes(H: int, half: int, elem_bytes: int) -> list[dict]:
    """HEADS=True configurations for H heads of half rows of `half` elements: each half row dealt to half/8
    lanes in 16-byte chunks, BH heads a tile (a multiple of the block's thread-rows that divides H, at most
    HEADS_MAX_ROWS), the most warps first (4, 2, 1); BN positions a block, as many as keep the raw loaded data
    (x1, x2 chunks and the f32 table chunks) within HEADS_REGS registers a thread, at most 8 (B4 N4096 H32
    D128 bf16: 32 heads x 2 positions, 16 KiB in and 16 KiB out a block, 2048 x 1 x 4 blocks)."""
    out = []
    lanes_per_row = half // 8
    if lanes_per_row >= LANES:
        return out
    for warps in (4, 2, 1):
        rows = warps * (LANES // lanes_per_row)                 # thread-rows of the block
        if H % rows:
            continue
        bh = max(k * rows for k in range(1, HEADS_MAX_ROWS // rows + 1) if H % (k * rows) == 0) \
            if rows <= HEADS_MAX_ROWS else 0
        if not bh:
            continue
        per_position = 2 * (bh // rows) * 8 * elem_bytes // 4 + 2 * 8      # x1, x2 words + cos, sin f32
        bn = 1
        while bn < 8 and 2 * bn * per_position <= HEADS_REGS:
            bn *= 2
        out.append(dict(HEADS=True, BH=bh, BN=bn, num_warps=warps))
    return out


def candidates(consts: dict, args: tuple) -> list[dict]:
    """For a call with these consts and kernel arguments in the baseline's views (x1 [B, H, N, HALF] first):
    the HEADS shapes for its heads, then the baseline (one head, 32 positions a block), which every target
    takes. A backend takes a HEADS shape where all its register values are strips (cuda's narrow strips)."""
    x1 = args[0]
    shapes = heads_shapes(x1.shape[1], x1.shape[3], x1.element_size())
    return [{**DEFAULT_CONFIG, **consts, **c} for c in shapes + [{}]]


def _halves(t: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    half = t.shape[-1] // 2
    if layout == "neox":
        return t.narrow(-1, 0, half), t.narrow(-1, half, half)      # narrow: a view, cheaper than indexing
    return t[..., 0::2], t[..., 1::2]


HEAD_DIMS = (32, 64, 128, 256)      # the head dims the rotary kernel takes


def _check(x, cos, sin, layout, offset, heads_first):
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ArgumentError(f"rotary: 'x' must be a 4-D tensor [B, N, H, D] ([B, H, N, D] with heads_first=True), "
                            f"got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ArgumentError(f"rotary: 'x' must be bfloat16, float16 or float32, got {x.dtype}")
    if layout not in LAYOUTS:
        raise ArgumentError(f"rotary: layout must be one of {LAYOUTS}, got {layout!r}")
    D = x.shape[-1]
    if D not in HEAD_DIMS:
        raise ArgumentError(f"rotary: head dim D must be 32, 64, 128 or 256, got {D}")
    n = x.shape[2] if heads_first else x.shape[1]
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ArgumentError(f"rotary: 'offset' must be an int >= 0, got {offset!r}")
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype != torch.float32:
            raise ArgumentError(f"rotary: '{name}' must be a float32 table [positions, D/2], got "
                                f"{(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.shape[1] != D // 2 or t.shape[0] < offset + n:
            raise ArgumentError(f"rotary: '{name}' must be [>= offset + N = {offset + n}, D/2 = {D // 2}], got "
                                f"{tuple(t.shape)}")
        if t.device != x.device:
            raise ArgumentError(f"rotary: '{name}' is on {t.device}, 'x' on {x.device}; expected one device")


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "neox", offset: int = 0,
           heads_first: bool = False, inverse: bool = False, inplace: bool = False, out=None, backend=None,
           **config) -> torch.Tensor:
    """x rotated by the tables' angles at positions offset.. (see the module docstring); returns the result
    (x itself when inplace). `inverse=True` is the backward: the gradient of rotary(x) w.r.t. x, applied to
    an upstream gradient, is rotary(grad, ..., inverse=True)."""
    T = torch.Tensor
    fresh = (not inplace and out is None and not config and isinstance(x, T) and x.dim() == 4
             and isinstance(cos, T) and isinstance(sin, T))
    if fresh:
        key = _PLANS.key(x.shape, x.stride(), x.dtype, x.device, cos.shape, cos.stride(), cos.dtype, cos.device,
                         sin.shape, sin.stride(), sin.dtype, sin.device, layout, heads_first, bool(inverse), backend)
        plan = _PLANS.get(key)
        n = x.shape[2] if heads_first else x.shape[1]
        if plan is not None and offset.__class__ is int and 0 <= offset and offset + n <= cos.shape[0]:
            by_heads, grid, cfg = plan      # a call like the last with these shapes: the views and the launch
            out = torch.empty_like(x)
            xk, ok = (x, out) if by_heads != heads_first else (x.transpose(1, 2), out.transpose(1, 2))
            rotary_kernel(*_halves(xk, layout), cos.narrow(0, offset, n), sin.narrow(0, offset, n),
                          *_halves(ok, layout), grid=grid, backend=backend, **cfg)
            return out
    _check(x, cos, sin, layout, offset, heads_first)
    if inplace and out is not None:
        raise ArgumentError("rotary: pass either inplace=True or out=, not both")
    if inplace:
        out = x
    elif out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ArgumentError(f"rotary: 'out' must be {tuple(x.shape)} {x.dtype} on {x.device}, got "
                            f"{tuple(out.shape)} {out.dtype} on {out.device}")
    else:
        check_no_overlap("rotary", {"out": out}, {"x": x, "cos": cos, "sin": sin})
    xv, ov = (x, out) if heads_first else (x.transpose(1, 2), out.transpose(1, 2))   # views [B, H, N, D]
    B, H, N, D = xv.shape
    flags = {"HALF": D // 2, "INVERSE": bool(inverse)}
    c, s = cos.narrow(0, offset, N), sin.narrow(0, offset, N)
    args = (*_halves(xv, layout), c, s, *_halves(ov, layout))

    def launch(cfg):
        cfg = {**DEFAULT_CONFIG, **cfg, **flags}
        views = args
        if cfg["HEADS"]:                    # [B, N, H, HALF]: a tile's rows are heads at one position
            xh, oh = (x.transpose(1, 2), out.transpose(1, 2)) if heads_first else (x, out)
            views = (*_halves(xh, layout), c, s, *_halves(oh, layout))
        grid = (hk.cdiv(N, cfg["BN"]), hk.cdiv(H, cfg["BH"]), B)
        rotary_kernel(*views, grid=grid, backend=backend, **cfg)
        return grid, cfg

    if config:
        launch(config)
        return out
    # the backend's choice (tuned per shape bucket where HK_AUTOTUNE is on), then the plan of a fresh call
    config = rotary_kernel.choose_config(
        lambda: candidates(flags, args), *args, backend=backend, launch=launch,
        bucket=hk.shape_bucket(B, H, N, D), key=(H, D, tuple(flags.items())))
    grid, cfg = launch(config)
    if fresh:
        _PLANS.put(key, (cfg["HEADS"], grid, cfg))
    return out


_PLANS = hk.CallPlans()     # rotary's configuration and grid (and which view it launches on) per call signature


def tables(n_positions: int, dim: int, base: float = 10000.0, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The usual cos/sin tables: angle(n, i) = n · base^(−2i/dim), in float64 then rounded to f32."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.arange(n_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return ang.cos().float().to(device), ang.sin().float().to(device)


def reference(x, cos, sin, layout="neox", offset=0, heads_first=False, inverse=False):
    """float64 math."""
    xd = x.double() if heads_first else x.double().transpose(1, 2)
    N = xd.shape[2]
    c, s = cos[offset:offset + N].double(), sin[offset:offset + N].double()
    s = -s if inverse else s
    x1, x2 = _halves(xd, layout)
    y = torch.empty_like(xd)
    y1, y2 = _halves(y, layout)
    y1.copy_(x1 * c - x2 * s)
    y2.copy_(x2 * c + x1 * s)
    return y if heads_first else y.transpose(1, 2)


def example_args(device="cpu", B=2, N=100, H=3, D=64, dtype=torch.bfloat16):
    x = torch.randn(B, H, N, D, device=device, dtype=dtype)
    cos, sin = tables(N, D, device=device)
    y = torch.empty_like(x)
    h = D // 2
    return (x[..., :h], x[..., h:], cos, sin, y[..., :h], y[..., h:]), {**DEFAULT_CONFIG, "HALF": h, "INVERSE": False}
