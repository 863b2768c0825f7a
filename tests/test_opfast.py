"""Op replay (runtime/opfast.cpp) on the CPU: the cuda backend's launch path on CPU tensors (testing/fake_cuda)
with cuLaunchKernel a Python callback that keeps every parameter buffer. A replayed call must hand the driver the
buffers the Python path hands it for the same arguments (pointers mapped tensor to tensor); signatures that differ
in anything the Python path reads must not share a plan; what cannot be replayed stays on the Python path.
The same ops on a GPU, with their results against the Python path's: tests/test_gpu_torch.py."""
from __future__ import annotations

import ctypes
import os

import pytest
import torch

import hk_portable as hk
import hk_portable.torch_ops
from hk_portable.runtime import clauncher, opfast, registry
from hk_portable.testing import fake_cuda

bf = torch.bfloat16


@pytest.fixture(scope="module")
def mod():
    return fake_cuda.compiled_or_skip(opfast.load(), f"no op replay here: {opfast.reason()}")


class Driver:
    """cuLaunchKernel as a Python callback: each launch's grid and parameter buffer."""

    def __init__(self):
        self.calls: list[tuple[tuple[int, int, int], bytes]] = []
        self.fn = fake_cuda.LaunchFunction(self._launch)

    def _launch(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        assert extra, "the fake backend's kernels take the `extra` buffer form"
        ex = ctypes.cast(extra, ctypes.POINTER(ctypes.c_void_p))
        size = ctypes.cast(ex[3], ctypes.POINTER(ctypes.c_size_t))[0]
        self.calls.append(((gx, gy, gz), ctypes.string_at(ex[1], size)))
        return 0

    def take(self):
        out, self.calls = self.calls, []
        return out


_DRIVER = Driver()     # one for the module: kernels keep the launchers built with its callback


@pytest.fixture
def driver(mod, monkeypatch):
    d = _DRIVER
    d.take()
    fake_cuda.install(fake_cuda.FakeCudrv(d.fn), raw_stream=abs, monkeypatch=monkeypatch)
    backend = fake_cuda.CpuCudaBackend()
    monkeypatch.setattr(registry, "claimant", lambda dev: backend)
    registry.reset()            # no kernel keeps a backend chosen for CPU tensors before (the reference one)
    mod.clear()
    mod.serve_devices(["cpu"])
    yield d
    mod.serve_devices(["cuda"])
    mod.clear()
    registry.reset()


def _tensors(x):
    return [t for t in (x if isinstance(x, (tuple, list)) else (x,)) if isinstance(t, torch.Tensor)]


def _normalised(calls, tensors):
    """Each buffer with every 8-byte word that points into one of `tensors` written as (index, offset)."""
    spans = [(t.data_ptr(), t.data_ptr() + max(t.numel() * t.element_size(), 1), i) for i, t in enumerate(tensors)
             if t.data_ptr()]
    out = []
    for grid, buf in calls:
        words = []
        for o in range(0, len(buf) - len(buf) % 8, 8):
            w = int.from_bytes(buf[o:o + 8], "little")
            hit = next(((i, w - lo) for lo, hi, i in spans if lo <= w < hi), None)
            words.append(("ptr", *hit) if hit else w)
        out.append((grid, words))
    return out


def _replayed_and_python(mod, driver, make_args, op):
    """(replayed launches, Python path's launches), both normalised, for one set of fresh arguments."""
    for _ in range(2):                          # seen, then recorded
        op(*make_args())
    driver.take()
    args = make_args()
    before = opfast.stats()["replays"]
    out = op(*args)
    assert opfast.stats()["replays"] == before + 1, opfast.last_refusal()
    replayed = _normalised(driver.take(), _tensors(args) + _tensors(out))
    mod.set_bypass(1)
    try:
        out = op(*args)
    finally:
        mod.set_bypass(-1)
    python = _normalised(driver.take(), _tensors(args) + _tensors(out))
    return replayed, python


def r(*shape, dtype=bf):
    return torch.randn(*shape, dtype=dtype)


CASES = {
    "rms_norm": (lambda: (r(8, 1024), None, r(1024)), torch.ops.hk.rms_norm),
    "rms_norm residual eps": (lambda: (r(8, 1024), r(8, 1024), r(1024), None, 0.0, 0, 0, 1e-3),
                              torch.ops.hk.rms_norm),
    "layernorm": (lambda: (r(4, 512), r(4, 512), r(512), r(512)), torch.ops.hk.dropout_residual_layernorm),
    "gemm nn": (lambda: (r(64, 128), r(128, 64)), torch.ops.hk.gemm),
    "gemm nt (Linear)": (lambda: (r(64, 128), r(96, 128).t()), torch.ops.hk.gemm),
    "gemm tn (weight grad)": (lambda: (r(128, 64).t(), r(128, 96)), torch.ops.hk.gemm),
    "gemm 3-d": (lambda: (r(2, 32, 128), r(128, 64)), torch.ops.hk.gemm),
    "attention causal": (lambda: (r(1, 2, 128, 64), r(1, 2, 128, 64), r(1, 2, 128, 64), True),
                         torch.ops.hk.attention),
    "attention, one tensor thrice": (lambda: (r(2, 4, 64, 64),) * 3, torch.ops.hk.attention),
    "rotary": (lambda: (r(1, 16, 2, 64), r(16, 32, dtype=torch.float32), r(16, 32, dtype=torch.float32)),
               torch.ops.hk.rotary),
}


@pytest.mark.parametrize("grad", ["inference", "no_grad", "grad"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_replay_launches_what_the_python_path_launches(case, grad, mod, driver):
    make_args, op = CASES[case]
    ctx = {"inference": torch.inference_mode, "no_grad": torch.no_grad, "grad": torch.enable_grad}[grad]()
    with ctx:
        replayed, python = _replayed_and_python(mod, driver, make_args, op)
    assert replayed and replayed == python


def test_signatures_do_not_share_plans(mod, driver):
    """Shape, stride, dtype, a scalar's value, aliasing: each a plan of its own, each launching its own buffers."""
    x = r(8, 1024)
    variants = [
        lambda: (r(8, 1024), None, r(1024)),
        lambda: (r(16, 1024), None, r(1024)),                               # shape
        lambda: (r(8, 2048)[:, :1024], None, r(1024)),                       # stride
        lambda: (r(8, 1024, dtype=torch.float16), None, r(1024, dtype=torch.float16)),   # dtype
        lambda: (r(8, 1024), None, r(1024), None, 0.0, 0, 0, 1e-2),          # eps
        lambda: (x, x, r(1024)),                                             # x as its own residual
    ]
    with torch.inference_mode():
        for make in variants:
            replayed, python = _replayed_and_python(mod, driver, make, torch.ops.hk.rms_norm)
            assert replayed == python
    assert opfast.stats()["plans"]["rms_norm"] == len(variants)


def test_what_reads_values_stays_on_the_python_path(mod, driver):
    """attention_kvcache checks CPU-held cache lengths by reading them (a .min()): refused, every call Python's."""
    args = (r(2, 1, 4, 64), r(2, 256, 2, 64), r(2, 256, 2, 64), torch.tensor([100, 200], dtype=torch.int32))
    before = opfast.stats()
    for _ in range(4):
        torch.ops.hk.attention_kvcache(*args)
    after = opfast.stats()
    assert after["replays"] == before["replays"] and after["refusals"] == before["refusals"] + 1
    assert "aten.min" in opfast.last_refusal()


def test_a_use_backend_block_turns_replay_off(mod, driver):
    make, op = CASES["rms_norm"]
    for _ in range(3):
        op(*make())
    before = opfast.stats()["replays"]
    with hk.use_backend("reference"):           # the block's choice is the Python path's to make
        op(*make())
    assert opfast.stats()["replays"] == before
    op(*make())
    assert opfast.stats()["replays"] == before + 1


def test_a_call_needing_a_gradient_goes_through_autograd(mod, driver):
    """Inputs needing a gradient: the Python Autograd kernel (its forward replays below it), a grad_fn on the output."""
    w = r(1024).requires_grad_()
    for _ in range(3):
        y, _ = torch.ops.hk.rms_norm(r(8, 1024), None, w)
    assert y.grad_fn is not None and "hk_rms_norm" in type(y.grad_fn).__name__


def test_the_launch_record_is_complete(mod, driver):
    """Every launch of a recording reaches the record list with the buffer the driver got."""
    lib = clauncher.load()
    rec = []
    lib.record_into(rec)
    try:
        torch.ops.hk.gemm(r(64, 128), r(128, 64))
    finally:
        lib.record_into(None)
    launched = driver.take()
    assert [(tuple(g), bytes(b)) for _, b, g, _ in rec] == [(g, b) for g, b in launched]
    assert all(off + 8 <= len(b) for L, b, _, _ in rec for off in L.data_offsets)


def test_describe_and_stats(mod):
    assert "op replay in C++" in opfast.describe()
    s = opfast.stats()
    assert {"replays", "records", "refusals", "plans"} <= set(s) and "gemm" in s["plans"]


def test_a_constant_table_is_kept_not_refused(mod, driver):
    """hnn's rms_norm without a weight passes a vector of ones made once (hk.constant_table): replayed, pointing at it."""
    from hk_portable.nn import functional as F
    before = opfast.stats()["replays"]
    for _ in range(4):
        F.rms_norm(r(8, 1024), (1024,))
    assert opfast.stats()["replays"] == before + 2, opfast.last_refusal()


def test_opcheck_passes_with_the_cpp_kernels_serving(mod):
    """torch.library.opcheck (schema, autograd registration, fake tensors, AOT dispatch) on the reference backend with
    the C++ kernels serving the CPU: AOT dispatch calls the op under PythonDispatcher, which the C++ Autograd kernel
    must mask off before it redispatches (it once recursed until the stack overflowed)."""
    x, w = r(10, 96).float().requires_grad_(), r(96).float().requires_grad_()
    mod.serve_devices(["cpu"])
    try:
        torch.library.opcheck(torch.ops.hk.rms_norm.default, (x, None, w, None, 0.0))
    finally:
        mod.serve_devices(["cuda"])
        mod.clear()



def test_an_op_defined_after_load_is_served(mod, driver):
    """load() enables the ops defined so far; one defined later (a module imported after the first GPU call, or after
    hk.precompile / a benchmark loaded op replay) is enabled when it is defined, so its calls reach the C++ kernel (a
    recording, then replays) instead of staying on the Python path for good."""
    import hk_portable.torch_ops as torch_ops

    def hk_test_late_op(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    if not hasattr(torch.ops.hk, "hk_test_late_op"):
        torch_ops._Op(hk_test_late_op)
    op = torch.ops.hk.hk_test_late_op.default
    before = opfast.stats()
    x = torch.randn(4, 4)
    for _ in range(4):
        op(x)
    after = opfast.stats()
    assert after["records"] + after["refusals"] > before["records"] + before["refusals"], (before, after)
