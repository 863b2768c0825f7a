"""Cross-lane builtins behave as AMD documents them (expected values from the ISA pseudo-code, written
here independently of the runtime): ds_bpermute, ds_permute, ds_swizzle, DPP, readfirstlane, readlane,
ballot, mbcnt, and on gfx950 permlane16/32_swap and ds_read_b64_tr_b16."""
from __future__ import annotations

import pytest
import torch

from hk_portable.backends.hip import emulator

from emu_testutil import PRELUDE, needs_emulator, offline_compile, ziglang_available

pytestmark = needs_emulator

NOPS = 24
XLANE_SRC = PRELUDE + r"""
#define OUT(k, x) out[(k) * nt + t] = (int)(x)
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 256)))
void xlane(int* out) {
  const int t = (int)tid(), nt = (int)__builtin_amdgcn_workgroup_size_x(), l = t & 63;
  const int v = 1000 + t;
  OUT(0, __builtin_amdgcn_ds_bpermute(4 * ((l * 7 + 3) & 63), v));
  OUT(1, __builtin_amdgcn_ds_permute(4 * ((l * 5 + 1) & 63), v));
  OUT(2, __builtin_amdgcn_ds_swizzle(v, 0x801B));                 // quad perm [3,2,1,0]
  OUT(3, __builtin_amdgcn_ds_swizzle(v, (1 << 10) | (0 << 5) | 0x1F));  // xor 1 within 32 lanes
  OUT(4, __builtin_amdgcn_update_dpp(-1, v, 0x111, 0xF, 0xF, false));   // row_shr:1, keep old
  OUT(5, __builtin_amdgcn_update_dpp(-1, v, 0x111, 0xF, 0xF, true));    // row_shr:1, bound_ctrl -> 0
  OUT(6, __builtin_amdgcn_update_dpp(-1, v, 0x123, 0xF, 0xF, false));   // row_ror:3
  OUT(7, __builtin_amdgcn_update_dpp(-1, v, 0xB1, 0xF, 0xF, false));    // quad_perm [1,0,3,2]
  OUT(8, __builtin_amdgcn_update_dpp(-1, v, 0x142, 0xA, 0xF, false));   // row_bcast:15, rows 1 and 3
  OUT(9, __builtin_amdgcn_update_dpp(-1, v, 0x143, 0xC, 0xF, false));   // row_bcast:31, rows 2 and 3
  OUT(10, __builtin_amdgcn_update_dpp(-1, v, 0x138, 0xF, 0xF, false));  // wave_shr:1
  OUT(11, __builtin_amdgcn_update_dpp(-1, v, 0x134, 0xF, 0xF, false));  // wave_rol:1
  OUT(12, __builtin_amdgcn_update_dpp(-1, v, 0x140, 0xF, 0xF, false));  // row_mirror
  OUT(13, __builtin_amdgcn_update_dpp(-1, v, 0x141, 0xF, 0xF, false));  // row_half_mirror
  OUT(14, __builtin_amdgcn_update_dpp(-1, v, 0xB1, 0xF, 0x5, false));   // banks 0 and 2 only
  OUT(15, __builtin_amdgcn_update_dpp(-1, v, 0x101, 0xF, 0xF, false));  // row_shl:1
  OUT(16, __builtin_amdgcn_readfirstlane(v));
  OUT(17, __builtin_amdgcn_readlane(v, 37));
  unsigned long b = __builtin_amdgcn_ballot_w64(l % 3 == 0);
  OUT(18, (unsigned)b);
  OUT(19, (unsigned)(b >> 32));
  OUT(20, __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)));
  OUT(21, __builtin_amdgcn_mbcnt_hi(0x0F0F0F0Fu, __builtin_amdgcn_mbcnt_lo(0xAAAAAAAAu, 5u)));
  OUT(22, (unsigned)__builtin_amdgcn_uicmp((unsigned)l, 40u, 36));      // ballot(l < 40), low word
  OUT(23, (unsigned)(__builtin_amdgcn_read_exec() >> 32));
}
"""


