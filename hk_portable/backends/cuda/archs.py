"""The cuda backend's one architecture table: every target, compile-only or emulated, is built from it."""
from __future__ import annotations

from dataclasses import dataclass

from ...interface.backend import Target


@dataclass(frozen=True)
class Arch:
    """One compile target and what the backend may use on it: the schedules, the emitter and the occupancy
    planner read these capabilities, never the arch's name (tests/test_architecture.py)."""
    name: str                      # the compile target NVRTC gets (-arch=)
    major: int                     # the compute capability major it runs on
    max_shared_bytes: int          # dynamic shared memory per block (opt-in maximum)
    mma_shapes: tuple[str, ...]
    fp8_mma: str                   # how an mma of OCP fp8 operands runs (docs/fp8.md): exact on every arch
    # an SM's shared memory (1 KiB of it reserved per block), or 0 where the arch's parts differ too much to
    # plan occupancy for (sm_80 cubins run on every sm_8x: 100 to 164 KiB a SM); see occupancy.py
    sm_shared_bytes: int = 0
    # Hopper's asynchronous data path: TMA tile loads and stores, mbarrier rings, warpgroup mma (wgmma) and the
    # warp-specialised schedules built on them (schedule.py). Without it: cp.async rings and mma.sync.
    async_tensor_core: bool = False
    sm_registers: int = 65536      # 32-bit registers per SM
    sm_max_warps: int = 64         # resident warps per SM
    sm_max_blocks: int = 32        # resident blocks per SM


ARCHS = {a.name: a for a in (
    Arch("sm_80", 8, 166912, ("m16n8k16",),        # 163 KiB (A100); sm_80 cubins run on all sm_8x
         "widened exactly to f16: two mma.sync m16n8k16 per k32 step (no fp8 tensor cores on sm_80)"),
    Arch("sm_90a", 9, 232448, ("m16n8k16", "m16n8k32 fp8", "wgmma k32 fp8"),   # 227 KiB (H100/H200)
         "native OCP e4m3/e5m2: wgmma m64nNk32 (both operands K-major in shared), else mma.sync m16n8k32",
         sm_shared_bytes=233472, async_tensor_core=True),     # 228 KiB (H100/H200)
)}
DEFAULT = "sm_80"                  # the table entry for an arch it does not list
EMULATED = "sm_80"                 # the arch the host emulator (include/hk_cuda_emu.h) models
DTYPES = ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "i32")
CAPABILITIES = ("atomics", "dropout", "fp8")


def arch_for(cc: tuple[int, int]) -> str:
    """The compile target for a compute capability (sm_90a on Hopper, sm_80 on all sm_8x), else sm_XY."""
    for a in ARCHS.values():
        if a.major == cc[0]:
            return a.name
    return f"sm_{cc[0]}{cc[1]}"


def of(target_or_arch) -> Arch:
    """The table row of a Target or an arch name (the default row for an arch the table does not list)."""
    name = getattr(target_or_arch, "arch", target_or_arch)
    return ARCHS.get(name, ARCHS[DEFAULT])


def async_path(target) -> bool:
    """Whether a build for `target` may use the asynchronous tensor-core path (TMA, wgmma, warp specialisation):
    the arch has it and the target is a GPU's (the host emulator models the synchronous path only)."""
    return of(target).async_tensor_core and not getattr(target, "emulated", False)


# TMA's rule for a tensor's base and strides, and the width of a cp.async copy: rows at other alignments load element
# by element (hk_cuda/global_shared.cuh)
ROW_ALIGNMENT = 16


def make_target(arch: str, *, runs: bool, compile_only: bool = False, emulated: bool = False,
                max_shared: int | None = None) -> Target:
    entry = of(arch)
    return Target(backend="cuda", arch=arch, vendor="nvidia", lanes=32,
                  max_shared_bytes=max_shared or entry.max_shared_bytes, mma_shapes=entry.mma_shapes,
                  dtypes=DTYPES, capabilities=CAPABILITIES + (("run",) if runs else ()),
                  compile_only=compile_only, emulated=emulated, row_alignment=ROW_ALIGNMENT)


def device_target(arch: str, smem_optin: int) -> Target:
    """The device's own target: its opt-in shared memory, capped by the table's (the table's if unknown)."""
    listed = ARCHS.get(arch)
    limit = min(smem_optin or listed.max_shared_bytes, listed.max_shared_bytes) if listed else smem_optin
    return make_target(arch, runs=True, max_shared=limit)
