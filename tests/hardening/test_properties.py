"""Property-based tests (issue 14, item 4, the library-kernel half): random shapes, strided views (transposed,
sliced, expanded), dtypes and configurations of every library kernel on the reference backend against float64
math, with the conformance suite's tolerance table; outputs poisoned with NaN.

Profiles: "ci" (the default; a few minutes at most) and "long" (HK_HYPOTHESIS_PROFILE=long). Seeds are fresh
each run; a failure prints the falsifying example and a @reproduce_failure blob, and
`pytest --hypothesis-seed=N` replays a run. The random-Program half of item 4 is not built yet."""
from __future__ import annotations

import math
import os

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from hk_portable.conformance.cases import f64, rand_float  # noqa: E402
from hk_portable.conformance.kernel_cases import attention_math, layernorm_math, rotary_math  # noqa: E402
from hk_portable.conformance.tolerances import Bound, bound_for  # noqa: E402
from hk_portable.kernels.attention import attention_fwd  # noqa: E402
from hk_portable.kernels.gemm import gemm  # noqa: E402
from hk_portable.kernels.layernorm import dropout_residual_layernorm  # noqa: E402
from hk_portable.kernels.rotary import rotary  # noqa: E402

_COMMON = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=40, **_COMMON)
settings.register_profile("long", max_examples=300, **_COMMON)
PROFILE = settings.get_profile(os.environ.get("HK_HYPOTHESIS_PROFILE", "ci"))

TORCH = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
REF = "reference"


def assert_within(name: str, out, ref, bound: Bound, scale, k: int = 0):
    """Every element within the conformance bound: |out - ref| <= abs + rel_total(k) * scale."""
    out = f64(out)
    assert not torch.isnan(out).any(), f"{name}: NaN left in the output (an element was never written)"
    err = (out - ref).abs()
    limit = bound.abs + bound.rel_total(k) * scale
    bad = err > limit
    assert not bad.any(), (f"{name}: {int(bad.sum())} of {out.numel()} elements out of bound; worst error "
                           f"{float((err - limit).max()):.3g} past the limit ({bound.reason})")


