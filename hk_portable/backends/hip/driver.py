"""The hip backend's device side: the device probe, argument packing (the shared hk::gl ABI of
codegen/abi.py), and launching, on the GPU through hip-python (hipModuleLoadData / hipModuleGetFunction /
hipModuleLaunchKernel on torch's current stream) or on the CPU emulator for CPU tensors.

`import hip` succeeds without ROCm; the first call fails (RuntimeError: failed to dlopen
libamdhip64.so). `probe()` therefore makes a real call and reports "no ROCm runtime: <reason>".

NOT RUN ON AMD HARDWARE: this project has no AMD GPU. What is tested here is what can be without
one (arch-name parsing, argument layout against the compiled kernels' metadata, the error paths with
the hip calls mocked); the hipModule* sequence follows the HIP driver API documentation.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ...codegen import abi
from ...interface.errors import ArgumentError, BackendError, UnsupportedError
from ...interface.ir import GlobalType, Param
from ...interface.names import c_symbol
from ...runtime import opfast
from . import compiler, hipapi
from .archs import NAMES as SUPPORTED
from .hipapi import HipError

EMULATED_LAUNCH_TIMEOUT_S = 300.0   # default per emulated launch; HK_EMU_TIMEOUT_S overrides


def parse_arch(gcn_arch_name) -> str:
    """'gfx942:sramecc+:xnack-' -> 'gfx942' (hipDeviceProp_t.gcnArchName carries feature flags)."""
    if isinstance(gcn_arch_name, (bytes, bytearray)):
        gcn_arch_name = bytes(gcn_arch_name).split(b"\0", 1)[0].decode(errors="replace")
    name = str(gcn_arch_name).strip().split(":", 1)[0].strip()
    if not name.startswith("gfx"):
        raise HipError(f"unexpected gcnArchName {gcn_arch_name!r} (expected e.g. 'gfx942:sramecc+:xnack-')")
    return name



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
        hip = hipapi.hip()
    except ImportError as e:
        return Probe(False, f"hip-python is not installed ({e}); pip install 'hk-portable[hip]' on a ROCm host")
    try:
        count = hipapi.ok(hip.hipGetDeviceCount(), "hipGetDeviceCount")
    except HipError as e:
        return Probe(False, f"no ROCm runtime: {e}")
    except Exception as e:  # noqa: BLE001 - hip-python raises RuntimeError when libamdhip64.so is absent
        return Probe(False, f"no ROCm runtime: {type(e).__name__}: {e}")
    if int(count) < 1:
        return Probe(False, "no ROCm runtime: hipGetDeviceCount found no AMD GPU")
    try:
        dev = hipapi.ok(hip.hipGetDevice(), "hipGetDevice")
        props = hip.hipDeviceProp_t()
        hipapi.ok(hip.hipGetDeviceProperties(props, dev), "hipGetDeviceProperties")
        arch = parse_arch(props.gcnArchName)
        name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
    except Exception as e:  # noqa: BLE001
        return Probe(False, f"ROCm device query failed: {e}")
    if arch not in SUPPORTED:
        return Probe(False, f"device {name} is {arch}; this backend generates code for {', '.join(SUPPORTED)}",
                     name, arch)
    return Probe(True, None, f"{name} ({arch})", arch)


# ----------------------------------------------------------------------------------- loading, launching
_lock = threading.Lock()
_functions: dict[tuple, Any] = {}               # (program hash, arch, flags) -> hipFunction_t
_modules: list = []                             # kept alive for the process


def function(source: str, arch: str, kernel: str, key: str, flags: tuple[str, ...] = compiler.DEVICE_FLAGS):
    """The loaded kernel (compiled once per program, arch and flags in this process)."""
    with _lock:
        fn = _functions.get((key, arch, flags))
    if fn is not None:
        return fn
    code = compiler.hiprtc_compile(source, arch, kernel, flags)
    hip = hipapi.hip()
    module = hipapi.ok(hip.hipModuleLoadData(code), "hipModuleLoadData")
    fn = hipapi.ok(hip.hipModuleGetFunction(module, kernel.encode()), "hipModuleGetFunction")
    with _lock:
        _modules.append(module)
        _functions[(key, arch, flags)] = fn
    return fn


def current_stream(stream=None):
    """The stream to launch on: the given one, else torch's current stream (its raw handle)."""
    if stream is not None:
        return getattr(stream, "cuda_stream", stream)
    import torch
    return torch.cuda.current_stream().cuda_stream


