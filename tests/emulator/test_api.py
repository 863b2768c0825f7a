"""The user-facing API (argument passing, structs, aliasing, ids, caching) and the memory, math and
conversion builtins."""
from __future__ import annotations

import struct
import time

import pytest
import torch

from hk_portable.backends.hip import emulator

from emu_testutil import PRELUDE, needs_emulator, offline_compile, ziglang_available

pytestmark = needs_emulator

SRC = PRELUDE + r"""
struct Desc { float* data; int n; int stride; };

extern "C" __global__ void scalars(double* out, int i, unsigned u, float f, double d, long l, bool b, char c) {
  if (tid() == 0) { out[0] = i; out[1] = u; out[2] = f; out[3] = d; out[4] = (double)l; out[5] = b; out[6] = c; }
}
extern "C" __global__ void by_struct(Desc in, float* out) {
  int t = (int)tid();
  if (t < in.n) out[t] = in.data[t * in.stride] + 1.f;
}
extern "C" __global__ void shift(const float* src, float* dst, int n) {
  int t = (int)tid();
  if (t < n) dst[t] = src[t] * 10.f;
}
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 128)))
void ids(unsigned* out) {
  unsigned bx = __builtin_amdgcn_workgroup_id_x(), by = __builtin_amdgcn_workgroup_id_y(), bz = __builtin_amdgcn_workgroup_id_z();
  unsigned sx = __builtin_amdgcn_workgroup_size_x(), sy = __builtin_amdgcn_workgroup_size_y(), sz = __builtin_amdgcn_workgroup_size_z();
  unsigned gx = __builtin_amdgcn_grid_size_x() / sx, gy = __builtin_amdgcn_grid_size_y() / sy;
  unsigned tx = __builtin_amdgcn_workitem_id_x(), ty = __builtin_amdgcn_workitem_id_y(), tz = __builtin_amdgcn_workitem_id_z();
  unsigned block = (bz * gy + by) * gx + bx, flat = (tz * sy + ty) * sx + tx;
  unsigned* o = out + 8 * (block * (sx * sy * sz) + flat);
  o[0] = bx; o[1] = by; o[2] = bz; o[3] = tx; o[4] = ty; o[5] = tz;
  const unsigned short* dp = (const unsigned short*)__builtin_amdgcn_dispatch_ptr();
  const unsigned* ia = (const unsigned*)__builtin_amdgcn_implicitarg_ptr();
  o[6] = dp[2] * 1000u + dp[3];          // workgroup_size_x, _y from the dispatch packet
  o[7] = ia[0] * 1000u + ia[1];          // block_count_x, _y from the implicit arguments
}
extern "C" __global__ void math(const float* x, float* out) {
  int t = (int)tid();
  float v = x[t];
  out[0 * 64 + t] = __builtin_amdgcn_exp2f(v);
  out[1 * 64 + t] = __builtin_amdgcn_logf(v);
  out[2 * 64 + t] = __builtin_amdgcn_rcpf(v);
  out[3 * 64 + t] = __builtin_amdgcn_rsqf(v);
  out[4 * 64 + t] = __builtin_amdgcn_sqrtf(v);
  out[5 * 64 + t] = __builtin_amdgcn_sinf(v);
  out[6 * 64 + t] = __builtin_amdgcn_fractf(v);
  out[7 * 64 + t] = __builtin_amdgcn_fmed3f(v, -1.f, 2.f);
  out[8 * 64 + t] = (float)__bf16(v);       // f32 -> bf16 round to nearest even, as v_cvt_pk_bf16_f32
}
extern "C" __global__ void fp8(const float* x, int* packed, float* back) {
  int t = (int)tid();
  int p = __builtin_amdgcn_cvt_pk_fp8_f32(x[2 * t], x[2 * t + 1], 0, false);
  p = __builtin_amdgcn_cvt_pk_bf8_f32(x[2 * t], x[2 * t + 1], p, true);
  packed[t] = p;
  back[4 * t + 0] = __builtin_amdgcn_cvt_f32_fp8(p, 0);
  back[4 * t + 1] = __builtin_amdgcn_cvt_f32_fp8(p, 1);
  back[4 * t + 2] = __builtin_amdgcn_cvt_f32_bf8(p, 2);
  back[4 * t + 3] = __builtin_amdgcn_cvt_f32_bf8(p, 3);
}
extern "C" __global__ void buffers(const float* src, float* dst, int nbytes) {
  int t = (int)tid();
  __amdgpu_buffer_rsrc_t r = __builtin_amdgcn_make_buffer_rsrc((void*)src, 0, nbytes, 0x00020000);
  unsigned v = __builtin_amdgcn_raw_buffer_load_b32(r, 4 * t, 0, 0);
  uint4_t q = __builtin_amdgcn_raw_buffer_load_b128(r, 16 * t, 0, 0);
  // (copy vector elements to scalars first: __builtin_bit_cast(float, q[e]) yields q[0] in clang 19
  // and 22, for the host and for amdgcn alike)
  unsigned s = __builtin_amdgcn_raw_buffer_load_b32(r, 4 * t, 8, 0);   // soffset: not range checked
  dst[t] = __builtin_bit_cast(float, v);
  for (int e = 0; e < 4; ++e) { unsigned qe = q[e]; dst[64 + 4 * t + e] = __builtin_bit_cast(float, qe); }
  dst[320 + t] = __builtin_bit_cast(float, s);
  __amdgpu_buffer_rsrc_t w = __builtin_amdgcn_make_buffer_rsrc((void*)(dst + 384), 0, 32 * 4, 0x00020000);
  __builtin_amdgcn_raw_buffer_store_b32(__builtin_bit_cast(unsigned, 1.f + t), w, 4 * t, 0, 0);   // lanes >= 32 dropped
}
extern "C" __global__ void direct_to_lds(const int* src, int* out, int off) {
  __shared__ __attribute__((aligned(16))) int lds[64 * 4 + 64];
  const int l = (int)tid();
  for (int i = l; i < 64 * 4 + 64; i += 64) HK_LDS_STORE(int, &lds[i], -1);
  __builtin_amdgcn_s_waitcnt(0);
  __builtin_amdgcn_global_load_lds((__attribute__((address_space(1))) void*)(src + 2 * l),
                                   (__attribute__((address_space(3))) void*)lds, 4, 0, 0);
#if defined(__gfx950__)
  __builtin_amdgcn_global_load_lds((__attribute__((address_space(1))) void*)(src + 4 * l),
                                   (__attribute__((address_space(3))) void*)(lds + 64), 16, 0, 0);
#endif
  __builtin_amdgcn_s_waitcnt(0);
  __builtin_amdgcn_s_barrier();
  for (int i = l; i < 64 * 4 + 64; i += 64) out[i] = HK_LDS_LOAD(int, &lds[i]);
}
"""
DMA16_SRC = PRELUDE + r"""
extern "C" __global__ void direct_to_lds_16(const int* src) {
  __shared__ __attribute__((aligned(16))) int lds[64 * 4];
  __builtin_amdgcn_global_load_lds((__attribute__((address_space(1))) void*)(src + 4 * tid()),
                                   (__attribute__((address_space(3))) void*)lds, 16, 0, 0);
}
"""


