"""The cuda backend's device side: the device probe, module loading, argument packing and launch.

A GPU launch goes through the driver API (`cuLaunchKernel`) with the kernel parameters packed into one byte
buffer (CU_LAUNCH_PARAM_BUFFER_POINTER; a kernelParams array into it for kernels with tensor maps): no
DLPack, no cupy arrays. The compiled launcher (runtime/clauncher.py) packs and calls cuLaunchKernel by
address in C; where it is unavailable, a generated struct.pack and ctypes (cudrv.py) do the same. An
artifact of the emulated target runs the same buffer through the host build (emulator.py) on CPU tensors.
The buffer's layout is the shared hk::gl ABI (codegen/abi.py).
"""
from __future__ import annotations

import ctypes
import os
import struct
import threading

from ...codegen.abi import launcher_params, make_packer
from ...interface.errors import ArgumentError, BackendError
from ...interface.kernel import sharing_error
from ...runtime import clauncher, opfast
from . import archs, cudrv, emulator, tma

CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
DEFAULT_DYNAMIC_SMEM = 48 * 1024
MAX_GRID_YZ = 65535
PERSISTENT_GRID = struct.Struct("=iii")     # a persistent kernel's logical grid, after its other parameters
EMULATED_HINT = f" (CPU tensors run on the emulated target: backend 'cuda:{archs.EMULATED}:emulated')"


def _torch():
    import torch
    return torch


def _runtime():
    from cupy_backends.cuda.api import runtime
    return runtime


def probe() -> tuple[bool, str | None, list[dict]]:
    """(usable, reason, devices [{index, name, cc, smem_optin}]) from real calls.

    Devices come from torch (whose CUDA runtime a caller with CUDA tensors has already started); cupy's
    own runtime is asked only to explain why there is no usable GPU (starting a second CUDA runtime costs
    a first kernel call tens of milliseconds)."""
    torch = _torch()
    import importlib.util
    if importlib.util.find_spec("cupy_backends") is None:      # NVRTC's binding (found, not imported: it is slow)
        return False, "cupy is not installed (the NVRTC binding); install hk-portable[cuda]", []
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
        if not _has_driver():   # the runtime says "driver version is insufficient" when there is none at all
            parts.append("no NVIDIA driver (libcuda.so.1 cannot be loaded)")
        else:
            parts.append(f"no usable NVIDIA GPU or driver: {type(e).__name__}: {e}")
    return "; ".join(parts)


def _has_driver() -> bool:
    """Whether the NVIDIA driver library loads (it is installed with the driver, never with a toolkit wheel)."""
    try:
        ctypes.CDLL("libcuda.so.1" if os.name != "nt" else "nvcuda.dll")
        return True
    except OSError:
        return False


def current_device() -> int:
    return device_getter()()


def device_getter():
    """A callable () -> the current CUDA device index: torch's C function where it has one."""
    torch = _torch()
    return getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


class _Packing:
    """The kernel's parameters as the launch sees them: a packer into the ABI buffer and the
    ArgumentError for arguments it refuses."""
    device_index = -1                  # what get_device() of an accepted tensor returns (-1: the CPU)

    def _init_packing(self, launch: dict) -> None:
        self.kinds = [p["kind"] for p in launch["params"]]
        self.names = [p["name"] for p in launch["params"]]
        self.stored = [i for i, p in enumerate(launch["params"]) if p.get("stored")]
        self.packer = struct.Struct(launch["param_format"])
        self.size = self.packer.size
        self.pack = make_packer(self.kinds, launch["param_format"])

    def _pack(self, args, buf, kernel_name: str) -> None:
        try:
            ok = self.pack(args, buf, self.device_index)
        except (AttributeError, TypeError, ValueError, OverflowError, struct.error):    # the compiled launcher's
            ok = False
        if not ok:
            raise self.explain(args, kernel_name)

    @staticmethod
    def check_grid(grid, kernel_name: str) -> None:
        if grid[1] > MAX_GRID_YZ or grid[2] > MAX_GRID_YZ:
            raise ArgumentError(f"{kernel_name}: grid {grid}: CUDA allows at most {MAX_GRID_YZ} blocks along axes "
                                "1 and 2")

    def wrong_device(self, name: str, a, kernel_name: str) -> ArgumentError:
        return ArgumentError(f"{kernel_name}: the emulated cuda target takes CPU tensors ('{name}' is on "
                             f"{getattr(a, 'device', type(a).__name__)})")

    def explain(self, args, kernel_name: str) -> ArgumentError:
        """The ArgumentError for arguments the fast packer refused."""
        if len(args) != len(self.kinds):
            return ArgumentError(f"{kernel_name}: expected {len(self.kinds)} arguments, got {len(args)}")
        for kind, name, a in zip(self.kinds, self.names, args):
            get_device = getattr(a, "get_device", None)
            if kind == "gl" and (get_device is None or get_device() != self.device_index):
                return self.wrong_device(name, a, kernel_name)
        for i in self.stored:
            error = sharing_error(kernel_name, self.names[i], args[i])
            if error is not None:
                return error
        return ArgumentError(f"{kernel_name}: a tensor dimension, stride or scalar argument does not fit the kernel's "
                             f"32-bit shape / int32 parameters ({self._describe(args)})")

    def _describe(self, args) -> str:
        parts = []
        for kind, name, a in zip(self.kinds, self.names, args):
            parts.append(f"{name}: shape {tuple(a.shape)}" if kind == "gl" else f"{name}={a!r}")
        return ", ".join(parts)