def expected(nt: int) -> torch.Tensor:
    E = torch.zeros(NOPS, nt, dtype=torch.int64)
    val = lambda t: 1000 + t  # noqa: E731
    for w0 in range(0, nt, 64):
        lanes = range(64)
        v = [val(w0 + l) for l in lanes]
        # ds_bpermute: dst[l] = v[addr[l] / 4]
        for l in lanes:
            E[0, w0 + l] = v[(l * 7 + 3) & 63]
        # ds_permute: dst[addr[l] / 4] = v[l], unwritten lanes 0, highest writer wins
        tmp = [0] * 64
        for l in lanes:
            tmp[(l * 5 + 1) & 63] = v[l]
        for l in lanes:
            E[1, w0 + l] = tmp[l]
            E[2, w0 + l] = v[(l & ~3) | (3 - (l & 3))]
            E[3, w0 + l] = v[(l & 32) | ((l & 31) ^ 1)]
        for l in lanes:
            r, row = l & 15, l >> 4
            E[4, w0 + l] = v[l - 1] if r >= 1 else -1
            E[5, w0 + l] = v[l - 1] if r >= 1 else 0
            E[6, w0 + l] = v[(l & ~15) | ((r - 3) & 15)]
            E[7, w0 + l] = v[(l & ~3) | [1, 0, 3, 2][l & 3]]
            E[8, w0 + l] = v[16 * row - 1] if row in (1, 3) else -1
            E[9, w0 + l] = v[31] if row in (2, 3) else -1
            E[10, w0 + l] = v[l - 1] if l >= 1 else -1
            E[11, w0 + l] = v[(l + 1) & 63]
            E[12, w0 + l] = v[(l & ~15) | (15 - r)]
            E[13, w0 + l] = v[(l & ~7) | (7 - (l & 7))]
            E[14, w0 + l] = v[(l & ~3) | [1, 0, 3, 2][l & 3]] if ((r >> 2) in (0, 2)) else -1
            E[15, w0 + l] = v[l + 1] if r + 1 < 16 else -1
            E[16, w0 + l] = v[0]
            E[17, w0 + l] = v[37]
        ball = sum(1 << l for l in lanes if l % 3 == 0)
        for l in lanes:
            E[18, w0 + l] = ball & 0xFFFFFFFF
            E[19, w0 + l] = ball >> 32
            E[20, w0 + l] = l
            lo = bin(0xAAAAAAAA & ((1 << l) - 1)).count("1") if l < 32 else bin(0xAAAAAAAA).count("1")
            hi = 0 if l < 32 else bin(0x0F0F0F0F & ((1 << (l - 32)) - 1)).count("1")
            E[21, w0 + l] = lo + 5 + hi
            E[22, w0 + l] = sum(1 << x for x in range(32) if x < 40) & 0xFFFFFFFF
            E[23, w0 + l] = 0xFFFFFFFF
    return E.to(torch.int64)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_cross_lane_builtins(arch):
    nt = 128
    out = torch.zeros(NOPS * nt, dtype=torch.int32)
    emulator.load(XLANE_SRC, arch).launch("xlane", 1, nt, [out])
    got = out.view(NOPS, nt).to(torch.int64) & 0xFFFFFFFF
    exp = expected(nt) & 0xFFFFFFFF
    bad = [(k, int((got[k] != exp[k]).nonzero()[0])) for k in range(NOPS) if not torch.equal(got[k], exp[k])]
    assert not bad, f"ops with wrong lanes (op, first lane): {bad}"


GFX950_SRC = PRELUDE + r"""
extern "C" __global__ void swaps(unsigned* out) {
  unsigned t = tid();
  uint2_t a = __builtin_amdgcn_permlane16_swap(100u + t, 200u + t, false, false);
  uint2_t b = __builtin_amdgcn_permlane32_swap(100u + t, 200u + t, false, false);
  out[0 * 64 + t] = a[0]; out[1 * 64 + t] = a[1];
  out[2 * 64 + t] = b[0]; out[3 * 64 + t] = b[1];
}
typedef short short4_lds __attribute__((ext_vector_type(4)));
extern "C" __global__ void tr16(const short* in, short* out) {
  __shared__ __attribute__((aligned(16))) short tile[64 * 4];   // four 4x16 tiles, one per 16 lanes
  unsigned t = tid();
  for (int e = 0; e < 4; ++e) HK_LDS_STORE(short, &tile[t * 4 + e], in[t * 4 + e]);
  __builtin_amdgcn_s_barrier();
  // lane j of each 16-lane block reads row j/4, columns 4*(j%4)..+3 of its block's 4x16 tile
  unsigned b = t / 16, j = t % 16;
  short* p = &tile[b * 64 + (j / 4) * 16 + 4 * (j % 4)];
  short4_lds r = __builtin_amdgcn_ds_read_tr16_b64_v4i16((__attribute__((address_space(3))) short4_lds*)p);
  for (int e = 0; e < 4; ++e) out[t * 4 + e] = r[e];
}
"""