def mod(arch="gfx942"):
    return emulator.load(SRC, arch, name="api.hip")


def test_scalar_arguments_by_parameter_type():
    out = torch.zeros(8, dtype=torch.float64)
    mod().launch("scalars", 1, 64, [out, -5, 4000000000, 1.5, 2.25, -(2 ** 40), True, -3])
    assert out[:7].tolist() == [-5, 4000000000, 1.5, 2.25, -(2 ** 40), 1, -3]
    mod().launch("scalars", 1, 64, [out, emulator.i32(7), emulator.u32(8), emulator.f32(0.5), emulator.f64(1.0),
                                    emulator.i64(9), True, emulator.i8(-1)])
    assert out[:7].tolist() == [7, 8, 0.5, 1.0, 9, 1, -1]
    with pytest.raises(emulator.EmulatorError, match="is a 4-byte int; got a 8-byte int"):
        mod().launch("scalars", 1, 64, [out, emulator.i64(1), 1, 1.0, 1.0, 1, True, 1])


def test_struct_argument_with_a_tensor_pointer():
    src = torch.arange(64, dtype=torch.float32)
    out = torch.zeros(16)
    mod().launch("by_struct", 1, 64, [emulator.blob("<Qii", src, 16, 4), out])
    assert torch.equal(out, src[::4] + 1)
    out.zero_()   # the same struct packed by hand: the pointer is found and relocated
    mod().launch("by_struct", 1, 64, [struct.pack("<Qii", src.data_ptr(), 16, 4), out], tensors=[src])
    assert torch.equal(out, src[::4] + 1)
    params = mod().kernels["by_struct"].params
    assert [p.kind for p in params] == ["other", "pointer"] and params[0].size == 16


