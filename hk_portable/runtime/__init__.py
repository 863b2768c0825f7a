"""The runtime: what happens when a kernel is called. It builds on the interface (which imports
nothing from here) and reaches backends only through the registry's entry points.

  registry.py   discovery (stevedore entry points), loading, `hk backends`' report, device claims
  selection.py  argument > hk.use_backend() > HK_BACKEND > the device's claimant; backend specs
  launch.py     Kernel (what `hk.kernel` returns): fast path, device checks, compile_program
  cache.py      the on-disk compile cache
  plans.py      CallPlans: a library wrapper's decisions per call signature
  precompile.py hk.precompile: a step's kernels recorded, then compiled in parallel
"""
from .launch import Kernel, compile_program, kernel
from .selection import select, use_backend

__all__ = ["Kernel", "kernel", "compile_program", "select", "use_backend"]
