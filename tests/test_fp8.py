"""FP8 as (format, target) pairs: every code of both OCP formats through an mma on every target that runs
here (reference, the cuda emulator's sm_80 widening, the hip emulator's gfx942 FNUZ mapping and widening,
gfx950's native OCP), the premise of gfx942's mapping checked against torch's FNUZ dtypes, gemm_fp8's
errors and its torch op. Conformance holds the random-value cases (op/mma/*/fp8*, kernel/gemm_fp8/*)."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable import torch_ops  # noqa: F401 - registers hk::gemm_fp8
from hk_portable.conformance.op_cases import _mma_kernel
from hk_portable.interface import ArgumentError
from hk_portable.kernels.gemm_fp8 import candidates, gemm_fp8, gemm_fp8_kernel, reference

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
ONE = {"e4m3": 0x38, "e5m2": 0x3C}


def _emulated(spec: str):
    """Skip unless the backend of `spec` runs on this machine."""
    if spec == "reference":
        return
    be = hk.get_backend(spec.split(":")[0])
    target = be.target(spec.split(":")[1], emulated=True)
    if not target.has("run"):
        pytest.skip(f"{spec} cannot run here")


TARGETS = ["reference", "cuda:sm_80:emulated", "hip:gfx942:emulated", "hip:gfx950:emulated"]


def _all_codes_matrix(fmt: str) -> torch.Tensor:
    """The 256 codes of a format as rows 0..7 of a 32 x 32 operand (rows 8.. zero)."""
    codes = torch.zeros(32, 32, dtype=torch.uint8)
    codes[:8] = torch.arange(256, dtype=torch.uint8).view(8, 32)
    return codes.view(FORMATS[fmt])


def _identity(fmt: str) -> torch.Tensor:
    return (torch.eye(32, dtype=torch.uint8) * ONE[fmt]).view(FORMATS[fmt])


@pytest.mark.parametrize("fmt_a,fmt_b", [("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2")])
@pytest.mark.parametrize("spec", TARGETS)
def test_every_code_through_an_mma_is_exact(spec, fmt_a, fmt_b):    # ~1 s each: all in the default run
    """A @ I with A holding every code: each finite code comes back as its exact value, NaN as NaN and
    (e5m2) infinities as IEEE arithmetic gives them, on gfx942 too (its e4m3 FNUZ mapping halves every
    value and remaps -0 and NaN; its e5m2 path widens, since FNUZ has no infinity)."""
    _emulated(spec)
    a, b = _all_codes_matrix(fmt_a), _identity(fmt_b)
    c = torch.zeros(32, 32)
    d = torch.full((32, 32), 12345.0)
    _mma_kernel(False, False, "st", "st")(a, b, c, d, grid=(1, 1), backend=spec)
    want = (a.double() @ b.double()).float()      # IEEE: inf * 0 is NaN, so rows holding inf are NaN elsewhere
    assert torch.equal(torch.isnan(d), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert torch.equal(d[finite], want[finite])


@pytest.mark.parametrize("spec", TARGETS)
def test_every_code_as_the_b_operand_is_exact(spec):
    """I @ B with B [K, N] holding every e4m3 code: B's K runs down its rows, so the hip backend stores it
    column-major, and on gfx942 as FNUZ codes, each element mapped as it is written (hk_hip shared_tiles.h,
    st<..., fnuz<colmajor>>::set) -- the path the every-code test above (codes in A, row-major chunks) does
    not take."""
    _emulated(spec)
    b = _all_codes_matrix("e4m3").view(torch.uint8).t().contiguous().view(FORMATS["e4m3"])   # codes in columns 0..7
    a = _identity("e4m3")
    d = torch.full((32, 32), 12345.0)
    _mma_kernel(False, False, "st", "st")(a, b, torch.zeros(32, 32), d, grid=(1, 1), backend=spec)
    want = (a.double() @ b.double()).float()
    assert torch.equal(torch.isnan(d), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert torch.equal(d[finite], want[finite])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_an_ocp_code_read_as_fnuz_is_half_its_value(fmt):
    """The premise of gfx942's mapping (hk_hip/instructions.h): apart from -0, NaN and (e5m2) infinities,
    every OCP code means half its OCP value in the FNUZ format of the same layout."""
    fnuz = getattr(torch, f"float8_{fmt}fnuz", None)
    if fnuz is None:
        pytest.skip("this torch has no FNUZ dtypes")
    codes = torch.arange(256, dtype=torch.uint8)
    ocp = codes.view(FORMATS[fmt]).double()
    as_fnuz = codes.view(fnuz).double()
    ordinary = torch.isfinite(ocp) & (codes != 0x80)
    assert torch.equal(as_fnuz[ordinary], ocp[ordinary] / 2)
    assert torch.isnan(as_fnuz[0x80])           # the code hk maps OCP NaNs onto; OCP -0 becomes 0x00


def test_gemm_fp8_matches_float64_with_rowwise_scales():
    g = torch.Generator().manual_seed(3)
    a = (torch.randn(70, 96, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(50, 96, generator=g) * 4).to(torch.float8_e5m2).t()
    sa, sb = torch.rand(70, generator=g) + 0.5, torch.rand(1, generator=g) + 0.5
    out = torch.full((70, 50), float("nan"))
    gemm_fp8(a, b, sa, sb, out)
    ref = reference(a, b, sa, sb)
    assert float((out.double() - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("fmt_a,fmt_b", [("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2")])
def test_every_code_through_gfx950s_f8f6f4_mma_is_exact(fmt_a, fmt_b):
    """A @ I at K = 128, gfx950's f8f6f4 16x16x128 form (the formats as cbsz / blgp, unit scales): every finite
    code of A comes back as its exact value, NaN as NaN, infinities as IEEE arithmetic gives them. Code c sits in
    row c // 32 (a row holding NaN or inf is NaN throughout, so those codes share two rows) and column
    4 * (c % 32) + (c // 32) % 4, so the codes reach all 128 k of the instruction's two runs a lane."""
    _emulated("hip:gfx950:emulated")
    a = torch.zeros(32, 128, dtype=torch.uint8)
    code = torch.arange(256)
    a[code // 32, 4 * (code % 32) + (code // 32) % 4] = code.to(torch.uint8)
    a = a.view(FORMATS[fmt_a])
    b = (torch.eye(128, dtype=torch.uint8) * ONE[fmt_b]).view(FORMATS[fmt_b])
    c = torch.zeros(32, 128)
    d = torch.full((32, 128), 12345.0)
    _mma_kernel(False, False, "st", "st")(a, b, c, d, grid=(1, 1), backend="hip:gfx950:emulated", BN=128, BK=128)
    want = (a.double() @ b.double()).float()
    assert torch.equal(torch.isnan(d), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert int(finite[:8].all(dim=1).sum()) == 6            # only the rows of NaN / inf codes (3 and 7) are NaN
    assert torch.equal(d[finite], want[finite])


@pytest.mark.parametrize("fmt_a,fmt_b", [("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2"), ("e5m2", "e4m3")])
def test_gemm_fp8_at_gfx950s_chosen_block_matches_float64(fmt_a, fmt_b):
    """The block a call on gfx950 takes, 128x128x128, whose mma K of 128 runs on the f8f6f4 16x16x128 MFMA
    (hk_hip/mma.h: formats by cbsz / blgp, unit scales), emulated against float64: ragged M and N, K over two
    whole tiles and a partial one. (The conformance runner's pinned backend does not forward choose_config,
    so its gemm_fp8 cases run the 64x64x64 baseline, whose K of 64 takes 16x16x32.)"""
    _emulated("hip:gfx950:emulated")
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(200, 320, generator=g) * 4).to(FORMATS[fmt_a])
    b = (torch.randn(136, 320, generator=g) * 4).to(FORMATS[fmt_b]).t()
    sa, sb = torch.rand(200, generator=g) + 0.5, torch.rand(136, generator=g) + 0.5
    out = torch.full((200, 136), float("nan"))
    cfg = gemm_fp8_kernel.choose_config(candidates({"B_NK": True}), a, b.t(), out, sa.reshape(200, 1).expand(200, 136),
                                        sb.reshape(1, 136).expand(200, 136), backend="hip:gfx950:emulated")
    assert (cfg["BM"], cfg["BN"], cfg["BK"]) == (128, 128, 128), cfg
    gemm_fp8(a, b, sa, sb, out, backend="hip:gfx950:emulated")
    ref = reference(a, b, sa, sb)
    assert float((out.double() - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("call,message", [
    (lambda a, b, s: gemm_fp8(a.to(torch.bfloat16), b, s, s), "'a' must be torch.float8_e4m3fn or"),
    (lambda a, b, s: gemm_fp8(a, b[:5], s, s), "a.shape[1] must equal b.shape[0]"),
    (lambda a, b, s: gemm_fp8(a, b, s.double(), s), "'scale_a' must be a float32 tensor"),
    (lambda a, b, s: gemm_fp8(a, b, s, torch.ones(3)), "'scale_b' must have 1 element (per tensor) or 24"),
    (lambda a, b, s: gemm_fp8(a, b, s, s, out_dtype=torch.int32), "'out_dtype' must be bfloat16"),
])
def test_gemm_fp8_names_the_bad_argument(call, message):
    a = torch.zeros(16, 32).to(torch.float8_e4m3fn)
    b = torch.zeros(32, 24).to(torch.float8_e4m3fn)
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        call(a, b, torch.ones(1))


def test_gemm_fp8_refuses_fnuz_tensors_with_the_reason():
    fnuz = getattr(torch, "float8_e4m3fnuz", None)
    if fnuz is None:
        pytest.skip("this torch has no FNUZ dtypes")
    a = torch.zeros(16, 32).to(fnuz)
    b = torch.zeros(32, 24).to(torch.float8_e4m3fn)
    with pytest.raises(ArgumentError, match="'a' is torch.float8_e4m3fnuz; hk_portable's fp8 formats are OCP"):
        gemm_fp8(a, b, torch.ones(1), torch.ones(1))


def test_gemm_fp8_op_fake_and_compile():
    """opcheck without its schema test: torch cannot compare fp8 CPU tensors (allclose has no fp8 kernel)."""
    a = (torch.randn(40, 64) * 2).to(torch.float8_e4m3fn)
    b = (torch.randn(24, 64) * 2).to(torch.float8_e5m2).t()
    sa, sb = torch.tensor([0.5]), torch.rand(24) + 0.5
    torch.library.opcheck(torch.ops.hk.gemm_fp8.default, (a, b, sa, sb),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    f = torch.compile(lambda x, y: torch.ops.hk.gemm_fp8(x, y, sa, sb, torch.float32), fullgraph=True,
                      backend="eager")
    assert torch.equal(f(a, b), torch.ops.hk.gemm_fp8(a, b, sa, sb, torch.float32))
