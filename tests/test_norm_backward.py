"""Normalisation backward (kernels/layernorm_bwd.py): gradients of the library's forward (h from
dropout_residual_layernorm / _rmsnorm) against float64 torch autograd of the same math (layernorm.reference,
whose dropout mask is the interface's Philox definition), judged by the tolerance table's layernorm_bwd bounds;
LayerNorm and RMSNorm, bias or not, p = 0 and p > 0, bf16/f16/f32, ragged rows and d_model not a power of two;
outputs poisoned with NaN; bitwise-equal reruns; argument errors that name the argument; the emulated gfx942."""
from __future__ import annotations

import pytest
import torch

from hk_portable.conformance.cases import Check
from hk_portable.conformance.kernel_cases import norm_bwd_math
from hk_portable.conformance.runner import judge
from hk_portable.conformance.tolerances import bound_for
from hk_portable.interface import ArgumentError
from hk_portable.kernels import layernorm, layernorm_bwd

SEED, OFFSET, EPS = 0xFEEDFACECAFE, 2**32 - 77, 1e-5
NAMES = ("dx", "dresidual", "dweight", "dbias")
DTYPE_NAME = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _inputs(rows, d, dtype, seed, with_bias, with_dh):
    g = torch.Generator().manual_seed(seed)
    x, r, dy = (torch.randn(rows, d, generator=g).to(dtype) for _ in range(3))
    w = 0.5 + torch.rand(d, generator=g)
    b = torch.randn(d, generator=g) if with_bias else None
    dh = torch.randn(rows, d, generator=g).to(dtype) if with_dh else None
    return x, r, w, b, dy, dh


def _poisoned(rows, d, dtype, with_bias):
    nan = float("nan")
    outs = dict(dx=torch.full((rows, d), nan, dtype=dtype), dresidual=torch.full((rows, d), nan, dtype=dtype),
                dweight=torch.full((d,), nan))
    return {**outs, "dbias": torch.full((d,), nan)} if with_bias else outs


def _forward_and_backward(rms, x, r, w, b, dy, dh, p, backend=None):
    fwd = layernorm.dropout_residual_rmsnorm if rms else layernorm.dropout_residual_layernorm
    bwd = layernorm_bwd.dropout_residual_rmsnorm_bwd if rms else layernorm_bwd.dropout_residual_layernorm_bwd
    _, h = fwd(x, r, w, b, p=p, seed=SEED, offset=OFFSET, eps=EPS)
    outs = _poisoned(*x.shape, x.dtype, b is not None)
    got = bwd(dy, h, w, b, dh=dh, p=p, seed=SEED, offset=OFFSET, eps=EPS, backend=backend, **outs)
    assert all(g is outs[n] for g, n in zip(got, NAMES) if g is not None), "the given outputs are written"
    return h, got


def _float64_autograd(rms, x, r, w, b, dy, dh, p):
    """d/d(x, residual, weight, bias) of <y, dy> + <h, dh> through layernorm.reference in float64."""
    leaves = [t.double().requires_grad_() for t in (x, r, w)] + ([b.double().requires_grad_()] if b is not None else [])
    y, h = layernorm.reference(*leaves[:3], leaves[3] if b is not None else None, p=p, seed=SEED, offset=OFFSET,
                               eps=EPS, rms=rms)
    loss = (y * dy.double()).sum() + ((h * dh.double()).sum() if dh is not None else 0.0)
    loss.backward()
    return {name: t.grad for name, t in zip(NAMES, leaves)}, h.detach()


