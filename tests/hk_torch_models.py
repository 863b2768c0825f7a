"""Shared by the torch-integration tests (CPU and GPU): a tiny transformer built twice, on hk modules and on
plain torch with the same parameter names (one state dict loads into both), its loss, training step and
20-step loss curve with the curves' tolerance, and a random transformers Llama pair (hk and SDPA
attention) with its inputs. Everything takes a device, so a GPU test runs the code a CPU test runs."""
from __future__ import annotations

import math

import torch
from torch import nn

import hk_portable.nn as hnn
from hk_portable.kernels.rotary import reference as rotary_reference, tables

VOCAB, DIM, HEADS, KV_HEADS, HIDDEN = 64, 128, 2, 1, 128     # head dim 64


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


def tokens(batch=2, n=16, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, n + 1), generator=g).to(device)


def loss(model, batch):
    """Next-token cross-entropy (in f32) of batch [B, n + 1]."""
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def training_step(model, opt, batch):
    """Forward, backward and the optimizer step; returns the loss as a tensor (no host sync, so that a CUDA
    graph can capture the step). Gradients accumulate: set them to None before, as the caller chooses."""
    value = loss(model, batch)
    value.backward()
    opt.step()
    return value.detach()


def train(model, steps=20, device="cpu"):
    """`steps` AdamW steps on one batch (it learns fast: the curve is steep); the losses, float64."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = tokens(batch=4, n=16, seed=2, device=device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        losses.append(training_step(model, opt, batch).item())
    return torch.tensor(losses, dtype=torch.float64)


def assert_follows_curve(ours, theirs):
    """bf16 weights on both sides: the curves may differ by bf16 rounding (the GEMM bound's 1 ulp, 2^-7 and
    the softmax's), accumulated over 20 steps; measured 0.3 % at most on the reference backend."""
    assert theirs[-1] < theirs[0] / 10                     # it learns (the comparison means something)
    assert ((ours - theirs).abs() <= 2 ** -6 * theirs + 2 ** -10).all(), (ours, theirs)


# ------------------------------------------------------------------------ transformers Llama (GQA, random)
LLAMA_VOCAB = 96
LLAMA_LOGITS_TOL = 2 ** -5          # max |hk - sdpa| / max |sdpa| of bf16 logits


def llama(attn_implementation, device="cpu"):
    """A randomly initialised 2-layer GQA Llama in bf16 (no weights downloaded), in eval mode."""
    import transformers
    config = transformers.LlamaConfig(vocab_size=LLAMA_VOCAB, hidden_size=128, intermediate_size=192,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      head_dim=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device, torch.bfloat16)
    model.config._attn_implementation = attn_implementation
    return model.eval()


def llama_pair(device="cpu"):
    """(hk model, SDPA model) with the same weights; registers hk's attention implementation."""
    from hk_portable.nn.huggingface import register
    register()
    hk_model, sdpa_model = llama("hk", device), llama("sdpa", device)
    sdpa_model.load_state_dict(hk_model.state_dict())
    return hk_model, sdpa_model


def llama_ids(device="cpu"):
    """[2, 12] token ids with no pad, bos or eos id among them."""
    return torch.randint(3, LLAMA_VOCAB, (2, 12), generator=torch.Generator().manual_seed(1)).to(device)


def llama_logits_error(hk_model, sdpa_model, ids):
    with torch.no_grad():
        ours, theirs = hk_model(ids).logits.float(), sdpa_model(ids).logits.float()
    return float((ours - theirs).abs().max() / theirs.abs().max())


def spy_hk_attention(monkeypatch):
    """A list that collects (query length, key length) of every hk attention call transformers makes, with
    "decode" for hk::attention_kvcache's calls and ("varlen", window) for hk::attention_varlen's (padding)."""
    from hk_portable.nn import huggingface
    shapes, attention, decode, varlen = [], huggingface.F.attention, huggingface.decode, huggingface._varlen
    monkeypatch.setattr(huggingface.F, "attention",
                        lambda q, k, v, **kw: shapes.append((q.shape[2], k.shape[2])) or attention(q, k, v, **kw))
    monkeypatch.setattr(huggingface, "decode", lambda q, k, v, s, **kw: shapes.append((q.shape[2], k.shape[2], "decode"))
                        or decode(q, k, v, s, **kw))
    monkeypatch.setattr(huggingface, "_varlen", lambda q, k, v, mask, s, **kw: shapes.append(
        (q.shape[2], k.shape[2], "varlen", mask.window)) or varlen(q, k, v, mask, s, **kw))
    return shapes


def llama_greedy(model, ids, new_tokens=6):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)


