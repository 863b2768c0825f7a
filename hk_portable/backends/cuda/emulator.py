"""The cuda backend's emulated target: its generated code and device library run on the CPU (for tests,
not a product).

The same emitted source is compiled by the host C++ compiler against include/hk_cuda_emu.h, which runs
one std::thread per CUDA thread and emulates the warp collectives (shfl, ldmatrix, mma.sync) from the
PTX ISA's lane maps, and cp.async synchronously. Kernel arguments go through the same packed parameter
buffer as on the GPU (codegen/abi.py). This checks layouts, swizzles, bounds handling, pipelines and
conversions of the cuda backend on a machine without a GPU; the instruction-level behaviour is checked
on a real GPU.

    be = CudaBackend()
    kern(*cpu_tensors, grid=..., backend=be, target=be.target("sm_80", emulated=True))
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

from ...codegen.abi import param_layout
from ...interface.errors import BackendError
from ...runtime import cachefiles
from . import codegen

EMU_HEADER = Path(__file__).with_name("include") / "hk_cuda_emu.h"
CXX_FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-pthread",
             "-Wno-unknown-pragmas", "-w"]


def host_compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


def available() -> tuple[bool, str]:
    if host_compiler() is None:
        return False, "no host C++ compiler (g++ or clang++) for the cuda emulation"
    return True, "cuda device library emulated on CPU threads"


@lru_cache(maxsize=1)
def _header_hash() -> str:
    return hashlib.sha256(EMU_HEADER.read_bytes()).hexdigest()[:12]


def identity() -> str:
    """What shapes an emulated build besides the generated source: part of the compile cache key."""
    return f"{host_compiler()} {' '.join(CXX_FLAGS)}; emu {_header_hash()}"


def emulation_source(emitted, shared_bytes: int) -> str:
    """The emitted kernel + an entry point that unpacks the GPU parameter buffer and runs the grid."""
    _, _, params = param_layout(emitted.params)
    emitter = codegen.CudaEmitter(None, None)      # for its C types of parameters: no target or plan read
    unpack, names = [], []
    for k, ((name, t), p) in enumerate(zip(emitted.params, params)):
        unpack.append(f"  {emitter.ctype(t)} a{k}; std::memcpy(&a{k}, params + {p['offset']}, sizeof(a{k}));")
        names.append(f"a{k}")
    return "\n".join([
        f'#include "{EMU_HEADER}"',
        emitted.source,
        "inline float hk_emu::half_to_float(unsigned short h, bool is_f16) {",
        "  return is_f16 ? hk::float_from_f16_bits(h) : hk::float_from_bf16_bits(h);",
        "}",
        "static_assert(sizeof(hk::gl<float, 2>) == 32 && sizeof(hk::gl<float, 3>) == 48, \"gl ABI\");",
        'extern "C" int hk_emu_launch(const unsigned char* params, int gx, int gy, int gz) {',
        *unpack,
        f"  return hk_emu::run_grid(gx, gy, gz, {emitted.num_threads}, {max(shared_bytes, 128)}, [&] {{",
        f"    {emitted.kernel_name}({', '.join(names)});",
        "  });",
        "}",
    ]) + "\n"


def build(source: str, kernel_name: str) -> bytes:
    """The host shared object of an emulation source."""
    cxx = host_compiler()
    if cxx is None:
        raise BackendError("no host C++ compiler for the cuda emulation")
    with tempfile.TemporaryDirectory(prefix="hk-emu-build-") as d:
        cpp, so = os.path.join(d, "k.cpp"), os.path.join(d, "k.so")
        Path(cpp).write_text(source)
        res = subprocess.run([cxx, *CXX_FLAGS, cpp, "-o", so], capture_output=True, text=True)
        if res.returncode != 0:
            raise BackendError(f"emulation build of '{kernel_name}' failed:\n{res.stderr[-6000:]}")
        return Path(so).read_bytes()


_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}


def load(binary: bytes) -> ctypes.CDLL:
    """The built shared object, loaded once per process (by content)."""
    key = hashlib.sha256(binary).hexdigest()
    with _lock:
        lib = _libs.get(key)
        if lib is None:
            path = cachefiles.private_dir() / f"cuda-emu-{key[:24]}.so"   # removed at exit
            path.write_bytes(binary)
            lib = ctypes.CDLL(str(path))
            lib.hk_emu_launch.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
            lib.hk_emu_launch.restype = ctypes.c_int
            _libs[key] = lib
    return lib
