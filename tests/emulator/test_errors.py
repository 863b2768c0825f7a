"""Planted bugs are caught and reported with kernel, block, wave, lane and address -- never a crash or a
hang -- and the emulator keeps working afterwards."""
from __future__ import annotations

import re

import pytest
import torch

from hk_portable.backends.hip import emulator

from emu_testutil import PRELUDE, needs_emulator

pytestmark = needs_emulator

SRC = PRELUDE + r"""
extern "C" __global__ void copy(const float* a, float* b, int n, int extra) {
  int i = (int)(__builtin_amdgcn_workgroup_id_x() * __builtin_amdgcn_workgroup_size_x() + tid());
  if (i < n + extra) b[i] = a[i] * 2.f;
}
extern "C" __global__ void before_start(const float* a, float* b) {
  int i = (int)tid();
  b[i] = a[i - 1];                 // lane 0 reads a[-1]
}
extern "C" __global__ void write_before(float* b) {
  b[(int)tid() - 1] = 1.f;         // lane 0 writes b[-1]
}
extern "C" __global__ void null_deref(float* b, float* maybe_null) {
  b[tid()] = maybe_null[tid()];
}
extern "C" __global__ void stray(float* b, long addr) {
  b[tid()] = *(float*)addr;
}
extern "C" __global__ void divergent_xlane(int* out) {
  int l = (int)tid();
  int v;
  if (l < 16) v = __builtin_amdgcn_ds_bpermute(4 * (l ^ 1), l);
  else v = __builtin_amdgcn_readfirstlane(l);
  out[l] = v;
}
extern "C" __global__ void exited_then_xlane(int* out) {
  int l = (int)tid();
  if (l >= 60) return;
  out[l] = __builtin_amdgcn_ds_bpermute(4 * (l ^ 1), l);
}
extern "C" __global__ void exited_then_ballot(unsigned long* out) {
  int l = (int)tid();
  if (l >= 60) return;
  out[l] = __builtin_amdgcn_ballot_w64(true);
}
extern "C" __global__ void divide(int* out, int d) {
  out[tid()] = 100 / (d + (int)tid() - 3);    // lane 3 divides by zero when d == 0
}
extern "C" __global__ void trap(int* out) {
  if (tid() == 9) __builtin_trap();
  out[tid()] = 1;
}
extern "C" __global__ void spin_with_sync(volatile int* flag) {
  while (*flag == 0) __builtin_amdgcn_s_waitcnt(0);
}
extern "C" __global__ void spin_without_sync(volatile int* flag) {
  while (*flag == 0) {}
}
extern "C" __global__ void recurse(int* out, int depth) {
  volatile char big[4096];
  big[0] = (char)depth;
  if (depth > 0) {
    // the kernel calls itself through a pointer so the compiler cannot turn it into a loop
    void (*volatile self)(int*, int) = recurse;
    self(out, depth - 1);
  }
  out[tid()] = big[0];
}
"""


def mod():
    return emulator.load(SRC, "gfx942", name="errors.hip")


def test_out_of_bounds_global_read_names_kernel_block_lane_and_tensor():
    a, b = torch.ones(1000), torch.zeros(1000)
    mod().launch("copy", 4, 256, [a, b, 1000, 0])
    assert torch.equal(b, 2 * a)
    with pytest.raises(emulator.EmulatorError) as e:
        mod().launch("copy", 4, 256, [a, b, 1000, 1])
    msg = str(e.value)
    assert "kernel 'copy' block (3,0,0)" in msg
    assert "out-of-bounds global access" in msg and "past the end of argument 0 (float32 tensor of shape (1000,))" in msg
    assert "wave 3 lane 40 (work-item (232,0,0)" in msg          # 3*256 + 232 == 1000
    assert re.search(r"\[at errors\.hip:\d+:\d+ in ", msg), msg   # symbolized source line


def test_fault_locations_are_symbolized_on_every_worker():
    """Workers beyond the first run unlinked copies of the kernel's object; reports still name the line."""
    a, b = torch.ones(1024), torch.zeros(64)     # 4096 bytes: a[-1] is in the guard page
    for _ in range(4):
        with pytest.raises(emulator.EmulatorError) as e:
            mod().launch("before_start", 8, 64, [a, b], threads=2)
        assert re.search(r"\[at errors\.hip:\d+:\d+ in ", str(e.value)), str(e.value)


def test_out_of_bounds_before_the_start():
    a, b = torch.ones(1024), torch.zeros(64)
    with pytest.raises(emulator.EmulatorError, match=r"4 bytes before the start of argument 0 .* wave 0 lane 0"):
        mod().launch("before_start", 1, 64, [a, b])