def test_views_of_one_storage_alias_as_on_the_device():
    x = torch.arange(128, dtype=torch.float32)
    mod().launch("shift", 1, 64, [x[:64], x[64:], 64])
    assert torch.equal(x[64:], torch.arange(64, dtype=torch.float32) * 10)


def test_non_contiguous_tensor():
    m = torch.arange(64 * 4, dtype=torch.float32).view(64, 4)
    out = torch.zeros(16)
    col = m[:, 1]                                   # stride 4
    mod().launch("by_struct", 1, 64, [emulator.blob("<Qii", col, 16, 4), out])   # data[t * 4] == col[t]
    assert torch.equal(out, col[:16] + 1)


def test_ids_sizes_and_dispatch_packets():
    grid, block = (3, 2, 2), (4, 8, 2)
    nb, nt = 12, 64
    out = torch.zeros(nb * nt * 8, dtype=torch.int32)
    mod().launch("ids", grid, block, [out])
    o = out.view(nb, nt, 8)
    for bz in range(2):
        for by in range(2):
            for bx in range(3):
                b = (bz * 2 + by) * 3 + bx
                for tz in range(2):
                    for ty in range(8):
                        for tx in range(4):
                            f = (tz * 8 + ty) * 4 + tx
                            assert o[b, f].tolist() == [bx, by, bz, tx, ty, tz, 4008, 3002]


def test_launch_bounds_are_enforced():
    out = torch.zeros(8 * 256, dtype=torch.int32)
    assert mod().kernels["ids"].bounds == (1, 128)
    with pytest.raises(emulator.EmulatorError, match=r"amdgpu_flat_work_group_size\(1, 128\)"):
        mod().launch("ids", 1, 256, [out])


def test_math_builtins():
    x = torch.tensor([0.5, 3.0, -126.5, -149.0, 8.0, 1e-40, 0.25, -0.75] + [1.0] * 55 + [1.00390625], dtype=torch.float32)
    out = torch.zeros(9 * 64)
    mod().launch("math", 1, 64, [x, out])
    o = out.view(9, 64)
    assert o[0, 0] == 2 ** 0.5 and o[0, 1] == 8.0
    assert o[0, 2] == 0.0 and o[0, 3] == 0.0               # v_exp_f32: denormal results flush to 0
    assert o[1, 4] == 3.0 and o[1, 1] == torch.tensor(3.0).log2()    # v_log_f32 is log2
    assert o[1, 5] == float("-inf")                          # ... and treats denormal inputs as 0
    assert o[2, 4] == 0.125 and o[2, 5] == float("inf")      # rcp of a denormal: flushed -> inf
    assert o[3, 4] == torch.tensor(8.0).rsqrt()
    assert o[4, 4] == torch.tensor(8.0).sqrt()
    assert abs(o[5, 6] - 1.0) < 1e-7                         # v_sin_f32 takes revolutions: sin(2*pi*0.25)
    assert o[6, 7] == 0.25                                   # fract(-0.75)
    assert o[7, 1] == 2.0 and o[7, 0] == 0.5                 # med3(x, -1, 2)
    assert o[8, 63] == 1.0                                   # 1.00390625 is a tie: rounds to even
    assert torch.equal(o[8], x.to(torch.bfloat16).float())


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_fp8_conversions_follow_the_arch_format(arch):
    """v_cvt_pk_fp8_f32 / _bf8_f32: round to nearest even into the arch's format (FNUZ on gfx942, OCP on
    gfx950); out of range is NaN (inf for OCP e5m2) -- torch saturates e4m3fn instead, so the in-range
    values are compared with torch and the overflow ones with the model."""
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(118, generator=g) * 20, torch.tensor([0.0, -0.0, 1e-6, 2.0, 230.0, -0.01]),
                   torch.tensor([500.0, 1e6, float("inf"), float("nan")])])
    packed = torch.zeros(64, dtype=torch.int32)
    back = torch.zeros(256)
    mod(arch).launch("fp8", 1, 64, [x, packed, back])
    e4 = torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn
    e5 = torch.float8_e5m2fnuz if arch == "gfx942" else torch.float8_e5m2
    p = packed.view(torch.uint8).view(64, 4)
    got4, got5 = p[:, 0:2].reshape(-1), p[:, 2:4].reshape(-1)
    inr = slice(0, 124)
    assert torch.equal(got4[inr], x[inr].to(e4).view(torch.uint8))
    assert torch.equal(got5[inr], x[inr].to(e5).view(torch.uint8))
    if arch == "gfx942":       # FNUZ: 0x80 is the only NaN, no infinity
        assert got4[124:].tolist() == [0x80] * 4 and got5[124:].tolist() == [100, 0x80, 0x80, 0x80]   # 500 -> 512 fits e5m2
    else:                      # OCP: e4m3fn NaN 0x7f (no infinity); e5m2 has infinity 0x7c
        assert got4[124:].tolist() == [0x7F, 0x7F, 0x7F, 0x7F] and got5[124:].tolist() == [0x60, 0x7C, 0x7C, 0x7F]
    b = back.view(64, 4)[:62]
    ref4 = x[inr].to(e4).float().view(62, 2)
    ref5 = x[inr].to(e5).float().view(62, 2)
    assert torch.equal(b[:, 0:2], ref4) and torch.equal(b[:, 2:4], ref5)


