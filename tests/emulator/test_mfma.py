"""Each MFMA variant, called through its real builtin name, against a float64 torch reference.

The operands are placed in lanes by the layouts AMD documents (AMD Matrix Instruction Calculator for
CDNA3; CDNA4 ISA guide for gfx950's 16x16x32 / 32x32x16), written here independently of the runtime:
  A[i][k] lives in lane i + M*(k // kp), slot k % kp      (kp = K*M/64 values per lane)
  B[k][j] lives in lane j + N*(k // kp), slot k % kp
  D[i][j], 16x16: lane j + 16*(i // 4), register i % 4
  D[i][j], 32x32: lane j + 32*((i // 4) % 2), register (i % 4) + 4*(i // 8)
"""
from __future__ import annotations

import pytest
import torch

from hk_portable.backends.hip import emulator

from emu_testutil import PRELUDE, needs_emulator, offline_compile, ziglang_available

pytestmark = needs_emulator

# name -> (builtin, M, N, K, operand C type, input kind, archs)
VARIANTS = {
    "16x16x16_bf16": ("__builtin_amdgcn_mfma_f32_16x16x16bf16_1k", 16, 16, 16, "short4_t", "bf16", ("gfx942", "gfx950")),
    "32x32x8_bf16": ("__builtin_amdgcn_mfma_f32_32x32x8bf16_1k", 32, 32, 8, "short4_t", "bf16", ("gfx942", "gfx950")),
    "16x16x16_f16": ("__builtin_amdgcn_mfma_f32_16x16x16f16", 16, 16, 16, "half4_t", "f16", ("gfx942", "gfx950")),
    "32x32x8_f16": ("__builtin_amdgcn_mfma_f32_32x32x8f16", 32, 32, 8, "half4_t", "f16", ("gfx942", "gfx950")),
    "16x16x32_bf16": ("__builtin_amdgcn_mfma_f32_16x16x32_bf16", 16, 16, 32, "bf16x8_t", "bf16", ("gfx950",)),
    "32x32x16_bf16": ("__builtin_amdgcn_mfma_f32_32x32x16_bf16", 32, 32, 16, "bf16x8_t", "bf16", ("gfx950",)),
    "16x16x32_f16": ("__builtin_amdgcn_mfma_f32_16x16x32_f16", 16, 16, 32, "half8_t", "f16", ("gfx950",)),
    "32x32x16_f16": ("__builtin_amdgcn_mfma_f32_32x32x16_f16", 32, 32, 16, "half8_t", "f16", ("gfx950",)),
    "16x16x32_fp8_fp8": ("__builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8", 16, 16, 32, "long", "fp8/fp8", ("gfx942", "gfx950")),
    "16x16x32_fp8_bf8": ("__builtin_amdgcn_mfma_f32_16x16x32_fp8_bf8", 16, 16, 32, "long", "fp8/bf8", ("gfx942", "gfx950")),
    "16x16x32_bf8_fp8": ("__builtin_amdgcn_mfma_f32_16x16x32_bf8_fp8", 16, 16, 32, "long", "bf8/fp8", ("gfx942", "gfx950")),
    "16x16x32_bf8_bf8": ("__builtin_amdgcn_mfma_f32_16x16x32_bf8_bf8", 16, 16, 32, "long", "bf8/bf8", ("gfx942", "gfx950")),
    "32x32x16_fp8_fp8": ("__builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8", 32, 32, 16, "long", "fp8/fp8", ("gfx942", "gfx950")),
    "32x32x16_bf8_bf8": ("__builtin_amdgcn_mfma_f32_32x32x16_bf8_bf8", 32, 32, 16, "long", "bf8/bf8", ("gfx942", "gfx950")),
    "16x16x4_f32": ("__builtin_amdgcn_mfma_f32_16x16x4f32", 16, 16, 4, "float", "f32", ("gfx942", "gfx950")),
    "32x32x2_f32": ("__builtin_amdgcn_mfma_f32_32x32x2f32", 32, 32, 2, "float", "f32", ("gfx942", "gfx950")),
    "16x16x32_i8": ("__builtin_amdgcn_mfma_i32_16x16x32_i8", 16, 16, 32, "long", "i8", ("gfx942", "gfx950")),
}
CASES = [(v, a) for v, spec in VARIANTS.items() for a in spec[6]]


