"""The cuda LaunchPlan without a GPU (hk_portable.testing.fake_cuda's cudrv, with a cuLaunchKernel that records
its calls): the parameter buffer holds exactly the data pointers, shapes, strides and scalars in the kernel's
ABI, bad arguments are ArgumentErrors that name the argument, and concurrent launching threads use separate
buffers. Every test runs on both launch paths: the compiled launcher (runtime/clauncher.py, calling the
recorder through its C function pointer) and the Python packer with ctypes."""
from __future__ import annotations

import ctypes
import struct
import threading

import pytest
import torch

from hk_portable.backends.cuda import driver
from hk_portable.codegen.abi import param_layout
from hk_portable.interface import ArgumentError, BackendError
from hk_portable.interface.backend import Artifact
from hk_portable.interface.dtypes import bf16, f32, i32
from hk_portable.interface.ir import GlobalType, ScalarType
from hk_portable.runtime import clauncher
from hk_portable.testing import fake_cuda


class RecordedLaunches(list):
    """A cuLaunchKernel in Python behind a C function pointer (`c_function`, for fake_cuda.FakeCudrv): records
    each call's geometry, stream, `extra`-form parameter bytes and calling thread; returns `rc`."""
    def __init__(self):
        super().__init__()
        self.rc = 0
        self.c_function = fake_cuda.LaunchFunction(self.launch_kernel)

    def launch_kernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        words = (ctypes.c_void_p * 5).from_address(extra)
        size = ctypes.c_size_t.from_address(words[3]).value
        self.append({"grid": (gx, gy, gz), "block": (bx, by, bz), "shared": shared, "stream": stream or 0,
                     "bytes": ctypes.string_at(words[1], size), "buffer": words[1],
                     "thread": threading.get_ident()})
        return self.rc                                  # 0: CUDA_SUCCESS


PARAMS = [("x", GlobalType(bf16, 2)), ("y", GlobalType(f32, 3)), ("n", ScalarType(i32)), ("s", ScalarType(f32))]


@pytest.fixture(params=["compiled", "python"])
def plan(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(clauncher, "load", lambda build_if_missing=True: None)
    elif clauncher.load() is None:
        pytest.skip(f"no compiled launcher here: {clauncher.reason()}")
    launches = RecordedLaunches()
    drv = fake_cuda.FakeCudrv(launches.c_function)
    monkeypatch.setattr(driver, "cudrv", drv)
    fmt, size, params = param_layout(PARAMS)
    art = Artifact(backend="cuda", target="sm_90a", kernel_name="k", program_hash="0", binary=b"cubin",
                   launch={"threads": 128, "shared_bytes": 64 * 1024, "params": params, "param_format": fmt,
                           "param_size": size})
    p = driver.LaunchPlan(art, device_index=-1)     # CPU tensors report get_device() == -1
    assert (p.c_launch is not None) == (request.param == "compiled")
    p.drv, p.launches = drv, launches
    return p


def test_parameter_buffer_is_the_kernel_abi(plan):
    x = torch.zeros(7, 9, dtype=torch.bfloat16)[:, 1:]          # a view: offset pointer, row stride 9
    y = torch.zeros(2, 3, 4).transpose(0, 2)
    plan.launch([x, y, -5, 2.5], (3, 2, 1), 1234, "k")
    (rec,) = plan.launches
    assert rec["grid"] == (3, 2, 1) and rec["block"] == (128, 1, 1) and rec["shared"] == 64 * 1024
    assert rec["stream"] == 1234
    assert plan.drv.max_dynamic_shared == 64 * 1024
    vals = struct.unpack(plan.packer.format, rec["bytes"])
    assert vals == (x.data_ptr(), 7, 8, 9, 1, y.data_ptr(), 4, 3, 2, 1, 4, 12, -5, 2.5)
    # gl<bf16,2> at 0 (32 bytes), gl<f32,3> at 32 (8 + 16 pad-free + 24 = 48 bytes), int at 80, float at 84
    _, size, params = param_layout(PARAMS)
    assert [p["offset"] for p in params] == [0, 32, 80, 84] and size == plan.size == 88


def test_bad_arguments_name_the_argument(plan, monkeypatch):
    x = torch.zeros(4, 4, dtype=torch.bfloat16)
    y = torch.zeros(2, 2, 2)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 7)   # now every tensor is on the wrong device
    with pytest.raises(ArgumentError, match="'x' must be a CUDA tensor"):
        plan.launch([x, y, 1, 1.0], (1, 1, 1), 0, "k")
    monkeypatch.undo()
    with pytest.raises(ArgumentError, match="int32"):
        plan.launch([x, y, 2**40, 1.0], (1, 1, 1), 0, "k")
    with pytest.raises(ArgumentError, match="65535"):
        plan.launch([x, y, 1, 1.0], (1, 70000, 1), 0, "k")
    with pytest.raises(ArgumentError, match="stream"):
        plan.launch([x, y, 1, 1.0], (1, 1, 1), object(), "k")
    assert not plan.launches