def test_small_underflows_and_tail_writes():
    """Within the page before a tensor (not guarded) reads see 0xFF bytes and writes are found after the
    launch; the alignment tail after a tensor whose size is not a multiple of 16 likewise."""
    a, b = torch.ones(64), torch.zeros(64)
    mod().launch("before_start", 1, 64, [a, b])
    assert torch.isnan(b[0]) and (b[1:] == 1).all()
    with pytest.raises(emulator.EmulatorError, match=r"out-of-bounds write 4 bytes before the start of argument 0"):
        mod().launch("write_before", 1, 64, [a])
    with pytest.raises(emulator.EmulatorError, match=r"out-of-bounds write 0 bytes past the end of argument 1 .*alignment padding"):
        mod().launch("copy", 1, 64, [torch.ones(64), torch.zeros(61), 61, 1])


def test_null_and_stray_pointers():
    b = torch.zeros(64)
    with pytest.raises(emulator.EmulatorError, match="null pointer dereference"):
        mod().launch("null_deref", 1, 64, [b, None])
    other = torch.zeros(64)     # not passed to the kernel: its address is not kernel memory
    with pytest.raises(emulator.EmulatorError, match="in no tensor argument of this launch"):
        mod().launch("stray", 1, 64, [b, emulator.i64(0x100000)])
    del other


def test_divergent_cross_lane_operations_are_reported_not_hung():
    with pytest.raises(emulator.EmulatorError) as e:
        mod().launch("divergent_xlane", 1, 64, [torch.zeros(64, dtype=torch.int32)])
    msg = str(e.value)
    assert "divergent wave operation in wave 0" in msg
    assert "ds_bpermute" in msg and "readfirstlane" in msg and "errors.hip:" in msg


def test_cross_lane_operation_after_lanes_returned():
    with pytest.raises(emulator.EmulatorError, match=r"ds_bpermute at errors\.hip:\d+ reached by wave 0 after 4 of its lanes returned"):
        mod().launch("exited_then_xlane", 1, 64, [torch.zeros(64, dtype=torch.int32)])
    out = torch.zeros(64, dtype=torch.int64)      # ballot is defined with inactive lanes
    mod().launch("exited_then_ballot", 1, 64, [out])
    assert (out[:60] == (1 << 60) - 1).all()


def test_integer_division_by_zero_and_trap():
    with pytest.raises(emulator.EmulatorError, match=r"integer division by zero .* wave 0 lane 3"):
        mod().launch("divide", 1, 64, [torch.zeros(64, dtype=torch.int32), 0])
    with pytest.raises(emulator.EmulatorError, match=r"wave 0 lane 9 .* executed a trap"):
        mod().launch("trap", 1, 64, [torch.zeros(64, dtype=torch.int32)])


def test_timeouts():
    flag = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(emulator.EmulatorError, match="timeout"):
        mod().launch("spin_with_sync", 2, 64, [flag], timeout=0.3)
    with pytest.raises(emulator.EmulatorError, match="timeout: .* still running without reaching a wave-level operation"):
        mod().launch("spin_without_sync", 2, 64, [flag], timeout=0.3)


def test_lane_stack_overflow():
    with pytest.raises(emulator.EmulatorError, match="stack overflow of the lane"):
        mod().launch("recurse", 1, 64, [torch.zeros(64, dtype=torch.int32), 100000])


def test_emulator_keeps_working_after_errors():
    a, b = torch.arange(256.), torch.zeros(256)
    for _ in range(3):
        with pytest.raises(emulator.EmulatorError):
            mod().launch("copy", 2, 256, [a, b, 256, 1])
    mod().launch("copy", 1, 256, [a, b, 256, 0])
    assert torch.equal(b, 2 * a)


def test_failed_launch_leaves_tensors_untouched():
    a, b = torch.ones(300), torch.full((300,), 7.0)
    with pytest.raises(emulator.EmulatorError):
        mod().launch("copy", 2, 256, [a, b, 300, 1])      # block 1 reads past the end of a
    assert torch.equal(b, torch.full((300,), 7.0))


def test_bad_launches():
    m = mod()
    a, b = torch.ones(64), torch.zeros(64)
    with pytest.raises(emulator.EmulatorError, match="no kernel 'nope'.*copy"):
        m.launch("nope", 1, 64, [])
    with pytest.raises(emulator.EmulatorError, match="takes 4 arguments"):
        m.launch("copy", 1, 64, [a, b])
    with pytest.raises(emulator.EmulatorError, match="argument 0 is a pointer"):
        m.launch("copy", 1, 64, [3, b, 64, 0])
    with pytest.raises(emulator.EmulatorError, match="argument 2 is a 4-byte int parameter, not a pointer"):
        m.launch("copy", 1, 64, [a, b, a, 0])
    with pytest.raises(emulator.EmulatorError, match="does not fit a 4-byte int"):
        m.launch("copy", 1, 64, [a, b, 2 ** 40, 0])
    with pytest.raises(emulator.EmulatorError, match="AMD allows 1..1024"):
        m.launch("copy", 1, 2048, [a, b, 64, 0])
