"""NVRTC compilation, module loading and kernel launch through cupy's low-level bindings.

NVRTC needs no GPU (the `nvidia-cuda-nvrtc` wheel is enough), so compiling works on a CPU-only machine.
Launching goes through the driver API (`cuLaunchKernel`) with the kernel parameters packed into one
byte buffer (CU_LAUNCH_PARAM_BUFFER_POINTER): no DLPack, no cupy arrays, one struct.pack per call.
"""
from __future__ import annotations

import ctypes
import os
import re
import struct
import threading
from dataclasses import dataclass
from functools import lru_cache

from ...interface.errors import ArgumentError, BackendError
from ...interface.ir import GlobalType

# Numerics flags (DESIGN section 4): no flush-to-zero, no FMA contraction, IEEE division and sqrt.
# They are part of every Artifact's options and of the cache key (through compiler_version()).
NUMERICS = {"ftz": False, "fmad": False, "prec_div": True, "prec_sqrt": True}
FLAGS = ("-std=c++17", "-ftz=false", "-fmad=false", "-prec-div=true", "-prec-sqrt=true", "-lineinfo",
         "--ptxas-options=-v",
         # generated code leaves unused values (shapes) and spells f64 literals that round to f32 exactly as
         # the reference rounds them: neither warning says anything about the kernel
         "--diag-suppress=177,1046")

CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
DEFAULT_DYNAMIC_SMEM = 48 * 1024


class CompileError(BackendError):
    """NVRTC rejected the generated source; the message carries its log."""


# ---------------------------------------------------------------------------------------------- nvrtc
def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as e:  # pragma: no cover - depends on the install
        raise BackendError(f"cupy is not installed or has no NVRTC binding ({e}); install hk-portable[cuda]") from e
    return nvrtc


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    major, minor = _nvrtc().getVersion()
    return f"{major}.{minor}"


