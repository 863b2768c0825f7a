"""Direct-to-LDS loads are asynchronous in the emulator as on the device: their data may be read only
after an s_waitcnt whose vmcnt covers them (in the loading wave; before an s_barrier for other waves).
A read or write of their destination before that is a missing-wait error naming kernel, block, wave,
lane and LDS address. Planted missing waits are caught; correct waits, by count too, pass."""
from __future__ import annotations

import pytest
import torch

from hk_portable.backends.hip import emulator

from emu_testutil import PRELUDE, needs_emulator

pytestmark = needs_emulator

NO_WAIT, WAIT_ALL, WAIT_ONE_LEFT = -1, 0, 0xF71     # 0xF71: vmcnt(1) expcnt(7) lgkmcnt(15), gfx9 encoding

SRC = PRELUDE + r"""
#define AS1(p) ((__attribute__((address_space(1))) void*)(p))
#define AS3(p) ((__attribute__((address_space(3))) void*)(p))
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 128)))
void two_loads(const int* src, int* out, int wait, int read_a, int read_b, int early) {
  __shared__ __attribute__((aligned(16))) int lds[2 * 64];
  const int t = (int)tid(), wave = t / 64, lane = t % 64;
  if (wave == 0) {
    __builtin_amdgcn_global_load_lds(AS1(src + lane), AS3(lds), 4, 0, 0);             // A: lds[0..63]
    __builtin_amdgcn_global_load_lds(AS1(src + 64 + lane), AS3(lds + 64), 4, 0, 0);   // B: lds[64..127]
    if (early) out[128 + lane] = HK_LDS_LOAD(int, &lds[lane]);                        // before any wait
    if (wait >= 0) __builtin_amdgcn_s_waitcnt(wait);
  }
  __builtin_amdgcn_s_barrier();
  if (wave == 1 && read_a) out[lane] = HK_LDS_LOAD(int, &lds[lane]);
  if (wave == 1 && read_b) out[64 + lane] = HK_LDS_LOAD(int, &lds[64 + lane]);
}
"""


def run(arch, wait, read_a, read_b, early=0):
    src = torch.arange(128, dtype=torch.int32) * 7 + 1
    out = torch.full((192,), -5, dtype=torch.int32)
    emulator.load(SRC, arch, name="missing_wait.hip").launch("two_loads", 2, 128,
                                                             [src, out, wait, read_a, read_b, early])
    return src, out


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_waited_loads_are_read_correctly(arch):
    src, out = run(arch, WAIT_ALL, 1, 1)
    assert torch.equal(out[:128], src)
    src, out = run(arch, WAIT_ONE_LEFT, 1, 0)          # vmcnt(1): the older load A has landed
    assert torch.equal(out[:64], src[:64]) and (out[64:] == -5).all()
    run(arch, NO_WAIT, 0, 0)                            # loads nobody reads need no wait


@pytest.mark.parametrize("wait,read_a,read_b,early,reader", [
    (NO_WAIT, 1, 0, 0, "wave 1 lane 0"),               # no wait before the barrier
    (WAIT_ONE_LEFT, 0, 1, 0, "wave 1 lane 0"),         # vmcnt(1) leaves the younger load B in flight
    (WAIT_ALL, 0, 0, 1, "wave 0 lane 0"),              # the loading wave reads before its wait
])
def test_planted_missing_waits_are_caught(wait, read_a, read_b, early, reader):
    with pytest.raises(emulator.EmulatorError) as e:
        run("gfx942", wait, read_a, read_b, early)
    msg = str(e.value)
    assert "missing s_waitcnt" in msg and "kernel 'two_loads' block (0,0,0)" in msg and reader in msg
    assert "direct-to-LDS load of wave 0" in msg and "LDS byte" in msg and "missing_wait.hip" in msg