def _deal(t, a_raw, b_raw, C, pa, pb, pc):
    """A [M, K], B [K, N] and C [M, N] into per-lane registers by a layout table (t["A"|"B"|"D"]: element ->
    (lane, slot))."""
    (M, K), N = a_raw.shape, b_raw.shape[1]
    for i in range(M):
        for k in range(K):
            ln, s = t["A"][i * K + k]
            pa[ln, s] = a_raw[i, k]
    for k in range(K):
        for j in range(N):
            ln, s = t["B"][k * N + j]
            pb[ln, s] = b_raw[k, j]
    for i in range(M):
        for j in range(N):
            ln, r = t["D"][i * N + j]
            pc[ln, r] = C[i, j]


def fp8_dtype(kind: str, arch: str) -> torch.dtype:
    """fp8 = e4m3, bf8 = e5m2; FNUZ encodings on gfx942 (CDNA3), OCP on gfx950 (CDNA4)."""
    if arch == "gfx942":
        return torch.float8_e4m3fnuz if kind == "fp8" else torch.float8_e5m2fnuz
    return torch.float8_e4m3fn if kind == "fp8" else torch.float8_e5m2


def random_operand(kind: str, shape, arch: str, gen: torch.Generator):
    """(raw element tensor as stored in registers, its float64 value)."""
    if kind == "bf16":
        x = torch.randn(shape, generator=gen).to(torch.bfloat16)
        return x.view(torch.int16), x.double()
    if kind == "f16":
        x = torch.randn(shape, generator=gen).to(torch.float16)
        return x.view(torch.int16), x.double()
    if kind == "f32":
        x = torch.randn(shape, generator=gen)
        return x, x.double()
    if kind == "i8":
        x = torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)
        return x, x.double()
    dt = fp8_dtype(kind, arch)
    x = (torch.randn(shape, generator=gen) * 4).to(dt)
    x = torch.where(torch.isfinite(x.float()), x.float(), torch.zeros(())).to(dt)   # no NaN codes
    return x.view(torch.uint8), x.float().double()


