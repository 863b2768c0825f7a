"""The cuda backend: Tile IR -> CUDA C++ over hk_cuda.cuh -> NVRTC -> cubin, launched on torch's stream;
an emulated sm_80 target runs the same source on CPU threads.

  backend.py    CudaBackend: status, targets, compile, restore (cache), launch, emit
  archs.py      the architecture table every target is built from
  options.py    CudaOptions: the frozen compile options (numerics flags, launch bounds)
  codegen.py    Program -> CUDA C++ (the shared C-style emitter + this backend's prelude and checks)
  compiler.py   NVRTC: source -> PTX + cubin, ptxas resource report, SASS disassembly
  driver.py     device probe, module load, argument packing (codegen/abi.py), launch (GPU or emulator)
  emulator.py   the emulated target's host build (include/hk_cuda_emu.h) and loading
"""
from .backend import CudaBackend

__all__ = ["CudaBackend"]
