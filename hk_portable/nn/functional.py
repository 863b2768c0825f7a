"""Functional forms of the hk ops, with torch.nn.functional's argument conventions where one exists.

Inputs of any rank are flattened here to the kernels' forms (rows x features for the norms; hk::gemm takes
linear's leading dims itself), and the result is given back in the input's shape."""
from __future__ import annotations

import functools

import torch

import hk_portable as hk

from .. import torch_ops  # noqa: F401  (registers the hk:: ops)

__all__ = ["linear", "attention", "rotary", "layer_norm", "rms_norm", "dropout_residual_layer_norm",
           "dropout_residual_rms_norm"]


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """input @ weight.T (+ bias), as torch.nn.functional.linear; weight [out, in], bf16 or f16."""
    # weight.T as a strided view (the kernel takes strides); the op takes input's leading dims itself and
    # returns a fresh tensor, not a view (as torch's linear does: FSDP2 warns on a view)
    out = _GEMM(input, weight.t())
    return out if bias is None else out + bias


_GEMM = torch.ops.hk.gemm.default       # the overload itself: the packet's lookup costs a call


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, window=None,
              align: str | None = None, scale: float | None = None, softcap: float | None = None,
              sinks: torch.Tensor | None = None, return_lse: bool = False):
    """softmax(q kᵀ · scale [+ mask]) v, q [B, Hq, N, D] and k/v [B, Hkv, Nkv, D] as in
    torch.nn.functional.scaled_dot_product_attention (causal = its is_causal, top-left aligned); GQA when
    Hkv divides Hq. window=(left, right) keys around the diagonal (None or -1: unbounded); align
    "top_left" | "bottom_right" when N != Nkv with a mask. softcap=c > 0: each scaled logit s becomes
    c * tanh(s / c) before the mask (FlashAttention, Gemma 2). sinks: f32 [Hq], a logit per query head joining
    each row's softmax denominator (GPT-OSS); lse includes it, and autograd gives sinks a gradient. Returns o, or
    (o, lse) with return_lse."""
    win = None if window is None else [-1 if w is None else int(w) for w in window]
    if softcap is None and sinks is None:
        o, lse = torch.ops.hk.attention(q, k, v, causal, win, align, scale)
    else:
        o, lse = torch.ops.hk.attention(q, k, v, causal, win, align, scale, softcap=softcap, sinks=sinks)
    return (o, lse) if return_lse else o


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "neox", offset: int = 0,
           heads_first: bool = False, inverse: bool = False) -> torch.Tensor:
    """x [B, N, H, D] ([B, H, N, D] with heads_first) rotated by f32 tables [positions, D/2] from `offset`."""
    return torch.ops.hk.rotary(x, cos, sin, layout, offset, heads_first, inverse)


def _rows(x: torch.Tensor, normalized_shape) -> tuple[torch.Tensor, int]:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"normalized_shape {shape} must be the trailing dims of the input {tuple(x.shape)}")
    d = 1
    for s in shape:
        d *= s
    return (x if x.dim() == 2 and len(shape) == 1 else x.reshape(-1, d)), d


def _vector(t: torch.Tensor | None, d: int, like: torch.Tensor, fill: float | None) -> torch.Tensor | None:
    if t is None:
        return None if fill is None else _filled(d, fill, like.device, like.dtype)
    return t if t.dim() == 1 else t.reshape(d)


@functools.lru_cache(maxsize=64)
def _filled(d: int, fill: float, device, dtype) -> torch.Tensor:
    """A constant vector (the weight of a norm without one), made once per shape, device and dtype: the kernels only
    read it."""
    return hk.constant_table(torch.full((d,), fill, device=device, dtype=dtype))


def _shaped(y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return y if y.dim() == like.dim() else y.reshape(like.shape)


_EPS = {torch.float64: torch.finfo(torch.float64).eps}
_EPS_DEFAULT = torch.finfo(torch.float32).eps       # what torch's rms_norm computes bf16/f16/f32 in


def layer_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """As torch.nn.functional.layer_norm, over the trailing `normalized_shape` dims."""
    rows, d = _rows(input, normalized_shape)
    y, _ = torch.ops.hk.dropout_residual_layernorm(rows, None, _vector(weight, d, rows, 1.0),
                                                   _vector(bias, d, rows, None), 0.0, 0, 0, eps)
    return _shaped(y, input)


def rms_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """As torch.nn.functional.rms_norm. eps None: torch's default, the machine epsilon of the dtype the norm is
    computed in (f32 for bf16/f16/f32 inputs), not of the input's dtype (bf16's is 2^16 times larger)."""
    rows, d = _rows(input, normalized_shape)
    if eps is None:
        eps = _EPS.get(input.dtype, _EPS_DEFAULT)
    y, _ = _RMS_NORM(rows, None, _vector(weight, d, rows, 1.0), None, 0.0, 0, 0, eps)
    return _shaped(y, input)


_RMS_NORM = torch.ops.hk.rms_norm.default


def dropout_residual_layer_norm(x, residual, weight, bias=None, *, p: float = 0.0, seed: int = 0, offset: int = 0,
                                eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused kernel: (y, h) with h = dropout(x, p) + residual and y = layer_norm(h) over the last dim.
    The dropout mask is the interface's Philox4x32-10 mask of element index offset + row * d + col
    (docs/numerics.md): the same on every backend, and the backward regenerates it from the seed."""
    rows, d = _rows(x, x.shape[-1])
    y, h = torch.ops.hk.dropout_residual_layernorm(rows, residual.reshape(-1, d), weight, bias, p, seed, offset, eps)
    return y.reshape(x.shape), h.reshape(x.shape)


def dropout_residual_rms_norm(x, residual, weight, bias=None, *, p: float = 0.0, seed: int = 0, offset: int = 0,
                              eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """As dropout_residual_layer_norm with RMSNorm: (y, h)."""
    rows, d = _rows(x, x.shape[-1])
    y, h = torch.ops.hk.rms_norm(rows, residual.reshape(-1, d), weight, bias, p, seed, offset, eps)
    return y.reshape(x.shape), h.reshape(x.shape)
