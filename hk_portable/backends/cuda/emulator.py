"""The cuda backend's generated code and device library, run on the CPU (for tests, not a product).

The same emitted source is compiled by the host C++ compiler against include/hk_cuda_emu.h, which runs
one std::thread per CUDA thread and emulates the warp collectives (shfl, ldmatrix, mma.sync) from the
PTX ISA's lane maps, and cp.async synchronously. Kernel arguments go through the same packed parameter
buffer as on the GPU. This checks layouts, swizzles, bounds handling, pipelines and conversions of the
cuda backend on a machine without a GPU; the instruction-level behaviour is checked on a real GPU.

    be = EmulatedCudaBackend()
    kern(*cpu_tensors, grid=..., backend=be)
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

from ...interface.backend import Artifact, Backend, BackendStatus, Target
from ...interface.errors import ArgumentError, BackendError, UnsupportedError
from ...interface.ir import GlobalType
from . import codegen, runtime

EMU_HEADER = Path(__file__).with_name("include") / "hk_cuda_emu.h"
CXX_FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-pthread",
             "-Wno-unknown-pragmas", "-w"]
TARGET = Target(backend="cuda-emu", arch="sm_80", vendor="nvidia", lanes=32, max_shared_bytes=166912,
                mma_shapes=("m16n8k16",), capabilities=("run", "atomics", "dropout", "fp8"), emulated=True)


def _cxx() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


def _ctype(t) -> str:
    em = codegen.CudaEmitter(TARGET)
    return em.ctype(t)


def emulation_source(emitted, shared_bytes: int) -> str:
    """The emitted kernel + an entry point that unpacks the GPU parameter buffer and runs the grid."""
    fmt, size, params = runtime.param_layout(emitted.params)
    unpack, names = [], []
    for k, ((name, t), p) in enumerate(zip(emitted.params, params)):
        ct = _ctype(t)
        unpack.append(f"  {ct} a{k}; std::memcpy(&a{k}, params + {p['offset']}, sizeof(a{k}));")
        names.append(f"a{k}")
    return "\n".join([
        f'#include "{EMU_HEADER}"',
        emitted.source,
        "inline float hk_emu::half_to_float(unsigned short h, bool is_f16) {",
        "  return is_f16 ? hk::float_from_f16_bits(h) : hk::float_from_bf16_bits(h);",
        "}",
        f"static_assert(sizeof(hk::gl<float, 2>) == 32 && sizeof(hk::gl<float, 3>) == 48, \"gl ABI\");",
        'extern "C" int hk_emu_launch(const unsigned char* params, int gx, int gy, int gz) {',
        *unpack,
        f"  return hk_emu::run_grid(gx, gy, gz, {emitted.num_threads}, {max(shared_bytes, 128)}, [&] {{",
        f"    {emitted.kernel_name}({', '.join(names)});",
        "  });",
        "}",
    ]) + "\n"


class EmulatedCudaBackend(Backend):
    """Compiles with the host C++ compiler, launches on CPU tensors. Name 'cuda-emu'."""
    name = "cuda-emu"

    def __init__(self):
        self._lock = threading.Lock()
        self._libs: dict[str, ctypes.CDLL] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="hk-cuda-emu-"))

    def status(self) -> BackendStatus:
        if _cxx() is None:
            return BackendStatus(False, "no host C++ compiler (g++ or clang++) for the cuda emulation")
        return BackendStatus(True, None, "cuda device library emulated on CPU threads")

    def targets(self) -> list[Target]:
        return [TARGET]

    def accepts_device(self, device) -> bool:
        return getattr(device, "type", None) == "cpu"

    def compiler_version(self) -> str:
        h = hashlib.sha256(EMU_HEADER.read_bytes()).hexdigest()[:12]
        return f"{_cxx()} {' '.join(CXX_FLAGS)}; lib {codegen.library_hash()}; emu {h}"

    def check(self, program, target) -> None:
        codegen.check(program, target)

    def compile(self, program, target, options=None) -> Artifact:
        codegen.check(program, target)
        emitted, shared = codegen.emit(program, target)
        src = emulation_source(emitted, shared)
        cxx = _cxx()
        if cxx is None:
            raise BackendError("no host C++ compiler for the cuda emulation")
        with tempfile.TemporaryDirectory(prefix="hk-emu-build-") as d:
            cpp, so = os.path.join(d, "k.cpp"), os.path.join(d, "k.so")
            Path(cpp).write_text(src)
            res = subprocess.run([cxx, *CXX_FLAGS, cpp, "-o", so], capture_output=True, text=True)
            if res.returncode != 0:
                raise BackendError(f"emulation build of '{emitted.kernel_name}' failed:\n{res.stderr[-6000:]}")
            binary = Path(so).read_bytes()
        fmt, size, params = runtime.param_layout(emitted.params)
        return Artifact(backend=self.name, target=target.arch, kernel_name=emitted.kernel_name,
                        program_hash=program.hash, source=src, binary=binary,
                        launch={"threads": emitted.num_threads, "shared_bytes": shared, "params": params,
                                "param_format": fmt, "param_size": size},
                        options={"emulated": True})

    def restore(self, artifact, program):
        return artifact if artifact.binary and artifact.program_hash == program.hash else None

    def _lib(self, artifact) -> ctypes.CDLL:
        key = hashlib.sha256(artifact.binary).hexdigest()
        with self._lock:
            lib = self._libs.get(key)
            if lib is None:
                path = self._dir / f"{key[:24]}.so"
                path.write_bytes(artifact.binary)
                lib = ctypes.CDLL(str(path))
                lib.hk_emu_launch.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
                lib.hk_emu_launch.restype = ctypes.c_int
                self._libs[key] = lib
        return lib

    def launch(self, artifact, args, grid, stream=None) -> None:
        launch = artifact.launch
        vals = []
        for p, a in zip(launch["params"], args):
            if p["kind"] == "gl":
                if a.device.type != "cpu":
                    raise ArgumentError(f"{artifact.kernel_name}: the emulated cuda backend takes CPU tensors "
                                        f"('{p['name']}' is on {a.device})")
                vals += [a.data_ptr(), *a.shape, *a.stride()]
            else:
                vals.append(a)
        buf = struct.pack(launch["param_format"], *vals)
        gx, gy, gz = grid
        if gy > 65535 or gz > 65535:
            raise ArgumentError(f"{artifact.kernel_name}: grid {grid}: at most 65535 blocks along axes 1 and 2")
        self._lib(artifact).hk_emu_launch(buf, gx, gy, gz)


__all__ = ["EmulatedCudaBackend", "emulation_source", "UnsupportedError", "GlobalType"]
