"""Header-free HIP kernels written outside the library run through emulator.load(...).launch(...) and
give the documented result: a one-wave 16x16 bf16 MFMA tile product (gfx942: 16x16x16, gfx950:
16x16x32), and a 4-wave 64x64-tile GEMM through LDS (also the speed measurement)."""
from __future__ import annotations

import time

import pytest
import torch

from hk_portable.backends.hip import emulator

from emu_testutil import PRELUDE, needs_emulator, offline_compile, ziglang_available

pytestmark = needs_emulator

# C (16x16, f32, row-major) = A (16xK, bf16 bits, row-major) @ B (Kx16, bf16 bits, row-major); one wave.
TILE_SRC = PRELUDE + r"""
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(64, 64)))
void tile16(const unsigned short* A, const unsigned short* B, float* C, int K) {
  const int l = (int)tid(), row = l % 16, grp = l / 16;
  float4_t acc = {0.f, 0.f, 0.f, 0.f};
#if defined(__gfx950__)
  // v_mfma_f32_16x16x32_bf16: A[i][k] in lane i + 16*(k/8), slot k%8 (8 consecutive k per lane)
  for (int k0 = 0; k0 < K; k0 += 32) {
    bf16x8_t a, b;
    for (int s = 0; s < 8; ++s) {
      a[s] = __builtin_bit_cast(__bf16, A[row * K + k0 + 8 * grp + s]);
      b[s] = __builtin_bit_cast(__bf16, B[(k0 + 8 * grp + s) * 16 + row]);
    }
    acc = __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, acc, 0, 0, 0);
  }
#else
  // v_mfma_f32_16x16x16_bf16: A[i][k] in lane i + 16*(k/4), slot k%4
  for (int k0 = 0; k0 < K; k0 += 16) {
    short4_t a, b;
    for (int s = 0; s < 4; ++s) {
      a[s] = (short)A[row * K + k0 + 4 * grp + s];
      b[s] = (short)B[(k0 + 4 * grp + s) * 16 + row];
    }
    acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, acc, 0, 0, 0);
  }
#endif
  // D[i][j] in lane j + 16*(i/4), register i%4
  for (int r = 0; r < 4; ++r) C[(4 * grp + r) * 16 + row] = acc[r];
}
"""