def llama_train(model, ids, steps=4):
    """`steps` AdamW steps through autograd (hk attention's backward included); the losses."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        value = model(ids, labels=ids).loss
        opt.zero_grad()
        value.backward()
        opt.step()
        losses.append(value.item())
    return losses


# ------------------------------------- transformers Qwen2 (GQA, a full and a sliding-window layer, random)
QWEN_WINDOW = 8                     # short enough that the prompts and the second turn run past it


def qwen2(attn_implementation, device="cpu", dtype=torch.float16, window=QWEN_WINDOW):
    """A randomly initialised 2-layer GQA Qwen2, layer 0 full attention and layer 1 a sliding window of `window`
    keys (no weights downloaded), in eval mode. f16 by default: greedy generation is compared token for token,
    and bf16's 8-bit mantissa puts near-ties of a random model's logits within reach of the two implementations'
    rounding (measured: one token of 40 flipped in a second turn on bf16, none on f16)."""
    import transformers
    config = transformers.Qwen2Config(vocab_size=LLAMA_VOCAB, hidden_size=128, intermediate_size=192,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=64, use_sliding_window=window is not None,
                                      sliding_window=window, max_window_layers=1)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(device, dtype)
    model.config._attn_implementation = attn_implementation
    return model.eval()


def qwen2_pair(device="cpu", **kw):
    """(hk model, SDPA model) with the same weights; registers hk's attention implementation."""
    from hk_portable.nn.huggingface import register
    register()
    hk_model, sdpa_model = qwen2("hk", device, **kw), qwen2("sdpa", device, **kw)
    sdpa_model.load_state_dict(hk_model.state_dict())
    return hk_model, sdpa_model


def padded_batch(lengths=(12, 9, 5, 11), side="left", device="cpu"):
    """(ids, attention mask) [4, 12]: sequences of `lengths` valid tokens padded with id 0 on `side`."""
    n = max(lengths)
    ids = torch.randint(3, LLAMA_VOCAB, (len(lengths), n), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(len(lengths), n, dtype=torch.long)
    for b, length in enumerate(lengths):
        pad = slice(0, n - length) if side == "left" else slice(length, n)
        ids[b, pad], mask[b, pad] = 0, 0
    return ids.to(device), mask.to(device)


def chat(model, ids, mask, chunk=7, new_tokens=6, turn_tokens=5, static=False, **generate):
    """A two-turn chat on one KV cache (a DynamicCache, or a StaticCache of 32 positions with `static`): the prompt
    prefilled in two chunks (`chunk` tokens, then the rest as a continuation of the cache), `new_tokens` greedy
    tokens, then `turn_tokens` more user tokens appended and generated from on the same cache. Returns (first
    turn's sequences, second turn's)."""
    from transformers import DynamicCache, StaticCache
    B = ids.shape[0]
    more = torch.randint(3, LLAMA_VOCAB, (B, turn_tokens), generator=torch.Generator().manual_seed(2)).to(ids.device)
    cache = StaticCache(config=model.config, max_cache_len=32) if static else DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :chunk], attention_mask=mask[:, :chunk], past_key_values=cache, use_cache=True)
        first = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=new_tokens,
                               do_sample=False, pad_token_id=0, **generate)
        ids2 = torch.cat([first, more], 1)
        mask2 = torch.cat([mask, mask.new_ones(B, ids2.shape[1] - mask.shape[1])], 1)
        second = model.generate(ids2, attention_mask=mask2, past_key_values=cache, max_new_tokens=new_tokens,
                                do_sample=False, pad_token_id=0, **generate)
    return first, second
