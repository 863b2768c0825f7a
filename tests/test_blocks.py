"""hk_portable.nn.blocks.LlamaBlock: the hk block and its plain-torch twin compute the same function (one
state_dict for both), in training, prefill and token-by-token decode against a KV cache."""
from __future__ import annotations

import pytest
import torch

from hk_portable.nn.blocks import LlamaBlock

bf16 = torch.bfloat16


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _pair(seed=0, **kw):
    torch.manual_seed(seed)
    ours = LlamaBlock(256, 4, 2, 192, impl="hk", max_positions=64, **kw).to(bf16)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    theirs = LlamaBlock(256, 4, 2, 192, impl="torch", max_positions=64, **kw).to(bf16)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def test_forward_and_gradients_match_the_torch_block():
    ours, theirs = _pair()
    assert ours.cos.dtype == torch.float32            # the rotary tables stay f32 under .to(bf16)
    x = torch.randn(2, 24, 256, dtype=bf16)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ys = [ours(xs[0]), theirs(xs[1])]
    assert _rel(ys[0], ys[1]) < 2e-2
    g = torch.randn_like(ys[0])
    for y in ys:
        y.backward(g)
    assert _rel(xs[0].grad, xs[1].grad) < 3e-2
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert _rel(p.grad, q.grad) < 3e-2, name


def test_decode_token_by_token_matches_the_forward():
    ours, theirs = _pair(1)
    x = torch.randn(2, 8, 256, dtype=bf16)
    with torch.no_grad():
        for block in (ours, theirs):
            full = block(x)
            cache = block.new_cache(2, 16, dtype=bf16)
            steps = torch.cat([block.decode(x[:, i:i + 1], cache, i) for i in range(8)], dim=1)
            assert _rel(steps, full) < 2e-2, block.impl


def test_impl_is_checked():
    with pytest.raises(ValueError, match="impl must be one of"):
        LlamaBlock(64, 4, 2, 96, impl="jax")
