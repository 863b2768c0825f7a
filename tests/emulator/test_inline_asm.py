"""The device library's inline assembly runs in the emulator from its operands: load() parses each asm
statement, checks it against the instructions it models (exact mnemonics, operand constraints, clobbers) and
executes it -- for the gfx950 LDS-DMA `buffer_load_dwordx4 %0, %1, 0 offen lds`, lane l's 16 bytes at
resource + soffset + the VGPR offset (range-checked against num_records) land at LDS address M0 + 16*l and
count on vmcnt until an s_waitcnt covers them. Wrong operand values (M0, the offset, the soffset), a missing
wait, and asm the emulator does not model are caught; the last at build time, naming the asm."""
from __future__ import annotations

import pytest
import torch

from hk_portable.backends.hip import emulator

from emu_testutil import PRELUDE, needs_emulator, offline_compile, ziglang_available

pytestmark = needs_emulator

# The template and operand binding of hk_hip/global_shared.h's dma16, with knobs for planted bugs.
ASM = r'asm volatile("s_nop 0\n\tbuffer_load_dwordx4 %0, %1, 0 offen lds" : : "v"(off), "s"(r), "{m0}"(m0) : "memory");'

SRC = PRELUDE + r"""
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(64, 128)))
void dma(const int* src, int* out, int nbytes, int m0_delta, int off_delta, int wait) {
  __shared__ __attribute__((aligned(16))) int lds[2 * 64 * 4 + 64];      // 1 KiB per wave, 256 bytes spare
  const int t = (int)tid(), wave = t / 64, lane = t % 64;
  const __amdgpu_buffer_rsrc_t r = __builtin_amdgcn_make_buffer_rsrc((void*)src, (short)0, nbytes, 0x00020000);
  unsigned char* dst = (unsigned char*)(lds + wave * 256);
  const unsigned m0 = (unsigned)(unsigned long long)(__attribute__((address_space(3))) void*)dst + (unsigned)m0_delta;
  const unsigned off = (unsigned)((wave * 64 + lane) * 16 + off_delta);
  @ASM@
  if (wait) __builtin_amdgcn_s_waitcnt(0);                                // vmcnt(0) expcnt(0) lgkmcnt(0)
  __builtin_amdgcn_s_barrier();
  for (int k = 0; k < 4; ++k) out[t * 4 + k] = HK_LDS_LOAD(int, &lds[wave * 256 + lane * 4 + k]);
}
"""


def source(asm: str = ASM) -> str:
    return SRC.replace("@ASM@", asm)


def run(nbytes=2 * 64 * 16, m0_delta=0, off_delta=0, wait=1, threads=128, asm=ASM):
    src = torch.arange(2 * 64 * 4, dtype=torch.int32) * 3 + 1
    out = torch.full((threads * 4,), -7, dtype=torch.int32)
    mod = emulator.load(source(asm), "gfx950", name="inline_asm.hip")
    mod.launch("dma", 1, threads, [src, out, nbytes, m0_delta, off_delta, wait])
    return src, out


def test_lds_dma_asm_places_lane_l_at_m0_plus_16l():
    src, out = run()
    assert torch.equal(out, src)


def test_range_check_on_num_records_reads_zero():
    src, out = run(nbytes=2 * 64 * 16 - 20)             # the last lane's last two dwords are out of range
    ref = src.clone()
    ref[-5:] = 0                                        # dword-granular: 20 bytes short -> 5 dwords read 0
    assert torch.equal(out, ref)


def test_wrong_m0_by_one_chunk_moves_the_data():
    # M0 one 16-byte chunk high: lane l's data lands in lane l+1's slot, wave 0's lane 63 in wave 1's first
    # slot, wave 1's lane 63 in the spare bytes; slot 0 of wave 0 keeps the LDS poison (0xFF bytes)
    src, out = run(m0_delta=16)
    assert torch.equal(out[4:], src[:-4]) and (out[:4] == -1).all()


