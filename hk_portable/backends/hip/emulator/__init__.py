"""Run header-free HIP kernels for AMD gfx942 / gfx950 on the CPU: a lane-accurate wave64 emulator.

    from hk_portable.backends.hip import emulator
    mod = emulator.load(source, arch="gfx942")
    mod.launch("kernel_name", grid=(gx, gy, gz), block=(bx, by, bz), args=[a, b, c, 128], shared_bytes=0)

The source is compiled for the host by clang++ against ``hk_emu.h`` (every AMD builtin the device code
uses, under its real name) and linked with the emulator runtime; each work-item runs as a fiber, the lanes
of a wave meet at every wave-level instruction (MFMA, ds_bpermute, DPP, ballot, ...), waves meet at
``s_barrier``. Out-of-bounds global or LDS accesses, LDS races between barriers, divergent wave operations
and barrier deadlocks raise :class:`EmulatorError` with the kernel, block, wave, lane and address.
README.md beside this file documents the API, the contract device code follows, the modeled semantics
and their sources, and which module of this package holds what.
"""
from __future__ import annotations

from .args import Blob, Scalar, blob, f32, f64, i8, i16, i32, i64, ptr, u8, u16, u32, u64
from .errors import CompileError, EmulatorError
from .loader import load
from .module import KernelInfo, LaunchStats, Module, Param
from .runtime_abi import ARCHS
from .source import rewrite_source
from .toolchain import available, compiler

__all__ = [
    "EmulatorError", "CompileError", "load", "available", "compiler", "Module", "KernelInfo", "Param",
    "LaunchStats", "Scalar", "Blob", "blob", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64",
    "f32", "f64", "ptr", "ARCHS",
]
