"""A tiny transformer built twice: on hk modules, and on plain torch with the same parameter names, so that
one state dict loads into both (for the torch-integration tests)."""
from __future__ import annotations

import math

import torch
from torch import nn

import hk_portable.nn as hnn
from hk_portable.kernels.rotary import reference as rotary_reference, tables

VOCAB, DIM, HEADS, KV_HEADS, HIDDEN = 64, 128, 2, 1, 128     # head dim 64 (the kernels take 64 or 128)


class TorchAttention(nn.Module):
    """The same computation as hnn.Attention (GQA, neox rotary, causal) in plain torch."""

    def __init__(self, dim, heads, kv_heads, rotary=True):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.rotary = rotary

    def _rotate(self, x):                                     # x [B, N, H, D]
        cos, sin = tables(x.shape[1], self.head_dim, device=x.device)
        half = self.head_dim // 2
        c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def forward(self, x):
        B, N, _ = x.shape
        q = self.q_proj(x).view(B, N, self.heads, self.head_dim)
        k = self.k_proj(x).view(B, N, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, N, self.kv_heads, self.head_dim)
        if self.rotary:
            q, k = self._rotate(q), self._rotate(k)
        o = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       is_causal=True, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, N, -1))


class Block(nn.Module):
    """x + attn(norm(x)), then h + mlp(norm(h)); the MLP is two linears with a SiLU."""

    def __init__(self, hk: bool):
        super().__init__()
        Norm = hnn.RMSNorm if hk else nn.RMSNorm
        Linear = hnn.Linear if hk else nn.Linear
        self.attn_norm, self.mlp_norm = Norm(DIM, eps=1e-6), Norm(DIM, eps=1e-6)
        self.attn = (hnn.Attention(DIM, HEADS, KV_HEADS, rotary=True, max_positions=64) if hk
                     else TorchAttention(DIM, HEADS, KV_HEADS))
        self.up, self.down = Linear(DIM, HIDDEN, bias=False), Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        h = x + self.attn(self.attn_norm(x))
        return h + self.down(nn.functional.silu(self.up(self.mlp_norm(h))))


class TinyLM(nn.Module):
    def __init__(self, hk: bool, layers: int = 1):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(hk) for _ in range(layers))
        self.norm = (hnn.RMSNorm if hk else nn.RMSNorm)(DIM, eps=1e-6)
        self.head = (hnn.Linear if hk else nn.Linear)(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def twins(layers: int = 1, dtype=torch.bfloat16, seed: int = 0):
    """(hk model, torch model) with the same weights, in `dtype`."""
    torch.manual_seed(seed)
    hk_model = TinyLM(True, layers).to(dtype)
    torch_model = TinyLM(False, layers).to(dtype)
    torch_model.load_state_dict(hk_model.state_dict())
    return hk_model, torch_model


def tokens(batch=2, n=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, n + 1), generator=g)