def test_m0_that_is_no_lds_address_is_reported():
    with pytest.raises(emulator.EmulatorError, match=r"M0 = 0x[0-9a-f]+ \+ offset 0 = .* is not an LDS address"):
        run(m0_delta=1 << 20)


def test_wrong_voffset_by_one_chunk_reads_the_next_chunk():
    src, out = run(off_delta=16)
    ref = torch.cat([src[4:], torch.zeros(4, dtype=torch.int32)])     # the last lane reads past num_records: 0
    assert torch.equal(out, ref)


def test_soffset_and_instruction_offset_are_executed():
    asm = ASM.replace("0 offen lds", "16 offen lds")                   # soffset 16: added, not range-checked
    src, out = run(asm=asm, nbytes=2 * 64 * 16 - 16)                   # (the last lane's voffset is)
    assert torch.equal(out[:-4], src[4:]) and (out[-4:] == 0).all()
    with pytest.raises(emulator.EmulatorError, match="past the end of argument 0"):
        run(asm=asm)                                                   # in range, but past the tensor
    asm = ASM.replace("0 offen lds", "0 offen offset:16 lds")          # offset: applies to global and LDS
    src, out = run(asm=asm, threads=64, nbytes=2 * 64 * 16)
    assert torch.equal(out[4:], src[4:256]) and (out[:4] == -1).all()   # chunk l+1 into slot l+1


def test_missing_wait_after_the_asm_is_caught():
    with pytest.raises(emulator.EmulatorError, match="missing s_waitcnt") as e:
        run(wait=0)
    assert "direct-to-LDS load of wave" in str(e.value) and "inline_asm.hip" in str(e.value)


@pytest.mark.parametrize("old,new,why", [
    ("s_nop 0\\n\\t", "", "first wait state after the compiler's write"),
    (': "memory");', ");", 'no "memory" clobber'),
    (', "{m0}"(m0)', "", 'binds 0 "{m0}" operands'),
    ('"v"(off)', '"s"(off)', "bound with constraint 's'"),
    ('"v"(off)', '"v"((unsigned long long)off)', "must bind a 32-bit value"),
    ("buffer_load_dwordx4", "buffer_load_dwordx2", "is not modeled"),
    ("offen lds", "idxen lds", "modifier 'idxen'"),
    ("offen lds", "offen", "only the LDS form"),
    ("s_nop 0", "s_nop 0\\n\\tv_mov_b32 v0, 0", "instruction 'v_mov_b32 v0, 0' is not modeled"),
])
def test_asm_the_emulator_does_not_model_fails_at_build_time(old, new, why):
    assert old in ASM
    with pytest.raises(emulator.CompileError, match="inline asm") as e:
        emulator.load(source(ASM.replace(old, new)), "gfx950", name="inline_asm.hip")
    msg = str(e.value) + getattr(e.value, "log", "")
    assert why in msg and "inline_asm.hip" in msg, msg


def test_dwordx4_lds_dma_is_gfx950_only():
    with pytest.raises(emulator.CompileError, match="gfx950-only"):
        emulator.load(source(), "gfx942", name="inline_asm.hip")


def test_empty_asm_barrier_is_kept_and_labels_are_not_asm():
    src = PRELUDE + r"""
extern "C" __shared__ int dyn[];
extern "C" __global__ void k(int* o) { asm volatile(""); o[tid()] = (int)tid(); HK_LDS_STORE(int, &dyn[0], 1); }
"""
    o = torch.zeros(64, dtype=torch.int32)
    emulator.load(src, "gfx942", name="empty_asm.hip").launch("k", 1, 64, [o], shared_bytes=16)
    assert torch.equal(o, torch.arange(64, dtype=torch.int32))


@pytest.mark.skipif(not ziglang_available(), reason="ziglang (offline clang) not installed")
def test_the_test_kernel_is_real_gfx950_code():
    asm = offline_compile(source(), "gfx950")
    assert "buffer_load_dwordx4" in asm and "offen lds" in asm and "s_mov_b32 m0" in asm
