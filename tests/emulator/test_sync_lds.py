"""Barriers, LDS and the LDS race detector."""
from __future__ import annotations

import math

import pytest
import torch

from hk_portable.backends.hip import emulator

from emu_testutil import PRELUDE, needs_emulator, offline_compile, ziglang_available

pytestmark = needs_emulator

SRC = PRELUDE + r"""
#define NT 256
// Wave w writes lds[w*64 + lane]; after the barrier every wave reads the next wave's values.
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 256)))
void exchange(int* out, int use_barrier) {
  __shared__ int lds[NT];
  const int t = (int)tid(), w = t >> 6, l = t & 63;
  HK_LDS_STORE(int, &lds[t], 1000 * w + l);
  if (use_barrier) __builtin_amdgcn_s_barrier();
  out[t] = HK_LDS_LOAD(int, &lds[((w + 1) & 3) * 64 + l]);
}

// Write-after-read across waves: wave 0 reads lds[l], wave 1 then overwrites it.
extern "C" __global__ void war(int* out, int use_barrier) {
  __shared__ int lds[64];
  const int t = (int)tid(), w = t >> 6, l = t & 63;
  if (w == 0) HK_LDS_STORE(int, &lds[l], l);
  __builtin_amdgcn_s_barrier();
  if (w == 0) out[l] = HK_LDS_LOAD(int, &lds[l]);
  if (use_barrier) __builtin_amdgcn_s_barrier();
  if (w == 1) HK_LDS_STORE(int, &lds[l], -l);
  if (!use_barrier) __builtin_amdgcn_s_barrier();
}

// Two waves write the same word between barriers.
extern "C" __global__ void ww(int* out) {
  __shared__ int lds[64];
  const int t = (int)tid(), l = t & 63;
  HK_LDS_STORE(int, &lds[l], t);
  __builtin_amdgcn_s_barrier();
  out[t] = HK_LDS_LOAD(int, &lds[l]);
}

// Double buffering: the barrier separates reuse, so no race.
extern "C" __global__ void pingpong(int* out, int iters) {
  __shared__ int buf[2][128];
  const int t = (int)tid(), w = t >> 6, l = t & 63;
  int acc = 0;
  for (int i = 0; i < iters; ++i) {
    int* b = buf[i & 1];
    HK_LDS_STORE(int, &b[t], i * 1000 + t);
    __builtin_amdgcn_s_barrier();
    acc += HK_LDS_LOAD(int, &b[(w ^ 1) * 64 + l]);
  }
  out[t] = acc;
}

// Lanes of ONE wave exchange through LDS: needs a wave-level sync point between write and read.
extern "C" __global__ void intrawave(int* out, int use_wave_barrier) {
  __shared__ int lds[64];
  const int l = (int)tid();
  HK_LDS_STORE(int, &lds[l], 10 * l);
  if (use_wave_barrier) __builtin_amdgcn_wave_barrier();
  out[l] = HK_LDS_LOAD(int, &lds[l ^ 1]);
}

// All lanes of one wave write one word in one instruction: not a race (one value wins).
extern "C" __global__ void samewave_same_word(int* out) {
  __shared__ int lds[1];
  const int l = (int)tid();
  HK_LDS_STORE(int, &lds[0], l);
  __builtin_amdgcn_wave_barrier();
  out[l] = HK_LDS_LOAD(int, &lds[0]);
}

// Reading LDS nobody wrote gives the emulator's poison (NaN bytes 0xFF), never a silent zero.
extern "C" __global__ void uninit(float* out) {
  __shared__ float lds[64];
  out[tid()] = HK_LDS_LOAD(float, &lds[tid()]);
}

// Dynamic LDS, declared the HIP way.
extern "C" __global__ void dyn(float* out, int n) {
  extern __shared__ float smem[];
  const int t = (int)tid();
  for (int i = t; i < n; i += (int)__builtin_amdgcn_workgroup_size_x()) HK_LDS_STORE(float, &smem[i], 0.5f * i);
  __builtin_amdgcn_s_barrier();
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += HK_LDS_LOAD(float, &smem[i]);
  out[t] = s;
}

// 8-wave ping-pong schedule (HipKittens): group 1 runs one extra barrier at the start, group 0 one
// at the end, so the groups are staggered by one barrier and the counts balance.
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 512)))
void staggered(int* out) {
  const int t = (int)tid(), g = (t >> 6) >> 2;
  int n = 0;
  if (g == 1) { __builtin_amdgcn_s_barrier(); ++n; }
  for (int i = 0; i < 3; ++i) { __builtin_amdgcn_s_setprio(1); __builtin_amdgcn_s_barrier(); ++n; __builtin_amdgcn_s_setprio(0); }
  if (g == 0) { __builtin_amdgcn_s_barrier(); ++n; }
  out[t] = n;
}

// Unbalanced: wave 0 runs one more barrier than the others.
extern "C" __global__ void unbalanced(int* out) {
  const int t = (int)tid();
  __builtin_amdgcn_s_barrier();
  if ((t >> 6) == 0) __builtin_amdgcn_s_barrier();
  out[t] = 1;
}

// Half of a wave runs an extra barrier the other half skips: the halves meet different barriers.
// (Identical barriers in both arms of an if/else would be merged by the compiler -- on the device too.)
extern "C" __global__ void divergent_barrier(int* out) {
  const int t = (int)tid();
  if ((t & 63) < 32) __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_s_barrier();
  out[t] = 1;
}
// Lanes that returned do not stop the rest of their wave at a barrier (partial EXEC, legal on AMD).
extern "C" __global__ void early_exit(int* out) {
  const int t = (int)tid();
  if ((t & 63) >= 32) return;
  __builtin_amdgcn_s_barrier();
  out[t] = 1;
}

// LDS out of bounds through the access macros.
extern "C" __global__ void lds_oob(int* out, int idx) {
  __shared__ int lds[64];
  HK_LDS_STORE(int, &lds[tid()], 1);
  __builtin_amdgcn_s_barrier();
  out[tid()] = HK_LDS_LOAD(int, &lds[tid() == 5 ? idx : 0]);
}
extern "C" __global__ void dyn_oob(float* out, int idx) {
  extern __shared__ float smem[];
  HK_LDS_STORE(float, &smem[tid() == 7 ? idx : 0], 1.f);
  out[tid()] = 0.f;
}
// ...and through a plain dereference far past the dynamic window (caught by its guard pages).
extern "C" __global__ void dyn_oob_plain(float* out, int idx) {
  extern __shared__ float smem[];
  smem[tid() == 3 ? idx : 0] = 1.f;
  out[tid()] = 0.f;
}
extern "C" __global__ void misaligned(int* out) {
  __shared__ __attribute__((aligned(16))) char lds[64];
  out[tid()] = HK_LDS_LOAD(int, lds + 2);
}
"""


