"""The cuda backend's launch path on a machine without a GPU: `FakeCudrv` stands in for
hk_portable/backends/cuda/cudrv.py (libcuda through ctypes), with cuLaunchKernel replaced by a function the
caller gives (a C stub compiled with `build_stub`, or a Python `LaunchFunction` callback);
`CpuCudaBackend` is the cuda backend on CPU tensors that compiles nothing; `install` points
backends/cuda/driver.py at a fake driver, device -1 (what CPU tensors report) and a stream function.

Users: tests/cuda/test_cuda_launch_plan.py, tests/test_clauncher.py and benchmarks/launch_path_cpu.py.
"""
from __future__ import annotations

import ctypes
import itertools
import subprocess
from pathlib import Path

import torch

from ..backends.cuda import CudaBackend, driver
from ..backends.cuda.backend import launch_params
from ..interface.backend import Artifact, Target

_u, _vp = ctypes.c_uint, ctypes.c_void_p
# cuLaunchKernel's argument types as cudrv.lib() declares them:
# (func, gx, gy, gz, bx, by, bz, shared, stream, kernelParams, extra) -> CUresult
LAUNCH_ARGTYPES = [_vp, _u, _u, _u, _u, _u, _u, _u, _vp, _vp, _vp]
LaunchFunction = ctypes.CFUNCTYPE(ctypes.c_int, *LAUNCH_ARGTYPES)   # wraps a Python callable as such a C function


def build_stub(cc: list[str], source: str, directory) -> ctypes.CDLL:
    """`source` (C defining a function of cuLaunchKernel's signature) compiled with `cc` into `directory`, loaded."""
    d = Path(directory)
    src, so = d / "stub.c", d / "stub.so"
    src.write_text(source)
    subprocess.run([*cc, "-O2", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    return ctypes.CDLL(str(so))


class FakeCudrv:
    """cudrv's calls as a LaunchPlan makes them: fixed handles (context 1, module 7, function 11), the dynamic
    shared-memory attribute remembered in `max_dynamic_shared`, and cuLaunchKernel replaced by `launch`, a
    ctypes function (a compiled stub's, or a LaunchFunction) that both launch paths call: the compiled
    launcher by its address, the Python path through ctypes."""

    def __init__(self, launch):
        launch.argtypes, launch.restype = LAUNCH_ARGTYPES, ctypes.c_int
        self.launch = launch
        self.max_dynamic_shared = None
        self.unloaded = []
        self.context = 1                # what cuCtxGetCurrent reports on every thread (0: none is current)

    CUDA_ERROR_INVALID_CONTEXT = 201

    def current_context(self) -> int:
        return self.context

    def set_current_context(self, ctx: int) -> None:
        self.context = ctx

    def load_module(self, image: bytes) -> int:
        return 7

    def get_function(self, module: int, name: str) -> int:
        return 11

    def set_max_dynamic_shared(self, func: int, nbytes: int) -> None:
        self.max_dynamic_shared = nbytes

    def unload_module(self, module: int) -> None:
        self.unloaded.append(module)

    def launch_address(self) -> int:
        return ctypes.cast(self.launch, ctypes.c_void_p).value

    def launcher(self):
        return self.launch

    def error_name(self, rc: int) -> str:
        return f"CUDA_ERROR_{rc}"


class CpuCudaBackend(CudaBackend):
    """The cuda backend's launch path on CPU tensors: one sm_90a device, compiles nothing (an artifact with the
    program's parameter layout and 128 threads), launches through whatever cudrv `install` put in place."""
    name = "stub_cuda"

    def _probed(self):
        return True, None, [{"index": 0, "name": "stub", "cc": (9, 0), "smem_optin": 227 * 1024}]

    def targets(self):
        return [Target(backend=self.name, arch="sm_90a", vendor="nvidia", lanes=32, capabilities=("run",))]

    def check(self, program, target, options=None):
        pass

    def cacheable(self):
        return False

    def accepts_device(self, device):
        return True

    def compile(self, program, target, options=None):
        fmt, size, params = launch_params(program.params, program)
        return Artifact(backend=self.name, target=target.arch, kernel_name="stub", program_hash=program.hash,
                        binary=b"stub", launch={"threads": 128, "block": (128, 1, 1), "shared_bytes": 0,
                                                "params": params, "param_format": fmt, "param_size": size})


def install(cudrv: FakeCudrv, *, raw_stream=abs, monkeypatch=None) -> None:
    """driver.py launches through `cudrv` on device -1 (what CPU tensors report), with `raw_stream` as torch's
    current-stream lookup (device index -> handle). With pytest's `monkeypatch` it is all undone after the test;
    without, it stays (a benchmark's process). The device getter and the default stream function are C
    callables, as cheap to call as torch's own."""
    def put(obj, name, value):
        if monkeypatch is None:
            setattr(obj, name, value)
        else:
            monkeypatch.setattr(obj, name, value, raising=False)

    device = itertools.repeat(-1).__next__
    put(driver, "cudrv", cudrv)
    put(driver, "current_device", device)
    put(driver, "device_getter", lambda: device)
    put(torch._C, "_cuda_getCurrentRawStream", raw_stream)


def compiled_or_skip(module, why: str):
    """`module` (a compiled host extension: the launcher, op replay), else skip the test with `why`; fail instead
    where CI promised the compilers (.ci/run sets HK_REQUIRE_C_LAUNCHER)."""
    import os

    import pytest
    if module is not None:
        return module
    if os.environ.get("HK_REQUIRE_C_LAUNCHER"):
        pytest.fail(f"HK_REQUIRE_C_LAUNCHER is set but {why}")
    pytest.skip(why)
