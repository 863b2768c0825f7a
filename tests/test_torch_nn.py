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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_norm_defaults_are_torchs_for_every_dtype(dtype):
    """Default eps where it decides the result (mean square ~1e-6): RMSNorm's None is the f32 epsilon torch
    computes in, not the input dtype's (bf16's differed from torch by up to 1.9); LayerNorm's 1e-5."""
    torch.manual_seed(4)
    x = (torch.randn(3, 5, 96) * 1e-3).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    for ours, theirs in ((hnn.RMSNorm(96), nn.RMSNorm(96)), (hnn.LayerNorm(96), nn.LayerNorm(96)),
                         (hnn.RMSNorm(96, elementwise_affine=False), nn.RMSNorm(96, elementwise_affine=False))):
        assert ours.eps == theirs.eps
        _close(ours.to(dtype)(x), theirs.to(dtype)(x), tol)


def test_empty_batch_and_empty_sum_give_what_torch_gives():
    """An MoE expert with no tokens ([0, K] input) gives [0, N]; K = 0 gives zeros, forward and backward."""
    lin = hnn.Linear(64, 32, bias=False, dtype=bf16)
    x = torch.randn(0, 64, dtype=bf16, requires_grad=True)
    y = lin(x)
    assert y.shape == (0, 32)
    y.sum().backward()
    assert x.grad.shape == (0, 64) and lin.weight.grad.abs().max() == 0
    a = torch.randn(5, 0, dtype=bf16, requires_grad=True)
    b = torch.randn(0, 7, dtype=bf16, requires_grad=True)
    c = torch.ops.hk.gemm(a, b)
    assert c.shape == (5, 7) and torch.equal(c, torch.zeros(5, 7, dtype=bf16))
    c.sum().backward()
    assert a.grad.shape == (5, 0) and b.grad.shape == (0, 7)
    assert torch.ops.hk.gemm(torch.randn(2, 0, 3, 64, dtype=bf16), torch.randn(64, 8, dtype=bf16)).shape == (2, 0, 3, 8)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_gemm_op_in_every_layout_and_linear_gradients_keep_the_weights_layout(layout):
    """torch.ops.hk.gemm on transposed views (the kernel's A_KM / B_NK forms) against float64; Linear's weight
    gradient comes back row-major as the weight (dCᵀ A, not a transposed view autograd would copy)."""
    torch.manual_seed(5)
    a = torch.randn(48, 40).to(bf16).t() if layout[0] == "t" else torch.randn(40, 48).to(bf16)
    b = torch.randn(24, 48).to(bf16).t() if layout[1] == "t" else torch.randn(48, 24).to(bf16)
    a.requires_grad_(), b.requires_grad_()
    c = torch.ops.hk.gemm(a, b)
    _close(c, a.double() @ b.double(), 2 ** -7)
    g = torch.randn_like(c)
    c.backward(g)
    _close(a.grad, g.double() @ b.double().t(), 2 ** -7)
    _close(b.grad, a.double().t() @ g.double(), 2 ** -7)
    lin = hnn.Linear(48, 24, bias=False, dtype=bf16)
    lin(torch.randn(2, 40, 48, dtype=bf16)).sum().backward()
    assert lin.weight.grad.is_contiguous()