class EmulatedPlan(_Packing):
    """An artifact of the emulated target, loaded on the host: runs the grid on CPU threads."""

    def __init__(self, artifact):
        self._init_packing(artifact.launch)
        self.lib = emulator.load(artifact.binary)

    def launch(self, args, grid, stream, kernel_name: str) -> None:
        self.check_grid(grid, kernel_name)
        buf = bytearray(max(self.size, 1))
        self._pack(args, buf, kernel_name)
        self.lib.hk_emu_launch(bytes(buf), *grid)


class LaunchPlan(_Packing):
    """A loaded kernel on one device: function handle, launch geometry and a parameter packer."""

    def __init__(self, artifact, device_index: int):
        torch = _torch()
        if cudrv.current_context() == 0:
            torch.cuda.set_device(device_index)           # makes the primary context current
        self.ctx = cudrv.current_context()
        self.device_index = device_index
        self.module = cudrv.load_module(artifact.binary)
        self.func = cudrv.get_function(self.module, artifact.kernel_name)
        launch = artifact.launch
        self.threads = int(launch["threads"])
        self.shared = int(launch["shared_bytes"])
        if self.shared > DEFAULT_DYNAMIC_SMEM:
            cudrv.set_max_dynamic_shared(self.func, self.shared)
        self._init_packing(launch)
        self.params = launch["params"]
        self.maps = tma.TensorMaps(launch["tma"], self.size) if launch.get("tma") else None
        if self.maps is not None:
            self.size = self.maps.size                      # the maps and their flag follow the params
        # a persistent kernel: the logical grid (three ints) follows; the launch runs one block per SM at most
        self.grid_at = self.size if launch.get("persistent") else None
        self.sms = 0
        if self.grid_at is not None:
            self.size += PERSISTENT_GRID.size
            self.sms = int(torch.cuda.get_device_properties(device_index).multi_processor_count)
        self.tls = threading.local()                       # one parameter buffer per launching thread
        self.launch_kernel = cudrv.launcher()
        self.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.kernel_name = artifact.kernel_name
        self.c_launch = self._compiled_launcher()

    def _compiled_launcher(self):
        """This plan's compiled launcher (runtime/clauncher.py): the same buffer, checks and cuLaunchKernel
        call in C; None when it is unavailable (clauncher.reason() says why) and launch() packs in Python."""
        mod = clauncher.load()
        if mod is None:
            return None
        maps = self.maps
        return mod.Launcher(
            self.func, cudrv.launch_address(), self.threads, self.shared, launcher_params(self.params), self.size,
            self.device_index, use_params=maps is not None,
            ptr_offsets=self._param_offsets() if maps is not None else None,
            grid_offset=-1 if self.grid_at is None else self.grid_at, max_blocks=self.sms,
            tags=(CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE, CU_LAUNCH_PARAM_END),
            max_gy=MAX_GRID_YZ, max_gz=MAX_GRID_YZ, stream_fn=self.raw_stream,
            tail_fn=maps.tail if maps is not None else None, tail_offset=maps.first if maps is not None else 0,
            on_status=self._status, tmaps=maps.c_specs(self.params) if maps is not None else None,
            encode=tma.encoder_address() if maps is not None else None)

    def _status(self, status: int, args, grid, stream):
        """What the compiled launcher did not launch, in today's words: a grid CUDA refuses, a stream object
        to resolve (then launched), arguments that do not fit, or cuLaunchKernel's error."""
        name = self.kernel_name
        if status == clauncher.STREAM_NOT_A_HANDLE:
            return self.c_launch(args, grid, self.stream_handle(stream))
        if self._made_current(status):
            return self.c_launch(args, grid, stream)
        if status == clauncher.GRID_REFUSED:
            self.check_grid(grid, name)
        if status < 0:
            raise self.explain(args, name)
        raise self._failed(status, grid, name)

    def _failed(self, rc: int, grid, kernel_name: str) -> BackendError:
        return BackendError(f"{kernel_name}: cuLaunchKernel failed: {cudrv.error_name(rc)} (grid {tuple(grid)}, "
                            f"{self.threads} threads, {self.shared} bytes of dynamic shared memory)")

    def _buffer(self):
        """(buffer, kernelParams address, `extra` address, keep-alives): cuLaunchKernel copies the
        parameters at the call. One packed buffer either way; a kernel with tensor maps (64-byte-aligned
        parameters) gets a kernelParams array of pointers into it, which the driver takes where the
        `extra` buffer form fails (H200, 2026-12-01: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)."""
        buf = ctypes.create_string_buffer(max(self.size, 1))
        if self.maps is not None:
            base = ctypes.addressof(buf)
            offsets = self._param_offsets()
            ptrs = (ctypes.c_void_p * len(offsets))(*[base + o for o in offsets])
            slot = self.tls.slot = (buf, ctypes.addressof(ptrs), 0, ptrs)
            return slot
        size = ctypes.c_size_t(self.size)
        extra = (ctypes.c_void_p * 5)(CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buf),
                                      CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size), CU_LAUNCH_PARAM_END)
        slot = self.tls.slot = (buf, 0, ctypes.addressof(extra), (size, extra))
        return slot

    def _param_offsets(self) -> list[int]:
        """Where each kernel parameter starts in the packed buffer: the Program's, the maps and their flag,
        a persistent kernel's logical grid."""
        grid = [] if self.grid_at is None else [self.grid_at + 4 * i for i in range(3)]
        return [p["offset"] for p in self.params] + self.maps.offsets() + grid

    def wrong_device(self, name: str, a, kernel_name: str) -> ArgumentError:
        if not getattr(a, "is_cuda", False):
            return ArgumentError(f"{kernel_name}: argument '{name}' must be a CUDA tensor, got "
                                 f"{getattr(a, 'device', type(a).__name__)}{EMULATED_HINT}")
        return ArgumentError(f"{kernel_name}: argument '{name}' is on cuda:{a.get_device()} but the current "
                             f"device is cuda:{self.device_index}; use torch.cuda.device(...) or move it")

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
        if self.c_launch is not None:
            self.c_launch(args, grid, stream)
            return
        opfast.untracked_launch()
        self.check_grid(grid, kernel_name)
        handle = self.raw_stream(self.device_index) if stream is None and self.raw_stream else \
            self.stream_handle(stream)
        try:
            slot = self.tls.slot
        except AttributeError:
            slot = self._buffer()
        self._pack(args, slot[0], kernel_name)
        if self.maps is not None:
            self.maps.fill(args, slot[0])
        gx, gy, gz = grid
        if self.grid_at is not None:
            PERSISTENT_GRID.pack_into(slot[0], self.grid_at, gx, gy, gz)
            gx, gy, gz = min(gx * gy * gz, self.sms), 1, 1
        rc = self.launch_kernel(self.func, gx, gy, gz, self.threads, 1, 1, self.shared, handle, slot[1], slot[2])
        if self._made_current(rc):
            rc = self.launch_kernel(self.func, gx, gy, gz, self.threads, 1, 1, self.shared, handle, slot[1], slot[2])
        if rc:
            raise self._failed(rc, grid, kernel_name)

    def _made_current(self, rc: int) -> bool:
        """Whether a launch refused for want of a current context (a thread that has made none current: torch's
        autograd device threads set the device without one) can be retried, the plan's context now current."""
        if rc != cudrv.CUDA_ERROR_INVALID_CONTEXT or cudrv.current_context() != 0:
            return False
        cudrv.set_current_context(self.ctx)
        return True

    def unload(self) -> None:
        try:
            cudrv.unload_module(self.module)
        except Exception:  # noqa: BLE001 - the context may already be gone at exit
            pass
