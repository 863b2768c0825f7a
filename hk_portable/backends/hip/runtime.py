"""The ROCm runtime path: hip-python's hiprtc compiles the generated source for the device's arch,
hipModuleLoadData / hipModuleGetFunction load it, hipModuleLaunchKernel runs it on torch's current
stream.

`import hip` succeeds without ROCm; the first call fails (RuntimeError: failed to dlopen
libamdhip64.so). `probe()` therefore makes a real call and reports "no ROCm runtime: <reason>".
hip-python calls return tuples (error, *results); `_ok` turns a non-success error into HipError
naming the call and HIP's error string.

NOT RUN ON AMD HARDWARE: this project has no AMD GPU. What is tested here is what can be without
one (arch-name parsing, argument layout against the compiled kernels' metadata, the error paths with
the hip calls mocked); the hipModule* sequence follows the HIP driver API documentation.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ...interface.errors import BackendError, UnsupportedError

SUPPORTED = ("gfx942", "gfx950")
HIPRTC_FLAGS = ("-O3", "-std=c++17", "-ffp-contract=off")   # hiprtc defaults to C++14; contraction off


class HipError(BackendError):
    """A HIP or hiprtc call failed."""


def parse_arch(gcn_arch_name) -> str:
    """'gfx942:sramecc+:xnack-' -> 'gfx942' (hipDeviceProp_t.gcnArchName carries feature flags)."""
    if isinstance(gcn_arch_name, (bytes, bytearray)):
        gcn_arch_name = bytes(gcn_arch_name).split(b"\0", 1)[0].decode(errors="replace")
    name = str(gcn_arch_name).strip().split(":", 1)[0].strip()
    if not name.startswith("gfx"):
        raise HipError(f"unexpected gcnArchName {gcn_arch_name!r} (expected e.g. 'gfx942:sramecc+:xnack-')")
    return name


def _hip():
    from hip import hip   # noqa: PLC0415 - optional dependency, imported on use
    return hip


def _hiprtc():
    from hip import hiprtc  # noqa: PLC0415
    return hiprtc


def _ok(result, call: str):
    """Unpack a hip-python result tuple; HipError if its error is not success."""
    if not isinstance(result, tuple):
        result = (result,)
    err, rest = result[0], result[1:]
    if _is_error(err):
        raise HipError(f"{call} failed: {_error_text(err)}")
    return rest[0] if len(rest) == 1 else rest


def _is_error(err) -> bool:
    # hipError_t / hiprtcResult are enums whose success value is 0
    return int(getattr(err, "value", err)) != 0


def _error_text(err) -> str:
    """The error's name and HIP's (or hiprtc's) description of it."""
    name = getattr(err, "name", str(err))
    try:
        if "hiprtc" in type(err).__name__:
            s = _hiprtc().hiprtcGetErrorString(err)
        else:
            s = _hip().hipGetErrorString(err)
        s = s[-1] if isinstance(s, tuple) else s
        return f"{name} ({s.decode() if isinstance(s, bytes) else s})"
    except Exception:  # noqa: BLE001 - the name alone still says what failed
        return str(name)


# ------------------------------------------------------------------------------------------- probing
@dataclass(frozen=True)
class Probe:
    available: bool
    reason: str | None = None
    device: str | None = None
    arch: str | None = None


_probe_lock = threading.Lock()
_probe: Probe | None = None


def probe(refresh: bool = False) -> Probe:
    """Whether a ROCm device this backend can generate code for is usable here (a real call, cached)."""
    global _probe
    with _probe_lock:
        if _probe is None or refresh:
            _probe = _probe_once()
        return _probe


def _probe_once() -> Probe:
    try:
        hip = _hip()
    except ImportError as e:
        return Probe(False, f"hip-python is not installed ({e}); pip install 'hk-portable[hip]' on a ROCm host")
    try:
        count = _ok(hip.hipGetDeviceCount(), "hipGetDeviceCount")
    except HipError as e:
        return Probe(False, f"no ROCm runtime: {e}")
    except Exception as e:  # noqa: BLE001 - hip-python raises RuntimeError when libamdhip64.so is absent
        return Probe(False, f"no ROCm runtime: {type(e).__name__}: {e}")
    if int(count) < 1:
        return Probe(False, "no ROCm runtime: hipGetDeviceCount found no AMD GPU")
    try:
        dev = _ok(hip.hipGetDevice(), "hipGetDevice")
        props = hip.hipDeviceProp_t()
        _ok(hip.hipGetDeviceProperties(props, dev), "hipGetDeviceProperties")
        arch = parse_arch(props.gcnArchName)
        name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
    except Exception as e:  # noqa: BLE001
        return Probe(False, f"ROCm device query failed: {e}")
    if arch not in SUPPORTED:
        return Probe(False, f"device {name} is {arch}; this backend generates code for {', '.join(SUPPORTED)}",
                     name, arch)
    return Probe(True, None, f"{name} ({arch})", arch)


# ------------------------------------------------------------------------------------------ compiling
def hiprtc_compile(source: str, arch: str, name: str) -> bytes:
    """A code object for `arch` from the generated source, through hiprtc."""
    hiprtc = _hiprtc()
    prog = _ok(hiprtc.hiprtcCreateProgram(source.encode(), f"{name}.hip".encode(), 0, [], []),
               "hiprtcCreateProgram")
    try:
        opts = [f"--offload-arch={arch}".encode()] + [f.encode() for f in HIPRTC_FLAGS]
        result = hiprtc.hiprtcCompileProgram(prog, len(opts), opts)
        err = result[0] if isinstance(result, tuple) else result
        if _is_error(err):
            raise HipError(f"hiprtc could not compile {name} for {arch}: {_error_text(err)}\n{_log(hiprtc, prog)}")
        size = _ok(hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
        code = bytearray(int(size))
        _ok(hiprtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
        return bytes(code)
    finally:
        hiprtc.hiprtcDestroyProgram(prog)


def _log(hiprtc, prog) -> str:
    try:
        n = _ok(hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
        buf = bytearray(int(n))
        _ok(hiprtc.hiprtcGetProgramLog(prog, buf), "hiprtcGetProgramLog")
        return buf.decode(errors="replace").rstrip("\0")
    except Exception as e:  # noqa: BLE001
        return f"(no log: {e})"


# ----------------------------------------------------------------------------------- loading, launching
_lock = threading.Lock()
_functions: dict[tuple[str, str], Any] = {}    # (program hash, arch) -> hipFunction_t
_modules: list = []                             # kept alive for the process


def function(source: str, arch: str, kernel: str, key: str):
    """The loaded kernel (compiled once per program and arch in this process)."""
    with _lock:
        fn = _functions.get((key, arch))
    if fn is not None:
        return fn
    code = hiprtc_compile(source, arch, kernel)
    hip = _hip()
    module = _ok(hip.hipModuleLoadData(code), "hipModuleLoadData")
    fn = _ok(hip.hipModuleGetFunction(module, kernel.encode()), "hipModuleGetFunction")
    with _lock:
        _modules.append(module)
        _functions[(key, arch)] = fn
    return fn


def current_stream(stream=None):
    """The stream to launch on: the given one, else torch's current stream (its raw handle)."""
    if stream is not None:
        return getattr(stream, "cuda_stream", stream)
    import torch
    return torch.cuda.current_stream().cuda_stream


def launch(fn, grid: tuple[int, int, int], threads: int, kernargs, stream=None) -> None:
    """hipModuleLaunchKernel with the packed argument segment (one ctypes Structure, see abi.py)."""
    for g in grid:
        if g * threads >= 2**32:
            raise UnsupportedError(f"grid {grid} x {threads} threads: HIP needs gridDim * blockDim < 2^32 per axis")
    hip = _hip()
    _ok(hip.hipModuleLaunchKernel(fn, *grid, threads, 1, 1, 0, current_stream(stream), None, extra=(kernargs,)),
        "hipModuleLaunchKernel")