def mod(arch="gfx942"):
    return emulator.load(SRC, arch, name="sync_lds.hip")


def test_barrier_makes_other_waves_writes_visible():
    out = torch.zeros(256, dtype=torch.int32)
    mod().launch("exchange", 1, 256, [out, 1])
    t = torch.arange(256)
    w, l = t // 64, t % 64
    assert torch.equal(out, (1000 * ((w + 1) % 4) + l).int())


def test_missing_barrier_is_a_reported_race():
    out = torch.zeros(256, dtype=torch.int32)
    with pytest.raises(emulator.EmulatorError) as e:
        mod().launch("exchange", 1, 256, [out, 0])
    msg = str(e.value)
    assert "LDS race" in msg and "kernel 'exchange' block (0,0,0)" in msg
    # waves run in order between barriers: wave 0 read lds[64..127] before wave 1 wrote it
    assert "wave 1 lane 0 (work-item (64,0,0), flat id 64) writes LDS byte 256" in msg
    assert "wave 0 lane 0 read it" in msg and "no s_barrier" in msg
    assert "sync_lds.hip:" in msg


def test_write_after_read_race_and_clean_version():
    out = torch.zeros(64, dtype=torch.int32)
    mod().launch("war", 1, 128, [out, 1])
    assert torch.equal(out, torch.arange(64, dtype=torch.int32))
    with pytest.raises(emulator.EmulatorError, match=r"LDS race: wave 1 lane 0 .* writes .* wave 0 lane 0 read it"):
        mod().launch("war", 1, 128, [out, 0])


def test_write_write_race():
    with pytest.raises(emulator.EmulatorError, match=r"LDS race: wave 1 lane 0 .* writes .* wave 0 lane 0 wrote it"):
        mod().launch("ww", 1, 128, [torch.zeros(128, dtype=torch.int32)])


