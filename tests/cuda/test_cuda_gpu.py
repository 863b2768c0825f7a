"""The cuda backend on a real NVIDIA GPU: CUDA graph capture and replay, ordering on non-default torch
streams, argument errors, ragged and strided shapes, and conformance cases. On a machine without a
usable GPU every test here skips with the backend's own reason."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, ArgumentError, f32

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    be = hk.get_backend("cuda")
    st = be.status()
    if not st.available:
        pytest.skip(f"cuda backend unusable here: {st.reason}")
    return be


@hk.kernel(num_warps=4)
def axpb(x: GL[2], y: GL[2], a: float, b: float, *, BM: hk.const = 64, BN: hk.const = 64):
    m, n = hk.block_idx(0), hk.block_idx(1)
    hk.store(y, hk.load(RT[f32, BM, BN], x, (m, n)) * a + b, (m, n))


def _axpb(x, y, a=2.0, b=1.0, **kw):
    axpb(x, y, a, b, grid=(hk.cdiv(x.shape[0], 64), hk.cdiv(x.shape[1], 64)), backend="cuda", **kw)


def _gemm_error(out, a, b):
    """max |out - a@b| / (2u (K+1) (|a|@|b|)): at most 1 when within the mma tolerance."""
    ref = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    bound = 2 * 2.0**-24 * (a.shape[1] + 1) * scale + 1e-30
    return float(((out.double() - ref).abs() / bound).max())


def test_graph_capture_replays_with_new_inputs(cuda):
    from hk_portable.kernels.gemm import gemm
    a = torch.randn(200, 96, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(96, 130, device="cuda", dtype=torch.bfloat16)
    out = torch.full((200, 130), float("nan"), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                     # warm up: trace, compile, load outside the capture
        gemm(a, b, out, backend="cuda")
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemm(a, b, out, backend="cuda")
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        err = _gemm_error(out, a, b)
        assert err <= 1.0, f"replayed graph: error {err} x the bound"


def test_ordering_on_a_non_default_stream(cuda):
    """Producer (torch) -> hk kernel -> consumer (torch), all queued on one side stream with no syncs;
    a long torch op first, so a kernel not ordered on the stream would read stale data."""
    n = 4096
    x = torch.zeros(n, n, device="cuda")
    y = torch.full((n, n), float("nan"), device="cuda")
    big = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(4):
            big = big @ big * 1e-3                  # keeps the stream busy for a while
        x.copy_(big.abs() + 1.0)                    # the producer the kernel must wait for
        _axpb(x, y)                                  # runs on s: torch's current stream here
        z = y.sum()                                  # the consumer
    s.synchronize()
    ref = (x.double() * 2 + 1).sum()
    assert torch.isfinite(z) and abs(float(z) - float(ref)) <= 1e-4 * abs(float(ref))
    # the explicit stream= argument orders the same way
    y2 = torch.full_like(y, float("nan"))          # on the default stream: s must wait for it (with the compiled
    s.wait_stream(torch.cuda.current_stream())      # launcher the kernel on s could overtake the fill, 2026-12-03)
    with torch.cuda.stream(s):
        x.mul_(3.0)
    _axpb(x, y2, stream=s)
    s.synchronize()
    assert torch.equal(y2, x * 2 + 1)


def test_strided_ragged_views_and_guards(cuda):
    base = torch.randn(300, 400, device="cuda")
    x = base[7:207:2, 5:290]                        # row stride 800, unaligned start, ragged in both dims
    buf = torch.full((120, 300), float("nan"), device="cuda")
    y = buf[:100, 3:288]
    _axpb(x, y, 0.5, -2.0)
    torch.cuda.synchronize()
    assert torch.equal(y, x * 0.5 - 2.0)
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[:100, 3:288] = False
    assert bool(torch.isnan(buf[outside]).all()), "the kernel wrote outside its output view"


def test_argument_errors_name_the_argument(cuda):
    x = torch.randn(64, 64, device="cuda")
    with pytest.raises(ArgumentError, match="'y'"):
        _axpb(x, torch.empty(64, 64))               # a CPU tensor next to a CUDA one
    with pytest.raises(ArgumentError, match="65535"):
        axpb(x, x.clone(), 1.0, 0.0, grid=(1, 70000), backend="cuda")


def test_repeated_launches_are_deterministic(cuda):
    from hk_portable.kernels.attention import attention_fwd
    q = torch.randn(2, 4, 333, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 333, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 333, 64, device="cuda", dtype=torch.bfloat16)
    o1, l1 = attention_fwd(q, k, v, causal=True, backend="cuda")
    o2, l2 = attention_fwd(q, k, v, causal=True, backend="cuda")
    torch.cuda.synchronize()
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


@pytest.mark.parametrize("pattern", ["op/mma/*", "op/reduce/*", "op/cast/*", "kernel/*"])
def test_conformance_cases_on_cuda(cuda, pattern):
    """A slice of the suite here; `hk conformance --backend cuda` runs all of it."""
    from hk_portable.conformance import runner
    res = runner.run("cuda", patterns=pattern, seed=1)
    failed = [f"{r.id}: {r.reason}" for r in res.results if r.status == runner.FAILED]
    assert res.results and not failed, "\n".join(failed[:10])


@pytest.mark.parametrize("fmt_b,rowwise,b_colmajor", [("e4m3", False, True), ("e5m2", True, True),
                                                       ("e4m3", False, False)])
def test_gemm_fp8_on_cuda_matches_float64_and_scaled_mm(cuda, fmt_b, rowwise, b_colmajor):
    """The fp8 GEMM at a size that takes the sm_90a wgmma k32 path (b column-major) or the mma.sync one
    (row-major b): within the bf16 output's rounding of float64, and of torch._scaled_mm (the oracle)."""
    from hk_portable.kernels.gemm_fp8 import gemm_fp8, reference
    fb = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt_b]
    M, N, K = 1000, 784, 1056          # N: a multiple of 16 (torch._scaled_mm), not of the 128-wide tiles
    a = (torch.randn(M, K, device="cuda") * 2).to(torch.float8_e4m3fn)
    bt = (torch.randn(N, K, device="cuda") * 2).to(fb)
    b = bt.t() if b_colmajor else bt.t().contiguous()
    sa = torch.rand(M if rowwise else 1, device="cuda") + 0.5
    sb = torch.rand(N if rowwise else 1, device="cuda") + 0.5
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_fp8(a, b, sa, sb, out, backend="cuda")
    ref = reference(a, b, sa, sb)
    scale = (a.double().abs() @ b.double().abs()) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    # bf16 output rounding plus the fp8 sum bound (tolerances.FP8_SUM: sm_90a's fp8 tensor cores sum with ~14 bits)
    bound = 2.0**-8 * ref.abs() + 2.0**-18 * K * scale + 1e-30
    assert float(((out.double() - ref).abs() / bound).max()) <= 1
    if b_colmajor and not rowwise:
        theirs = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        assert float((out.double() - theirs.double()).abs().max()) <= 2.0**-7 * float(ref.abs().max())