def launch(fn, grid: tuple[int, int, int], threads: int, kernargs, stream=None) -> None:
    """hipModuleLaunchKernel with the packed argument segment (one ctypes Structure, device_struct)."""
    for g in grid:
        if g * threads >= 2**32:
            raise UnsupportedError(f"grid {grid} x {threads} threads: HIP needs gridDim * blockDim < 2^32 per axis")
    opfast.untracked_launch()                    # op replay cannot record this path: it stays in Python
    hip = hipapi.hip()
    hipapi.ok(hip.hipModuleLaunchKernel(fn, *grid, threads, 1, 1, 0, current_stream(stream), None, extra=(kernargs,)),
        "hipModuleLaunchKernel")


# ------------------------------------------------------------------------------------------- arguments
def check_args(name: str, params: Sequence[Param], args: Sequence[Any]) -> None:
    if len(args) != len(params):
        raise ArgumentError(f"{name}: {len(params)} arguments expected ({', '.join(p.name for p in params)}), "
                            f"got {len(args)}")
    for p, a in zip(params, args):
        if isinstance(p.type, GlobalType):
            if not isinstance(a, torch.Tensor) or a.dim() != p.type.rank:
                raise ArgumentError(f"{name}: argument {p.name!r} must be a rank-{p.type.rank} tensor")
        elif p.type.dtype.name == "i32" and (isinstance(a, bool) or not isinstance(a, int)):
            raise ArgumentError(f"{name}: argument {p.name!r} must be an int, got {a!r}")


def device_struct(params: Sequence[Param], args: Sequence[Any]):
    """All arguments as one ctypes Structure laid out like the kernel argument segment (hip-python
    copies it into the launch with its C alignment)."""
    return abi.pack_struct(params, args)


def emulator_args(params: Sequence[Param], args: Sequence[Any], emulator) -> list:
    """Arguments for emulator.Module.launch: gl structs as blobs carrying their tensor (which stands for
    its data pointer: the emulator maps it), scalars as the emulator's typed scalars."""
    out = []
    for p, a in zip(params, args):
        if isinstance(p.type, GlobalType):
            out.append(emulator.blob(abi.gl_format(a.dim()), a, *abi.gl_values(a)[1:]))
        elif p.type.dtype.name == "i32":
            out.append(emulator.i32(int(a)))
        else:
            out.append(emulator.f32(float(a)))
    return out


# ------------------------------------------------------------------------------------------- emulator
def emulator_module():
    """The emulator module and whether it can run here: (module | None, reason)."""
    try:
        from . import emulator
    except Exception as e:  # noqa: BLE001 - a broken emulator is a reason, not a crash
        return None, f"the emulator failed to import: {type(e).__name__}: {e}"
    ok, why = emulator.available()
    return (emulator, "ok") if ok else (None, why)


def launch_emulated(artifact, program, args, grid, threads: int, fp_contract: str) -> None:
    emu, why = emulator_module()
    if emu is None:
        raise BackendError(f"cannot run {artifact.kernel_name} on CPU tensors: {why}")
    mod = emu.load(artifact.source, artifact.target, name=f"{c_symbol(artifact.kernel_name)}.hip", fp_contract=fp_contract)
    # a generated kernel that loops forever must fail the case, not hang the suite (or CI)
    timeout = None if os.environ.get("HK_EMU_TIMEOUT_S") else EMULATED_LAUNCH_TIMEOUT_S
    mod.launch(artifact.kernel_name, grid=grid, block=(threads, 1, 1),
               args=emulator_args(program.params, args, emu), timeout=timeout)
