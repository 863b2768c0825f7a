"""Index math on views (issue 14, item 3, the CPU part): stride-0 (expanded) and padded-row inputs give the
float64 answer on the reference and the emulated gfx942 target. The GPU tests past 2**31 elements are not
here (they need an H200)."""
from __future__ import annotations

import pytest
import torch

from hk_portable.conformance.cases import f64, rand_float
from hk_portable.conformance.kernel_cases import attention_math, layernorm_math
from hk_portable.conformance.tolerances import bound_for
from hk_portable.interface import BackendError
from hk_portable.kernels.attention import attention_fwd
from hk_portable.kernels.gemm import gemm
from hk_portable.kernels.layernorm import dropout_residual_layernorm

BACKENDS = ["reference", "hip:gfx942:emulated"]


def _within(name, out, ref, bound, scale, k=0):
    out = f64(out)
    assert not torch.isnan(out).any(), f"{name}: an element was never written"
    bad = (out - ref).abs() > bound.abs + bound.rel_total(k) * scale
    assert not bad.any(), f"{name}: {int(bad.sum())} elements out of bound ({bound.reason})"


def _run(fn):
    try:
        return fn()
    except BackendError as e:
        pytest.skip(f"cannot run here: {e}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gemm_with_a_broadcast_row_and_padded_rows(backend):
    g = torch.Generator().manual_seed(1)
    a = rand_float(g, (1, 48), "bf16", 0.1, 2.0).expand(40, 48)          # every row the same storage
    big = rand_float(g, (48, 100), "bf16", 0.1, 2.0)
    b = big[:, 7:7 + 36]                                                  # row stride 100, offset 7
    out = torch.full((40, 36), float("nan"))
    _run(lambda: gemm(a, b, out, backend=backend))
    _within("gemm", out, f64(a) @ f64(b), bound_for("gemm", "f32"), f64(a).abs() @ f64(b).abs(), k=48)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layernorm_with_expanded_residual_and_weight(backend):
    g = torch.Generator().manual_seed(2)
    x = rand_float(g, (24, 80), "f32", 0.05, 3.0)
    residual = rand_float(g, (80,), "f32", 0.05, 3.0).expand(24, 80)
    weight = rand_float(g, (1,), "f32", 0.5, 1.5).expand(80)              # stride 0 along d_model
    bias = rand_float(g, (80,), "f32", 0.05, 0.5)
    y, h = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    _run(lambda: dropout_residual_layernorm(x, residual, weight, bias, p=0.1, seed=5, offset=9, out=y, h_out=h,
                                            backend=backend))
    y_val, h_val, _, y_scale, h_scale = layernorm_math(x, residual, weight, bias, 0.1, 5, 9, 1e-5)
    _within("h", h, h_val, bound_for("dropout_residual_layernorm.h", "f32"), h_scale)
    _within("y", y, y_val, bound_for("dropout_residual_layernorm.y", "f32"), y_scale, k=80)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_with_keys_shared_across_the_batch(backend):
    g = torch.Generator().manual_seed(3)
    q = rand_float(g, (3, 2, 20, 64), "bf16", 0.05, 2.0)
    k, v = (rand_float(g, (1, 1, 33, 64), "bf16", 0.05, 2.0).expand(3, 1, 33, 64) for _ in range(2))  # B, H stride 0
    o = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
    lse = torch.full((3, 2, 20), float("nan"))
    _run(lambda: attention_fwd(q, k, v, out=o, lse=lse, backend=backend))
    o_val, lse_val, o_scale = attention_math(q, k, v, False, 64 ** -0.5)
    _within("o", o, o_val, bound_for("attention_fwd.o", "bf16"), o_scale)
    _within("lse", lse, lse_val, bound_for("attention_fwd.lse", "f32"), lse_val.abs(), k=33)
