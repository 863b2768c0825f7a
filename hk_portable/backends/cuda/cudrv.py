"""The few CUDA driver API calls a launch needs, through ctypes on libcuda: context query, module load,
function lookup, the dynamic shared-memory attribute, cuLaunchKernel, module unload, and the tensor-map
encoder (tma.py).

Why not cupy's binding: importing it pulls in all of cupy (about 130 ms on the H200, 2026-12-02, most of a
first call), and a ctypes call with fixed argtypes costs about what its Cython wrapper does. cupy stays the
NVRTC binding the compiler uses."""
from __future__ import annotations

import ctypes
from functools import lru_cache

from ...interface.errors import BackendError

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CUDA_ERROR_INVALID_CONTEXT = 201
_vp, _u32, _int = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
_u32p, _u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)


@lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    """libcuda with the argument types of the calls below (OSError where no driver is installed)."""
    cu = ctypes.CDLL("libcuda.so.1")
    for name, args in (("cuCtxGetCurrent", [ctypes.POINTER(_vp)]),
                       ("cuCtxSetCurrent", [_vp]),
                       ("cuModuleLoadData", [ctypes.POINTER(_vp), ctypes.c_char_p]),
                       ("cuModuleGetFunction", [ctypes.POINTER(_vp), _vp, ctypes.c_char_p]),
                       ("cuFuncSetAttribute", [_vp, _int, _int]),
                       ("cuModuleUnload", [_vp]),
                       ("cuGetErrorName", [_int, ctypes.POINTER(ctypes.c_char_p)]),
                       ("cuLaunchKernel", [_vp, _u32, _u32, _u32, _u32, _u32, _u32, _u32, _vp, _vp, _vp]),
                       ("cuTensorMapEncodeTiled", [_vp, _int, ctypes.c_uint32, _vp, _u64p, _u64p, _u32p, _u32p,
                                                   _int, _int, _int, _int])):
        fn = getattr(cu, name)
        fn.argtypes, fn.restype = args, _int
    return cu


def error_name(rc: int) -> str:
    name = ctypes.c_char_p()
    if lib().cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
        return name.value.decode()
    return f"CUresult {rc}"


def check(rc: int, what: str) -> None:
    if rc:
        raise BackendError(f"cuda driver: {what} failed: {error_name(rc)}")


def current_context() -> int:
    ctx = _vp()
    check(lib().cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    return ctx.value or 0


def set_current_context(ctx: int) -> None:
    check(lib().cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def load_module(binary: bytes) -> int:
    mod = _vp()
    check(lib().cuModuleLoadData(ctypes.byref(mod), binary), "cuModuleLoadData")
    return mod.value


def get_function(module: int, name: str) -> int:
    fn = _vp()
    check(lib().cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), f"cuModuleGetFunction({name})")
    return fn.value


def set_max_dynamic_shared(func: int, nbytes: int) -> None:
    check(lib().cuFuncSetAttribute(func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
          f"cuFuncSetAttribute(max dynamic shared = {nbytes})")


def unload_module(module: int) -> None:
    lib().cuModuleUnload(module)


def launch_address() -> int:
    """cuLaunchKernel's address: the compiled launcher (runtime/clauncher.py) calls it directly."""
    return ctypes.cast(lib().cuLaunchKernel, ctypes.c_void_p).value


def launcher():
    """cuLaunchKernel itself: (func, gx, gy, gz, bx, by, bz, shared, stream, kernelParams, extra) -> CUresult."""
    return lib().cuLaunchKernel