def test_buffer_loads_and_stores_are_range_checked():
    src = torch.arange(64, dtype=torch.float32)
    dst = torch.full((384 + 64,), -1.0)
    mod().launch("buffers", 1, 64, [src, dst, 40 * 4])          # num_records: 40 floats
    t = torch.arange(64, dtype=torch.float32)
    assert torch.equal(dst[:64], torch.where(t < 40, t, 0.0))           # dword loads past num_records: 0
    q = dst[64:320].view(64, 4)
    expect = torch.where(torch.arange(256) < 40, torch.arange(256).float(), 0.0).view(64, 4)
    assert torch.equal(q[:16], expect[:16]) and torch.equal(q[16:], torch.zeros(48, 4))
    assert torch.equal(dst[320:384], torch.where(t < 40, t + 2, 0.0))    # soffset=8 not range checked
    assert torch.equal(dst[384:416], 1 + t[:32]) and torch.equal(dst[416:], torch.full((32,), -1.0))


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_direct_to_lds_loads(arch):
    src = torch.arange(512, dtype=torch.int32)
    out = torch.zeros(64 * 4 + 64, dtype=torch.int32)
    mod(arch).launch("direct_to_lds", 1, 64, [src, out, 0])
    l = torch.arange(64)
    assert torch.equal(out[:64], (2 * l).int())                 # 4 bytes per lane at lds + 4 * lane
    if arch == "gfx950":
        assert torch.equal(out[64:], src[:256])                  # 16 bytes per lane at lds + 16 * lane
    else:
        assert (out[64:] == -1).all()
    if arch == "gfx942":   # as the device compiler does, the emulator rejects 16-byte DMA at compile time
        with pytest.raises(emulator.CompileError, match="invalid size value: size must be 1, 2, or 4"):
            emulator.load(DMA16_SRC, arch)
    else:
        emulator.load(DMA16_SRC, arch).launch("direct_to_lds_16", 1, 64, [src])


def test_threads_do_not_change_results():
    a, b = torch.randn(4096), torch.zeros(4096)
    outs = []
    for threads in (1, 2):
        b.zero_()
        st = mod().launch("shift", 64, 64, [a.view(64, 64)[0], b[:64], 64], threads=threads)
        outs.append(b.clone())
        assert st.workers == threads
    assert torch.equal(outs[0], outs[1])


def test_modules_are_cached():
    t0 = time.perf_counter()
    m1 = emulator.load(SRC, "gfx942", name="api.hip")
    m2 = emulator.load(SRC, "gfx942", name="api.hip")
    assert m1 is m2 and time.perf_counter() - t0 < 0.5
    assert sorted(m1.kernels) == sorted(["scalars", "by_struct", "shift", "ids", "math", "fp8", "buffers",
                                         "direct_to_lds"])
    assert emulator.available() == (True, "ok")


def test_compile_errors_are_reported():
    with pytest.raises(emulator.CompileError) as e:
        emulator.load(PRELUDE + 'extern "C" __global__ void k(int* o) { o[0] = undefined_thing; }', "gfx942",
                      name="broken.hip")
    assert "broken.hip" in e.value.log and "undefined_thing" in e.value.log


@pytest.mark.skipif(not ziglang_available(), reason="ziglang (clang 22 for amdgcn) not installed")
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_api_kernels_are_real_amd_code(arch):
    asm = offline_compile(SRC, arch)
    assert "buffer_load_dword" in asm and "v_exp_f32" in asm and "v_cvt_pk_fp8_f32" in asm
    if arch == "gfx950":
        assert "global_load_lds_dwordx4" in asm