def _check(rms, x, r, w, b, dy, dh, p, h, got):
    """(1) The table's math at the exact h equals float64 autograd through the forward; (2) each gradient is
    within its norm_bwd bound of that math at the h the backward was given (the forward's, rounded)."""
    ref, h64 = _float64_autograd(rms, x, r, w, b, dy, dh, p)
    exact, _ = norm_bwd_math(h64, dy, dh, w, b is not None, rms, p, SEED, OFFSET, EPS)
    for name in ref:
        assert torch.allclose(exact[name][0], ref[name], rtol=1e-9, atol=1e-12), f"{name}: the table's math"
    at_h, keep = norm_bwd_math(h, dy, dh, w, b is not None, rms, p, SEED, OFFSET, EPS)
    dt = DTYPE_NAME[x.dtype]
    d = x.shape[1]
    bounds = {"dx": ("layernorm_bwd.dh", dt, d), "dresidual": ("layernorm_bwd.dh", dt, d),
              "dweight": ("layernorm_bwd.dweight", "f32", x.shape[0] + d), "dbias": ("layernorm_bwd.dbias", "f32", x.shape[0])}
    for name, out in zip(NAMES, got):
        if out is None:
            assert b is None and name == "dbias"
            continue
        value, magnitude = at_h[name]
        kind, dtype, k = bounds[name]
        res = judge(Check(name, name, value, bound_for(kind, dtype), scale=magnitude, k=k), out)
        assert res.passed, f"{name}: {res.detail} (error {res.max_error:.3g}, bound {res.bound:.3g})"
    if p > 0:
        assert not got[0][~keep].any() and got[0][~keep].numel() > 0, "dropped elements get exactly 0"
    else:
        assert torch.equal(got[0], got[1]), "without dropout dx is dresidual"


# (rms, rows, d, p, bias, dh): ragged rows (not a multiple of the 64-row block), d not a power of two
CONFIGS = [(False, 45, 200, 0.0, True, False), (False, 33, 1000, 0.2, False, True), (False, 70, 96, 0.5, True, True),
           (True, 45, 200, 0.0, False, False), (True, 33, 1000, 0.2, True, True), (True, 70, 96, 0.5, False, True)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=DTYPE_NAME.get)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "{}_{}x{}_p{}_bias{}_dh{}".format(
    "rms" if c[0] else "ln", *c[1:]))
def test_gradients_match_float64_autograd(config, dtype):
    rms, rows, d, p, with_bias, with_dh = config
    x, r, w, b, dy, dh = _inputs(rows, d, dtype, rows * d, with_bias, with_dh)
    h, got = _forward_and_backward(rms, x, r, w, b, dy, dh, p)
    assert got[0].dtype == got[1].dtype == dtype and got[2].dtype == torch.float32
    _check(rms, x, r, w, b, dy, dh, p, h, got)


def test_reruns_are_bitwise_equal():
    x, r, w, b, dy, dh = _inputs(1100, 96, torch.bfloat16, 3, True, True)       # 18 row blocks: 2 reduction tiles
    first = _forward_and_backward(False, x, r, w, b, dy, dh, 0.3)[1]
    second = _forward_and_backward(False, x, r, w, b, dy, dh, 0.3)[1]
    for a, c in zip(first, second):
        assert torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                           c.view(torch.int16 if c.element_size() == 2 else torch.int32))


def test_parameter_gradients_in_the_parameters_dtypes():
    x, r, _, _, dy, _ = _inputs(9, 64, torch.bfloat16, 4, False, False)
    w, b = torch.rand(64).to(torch.bfloat16) + 0.5, torch.randn(64).to(torch.float16)
    _, h = layernorm.dropout_residual_layernorm(x, r, w, b)
    dx, dres, dw, db = layernorm_bwd.dropout_residual_layernorm_bwd(dy, h, w, b)
    assert (dw.dtype, db.dtype) == (torch.bfloat16, torch.float16)
    ref, _ = _float64_autograd(False, x, r, w, b, dy, None, 0.0)
    assert (db.double() - ref["dbias"]).abs().max() <= 2.0 ** -9 * ref["dbias"].abs().max()


def _args():
    x = torch.randn(4, 64)
    return dict(dy=x.clone(), h=x.clone(), weight=torch.ones(64), bias=None)