def test_double_buffering_with_barrier_is_clean():
    out = torch.zeros(128, dtype=torch.int32)
    mod().launch("pingpong", 1, 128, [out, 5])
    t = torch.arange(128)
    partner = (t // 64 ^ 1) * 64 + t % 64
    assert torch.equal(out, (sum(i * 1000 for i in range(5)) + 5 * partner).int())


def test_intra_wave_exchange_needs_a_wave_sync_point():
    out = torch.zeros(64, dtype=torch.int32)
    mod().launch("intrawave", 1, 64, [out, 1])
    assert torch.equal(out, 10 * (torch.arange(64) ^ 1).int())
    with pytest.raises(emulator.EmulatorError, match="intra-wave LDS exchange without a wave-level sync point"):
        mod().launch("intrawave", 1, 64, [out, 0])


def test_same_wave_same_word_is_not_a_race():
    out = torch.zeros(64, dtype=torch.int32)
    mod().launch("samewave_same_word", 1, 64, [out])
    assert torch.equal(out, torch.full((64,), 63, dtype=torch.int32))   # the highest lane's write lands last


def test_lds_is_poisoned_per_block():
    out = torch.zeros(64)
    mod().launch("uninit", 1, 64, [out])
    assert torch.isnan(out).all()


def test_dynamic_lds():
    out = torch.zeros(128)
    mod().launch("dyn", 1, 128, [out, 300], shared_bytes=300 * 4)
    assert torch.allclose(out, torch.full((128,), 0.5 * sum(range(300))))


def test_staggered_ping_pong_barriers():
    out = torch.zeros(512, dtype=torch.int32)
    mod().launch("staggered", 1, 512, [out])
    assert torch.equal(out, torch.full((512,), 4, dtype=torch.int32))


def test_unbalanced_barriers_are_a_reported_deadlock():
    with pytest.raises(emulator.EmulatorError, match=r"barrier deadlock: waves 0 wait at s_barrier #2 .* waves 1 \(after 1 barriers\)"):
        mod().launch("unbalanced", 1, 128, [torch.zeros(128, dtype=torch.int32)])


def test_divergent_barrier_is_reported():
    with pytest.raises(emulator.EmulatorError, match="divergent wave operation in wave 0.*lane 0 .* s_barrier.*lane 32 .* s_barrier"):
        mod().launch("divergent_barrier", 1, 64, [torch.zeros(64, dtype=torch.int32)])


def test_lanes_that_returned_do_not_block_a_barrier():
    out = torch.zeros(128, dtype=torch.int32)
    mod().launch("early_exit", 1, 128, [out])
    assert torch.equal(out, ((torch.arange(128) % 64) < 32).int())


def test_static_lds_out_of_bounds():
    out = torch.zeros(64, dtype=torch.int32)
    mod().launch("lds_oob", 1, 64, [out, 63])
    with pytest.raises(emulator.EmulatorError) as e:
        mod().launch("lds_oob", 1, 64, [out, 64])
    msg = str(e.value)
    assert "LDS out of bounds" in msg and "wave 0 lane 5" in msg and "static LDS byte 256" in msg
    assert "256 bytes of static __shared__" in msg


def test_dynamic_lds_out_of_bounds():
    out = torch.zeros(64)
    with pytest.raises(emulator.EmulatorError, match=r"LDS out of bounds: wave 0 lane 7 .* writes 4 bytes at dynamic LDS byte 400 .* 400 bytes of dynamic LDS"):
        mod().launch("dyn_oob", 1, 64, [out, 100], shared_bytes=400)
    with pytest.raises(emulator.EmulatorError, match=r"LDS out of bounds at .* dynamic LDS byte 8192, but the launch has 400 bytes .* wave 0 lane 3"):
        mod().launch("dyn_oob_plain", 1, 64, [out, 2048], shared_bytes=400)


def test_misaligned_lds_access():
    with pytest.raises(emulator.EmulatorError, match="misaligned LDS access.*not 4-byte aligned"):
        mod().launch("misaligned", 1, 64, [torch.zeros(64, dtype=torch.int32)])


def test_lds_limit_per_arch():
    src = PRELUDE + """
extern "C" __global__ void big(float* out) {
  __shared__ float lds[20000];   // 80000 bytes: over gfx942's 64 KiB, within gfx950's 160 KiB
  HK_LDS_STORE(float, &lds[tid()], 1.f);
  out[tid()] = HK_LDS_LOAD(float, &lds[tid()]);
}
"""
    out = torch.zeros(64)
    emulator.load(src, "gfx950").launch("big", 1, 64, [out])
    with pytest.raises(emulator.EmulatorError, match="more than the 65536 bytes of LDS"):
        emulator.load(src, "gfx942").launch("big", 1, 64, [out])


@pytest.mark.skipif(not ziglang_available(), reason="ziglang (clang 22 for amdgcn) not installed")
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_sync_kernels_are_real_amd_code(arch):
    asm = offline_compile(SRC, arch)
    assert "s_barrier" in asm and "ds_write_b32" in asm and "ds_read_b32" in asm


def test_plain_static_lds_overflow_hits_the_guard_page():
    """Static LDS ends at a PROT_NONE page, so even a plain (unchecked) access just past it is caught."""
    src = PRELUDE + """
extern "C" __global__ void plain(float* out, int idx) {
  __shared__ float lds[100];
  lds[tid()] = 1.f;
  out[tid()] = lds[tid() == 2 ? idx : 0];
}
"""
    m = emulator.load(src, "gfx942", name="plain.hip")
    assert m.kernels["plain"].static_lds == 400
    out = torch.zeros(64)
    m.launch("plain", 1, 64, [out, 99])
    with pytest.raises(emulator.EmulatorError, match=r"LDS out of bounds at .*: 0 bytes past the end of the kernel's 400 bytes of static __shared__ storage by wave 0 lane 2"):
        m.launch("plain", 1, 64, [out, 100])
