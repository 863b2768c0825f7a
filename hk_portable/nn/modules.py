"""Drop-in modules on the hk ops. Parameters and their names follow torch.nn (state dicts load either way)."""
from __future__ import annotations

import torch
from torch import nn

from ..interface import ArgumentError
from ..kernels.attention import check_head_dim
from ..kernels.rotary import HEAD_DIMS as ROTARY_HEAD_DIMS, tables
from . import functional as F


def check_rotary_dim(fn: str, dim, what: str) -> None:
    """An ArgumentError naming `what` unless the rotary kernel takes head dim `dim`."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in ROTARY_HEAD_DIMS:
        raise ArgumentError(f"{fn}: {what} must be a rotary head dim, one of {ROTARY_HEAD_DIMS}, got {dim!r}")


def check_attention_dims(fn: str, head_dim: int, what: str, rotary: bool) -> None:
    """What a module built on hk attention checks at construction rather than at its first forward: the head dim
    (`what` says where it comes from) is one the attention kernels take, and with rotary one the rotary kernel
    takes too."""
    check_head_dim(fn, head_dim, f"the head dim ({what})")
    if rotary:
        check_rotary_dim(fn, head_dim, f"with rotary, the head dim ({what})")


class Linear(nn.Linear):
    """torch.nn.Linear whose product runs on the hk GEMM (bf16/f16 weights and inputs)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight, self.bias)


class LayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias) on the hk fused norm kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.RMSNorm):
    """torch.nn.RMSNorm(normalized_shape, eps, elementwise_affine) on the hk fused norm kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)


class Rotary(nn.Module):
    """Rotary position embedding with cached f32 tables (non-persistent buffers) for `max_positions`.
    forward(x, offset=0): x [B, N, H, D] ([B, H, N, D] with heads_first=True) at positions offset.."""

    def __init__(self, dim: int, max_positions: int = 2048, base: float = 10000.0, layout: str = "neox",
                 heads_first: bool = False, device=None):
        super().__init__()
        check_rotary_dim("hnn.Rotary", dim, "'dim'")
        self.dim, self.layout, self.heads_first = dim, layout, heads_first
        self.max_positions, self.base = max_positions, base
        cos, sin = tables(max_positions, dim, base, device=device or "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _apply(self, fn, *args, **kwargs):
        """Follow .to(device) but keep the tables f32 (the kernel's contract) under .to(dtype) / .half()."""
        super()._apply(fn, *args, **kwargs)
        if self.cos.dtype != torch.float32:
            self.cos, self.sin = tables(self.max_positions, self.dim, self.base, device=self.cos.device)
        return self

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return F.rotary(x, self.cos, self.sin, layout=self.layout, offset=offset, heads_first=self.heads_first)


class Attention(nn.Module):
    """Multi-head self-attention: x [B, N, embed_dim] -> q/k/v projections (num_kv_heads < num_heads: GQA),
    optional rotary on q and k, hk attention (causal by default), output projection."""

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int | None = None, *, bias: bool = False,
                 causal: bool = True, rotary: bool = False, max_positions: int = 2048, rotary_base: float = 10000.0,
                 device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_kv_heads or num_heads
        if embed_dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be a multiple of num_heads ({num_heads}), and num_heads "
                             f"of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.causal = num_heads, num_kv_heads, causal
        self.head_dim = embed_dim // num_heads
        check_attention_dims("hnn.Attention", self.head_dim, f"embed_dim / num_heads = {embed_dim} / {num_heads}",
                             rotary)
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.q_proj = Linear(embed_dim, num_heads * self.head_dim, **kw)
        self.k_proj = Linear(embed_dim, num_kv_heads * self.head_dim, **kw)
        self.v_proj = Linear(embed_dim, num_kv_heads * self.head_dim, **kw)
        self.o_proj = Linear(num_heads * self.head_dim, embed_dim, **kw)
        self.rotary = Rotary(self.head_dim, max_positions, rotary_base, device=device) if rotary else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        q = self.q_proj(x).view(B, N, self.num_heads, self.head_dim)       # [B, N, H, D]: rotary's layout
        k = self.k_proj(x).view(B, N, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, N, self.num_kv_heads, self.head_dim)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        o = F.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=self.causal)
        return self.o_proj(o.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim))