def pack_a(A, M, K, kp):
    """A (M x K) -> per-lane slots (64, kp): A[i][k] at lane i + M*(k // kp), slot k % kp."""
    P = torch.zeros((64, kp), dtype=A.dtype)
    for i in range(M):
        for k in range(K):
            P[i + M * (k // kp), k % kp] = A[i, k]
    return P


def pack_b(B, N, K, kp):
    """B (K x N) -> (64, kp): B[k][j] at lane j + N*(k // kp), slot k % kp."""
    P = torch.zeros((64, kp), dtype=B.dtype)
    for k in range(K):
        for j in range(N):
            P[j + N * (k // kp), k % kp] = B[k, j]
    return P


def d_lane_reg(M, i, j):
    if M == 16:
        return j + 16 * (i // 4), i % 4
    return j + 32 * ((i // 4) % 2), (i % 4) + 4 * (i // 8)


def pack_c(C, M, N):
    P = torch.zeros((64, M * N // 64), dtype=C.dtype)
    for i in range(M):
        for j in range(N):
            ln, r = d_lane_reg(M, i, j)
            P[ln, r] = C[i, j]
    return P


def unpack_d(P, M, N):
    D = torch.zeros((M, N), dtype=P.dtype)
    for i in range(M):
        for j in range(N):
            ln, r = d_lane_reg(M, i, j)
            D[i, j] = P[ln, r]
    return D


def kernel_source(builtin: str, atype: str, M: int, out_int: bool) -> str:
    ctype = ("int4_t" if M == 16 else "int16_t_") if out_int else ("float4_t" if M == 16 else "float16_t")
    return PRELUDE + f"""
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 64)))
void mfma_test(const {atype}* a, const {atype}* b, const {ctype}* c, {ctype}* d) {{
  unsigned l = tid();
  d[l] = {builtin}(a[l], b[l], c[l], 0, 0, 0);
}}
"""


@pytest.mark.parametrize("variant,arch", CASES, ids=[f"{v}-{a}" for v, a in CASES])
def test_mfma_matches_reference(variant, arch):
    builtin, M, N, K, atype, kind, _ = VARIANTS[variant]
    kp = K * M // 64
    ka, kb = (kind.split("/") + kind.split("/"))[:2] if "/" in kind else (kind, kind)
    gen = torch.Generator().manual_seed(hash((variant, arch)) & 0xFFFF)
    a_raw, a_val = random_operand(ka, (M, K), arch, gen)
    b_raw, b_val = random_operand(kb, (K, N), arch, gen)
    is_int = kind == "i8"
    if is_int:
        C = torch.randint(-1000, 1000, (M, N), generator=gen, dtype=torch.int32)
    else:
        C = torch.randn((M, N), generator=gen)
    pa, pb, pc = pack_a(a_raw, M, K, kp), pack_b(b_raw, N, K, kp), pack_c(C, M, N)
    d = torch.zeros_like(pc)
    mod = emulator.load(kernel_source(builtin, atype, M, is_int), arch, name=f"mfma_{variant}.hip")
    mod.launch("mfma_test", grid=1, block=64, args=[pa, pb, pc, d])
    D = unpack_d(d, M, N)
    ref = a_val @ b_val + C.double()
    if is_int:
        assert torch.equal(D, ref.to(torch.int64).to(torch.int32))
    else:
        torch.testing.assert_close(D, ref.float(), rtol=1e-6, atol=1e-6)


def test_mfma_accumulates_across_calls():
    """D of one MFMA fed as C of the next: K=32 as two 16x16x16 steps equals the 16x32 @ 32x16 product."""
    src = PRELUDE + """
extern "C" __global__ void two_steps(const short4_t* a0, const short4_t* b0, const short4_t* a1,
                                     const short4_t* b1, float4_t* d) {
  unsigned l = tid();
  float4_t acc = {0.f, 0.f, 0.f, 0.f};
  acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a0[l], b0[l], acc, 0, 0, 0);
  acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a1[l], b1[l], acc, 0, 0, 0);
  d[l] = acc;
}
"""
    g = torch.Generator().manual_seed(1)
    A = torch.randn(16, 32, generator=g).to(torch.bfloat16)
    B = torch.randn(32, 16, generator=g).to(torch.bfloat16)
    parts = [pack_a(A[:, :16].view(torch.int16), 16, 16, 4), pack_b(B[:16].view(torch.int16), 16, 16, 4),
             pack_a(A[:, 16:].view(torch.int16), 16, 16, 4), pack_b(B[16:].view(torch.int16), 16, 16, 4)]
    d = torch.zeros(64, 4)
    emulator.load(src, "gfx942").launch("two_steps", 1, 64, [*parts, d])
    torch.testing.assert_close(unpack_d(d, 16, 16), (A.double() @ B.double()).float(), rtol=1e-5, atol=1e-5)


def test_mfma_rejects_partial_wave():
    src = PRELUDE + """
extern "C" __global__ void partial(const short4_t* a, float4_t* d) {
  unsigned l = tid();
  float4_t c = {0.f, 0.f, 0.f, 0.f};
  d[l] = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a[l], a[l], c, 0, 0, 0);
}
"""
    a = torch.zeros(64, 4, dtype=torch.int16)
    d = torch.zeros(64, 4)
    with pytest.raises(emulator.EmulatorError, match="partial wave.*all 64 lanes"):
        emulator.load(src, "gfx942").launch("partial", 1, 32, [a, d])


def test_gfx950_mfma_does_not_compile_for_gfx942():
    """The gfx950-only builtins are absent from the gfx942 emulation, as from the real compiler."""
    src = kernel_source("__builtin_amdgcn_mfma_f32_16x16x32_bf16", "bf16x8_t", 16, False)
    with pytest.raises(emulator.CompileError, match="mfma_f32_16x16x32_bf16"):
        emulator.load(src, "gfx942")


@pytest.mark.skipif(not ziglang_available(), reason="ziglang (clang 22 for amdgcn) not installed")
@pytest.mark.parametrize("variant,arch", CASES, ids=[f"{v}-{a}" for v, a in CASES])
def test_mfma_test_kernels_are_real_amd_code(variant, arch):
    """The same kernel text compiles for the real target and contains the intended instruction."""
    builtin, M, N, K, atype, kind, _ = VARIANTS[variant]
    asm = offline_compile(kernel_source(builtin, atype, M, kind == "i8"), arch)
    assert f"v_mfma_{'i32' if kind == 'i8' else 'f32'}_{M}x{N}x{K}" in asm


# --------------------------------------------------------------------------------------------------
# The emulator against AMD's own tool: operands are placed by the lane/slot tables that the AMD Matrix
# Instruction Calculator prints for CDNA3 (tests/emulator/data/cdna3_mfma_layouts.json), not by the
# formulas above.
# --------------------------------------------------------------------------------------------------
import json  # noqa: E402
from pathlib import Path  # noqa: E402

CALC = json.loads((Path(__file__).parent / "data" / "cdna3_mfma_layouts.json").read_text())["instructions"]
CALC_BUILTIN = {
    "v_mfma_f32_16x16x16_bf16": ("__builtin_amdgcn_mfma_f32_16x16x16bf16_1k", "short4_t", "bf16"),
    "v_mfma_f32_32x32x8_bf16": ("__builtin_amdgcn_mfma_f32_32x32x8bf16_1k", "short4_t", "bf16"),
    "v_mfma_f32_16x16x16_f16": ("__builtin_amdgcn_mfma_f32_16x16x16f16", "half4_t", "f16"),
    "v_mfma_f32_32x32x8_f16": ("__builtin_amdgcn_mfma_f32_32x32x8f16", "half4_t", "f16"),
    "v_mfma_f32_16x16x32_fp8_fp8": ("__builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8", "long", "fp8"),
    "v_mfma_f32_32x32x16_fp8_fp8": ("__builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8", "long", "fp8"),
    "v_mfma_f32_16x16x4_f32": ("__builtin_amdgcn_mfma_f32_16x16x4f32", "float", "f32"),
    "v_mfma_f32_32x32x2_f32": ("__builtin_amdgcn_mfma_f32_32x32x2f32", "float", "f32"),
    "v_mfma_i32_16x16x32_i8": ("__builtin_amdgcn_mfma_i32_16x16x32_i8", "long", "i8"),
    "v_mfma_i32_32x32x16_i8": ("__builtin_amdgcn_mfma_i32_32x32x16_i8", "long", "i8"),
}


@pytest.mark.parametrize("instr", sorted(CALC_BUILTIN))
def test_mfma_matches_amd_calculator_layout(instr):
    t = CALC[instr]
    M, N, K = t["M"], t["N"], t["K"]
    builtin, atype, kind = CALC_BUILTIN[instr]
    kp = K * M // 64
    gen = torch.Generator().manual_seed(7)
    a_raw, a_val = random_operand(kind, (M, K), "gfx942", gen)
    b_raw, b_val = random_operand(kind, (K, N), "gfx942", gen)
    is_int = kind == "i8"
    C = torch.randint(-99, 99, (M, N), generator=gen, dtype=torch.int32) if is_int else torch.randn((M, N), generator=gen)
    pa = torch.zeros((64, kp), dtype=a_raw.dtype)
    pb = torch.zeros((64, kp), dtype=b_raw.dtype)
    pc = torch.zeros((64, M * N // 64), dtype=C.dtype)
    _deal(t, a_raw, b_raw, C, pa, pb, pc)
    d = torch.zeros_like(pc)
    emulator.load(kernel_source(builtin, atype, M, is_int), "gfx942").launch("mfma_test", 1, 64, [pa, pb, pc, d])
    D = torch.zeros((M, N), dtype=C.dtype)
    for i in range(M):
        for j in range(N):
            ln, r = t["D"][i * N + j]
            D[i, j] = d[ln, r]
    ref = a_val @ b_val + C.double()
    if is_int:
        assert torch.equal(D, ref.to(torch.int64).to(torch.int32))
    else:
        torch.testing.assert_close(D, ref.float(), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# gfx950's f8f6f4 forms with fp8 operands (__builtin_amdgcn_mfma_scale_f32_{16x16x128,32x32x64}_f8f6f4): operands
# placed by tests/emulator/data/cdna4_f8f6f4_layouts.json (AMD's CDNA4 layout; its "source" says where from), the
# A / B formats by cbsz / blgp (0 e4m3, 1 e5m2), E8M0 scales 2^(e - 127). With one scale per operand the order of
# k inside a lane group is invisible in D (A and B share it: any consistent relabelling of k sums the same
# products), so these tests pin rows, columns, D's layout, the formats and the scales; the k order matters to
# device code only as A and B agreeing (hk_hip/mma.h reads both by one lane map).
# --------------------------------------------------------------------------------------------------
F8F6F4 = json.loads((Path(__file__).parent / "data" / "cdna4_f8f6f4_layouts.json").read_text())["instructions"]
F8F6F4_BUILTIN = {"v_mfma_scale_f32_16x16x128_f8f6f4": "__builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4",
                  "v_mfma_scale_f32_32x32x64_f8f6f4": "__builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4"}
FORMATS = {0: "fp8", 1: "bf8"}


def f8f6f4_source(builtin: str, M: int, fa: int, fb: int) -> str:
    ctype = "float4_t" if M == 16 else "float16_t"
    return PRELUDE + f"""
typedef int int8_t_ __attribute__((ext_vector_type(8)));
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 64)))
void mfma_test(const int8_t_* a, const int8_t_* b, const {ctype}* c, {ctype}* d, const int* sa, const int* sb) {{
  unsigned l = tid();
  d[l] = {builtin}(a[l], b[l], c[l], {fa}, {fb}, 1, sa[l], 2, sb[l]);
}}
"""


def run_f8f6f4(instr: str, fa: int, fb: int, scale_a, scale_b, seed: int = 11):
    """(D from the emulator, A, B, C as float64): scale_a / scale_b are the 64 lanes' scale words."""
    t = F8F6F4[instr]
    M, N, K = t["M"], t["N"], t["K"]
    gen = torch.Generator().manual_seed(seed)
    a_raw, a_val = random_operand(FORMATS.get(fa, "fp8"), (M, K), "gfx950", gen)   # bytes for any format
    b_raw, b_val = random_operand(FORMATS[fb], (K, N), "gfx950", gen)
    C = torch.randn((M, N), generator=gen)
    pa, pb = torch.zeros((64, 32), dtype=torch.uint8), torch.zeros((64, 32), dtype=torch.uint8)
    pc = torch.zeros((64, M * N // 64))
    _deal(t, a_raw, b_raw, C, pa, pb, pc)
    d = torch.zeros_like(pc)
    mod = emulator.load(f8f6f4_source(F8F6F4_BUILTIN[instr], M, fa, fb), "gfx950")
    mod.launch("mfma_test", 1, 64, [pa.view(torch.int32), pb.view(torch.int32), pc, d,
                                    torch.tensor(scale_a, dtype=torch.int32), torch.tensor(scale_b, dtype=torch.int32)])
    D = torch.zeros((M, N))
    for i in range(M):
        for j in range(N):
            ln, r = t["D"][i * N + j]
            D[i, j] = d[ln, r]
    return D, a_val, b_val, C.double()


@pytest.mark.parametrize("fa,fb", [(0, 0), (0, 1), (1, 0), (1, 1)], ids=["fp8_fp8", "fp8_bf8", "bf8_fp8", "bf8_bf8"])
@pytest.mark.parametrize("instr", sorted(F8F6F4))
def test_f8f6f4_matches_reference(instr, fa, fb):
    """Unit scales (127 in the byte opsel picks: byte 1 of A's word, byte 2 of B's)."""
    D, a, b, C = run_f8f6f4(instr, fa, fb, [0x7F << 8] * 64, [0x7F << 16] * 64)
    torch.testing.assert_close(D, (a @ b + C).float(), rtol=1e-6, atol=1e-6)


def test_f8f6f4_scales_the_products_not_c():
    """E8M0 130 and 125: the sum of products times 2^(3 - 2); C added unscaled."""
    instr = "v_mfma_scale_f32_16x16x128_f8f6f4"
    D, a, b, C = run_f8f6f4(instr, 0, 0, [130 << 8] * 64, [125 << 16] * 64)
    torch.testing.assert_close(D, (2.0 * (a @ b) + C).float(), rtol=1e-6, atol=1e-6)


def test_f8f6f4_refuses_per_lane_scales_and_fp4():
    instr = "v_mfma_scale_f32_16x16x128_f8f6f4"
    with pytest.raises(emulator.EmulatorError, match="different E8M0 scales"):
        run_f8f6f4(instr, 0, 0, [0x7F << 8] * 63 + [0x80 << 8], [0x7F << 16] * 64)
    with pytest.raises(emulator.EmulatorError, match="FP6 / FP4"):
        run_f8f6f4(instr, 4, 0, [0x7F << 8] * 64, [0x7F << 16] * 64)


def test_f8f6f4_does_not_compile_for_gfx942():
    src = f8f6f4_source(F8F6F4_BUILTIN["v_mfma_scale_f32_16x16x128_f8f6f4"], 16, 0, 0)
    with pytest.raises(emulator.CompileError, match="mfma_scale_f32_16x16x128_f8f6f4"):
        emulator.load(src, "gfx942")


@pytest.mark.skipif(not ziglang_available(), reason="ziglang (clang 22 for amdgcn) not installed")
@pytest.mark.parametrize("instr", sorted(F8F6F4))
def test_f8f6f4_test_kernels_are_real_amd_code(instr):
    """clang 22 lowers the builtin to the scaled instruction, 8 VGPRs of A and of B, the formats as cbsz / blgp."""
    t = F8F6F4[instr]
    asm = offline_compile(f8f6f4_source(F8F6F4_BUILTIN[instr], t["M"], 1, 0), "gfx950")
    line = next(x for x in asm.splitlines() if instr in x)
    ops = [o.strip() for o in line.split(instr, 1)[1].split(",")]
    for reg in ops[1:3]:
        lo, hi = (int(x) for x in reg.strip("v[]").split(":"))
        assert hi - lo + 1 == 8, line
    assert "cbsz:1" in line and "blgp" not in line, line