def _layout(base: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values as `base`, laid out as `kind`: contiguous, transposed storage, or a slice of a larger
    tensor (padding between rows, every other column)."""
    if kind == "contiguous":
        return base.clone()
    if kind == "transposed":                      # stored transposed, viewed back: strides reversed
        return base.transpose(-1, -2).contiguous().transpose(-1, -2)
    big = torch.full((*base.shape[:-1], base.shape[-1] * 2 + 3), float("nan"), dtype=base.dtype)
    view = big[..., 1:1 + 2 * base.shape[-1]:2]     # column stride 2, row stride 2n + 3, offset 1
    view.copy_(base)
    return view


LAYOUTS = st.sampled_from(["contiguous", "transposed", "sliced"])


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------- gemm
@PROFILE
@given(m=st.integers(1, 80), n=st.integers(1, 80), k=st.integers(1, 80), dtype=st.sampled_from(["bf16", "f16"]),
       out_same=st.booleans(), a_layout=LAYOUTS, b_layout=LAYOUTS, seed=st.integers(0, 2**31 - 1))
def test_gemm_any_shape_and_layout(m, n, k, dtype, out_same, a_layout, b_layout, seed):
    g = _gen(seed)
    a = _layout(rand_float(g, (m, k), dtype, 0.1, 2.0), a_layout)
    b = _layout(rand_float(g, (k, n), dtype, 0.1, 2.0), b_layout)
    out_dtype = dtype if out_same else "f32"
    out = torch.full((m, n), float("nan"), dtype=TORCH[out_dtype])
    gemm(a, b, out, backend=REF)
    assert_within("gemm", out, f64(a) @ f64(b), bound_for("gemm", out_dtype), f64(a).abs() @ f64(b).abs(), k=k)


# -------------------------------------------------------------------------------------------- rotary
@PROFILE
@given(b=st.integers(1, 2), n=st.integers(1, 40), h=st.integers(1, 3), d=st.sampled_from([32, 64, 128]),
       dtype=st.sampled_from(["bf16", "f16", "f32"]), layout=st.sampled_from(["neox", "gptj"]),
       heads_first=st.booleans(), inverse=st.booleans(), offset=st.integers(0, 9), sliced=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_rotary_any_shape_and_layout(b, n, h, d, dtype, layout, heads_first, inverse, offset, sliced, seed):
    g = _gen(seed)
    shape = (b, h, n, d) if heads_first else (b, n, h, d)
    x = rand_float(g, shape, dtype, 0.05, 3.0)
    if sliced:                                    # heads interleaved with other data: a strided head axis
        big = torch.full((*shape[:2], shape[2] * 2, d), float("nan"), dtype=x.dtype)
        big[:, :, ::2] = x
        x = big[:, :, ::2]
    ang = rand_float(g, (n + offset, d // 2), "f32", 0.0, 6.0)
    cos, sin = ang.double().cos().float(), ang.double().sin().float()
    out = torch.full(shape, float("nan"), dtype=TORCH[dtype])
    rotary(x, cos, sin, layout=layout, offset=offset, heads_first=heads_first, inverse=inverse, out=out, backend=REF)
    ref, scale = rotary_math(x, cos, sin, layout, heads_first, inverse, offset)
    assert_within("rotary", out, ref, bound_for("rotary", dtype), scale)


# ----------------------------------------------------------------------------------------- layernorm
@PROFILE
@given(rows=st.integers(1, 40), d=st.integers(1, 300), dtype=st.sampled_from(["bf16", "f16", "f32"]),
       p=st.sampled_from([0.0, 0.1, 0.5]), x_layout=st.sampled_from(["contiguous", "sliced"]),
       residual_expanded=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_layernorm_any_shape_and_layout(rows, d, dtype, p, x_layout, residual_expanded, seed):
    g = _gen(seed)
    x = _layout(rand_float(g, (rows, d), dtype, 0.05, 3.0), x_layout)
    residual = rand_float(g, (1 if residual_expanded else rows, d), dtype, 0.05, 3.0).expand(rows, d)
    weight, bias = rand_float(g, (d,), "f32", 0.5, 1.5), rand_float(g, (d,), "f32", 0.05, 0.5)
    seed_, offset, eps = seed, 3 * seed % 1000, 1e-5
    y = torch.full((rows, d), float("nan"), dtype=TORCH[dtype])
    h = torch.full((rows, d), float("nan"), dtype=TORCH[dtype])
    dropout_residual_layernorm(x, residual, weight, bias, p=p, seed=seed_, offset=offset, eps=eps, out=y, h_out=h,
                               backend=REF)
    y_val, h_val, _, y_scale, h_scale = layernorm_math(x, residual, weight, bias, p, seed_, offset, eps)
    assert_within("layernorm.h", h, h_val, bound_for("dropout_residual_layernorm.h", dtype), h_scale)
    assert_within("layernorm.y", y, y_val, bound_for("dropout_residual_layernorm.y", dtype), y_scale, k=d)


# ----------------------------------------------------------------------------------------- attention
@PROFILE
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), group=st.integers(1, 2), n=st.integers(1, 70),
       nkv=st.integers(1, 70), d=st.sampled_from([64, 128]), dtype=st.sampled_from(["bf16", "f16"]),
       causal=st.booleans(), bnhd=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_attention_any_shape_and_layout(b, hkv, group, n, nkv, d, dtype, causal, bnhd, seed):
    g = _gen(seed)
    hq = hkv * group

    def make(h, length):
        t = rand_float(g, (b, h, length, d), dtype, 0.05, 2.0)
        # [B, N, H, D] storage viewed as [B, H, N, D] (the layout most models keep): a strided head axis
        return t.transpose(1, 2).contiguous().transpose(1, 2) if bnhd else t

    q, k, v = make(hq, n), make(hkv, nkv), make(hkv, nkv)
    align = "bottom_right" if causal and n != nkv else None
    scale = 1.0 / math.sqrt(d)
    o = torch.full((b, hq, n, d), float("nan"), dtype=TORCH[dtype])
    lse = torch.full((b, hq, n), float("nan"))
    attention_fwd(q, k, v, causal=causal, align=align, scale=scale, out=o, lse=lse, backend=REF)
    o_val, lse_val, o_scale = attention_math(q, k, v, causal, scale, None, align)
    seen = torch.isfinite(lse_val)                  # rows that see no key: o = 0, lse = -inf
    assert torch.equal(torch.isfinite(lse), seen)
    assert_within("attention.o", o, o_val, bound_for("attention_fwd.o", dtype), o_scale)
    assert_within("attention.lse", lse[seen], lse_val[seen], bound_for("attention_fwd.lse", "f32"),
                  lse_val[seen].abs(), k=nkv)