PARTIAL_SRC = PRELUDE + r"""
static __device__ inline int wave_id() { return __builtin_amdgcn_readfirstlane((int)(tid() >> 6)); }
// A partial EXEC: only lanes 0-15 of each wave reach the readfirstlane; the others wait at the barrier.
extern "C" __global__ void partial_uniform(int* out) {
  __shared__ int lds[4 * 16];
  const int l = (int)(tid() & 63);
  if (l < 16) {
    HK_LDS_STORE(int, &lds[wave_id() * 16 + l], 100 * wave_id() + l);
    out[256 + tid()] = (int)__builtin_amdgcn_ballot_w64(l % 2 == 0);   // lanes 0..15 active
  }
  __builtin_amdgcn_s_barrier();
  out[tid()] = HK_LDS_LOAD(int, &lds[(tid() % 64) % 16 + 16 * ((tid() / 64 + 1) % 4)]);
}
// The same shape with a data-moving cross-lane op is still an error.
extern "C" __global__ void partial_bpermute(int* out) {
  const int l = (int)(tid() & 63);
  if (l < 16) out[tid()] = __builtin_amdgcn_ds_bpermute(4 * (l ^ 1), l);
  __builtin_amdgcn_s_barrier();
}
"""


def test_uniformity_ops_under_partial_exec_while_the_rest_waits_at_a_barrier():
    out = torch.zeros(512, dtype=torch.int32)
    m = emulator.load(PARTIAL_SRC, "gfx942", name="partial.hip")
    m.launch("partial_uniform", 1, 256, [out])
    t = torch.arange(256)
    assert torch.equal(out[:256], (100 * ((t // 64 + 1) % 4) + (t % 64) % 16).int())
    ball = sum(1 << i for i in range(0, 16, 2))
    assert (out[256:][(t % 64) < 16] == ball).all()
    with pytest.raises(emulator.EmulatorError, match="divergent wave operation.*ds_bpermute.*s_barrier"):
        m.launch("partial_bpermute", 1, 64, [torch.zeros(64, dtype=torch.int32)])


def test_gfx950_permlane_swaps():
    out = torch.zeros(4 * 64, dtype=torch.int32)
    emulator.load(GFX950_SRC, "gfx950").launch("swaps", 1, 64, [out])
    o = out.view(4, 64).tolist()
    for i in range(64):
        # permlane16_swap: odd rows of the first operand <-> even rows of the second
        upper16 = (i & 16) != 0
        assert o[0][i] == (200 + i - 16 if upper16 else 100 + i)
        assert o[1][i] == (200 + i if upper16 else 100 + i + 16)
        # permlane32_swap: rows 2-3 of the first <-> rows 0-1 of the second
        upper32 = i >= 32
        assert o[2][i] == (200 + i - 32 if upper32 else 100 + i)
        assert o[3][i] == (200 + i if upper32 else 100 + i + 32)


def test_gfx950_ds_read_tr16_transposes_4x16_tiles():
    inp = torch.arange(256, dtype=torch.int16)
    out = torch.zeros(256, dtype=torch.int16)
    emulator.load(GFX950_SRC, "gfx950").launch("tr16", 1, 64, [inp, out])
    for blk in range(4):
        tile = inp[blk * 64:(blk + 1) * 64].view(4, 16)           # row-major 4x16 tile in LDS
        got = out.view(64, 4)[blk * 16:(blk + 1) * 16]            # lane i of the block: 4 values
        assert torch.equal(got, tile.t().contiguous()), f"block {blk}: lane i must get column i"


def test_gfx950_builtins_absent_on_gfx942():
    with pytest.raises(emulator.CompileError, match="permlane16_swap"):
        emulator.load(GFX950_SRC, "gfx942")


@pytest.mark.skipif(not ziglang_available(), reason="ziglang (clang 22 for amdgcn) not installed")
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_cross_lane_kernels_are_real_amd_code(arch):
    asm = offline_compile(XLANE_SRC, arch)
    for ins in ("ds_bpermute_b32", "ds_permute_b32", "ds_swizzle_b32", "row_shr:1", "row_bcast:15",
                "v_readfirstlane_b32", "v_mbcnt_hi_u32_b32"):
        assert ins in asm, ins
    if arch == "gfx950":
        asm = offline_compile(GFX950_SRC, arch)
        for ins in ("v_permlane16_swap_b32", "v_permlane32_swap_b32", "ds_read_b64_tr_b16"):
            assert ins in asm, ins
