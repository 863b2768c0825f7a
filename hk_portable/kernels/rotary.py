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
from hk_portable.interface import GL, RT, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

LAYOUTS = ("neox", "gptj")
DEFAULT_CONFIG = dict(BN=32)


@hk.kernel(num_warps=4)
def rotary_kernel(x1: GL[4], x2: GL[4], cos: GL[2], sin: GL[2], y1: GL[4], y2: GL[4], *,
                  HALF: hk.const = 32, BN: hk.const = 32, INVERSE: hk.const = False):
    n, h, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    a = hk.load(RT[f32, BN, HALF], x1, (b, h, n, 0))
    c = hk.load(RT[f32, BN, HALF], x2, (b, h, n, 0))
    cs = hk.load(RT[f32, BN, HALF], cos, (n, 0))
    sn = hk.load(RT[f32, BN, HALF], sin, (n, 0))
    if INVERSE:
        sn = -sn
    hk.store(y1, (a * cs - c * sn).to(y1.dtype), (b, h, n, 0))
    hk.store(y2, (c * cs + a * sn).to(y2.dtype), (b, h, n, 0))


def _halves(t: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    half = t.shape[-1] // 2
    if layout == "neox":
        return t[..., :half], t[..., half:]
    return t[..., 0::2], t[..., 1::2]


def _check(x, cos, sin, layout, offset, heads_first):
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ArgumentError(f"rotary: 'x' must be a 4-D tensor [B, N, H, D] ([B, H, N, D] with heads_first=True), "
                            f"got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ArgumentError(f"rotary: 'x' must be bfloat16, float16 or float32, got {x.dtype}")
    if layout not in LAYOUTS:
        raise ArgumentError(f"rotary: layout must be one of {LAYOUTS}, got {layout!r}")
    D = x.shape[-1]
    if D % 2 or D // 2 not in (16, 32, 64, 128):
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
    cfg = {**DEFAULT_CONFIG, **config, "HALF": D // 2, "INVERSE": bool(inverse)}
    c, s = cos[offset:offset + N], sin[offset:offset + N]
    grid = (hk.cdiv(N, cfg["BN"]), H, B)
    rotary_kernel(*_halves(xv, layout), c, s, *_halves(ov, layout), grid=grid, backend=backend, **cfg)
    return out


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
    return (x[..., :h], x[..., h:], cos, sin, y[..., :h], y[..., h:]), {**DEFAULT_CONFIG, "HALF": h}
