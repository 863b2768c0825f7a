"""The hip backend's one architecture table: targets, the LDS limit codegen checks, the archs the compilers and
the runtime take, the instruction costs the ISA analyser reads, the ids the CPU emulator's runtime models them by.
Code decides by these capabilities, never by an arch's name (tests/test_architecture.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...interface.backend import Target

# MFMA cycles on one SIMD's matrix core, (M, N, K, instruction kind) -> cycles, one table per arch. Sources, which
# agree on every entry but one: AMD, "Matrix Core Programming on AMD CDNA3 and CDNA4 architecture" (ROCm blog,
# 2025), its table of MFMA instructions with cycle counts, and the CDNA3 / CDNA4 ISA guides (ch. 7, "Matrix
# Arithmetic Instructions": passes, 4 cycles each); LLVM's scheduling model (SISchedule.td), as its llvm-mca tests
# print it: the HWXDL resource cycles of llvm/test/tools/llvm-mca/AMDGPU/gfx942-mfma.s and gfx950.s are passes
# (16x16 forms 4, 32x32 8, f32 16x16x4 8, f64 16x16x4 8 on gfx942 and 16 on gfx950). On gfx950 LLVM gives
# 16x16x16 f16/bf16 and 16x16x32 f16/bf16 both 4 passes: the older form does half the work in the same time (the
# analyser's form efficiency, below, reads 0.5). The one disagreement: LLVM gives the f8f6f4 forms 4 (16x16x128)
# and 8 (32x32x64) passes whatever the operands, with a FIXME saying fp8 operands should cost more; AMD's tables
# give fp8 operands 8 and 16 passes (FP6/FP4: 4 and 8), which the peaks below confirm: the table takes AMD's.
CDNA3_MFMA_CYCLES = {
    (16, 16, 16, "f16"): 16, (32, 32, 8, "f16"): 32,
    (16, 16, 32, "f8"): 16, (32, 32, 16, "f8"): 32,
    (16, 16, 32, "i8"): 16, (32, 32, 16, "i8"): 32,
    (16, 16, 4, "f32"): 32, (32, 32, 2, "f32"): 64,
    (16, 16, 8, "xf32"): 16, (32, 32, 4, "xf32"): 32,
    (16, 16, 4, "f64"): 32}          # 8 passes on gfx940 (llvm-project PR #83782)
CDNA4_MFMA_CYCLES = {
    (16, 16, 16, "f16"): 16, (32, 32, 8, "f16"): 32,          # half rate on CDNA4: the x32 / x16 forms do twice
    (16, 16, 32, "f16"): 16, (32, 32, 16, "f16"): 32,
    (16, 16, 32, "f8"): 16, (32, 32, 16, "f8"): 32,           # half rate on CDNA4: f8f6f4 does 4x in 2x the time
    (16, 16, 64, "i8"): 16, (32, 32, 32, "i8"): 32,
    (16, 16, 32, "i8"): 16, (32, 32, 16, "i8"): 32,
    (16, 16, 128, "f8f6f4"): 32, (32, 32, 64, "f8f6f4"): 64,   # the FP8 forms (FP4/FP6: half)
    (16, 16, 4, "f32"): 32, (32, 32, 2, "f32"): 64,
    (16, 16, 4, "f64"): 64}
# The matrix cores' peak, FLOP (int8: OP) per clock per SIMD, by operand kind ("f16" is f16 and bf16; "f8" fp8 and
# bf8, also as f8f6f4 operands): AMD's dense peaks divided by SIMDs x clock. MI300X (gfx942; 304 CUs x 4 SIMDs,
# 2.1 GHz): 1307.4 TFLOP/s f16/bf16, 2614.9 fp8 and int8, 653.7 tf32, 163.4 f32 and f64 matrix. MI355X (gfx950;
# 256 CUs x 4, 2.4 GHz): 2516.6 f16/bf16, 5033.2 fp8 and int8, 157.3 f32 and 78.6 f64 matrix (FP6/FP4 10066: not
# listed, the analyser costs f8f6f4 as fp8). Each equals the best form's 2*M*N*K / cycles in the table above
# (tests/hip/test_analyze.py): the two sources agree.
CDNA3_MFMA_PEAK = {"f16": 512, "f8": 1024, "i8": 1024, "xf32": 256, "f32": 64, "f64": 64}
CDNA4_MFMA_PEAK = {"f16": 1024, "f8": 2048, "i8": 2048, "f32": 64, "f64": 32}


@dataclass(frozen=True)
class Arch:
    name: str
    lds_bytes: int                 # LDS one block may use
    mma_shapes: tuple[str, ...]
    fp8_mma: str                   # how an mma of OCP fp8 operands runs (docs/fp8.md): exact on every arch
    fnuz_e4m3: bool = False        # e4m3 x e4m3 runs on FNUZ codes (halved values): schedule.fnuz_storage and
                                   # schedule.quartered_carries move the mapping and the rescale out of the loop
    emulator_id: int = 0           # the id the CPU emulator's runtime models the arch by (emulator/runtime_abi.py)
    mfma_cycles: dict = field(default_factory=dict)     # the ISA analyser's MFMA costs (above)
    mfma_peak: dict = field(default_factory=dict)       # FLOP per clock per SIMD by operand kind (above): what
                                                        # `hk analyze` measures a loop's MFMA work against
    # LDS bytes per clock per CU: 32 banks x 4 bytes on gfx942 (CDNA3 ISA guide, "Local Data Share"); 64 banks on
    # gfx950 (CDNA4 doubled the LDS bandwidth with its size; the backend's swizzle assumes 64 banks too)
    lds_bytes_per_clock: int = 128
    # ds_read_b64_tr_b16: a transposing LDS read, so an MFMA's B operand is read from row-major LDS (CDNA4)
    lds_transpose_read: bool = False
    # LDS-DMA (buffer_load ... lds) of 12 or 16 bytes a lane, not only 1-4 (CDNA4)
    lds_dma_wide: bool = False
    # v_mfma_f32_16x16x32_{bf16,f16}: the 16-bit MFMA of K=32, twice the 16x16x16 form's work in its cycles (CDNA4;
    # mfma_cycles above). The device library takes it for a 16-bit mma whose K is a multiple of 32 (mma.h kv_for);
    # the tuning table (preferences.py) ranks first the configurations whose k-step feeds it
    mfma_16bit_k32: bool = False
    # v_mfma_scale_f32_16x16x128_f8f6f4 on fp8 operands (unit E8M0 scales): 4x the work of 16x16x32 fp8 in 2x its
    # cycles, CDNA4's fp8 peak (mfma_cycles above). The device library takes it for an fp8 mma whose K is a
    # multiple of 128 (mma.h mfma_for), two 16-byte LDS reads a lane per operand
    mfma_f8f6f4: bool = False
    # v_cvt_pk_bf16_f32: f32 -> bf16 in one instruction (CDNA4). Without it the device library rounds in software
    # (elementwise.h), where attention's P takes the form without the NaN arm (patterns.nan_row_casts)
    bf16_convert: bool = False
    # lanes per wave: what a block's waves are counted in, layouts divide rows over, the ISA analyser scales by
    wave_size: int = 64
    # accelerator dies (XCDs), each with its own L2, that blocks are dealt round-robin over: hk::block_idx numbers
    # blocks so that consecutive ones share a die (HK_XCDS; 8 on MI300X/MI325X and MI350X/MI355X)
    xcds: int = 8


ARCHS = {a.name: a for a in (
    Arch("gfx942", 64 * 1024, ("16x16x16", "16x16x32 fp8"),            # CDNA3: MI300X / MI325X
         "FNUZ hardware: e4m3 x e4m3 mapped onto FNUZ codes (value halved, -0/NaN remapped, accumulator "
         "rescaled by 4); any e5m2 widened to f16 (FNUZ has no infinity)", fnuz_e4m3=True,
         emulator_id=942, mfma_cycles=CDNA3_MFMA_CYCLES, mfma_peak=CDNA3_MFMA_PEAK, lds_bytes_per_clock=128),
    Arch("gfx950", 160 * 1024, ("16x16x16", "16x16x32", "16x16x32 fp8", "16x16x128 fp8"),   # CDNA4: MI350X / MI355X
         "native OCP e4m3/e5m2 (v_mfma_scale_f32_16x16x128_f8f6f4 where K is a multiple of 128, else "
         "v_mfma_f32_16x16x32_{fp8,bf8}_{fp8,bf8})", emulator_id=950,
         mfma_cycles=CDNA4_MFMA_CYCLES, mfma_peak=CDNA4_MFMA_PEAK, lds_bytes_per_clock=256,
         lds_transpose_read=True, lds_dma_wide=True, mfma_16bit_k32=True, mfma_f8f6f4=True, bf16_convert=True),
)}
NAMES = tuple(ARCHS)


def has(arch: str | None, capability: str) -> bool:
    """Whether the row of `arch` has `capability` (an Arch field); False for an arch the table does not list."""
    row = ARCHS.get(arch)
    return bool(row is not None and getattr(row, capability))


DTYPES = ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "i32")
CAPABILITIES = ("atomics", "dropout", "fp8")


# a dwordx4 global load's width: rows at other alignments load element by element
ROW_ALIGNMENT = 16


def make_target(arch: str, *, runs: bool, compile_only: bool = False, emulated: bool = False) -> Target:
    entry = ARCHS[arch]
    return Target(backend="hip", arch=arch, vendor="amd", lanes=entry.wave_size, max_shared_bytes=entry.lds_bytes,
                  mma_shapes=entry.mma_shapes, dtypes=DTYPES,
                  capabilities=CAPABILITIES + (("run",) if runs else ()), compile_only=compile_only,
                  emulated=emulated, row_alignment=ROW_ALIGNMENT)