@pytest.mark.parametrize("change, match", [
    (dict(h=torch.randn(4, 64, 2)), r"layernorm_bwd: 'h' must be a 2-D bf16, f16 or f32 tensor"),
    (dict(h=torch.randn(4, 64, dtype=torch.float64)), r"layernorm_bwd: 'h' must be a 2-D"),
    (dict(dy=torch.randn(4, 63)), r"layernorm_bwd: 'dy' must be a bf16, f16 or f32 tensor of h's shape \(4, 64\)"),
    (dict(dh=torch.randn(5, 64)), r"layernorm_bwd: 'dh' must be .* of h's shape \(4, 64\), got \(5, 64\)"),
    (dict(weight=torch.ones(63)), r"layernorm_bwd: 'weight' must be a bf16, f16 or f32 tensor of shape \(64,\)"),
    (dict(bias=torch.ones(64, dtype=torch.float64)), r"layernorm_bwd: 'bias' must be .* shape \(64,\)"),
    (dict(p=1.0), r"layernorm_bwd: 'p' must be in \[0, 1\), got 1.0"),
    (dict(eps=0.0), r"layernorm_bwd: 'eps' must be > 0"),
    (dict(seed=-1), r"layernorm_bwd: 'seed' must be an int in \[0, 2\*\*64\)"),
    (dict(offset=2**64), r"layernorm_bwd: 'offset' must be an int in \[0, 2\*\*64\)"),
    (dict(dx=torch.empty(4, 65)), r"layernorm_bwd: 'dx' must be a bf16, f16 or f32 tensor of shape \(4, 64\)"),
    (dict(dweight=torch.empty(64, dtype=torch.int32)), r"layernorm_bwd: 'dweight' must be .* shape \(64,\)"),
])
def test_bad_input_is_named(change, match):
    a = {**_args(), **change}
    with pytest.raises(ArgumentError, match=r"dropout_residual_" + match):
        layernorm_bwd.dropout_residual_layernorm_bwd(a.pop("dy"), a.pop("h"), a.pop("weight"), a.pop("bias"), **a)
    with pytest.raises(ArgumentError, match=r"dropout_residual_rms" + match.replace("layernorm_bwd", "norm_bwd", 1)):
        a = {**_args(), **change}
        layernorm_bwd.dropout_residual_rmsnorm_bwd(a.pop("dy"), a.pop("h"), a.pop("weight"), a.pop("bias"), **a)


def test_an_output_overlapping_an_input_is_named():
    a = _args()
    with pytest.raises(ArgumentError, match="dropout_residual_layernorm_bwd: output 'dx' overlaps argument 'dy'"):
        layernorm_bwd.dropout_residual_layernorm_bwd(a["dy"], a["h"], a["weight"], None, dx=a["dy"])


# ------------------------------------------------------------------------------- the emulated gfx942
EMULATED = "hip:gfx942:emulated"


# the default run takes the layernorm with every option; the plain rmsnorm is `slow` (tests/hip/test_conformance_emulated
# runs kernel/layernorm_bwd's rms case on both archs by default)
@pytest.mark.parametrize("config", [(False, 33, 160, 0.25, True, True),
                                    pytest.param((True, 20, 96, 0.0, False, False), marks=pytest.mark.slow)],
                         ids=["ln_ragged_dropout_bias_dh", "rms_plain"])
def test_on_emulated_gfx942(config):
    from hk_portable.backends.hip import emulator
    ok, why = emulator.available()
    if not ok:
        pytest.skip(f"hip emulator unavailable: {why}")
    rms, rows, d, p, with_bias, with_dh = config
    x, r, w, b, dy, dh = _inputs(rows, d, torch.bfloat16, 5, with_bias, with_dh)
    h, got = _forward_and_backward(rms, x, r, w, b, dy, dh, p, backend=EMULATED)
    _check(rms, x, r, w, b, dy, dh, p, h, got)
    reference = _forward_and_backward(rms, x, r, w, b, dy, dh, p, backend="reference")[1]
    for a, c in zip(got, reference):
        assert a is None and c is None or (a.double() - c.double()).abs().max() <= 2.0 ** -7 * c.abs().max()


@pytest.mark.parametrize("rms", [False, True])
def test_no_rows_give_zero_parameter_gradients(rms):
    h = torch.empty(0, 96, dtype=torch.bfloat16)
    w, b = torch.ones(96), torch.ones(96)
    bwd = layernorm_bwd.dropout_residual_rmsnorm_bwd if rms else layernorm_bwd.dropout_residual_layernorm_bwd
    dx, dres, dw, db = bwd(h, h, w, b, p=0.1, dweight=torch.full((96,), float("nan")),
                           dbias=torch.full((96,), float("nan")))
    assert dx.shape == dres.shape == (0, 96) and not dw.any() and not db.any()
