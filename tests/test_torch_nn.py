"""hk_portable.nn against its torch counterparts: same arguments, same results within the kernels' dtypes."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import hk_portable.nn as hnn
from hk_portable.nn import functional as F

bf16 = torch.bfloat16


def _close(got, want, rel):
    err = (got.double() - want.double()).abs().max() / want.double().abs().max()
    assert err < rel, f"relative error {err:.3g} >= {rel}"


def test_linear_matches_torch_on_3d_inputs():
    torch.manual_seed(0)
    ours = hnn.Linear(96, 80, bias=True, dtype=bf16)
    theirs = nn.Linear(96, 80, dtype=bf16)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 7, 96).to(bf16)
    y = ours(x)
    assert y.shape == (3, 7, 80) and y.dtype == bf16
    assert y._base is None                          # a fresh tensor as torch's (FSDP2 warns on a view output)
    _close(y, theirs(x), 2 ** -7)
    _close(ours(x[0, 0]), theirs(x[0, 0]), 2 ** -7)  # a 1-D input, as torch.nn.functional.linear takes


@pytest.mark.parametrize("shape", [(64,), (4, 32)])
def test_layer_norm_module_matches_torch(shape):
    torch.manual_seed(1)
    ours, theirs = hnn.LayerNorm(shape, eps=1e-5), nn.LayerNorm(shape, eps=1e-5)
    with torch.no_grad():
        ours.weight.normal_(), ours.bias.normal_()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, *shape)
    _close(ours(x), theirs(x), 1e-5)
    assert hnn.LayerNorm(shape, bias=False).bias is None
    _close(hnn.LayerNorm(shape, elementwise_affine=False)(x), nn.LayerNorm(shape, elementwise_affine=False)(x), 1e-5)


@pytest.mark.parametrize("eps", [None, 1e-6])
def test_rms_norm_module_matches_torch(eps):
    torch.manual_seed(2)
    ours, theirs = hnn.RMSNorm(128, eps=eps), nn.RMSNorm(128, eps=eps)
    with torch.no_grad():
        ours.weight.normal_()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 4, 128).to(bf16)
    _close(ours.to(bf16)(x), theirs.to(bf16)(x), 2 ** -7)
    _close(F.rms_norm(x.float(), (128,), eps=eps), nn.functional.rms_norm(x.float(), (128,), eps=eps), 1e-5)


def test_functional_attention_matches_sdpa_with_gqa():
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 4, 50, 64).to(bf16), torch.randn(2, 2, 50, 64).to(bf16), torch.randn(2, 2, 50, 64).to(bf16)
    for causal in (False, True):
        want = nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                          enable_gqa=True)
        _close(F.attention(q, k, v, causal=causal), want, 2e-2)
    o, lse = F.attention(q, k, v, window=(4, None), return_lse=True)
    assert o.shape == q.shape and lse.shape == (2, 4, 50) and lse.dtype == torch.float32


def test_rotary_module_keeps_f32_tables_and_matches_rotate_half():
    torch.manual_seed(4)
    rot = hnn.Rotary(64, max_positions=32).to(bf16)
    assert rot.cos.dtype == torch.float32 and "cos" not in rot.state_dict()
    x = torch.randn(2, 20, 3, 64)                       # [B, N, H, D]
    half = 32
    c, s = rot.cos[:20, None, :], rot.sin[:20, None, :]
    want = torch.cat([x[..., :half] * c - x[..., half:] * s, x[..., half:] * c + x[..., :half] * s], -1)
    _close(rot(x), want, 1e-6)
    _close(hnn.Rotary(64, heads_first=True)(x.transpose(1, 2)), want.transpose(1, 2), 1e-6)


def test_attention_module_matches_a_torch_twin():
    from hk_torch_models import TorchAttention
    torch.manual_seed(5)
    ours = hnn.Attention(128, 2, 1, rotary=True, max_positions=32).to(bf16)
    theirs = TorchAttention(128, 2, 1).to(bf16)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 24, 128).to(bf16)
    _close(ours(x), theirs(x), 3e-2)


def test_fused_dropout_residual_norm_returns_y_and_h():
    torch.manual_seed(6)
    x, r, w = torch.randn(2, 9, 64), torch.randn(2, 9, 64), torch.randn(64)
    y, h = F.dropout_residual_rms_norm(x, r, w, p=0.0)
    _close(h, x + r, 1e-6)
    _close(y, nn.functional.rms_norm(x + r, (64,), w, eps=1e-6), 1e-5)
    y, h = F.dropout_residual_layer_norm(x, r, w, p=0.5, seed=3)
    dropped = (h - r).abs() < 1e-6
    assert 0.3 < dropped.float().mean() < 0.7


def test_readme_torch_example_runs():
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("## Use in a torch model", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    scope = {"torch": torch, "x": torch.randn(2, 10, 128).to(bf16)}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["y"].shape == (2, 10, 128) and scope["y"].dtype == bf16
