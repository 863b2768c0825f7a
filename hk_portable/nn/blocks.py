"""A Llama-style decoder block, once on hk_portable.nn and once in plain torch, with the same parameter names, so
that one state_dict loads into both: what `hk bench`'s block family times side by side, and a model to copy.

    x = x + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n), causal))   n = attn_norm(x)
    x = x + down_proj(silu(gate_proj(m)) * up_proj(m))                               m = mlp_norm(x)

impl="hk": hnn.Linear / hnn.RMSNorm (the second norm fused with the residual add: one kernel gives x and m),
hk rotary and hk attention (the KV cache's decode through hk::attention_kvcache). impl="torch": nn.Linear,
nn.RMSNorm, RoPE as torch element-wise ops (rotate-half, as Llama's reference code), SDPA (cuDNN / flash) with
GQA. The MLP's SiLU and product are torch element-wise ops in both."""
from __future__ import annotations

import torch
import torch.nn.functional as TF
from torch import nn

from . import functional as F
from .modules import Linear, RMSNorm, check_attention_dims
from ..kernels.rotary import tables

IMPLS = ("hk", "torch")


class LlamaBlock(nn.Module):
    def __init__(self, dim: int = 2048, num_heads: int = 16, num_kv_heads: int = 4, ffn_dim: int = 5632, *,
                 impl: str = "hk", max_positions: int = 4096, eps: float = 1e-5, rope_base: float = 10000.0,
                 device=None, dtype=None):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"LlamaBlock: impl must be one of {IMPLS}, got {impl!r}")
        if dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"LlamaBlock: dim ({dim}) must be a multiple of num_heads ({num_heads}), and num_heads "
                             f"of num_kv_heads ({num_kv_heads})")
        self.impl, self.heads, self.kv_heads, self.head_dim = impl, num_heads, num_kv_heads, dim // num_heads
        if impl == "hk":            # hk attention and rotary: refused here rather than at the first forward
            check_attention_dims("LlamaBlock", self.head_dim, f"dim / num_heads = {dim} / {num_heads}", rotary=True)
        lin = Linear if impl == "hk" else nn.Linear
        norm = RMSNorm if impl == "hk" else nn.RMSNorm
        kw = dict(bias=False, device=device, dtype=dtype)
        self.attn_norm = norm(dim, eps=eps, device=device, dtype=dtype)
        self.q_proj = lin(dim, num_heads * self.head_dim, **kw)
        self.k_proj = lin(dim, num_kv_heads * self.head_dim, **kw)
        self.v_proj = lin(dim, num_kv_heads * self.head_dim, **kw)
        self.o_proj = lin(num_heads * self.head_dim, dim, **kw)
        self.mlp_norm = norm(dim, eps=eps, device=device, dtype=dtype)
        self.gate_proj = lin(dim, ffn_dim, **kw)
        self.up_proj = lin(dim, ffn_dim, **kw)
        self.down_proj = lin(ffn_dim, dim, **kw)
        cos, sin = tables(max_positions, self.head_dim, rope_base, device=device or "cpu")
        self.register_buffer("cos", cos, persistent=False)       # f32 [positions, head_dim / 2]
        self.register_buffer("sin", sin, persistent=False)

    def _apply(self, fn, *args, **kwargs):
        """Keep the rotary tables f32 under .to(dtype), as hnn.Rotary does."""
        cos, sin = self.cos, self.sin
        super()._apply(fn, *args, **kwargs)
        if self.cos.dtype != torch.float32:
            self.cos, self.sin = cos.to(self.cos.device), sin.to(self.sin.device)
        return self

    # ------------------------------------------------------------------------------------------- pieces
    def _rope(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        """x [B, N, H, D] rotated at positions offset.. (NeoX / rotate-half pairing in both impls)."""
        if self.impl == "hk":
            return F.rotary(x, self.cos, self.sin, offset=offset)
        n, half = x.shape[1], x.shape[-1] // 2
        cos = self.cos[offset:offset + n].view(1, n, 1, half)
        sin = self.sin[offset:offset + n].view(1, n, 1, half)
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def _qkv(self, n: torch.Tensor, offset: int):
        B, N, _ = n.shape
        q = self._rope(self.q_proj(n).view(B, N, self.heads, self.head_dim), offset)
        k = self._rope(self.k_proj(n).view(B, N, self.kv_heads, self.head_dim), offset)
        return q, k, self.v_proj(n).view(B, N, self.kv_heads, self.head_dim)

    def _mlp_residual(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x + attn, then that + mlp(mlp_norm(that))."""
        if self.impl == "hk":       # one kernel: h = attn + x and m = rms_norm(h)
            m, h = F.dropout_residual_rms_norm(attn, x, self.mlp_norm.weight, eps=self.mlp_norm.eps)
        else:
            h = x + attn
            m = self.mlp_norm(h)
        return h + self.down_proj(TF.silu(self.gate_proj(m)) * self.up_proj(m))

    # ------------------------------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Training and prefill: x [B, N, dim], causal self-attention over N."""
        B, N, E = x.shape
        q, k, v = self._qkv(self.attn_norm(x), 0)
        if self.impl == "hk":       # [B, H, N, D] views of [B, N, H, D]: o comes back in q's layout, so no copy
            o = F.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        else:
            o = TF.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                is_causal=True, enable_gqa=True)
        return self._mlp_residual(x, self.o_proj(o.transpose(1, 2).reshape(B, N, E)))

    def new_cache(self, batch: int, length: int, *, device=None, dtype=None):
        """An empty KV cache for decode(): (k, v), [B, length, Hkv, D] for hk (its cache layout), [B, Hkv, length, D]
        for torch (what SDPA reads)."""
        shape = ((batch, length, self.kv_heads, self.head_dim) if self.impl == "hk"
                 else (batch, self.kv_heads, length, self.head_dim))
        return torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype)

    def decode(self, x: torch.Tensor, cache, pos: int) -> torch.Tensor:
        """One token per sequence: x [B, 1, dim] at position `pos`; its k, v written into the cache at pos, and
        attention over positions 0..pos."""
        B, _, E = x.shape
        k_cache, v_cache = cache
        q, k, v = self._qkv(self.attn_norm(x), pos)
        if self.impl == "hk":
            k_cache[:, pos] = k[:, 0]
            v_cache[:, pos] = v[:, 0]
            seqlens = torch.full((B,), pos + 1, device=x.device, dtype=torch.int32)
            o, _ = torch.ops.hk.attention_kvcache(q, k_cache, v_cache, seqlens)      # [B, 1, H, D]
        else:
            k_cache[:, :, pos] = k[:, 0]
            v_cache[:, :, pos] = v[:, 0]
            o = TF.scaled_dot_product_attention(q.transpose(1, 2), k_cache[:, :, :pos + 1], v_cache[:, :, :pos + 1],
                                                enable_gqa=True).transpose(1, 2)
        return self._mlp_residual(x, self.o_proj(o.reshape(B, 1, E)))
