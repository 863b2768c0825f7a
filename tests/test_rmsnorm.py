"""RMSNorm through the fused dropout+residual kernel: against torch's own F.rms_norm in float64, with and
without bias and dropout (the mask regenerated from the seed, as the backward will), and its argument errors."""
from __future__ import annotations

import pytest
import torch

from hk_portable.interface import ArgumentError
from hk_portable.kernels.layernorm import dropout_residual_layernorm, dropout_residual_rmsnorm, reference


def _t(shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_plain_rmsnorm_matches_torch():
    x, w = _t((37, 300)), _t((300,), torch.float32, 1)
    y, h = dropout_residual_rmsnorm(x, torch.zeros_like(x), w, eps=1e-6)
    expect = torch.nn.functional.rms_norm(x.double(), (300,), w.double(), eps=1e-6)
    assert torch.equal(h, x)
    assert (y.double() - expect).abs().max() <= 2 * 2.0 ** -8 * expect.abs().max()


@pytest.mark.parametrize("with_bias", [False, True])
def test_dropout_residual_rmsnorm_matches_float64(with_bias):
    x, r, w = _t((20, 513)), _t((20, 513), seed=2), _t((513,), torch.float32, 3)
    b = _t((513,), torch.float32, 4) if with_bias else None
    y, h = dropout_residual_rmsnorm(x, r, w, b, p=0.2, seed=99, offset=7)
    y_ref, h_ref = reference(x, r, w, b, p=0.2, seed=99, offset=7, eps=1e-6, rms=True)
    assert (h.double() - h_ref).abs().max() <= 2.0 ** -7 * h_ref.abs().max()
    assert (y.double() - y_ref).abs().max() <= 2.0 ** -6 * y_ref.abs().max()


def test_layernorm_takes_no_bias():
    x, r, w = _t((9, 128)), _t((9, 128), seed=5), _t((128,), torch.float32, 6)
    y, _ = dropout_residual_layernorm(x, r, w, None)
    y_ref, _ = reference(x, r, w, None)
    assert (y.double() - y_ref).abs().max() <= 2.0 ** -6 * y_ref.abs().max()


def test_errors_name_the_rmsnorm_entry_point():
    x = _t((4, 64))
    with pytest.raises(ArgumentError, match=r"dropout_residual_rmsnorm: 'weight' must have shape \(64,\)"):
        dropout_residual_rmsnorm(x, x.clone(), torch.ones(63))
    with pytest.raises(ArgumentError, match=r"dropout_residual_rmsnorm: 'seed' must be an int in \[0, 2\*\*64\)"):
        dropout_residual_rmsnorm(x, x.clone(), torch.ones(64), seed=-1)


@pytest.mark.parametrize("backend", ["reference", "cuda:sm_80:emulated", "hip:gfx942:emulated"])
def test_a_norm_without_residual_reads_none_and_writes_no_h(backend, request):
    """residual=None: the kernel reads no residual (RESIDUAL=False); with p = 0 it writes no h either
    (STORE_H=False) and h is x itself; with dropout h is written. Both against float64 math, one-pass and
    swept shapes, poisoned outputs."""
    from hk_portable.kernels.layernorm import dropout_residual_layernorm, reference
    if backend.startswith("hip"):
        request.getfixturevalue("hip_emulator")
    torch.manual_seed(7)
    for d in (300, 4100):
        x = torch.randn(5, d).to(torch.bfloat16)
        w, b = torch.randn(d), torch.randn(d)
        for rms, p in ((True, 0.0), (False, 0.0), (True, 0.25)):
            fn = dropout_residual_rmsnorm if rms else dropout_residual_layernorm
            out = torch.full_like(x, float("nan"))
            y, h = fn(x, None, w, None if rms else b, p=p, seed=3, eps=1e-6, out=out, backend=backend)
            y_ref, h_ref = reference(x, None, w, None if rms else b, p=p, seed=3, eps=1e-6, rms=rms)
            assert y is out and not y.isnan().any()
            assert (y.double() - y_ref).abs().max() < 2e-2 * y_ref.abs().max(), (d, rms, p)
            if p == 0:
                assert h is x
            else:
                assert (h.double() - h_ref).abs().max() <= 1e-2 * h_ref.abs().max()


def test_a_repeat_call_still_checks_what_its_plan_does_not_hold():
    """_fused memoises its checks and configuration per shapes/dtypes/flags: a repeat call with a bad p or eps, or
    a weight of another shape, is still refused with the argument named."""
    x, w = torch.randn(4, 64).to(torch.bfloat16), torch.ones(64)
    for _ in range(2):
        dropout_residual_rmsnorm(x, None, w, p=0.1, seed=1)
    with pytest.raises(ArgumentError, match="'p' must be in"):
        dropout_residual_rmsnorm(x, None, w, p=1.5)
    with pytest.raises(ArgumentError, match="'eps' must be finite"):
        dropout_residual_rmsnorm(x, None, w, p=0.1, eps=0.0)
    with pytest.raises(ArgumentError, match=r"'weight' must have shape \(64,\)"):
        dropout_residual_rmsnorm(x, None, torch.ones(63), p=0.1)