# 64x64 block tile, BK = 32, 4 waves in a 2x2 grid of 32x32 wave tiles, A and B staged through LDS.
GEMM_SRC = PRELUDE + r"""
#define BM 64
#define BN 64
#define BK 32
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(256, 256)))
void gemm64(const unsigned short* A, const unsigned short* B, float* C, int M, int N, int K) {
  __shared__ __attribute__((aligned(16))) unsigned short As[BM * BK];
  __shared__ __attribute__((aligned(16))) unsigned short Bs[BK * BN];
  const int t = (int)tid(), w = t / 64, l = t % 64, row = l % 16, grp = l / 16;
  const int bm = (int)__builtin_amdgcn_workgroup_id_y() * BM, bn = (int)__builtin_amdgcn_workgroup_id_x() * BN;
  const int wm = (w / 2) * 32, wn = (w % 2) * 32;
  float4_t acc[2][2];
  for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) acc[i][j] = (float4_t){0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < K; k0 += BK) {
    {  // 2048 elements of A and of B per stage: one 16-byte chunk per thread each
      const int ar = t / 4, ac = (t % 4) * 8;
      HK_LDS_STORE(uint4_t, &As[ar * BK + ac], *(const uint4_t*)&A[(bm + ar) * K + k0 + ac]);
      const int br = t / 8, bc = (t % 8) * 8;
      HK_LDS_STORE(uint4_t, &Bs[br * BN + bc], *(const uint4_t*)&B[(k0 + br) * N + bn + bc]);
    }
    __builtin_amdgcn_s_waitcnt(0);
    __builtin_amdgcn_s_barrier();
#if defined(__gfx950__)
    for (int kk = 0; kk < BK; kk += 32) {
      bf16x8_t a[2], b[2];
      for (int i = 0; i < 2; ++i)
        a[i] = HK_LDS_LOAD(bf16x8_t, &As[(wm + 16 * i + row) * BK + kk + 8 * grp]);
      for (int j = 0; j < 2; ++j)
        for (int s = 0; s < 8; ++s)
          b[j][s] = __builtin_bit_cast(__bf16, HK_LDS_LOAD(unsigned short, &Bs[(kk + 8 * grp + s) * BN + wn + 16 * j + row]));
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) acc[i][j] = __builtin_amdgcn_mfma_f32_16x16x32_bf16(a[i], b[j], acc[i][j], 0, 0, 0);
    }
#else
    for (int kk = 0; kk < BK; kk += 16) {
      short4_t a[2], b[2];
      for (int i = 0; i < 2; ++i)
        a[i] = HK_LDS_LOAD(short4_t, &As[(wm + 16 * i + row) * BK + kk + 4 * grp]);
      for (int j = 0; j < 2; ++j)
        for (int s = 0; s < 4; ++s)
          b[j][s] = (short)HK_LDS_LOAD(unsigned short, &Bs[(kk + 4 * grp + s) * BN + wn + 16 * j + row]);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) acc[i][j] = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a[i], b[j], acc[i][j], 0, 0, 0);
    }
#endif
    __builtin_amdgcn_s_barrier();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int r = 0; r < 4; ++r)
        C[(bm + wm + 16 * i + 4 * grp + r) * N + bn + wn + 16 * j + row] = acc[i][j][r];
}
"""


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int16)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_16x16_bf16_tile_product(arch):
    g = torch.Generator().manual_seed(3)
    K = 64
    A = torch.randn(16, K, generator=g).to(torch.bfloat16)
    B = torch.randn(K, 16, generator=g).to(torch.bfloat16)
    C = torch.zeros(16, 16)
    emulator.load(TILE_SRC, arch, name="tile16.hip").launch("tile16", grid=(1, 1, 1), block=(64, 1, 1),
                                                             args=[bits(A), bits(B), C, K])
    torch.testing.assert_close(C, (A.double() @ B.double()).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_gemm_64x64_tiles_through_lds(arch):
    g = torch.Generator().manual_seed(4)
    M, N, K = 128, 192, 96
    A = torch.randn(M, K, generator=g).to(torch.bfloat16)
    B = torch.randn(K, N, generator=g).to(torch.bfloat16)
    C = torch.zeros(M, N)
    st = emulator.load(GEMM_SRC, arch, name="gemm64.hip").launch(
        "gemm64", grid=(N // 64, M // 64, 1), block=(256, 1, 1), args=[bits(A), bits(B), C, M, N, K])
    torch.testing.assert_close(C, (A.double() @ B.double()).float(), rtol=1e-5, atol=1e-5)
    assert st.blocks == (N // 64) * (M // 64)
    assert st.barriers == st.blocks * 2 * (K // 32)
    # wave operations resolved = MFMAs: 4 waves x 4 per k step (2x2 wave tile)
    assert st.wave_ops == st.blocks * 4 * (K // 16 if arch == "gfx942" else K // 32) * 4


def test_gemm_block_speed(capsys):
    """One 64x64x64 GEMM block (4 waves, 8 MFMAs per wave per 32-wide k step) should take milliseconds."""
    A = torch.randn(64, 64).to(torch.bfloat16)
    B = torch.randn(64, 64).to(torch.bfloat16)
    C = torch.zeros(64, 64)
    mod = emulator.load(GEMM_SRC, "gfx942", name="gemm64.hip")
    args = [bits(A), bits(B), C, 64, 64, 64]
    mod.launch("gemm64", (1, 1, 1), 256, args)
    best = min(_timed(mod, args) for _ in range(5))
    with capsys.disabled():
        print(f"\n[hip emulator] one 64x64x64 bf16 GEMM block (256 work-items, 32 MFMAs): {best * 1e3:.2f} ms")
    assert best < 0.25, f"a 64x64x64 GEMM block took {best * 1e3:.1f} ms"


def _timed(mod, args):
    t0 = time.perf_counter()
    mod.launch("gemm64", (1, 1, 1), 256, args, threads=1)
    return time.perf_counter() - t0


@pytest.mark.skipif(not ziglang_available(), reason="ziglang (clang 22 for amdgcn) not installed")
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_gemm_kernels_are_real_amd_code(arch):
    mnemonic = "v_mfma_f32_16x16x32_bf16" if arch == "gfx950" else "v_mfma_f32_16x16x16"
    for src in (TILE_SRC, GEMM_SRC):
        asm = offline_compile(src, arch)
        assert mnemonic in asm
        assert ".vgpr_spill_count: 0" in asm
