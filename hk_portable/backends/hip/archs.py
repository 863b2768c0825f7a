"""The hip backend's one architecture table: targets, the LDS limit codegen checks, the archs the
compilers and the runtime take. (The CPU emulator keeps its own table of the archs it models, in
emulator/, with the same LDS sizes.)"""
from __future__ import annotations

from dataclasses import dataclass

from ...interface.backend import Target


@dataclass(frozen=True)
class Arch:
    name: str
    lds_bytes: int                 # LDS one block may use
    mma_shapes: tuple[str, ...]
    fp8_mma: str                   # how an mma of OCP fp8 operands runs (docs/fp8.md): exact on every arch
    fnuz_e4m3: bool = False        # e4m3 x e4m3 runs on FNUZ codes (halved values): codegen.fnuz_storage and
                                   # codegen.quartered_carries move the mapping and the rescale out of the loop


ARCHS = {a.name: a for a in (
    Arch("gfx942", 64 * 1024, ("16x16x16", "16x16x32 fp8"),            # CDNA3: MI300X / MI325X
         "FNUZ hardware: e4m3 x e4m3 mapped onto FNUZ codes (value halved, -0/NaN remapped, accumulator "
         "rescaled by 4); any e5m2 widened to f16 (FNUZ has no infinity)", fnuz_e4m3=True),
    Arch("gfx950", 160 * 1024, ("16x16x16", "16x16x32", "16x16x32 fp8"),   # CDNA4: MI350X / MI355X
         "native OCP e4m3/e5m2 (v_mfma_f32_16x16x32_{fp8,bf8}_{fp8,bf8})"),
)}
NAMES = tuple(ARCHS)
LANES = 64
DTYPES = ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "i32")
CAPABILITIES = ("atomics", "dropout", "fp8")


def make_target(arch: str, *, runs: bool, compile_only: bool = False, emulated: bool = False) -> Target:
    entry = ARCHS[arch]
    return Target(backend="hip", arch=arch, vendor="amd", lanes=LANES, max_shared_bytes=entry.lds_bytes,
                  mma_shapes=entry.mma_shapes, dtypes=DTYPES,
                  capabilities=CAPABILITIES + (("run",) if runs else ()), compile_only=compile_only,
                  emulated=emulated)