def test_threads_pack_into_their_own_buffers(plan):
    x = torch.zeros(4, 4, dtype=torch.bfloat16)
    y = torch.zeros(2, 2, 2)
    barrier = threading.Barrier(4)

    def worker(n):
        barrier.wait()
        for _ in range(200):
            plan.launch([x, y, n, float(n)], (1, 1, 1), 0, "k")

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(plan.launches) == 800
    by_thread = {}
    for rec in plan.launches:
        vals = struct.unpack(plan.packer.format, rec["bytes"])
        by_thread.setdefault(rec["thread"], set()).add(vals[-2])
    assert len(by_thread) == 4
    for seen in by_thread.values():
        assert len(seen) == 1, "a thread's launches carried another thread's scalars"


def test_a_failed_launch_is_an_error_that_names_the_driver_result(plan):
    plan.launches.rc = 701                                               # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    x = torch.zeros(4, 4, dtype=torch.bfloat16)
    y = torch.zeros(2, 2, 2)
    with pytest.raises(BackendError, match="cuLaunchKernel failed: CUDA_ERROR_701"):
        plan.launch([x, y, 1, 1.0], (1, 1, 1), 0, "k")


def test_a_thread_without_a_current_context_gets_the_plans_and_launches(plan):
    """torch's autograd device threads set the device without making a context current: the first launch there
    returns CUDA_ERROR_INVALID_CONTEXT; the plan makes its context current and launches again (once)."""
    x, y = torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(2, 2, 2)
    refused = []

    def launch_kernel(*args):
        if plan.drv.context == 0:
            refused.append(1)
            return plan.drv.CUDA_ERROR_INVALID_CONTEXT
        return plan.launches.launch_kernel(*args)
    plan.launches.c_function = fake_cuda.LaunchFunction(launch_kernel)
    plan.drv.context = 0
    plan.launch_kernel = plan.launches.c_function
    if plan.c_launch is not None:
        plan.drv.launch = plan.launches.c_function
        plan.c_launch = plan._compiled_launcher()
    plan.launch([x, y, 1, 1.0], (1, 1, 1), 0, "k")
    assert refused == [1] and plan.drv.context == plan.ctx == 1 and len(plan.launches) == 1
    plan.launches.rc = 5                              # any other error is still the driver's, in words
    with pytest.raises(BackendError, match="cuLaunchKernel failed: CUDA_ERROR_5"):
        plan.launch([x, y, 1, 1.0], (1, 1, 1), 0, "k")


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_a_tensor_passed_twice_packs_as_itself_twice(path, monkeypatch):
    """The compiled launcher reads a tensor passed for two parameters once (the norms pass x as the residual and
    the weight as the bias): both parameters' words are that tensor's, as the Python packer writes them."""
    if path == "python":
        monkeypatch.setattr(clauncher, "load", lambda build_if_missing=True: None)
    elif clauncher.load() is None:
        pytest.skip(f"no compiled launcher here: {clauncher.reason()}")
    launches = RecordedLaunches()
    monkeypatch.setattr(driver, "cudrv", fake_cuda.FakeCudrv(launches.c_function))
    params2 = [("a", GlobalType(f32, 2)), ("b", GlobalType(f32, 2)), ("c", GlobalType(f32, 2))]
    fmt, size, params = param_layout(params2)
    art = Artifact(backend="cuda", target="sm_90a", kernel_name="k", program_hash="0", binary=b"cubin",
                   launch={"threads": 128, "shared_bytes": 0, "params": params, "param_format": fmt,
                           "param_size": size})
    p = driver.LaunchPlan(art, device_index=-1)
    x = torch.zeros(6, 10)[1:, ::2]
    z = torch.zeros(3, 4)
    p.launch([x, z, x], (1, 1, 1), 0, "k")
    vals = struct.unpack(p.packer.format, launches[0]["bytes"])
    words = (x.data_ptr(), 5, 5, 10, 2)
    assert vals == words + (z.data_ptr(), 3, 4, 4, 1) + words
