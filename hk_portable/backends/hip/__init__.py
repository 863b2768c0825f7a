"""The hip backend: AMD Instinct CDNA3 (gfx942) and CDNA4 (gfx950).

  backend.py   HipBackend: status, targets, compile, emit, launch (CPU tensors: the emulator)
  archs.py     the architecture table every target is built from
  options.py   HipOptions: the frozen compile options (waves, schedule, block remap, fp contraction)
  schedule.py  the plan: every decision per program and target (waves, schedules, layouts, LDS, fp8, fusions)
  patterns.py  the IR patterns the library lowers in forms of its own, found for schedule.py
  codegen.py   Program + plan -> header-free HIP C++ over include/hk_hip.h (the device library)
  compiler.py  the pinned clang offline (assembly, code object, resource report; no ROCm needed) and hiprtc
  analyze.py   the ISA analyser behind `hk analyze`: loops, instruction classes, occupancy, issue-rate bound
  costs.py     its cost model: instruction clocks, the matrix peak, the bounds against the MFMAs chosen and the peak
  driver.py    device probe, module load, argument packing (codegen/abi.py), launch (GPU or emulator)
  hipapi.py    hip-python access shared by compiler and driver
  emulator/    the CPU wave64 emulator that runs the same source for emulated targets

See README.md in this folder.
"""
from .backend import HipBackend

__all__ = ["HipBackend"]