@lru_cache(maxsize=1)
def nvrtc_identity() -> str:
    """NVRTC's identity for the cache key, cheap enough for a cache hit: the libnvrtc file of the
    nvidia-cuda-nvrtc wheel (which cupy loads first, through cuda-pathfinder) by name, size and mtime.
    Without the wheel, NVRTC's own version (this loads cupy: about half a second)."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia")
        roots = list(spec.submodule_search_locations or []) if spec else []
    except (ImportError, ValueError):
        roots = []
    for root in roots:
        for sub in ("cu13/lib", "cu12/lib", "cuda_nvrtc/lib"):
            d = os.path.join(root, sub)
            if not os.path.isdir(d):
                continue
            libs = sorted(f for f in os.listdir(d) if f.startswith("libnvrtc.so"))
            if libs:
                st = os.stat(os.path.join(d, libs[-1]))
                return f"{sub}/{libs[-1]}:{st.st_size}:{int(st.st_mtime)}"
    return f"nvrtc {nvrtc_version()}"


@dataclass
class Compiled:
    ptx: str
    cubin: bytes
    log: str
    options: list[str]


def compile_source(source: str, name: str, arch: str) -> Compiled:
    """NVRTC: source -> (PTX, cubin for `arch`, log). CompileError carries the log and the options."""
    nvrtc = _nvrtc()
    options = [f"-arch={arch}", *FLAGS]
    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC {nvrtc_version()} could not compile kernel '{name}' for {arch} "
                               f"({e}); options {options}\n{log}") from None
        log = nvrtc.getProgramLog(prog)
        return Compiled(nvrtc.getPTX(prog).decode().rstrip("\0"), bytes(nvrtc.getCUBIN(prog)), log, options)
    finally:
        nvrtc.destroyProgram(prog)


_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "barriers": re.compile(r"used (\d+) barriers"),
    "static_shared_bytes": re.compile(r"(\d+) bytes smem"),
}


def parse_ptxas(log: str) -> dict:
    """Registers, spills, stack frame, barriers (and static shared memory) from ptxas -v output."""
    out = {}
    for key, rx in _PTXAS.items():
        m = rx.search(log)
        out[key] = int(m.group(1)) if m else 0
    return out


# ----------------------------------------------------------------------------------- parameter ABI
def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def param_layout(params) -> tuple[str, int, list[dict]]:
    """The struct format, byte size and per-parameter description of the kernel's parameter buffer.

    `hk::gl<T, R>` is `{T* ptr; int shape[R]; long long stride[R];}` with natural C alignment; scalars are
    4-byte int/float; each parameter starts at its own alignment, as the CUDA ABI lays them out."""
    fmt, off, desc = "<", 0, []
    for name, t in params:
        if isinstance(t, GlobalType):
            start = _align(off, 8)
            r = t.rank
            strides_at = start + 8 + _align(4 * r, 8)
            fmt += "x" * (start - off) + "Q" + "i" * r + "x" * (strides_at - (start + 8 + 4 * r)) + "q" * r
            off = strides_at + 8 * r
            desc.append({"name": name, "kind": "gl", "rank": r, "dtype": t.dtype.name, "offset": start,
                         "size": off - start})
        else:
            start = _align(off, 4)
            code = "i" if t.dtype.name == "i32" else "f"
            fmt += "x" * (start - off) + code
            off = start + 4
            desc.append({"name": name, "kind": t.dtype.name, "offset": start, "size": 4})
    return fmt, off, desc


# ------------------------------------------------------------------------------------------- device
def _torch():
    import torch
    return torch


def _driver():
    from cupy_backends.cuda.api import driver
    return driver


def _runtime():
    from cupy_backends.cuda.api import runtime
    return runtime


def probe() -> tuple[bool, str | None, list[dict]]:
    """(usable, reason, devices [{index, name, cc, smem_optin}]) from real calls.

    Devices come from torch (whose CUDA runtime a caller with CUDA tensors has already started); cupy's
    own runtime is asked only to explain why there is no usable GPU (starting a second CUDA runtime costs
    a first kernel call tens of milliseconds)."""
    torch = _torch()
    try:
        _driver()                                          # what launching needs from cupy
    except ImportError as e:
        return False, f"cupy is not installed ({e}); install hk-portable[cuda]", []
    if getattr(torch.version, "hip", None):
        return False, f"torch {torch.__version__} is a ROCm build; the cuda backend launches on torch's CUDA streams", []
    try:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as e:  # noqa: BLE001 - a broken driver is a reason, not a crash
        return False, f"torch cannot use CUDA here: {type(e).__name__}: {e}", []
    if n == 0:
        return False, _why_no_gpu(torch), []
    devices = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": p.name, "cc": (int(p.major), int(p.minor)),
                        "smem_optin": int(getattr(p, "shared_memory_per_block_optin", 0) or 0)})
    if devices[0]["cc"] < (8, 0):
        return False, f"{devices[0]['name']} is sm_{devices[0]['cc'][0]}{devices[0]['cc'][1]}; the cuda backend needs sm_80 or newer", devices
    return True, None, devices


def _why_no_gpu(torch) -> str:
    """In words: the driver's answer (through cupy's runtime) and whether torch was built with CUDA."""
    parts = []
    if not torch.version.cuda:
        parts.append(f"torch {torch.__version__} is built without CUDA")
    try:
        n = _runtime().getDeviceCount()
        parts.append("no NVIDIA GPU found (cudaGetDeviceCount() = 0)" if n == 0 else
                     f"cupy sees {n} GPU(s) but torch.cuda.is_available() is False")
    except ImportError as e:
        parts.append(f"cupy's runtime is missing ({e})")
    except Exception as e:  # noqa: BLE001 - no driver, driver too old: the reason itself
        parts.append(f"no usable NVIDIA GPU or driver: {type(e).__name__}: {e}")
    return "; ".join(parts)


def arch_for(cc: tuple[int, int]) -> str:
    """The compile target for a compute capability: sm_90a on Hopper, sm_80 cubins run on all sm_8x."""
    if cc[0] == 9:
        return "sm_90a"
    if cc[0] == 8:
        return "sm_80"
    return f"sm_{cc[0]}{cc[1]}"


def _make_packer(kinds: list[str], packer: struct.Struct):
    """A function (args, buf, dev) -> bool that packs the kernel parameters into buf with no
    intermediate list, or returns False (the caller then explains the bad argument)."""
    names = [f"a{i}" for i in range(len(kinds))]
    check = [f"{n}.get_device() != dev" for n, k in zip(names, kinds) if k == "gl"]
    parts = []
    for n, k in zip(names, kinds):
        parts.append(f"{n}.data_ptr(), *{n}.shape, *{n}.stride()" if k == "gl" else n)
    src = [f"def pack(args, buf, dev, pack_into=pack_into):",
           f"    {', '.join(names)}{',' if len(names) == 1 else ''} = args" if names else "    pass"]
    if check:
        src.append(f"    if {' or '.join(check)}:")
        src.append("        return False")
    src.append(f"    pack_into(buf, 0, {', '.join(parts)})")
    src.append("    return True")
    scope = {"pack_into": packer.pack_into}
    exec("\n".join(src), scope)
    return scope["pack"]


def current_device() -> int:
    torch = _torch()
    get = getattr(torch._C, "_cuda_getDevice", None)
    return get() if get is not None else torch.cuda.current_device()


class LaunchPlan:
    """A loaded kernel on one device: function handle, launch geometry and a parameter packer."""

    def __init__(self, artifact, device_index: int):
        torch = _torch()
        driver = _driver()
        if driver.ctxGetCurrent() == 0:
            torch.cuda.set_device(device_index)           # makes the primary context current
        self.ctx = driver.ctxGetCurrent()
        self.device_index = device_index
        self.module = driver.moduleLoadData(artifact.binary)
        self.func = driver.moduleGetFunction(self.module, artifact.kernel_name)
        launch = artifact.launch
        self.threads = int(launch["threads"])
        self.shared = int(launch["shared_bytes"])
        if self.shared > DEFAULT_DYNAMIC_SMEM:
            driver.funcSetAttribute(self.func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared)
        self.kinds = [p["kind"] for p in launch["params"]]
        self.names = [p["name"] for p in launch["params"]]
        self.packer = struct.Struct(launch["param_format"])
        self.size = self.packer.size
        self.pack = _make_packer(self.kinds, self.packer)
        self.tls = threading.local()                       # one parameter buffer per launching thread
        self.launch_kernel = driver.launchKernel
        self.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def _buffer(self):
        """(buffer, address of its `extra` array): cuLaunchKernel copies the parameters at the call."""
        buf = ctypes.create_string_buffer(max(self.size, 1))
        size = ctypes.c_size_t(self.size)
        extra = (ctypes.c_void_p * 5)(CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buf),
                                      CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size), CU_LAUNCH_PARAM_END)
        slot = self.tls.slot = (buf, ctypes.addressof(extra), size, extra)
        return slot

    def explain(self, args, kernel_name: str) -> ArgumentError:
        """The ArgumentError for arguments the fast packer refused."""
        if len(args) != len(self.kinds):
            return ArgumentError(f"{kernel_name}: expected {len(self.kinds)} arguments, got {len(args)}")
        for kind, name, a in zip(self.kinds, self.names, args):
            if kind != "gl":
                continue
            get_device = getattr(a, "get_device", None)
            if get_device is not None and get_device() == self.device_index:
                continue
            if not getattr(a, "is_cuda", False):
                return ArgumentError(f"{kernel_name}: argument '{name}' must be a CUDA tensor, got "
                                     f"{getattr(a, 'device', type(a).__name__)}")
            if a.get_device() != self.device_index:
                return ArgumentError(f"{kernel_name}: argument '{name}' is on cuda:{a.get_device()} but the current "
                                     f"device is cuda:{self.device_index}; use torch.cuda.device(...) or move it")
        return ArgumentError(f"{kernel_name}: a tensor dimension, stride or scalar argument does not fit the kernel's "
                             f"32-bit shape / int32 parameters ({self._describe(args)})")

    def stream_handle(self, stream) -> int:
        if stream is None:
            if self.raw_stream is not None:
                return self.raw_stream(self.device_index)
            return _torch().cuda.current_stream(self.device_index).cuda_stream
        if isinstance(stream, int):
            return stream
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:
            handle = getattr(stream, "ptr", None)           # a cupy stream
        if handle is None:
            raise ArgumentError(f"stream must be a torch.cuda.Stream, a cupy stream or a raw handle, got {stream!r}")
        return int(handle)

    def launch(self, args, grid, stream, kernel_name: str) -> None:
        gx, gy, gz = grid
        if gy > 65535 or gz > 65535:
            raise ArgumentError(f"{kernel_name}: grid {grid}: CUDA allows at most 65535 blocks along axes 1 and 2")
        handle = self.raw_stream(self.device_index) if stream is None and self.raw_stream else \
            self.stream_handle(stream)
        try:
            slot = self.tls.slot
        except AttributeError:
            slot = self._buffer()
        try:
            ok = self.pack(args, slot[0], self.device_index)
        except (AttributeError, TypeError, ValueError, struct.error):
            ok = False
        if not ok:
            raise self.explain(args, kernel_name)
        self.launch_kernel(self.func, gx, gy, gz, self.threads, 1, 1, self.shared, handle, 0, slot[1])

    def _describe(self, args) -> str:
        parts = []
        for kind, name, a in zip(self.kinds, self.names, args):
            parts.append(f"{name}: shape {tuple(a.shape)}" if kind == "gl" else f"{name}={a!r}")
        return ", ".join(parts)

    def unload(self) -> None:
        try:
            _driver().moduleUnload(self.module)
        except Exception:  # noqa: BLE001 - the context may already be gone at exit
            pass
