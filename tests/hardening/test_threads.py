"""Concurrency (issue 14, item 5): a kernel called from 8 threads at once with different shapes, dtypes and
backends gives the right results, and first calls racing to compile one specialisation trace and compile
it once."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, f32
from hk_portable.interface import kernel as kernel_mod
from hk_portable.runtime import registry

THREADS = 8


def _scale(x: GL[2], y: GL[2], s: float, *, BM: hk.const = 16, BN: hk.const = 32):
    m, n = hk.block_idx(0), hk.block_idx(1)
    t = hk.load(RT[f32, BM, BN], x, (m, n))
    hk.store(y, t * s, (m, n))


def _grid(x, bm=16, bn=32):
    return (-(-x.shape[0] // bm), -(-x.shape[1] // bn))


def _run_together(fn, jobs):
    """fn(*job) for every job, each in its own thread, all released at once."""
    barrier = threading.Barrier(len(jobs))

    def go(job):
        barrier.wait()
        return fn(*job)

    with ThreadPoolExecutor(len(jobs)) as ex:
        return list(ex.map(go, jobs))


def _case(k: int):
    dtype = (torch.float32, torch.bfloat16, torch.float16)[k % 3]
    g = torch.Generator().manual_seed(100 + k)
    x = torch.randn(17 + 9 * k, 33 + 21 * k, generator=g).to(dtype)
    return x, torch.full_like(x, float("nan")), 0.5 + k


def _expected(x, s):
    return (x.double() * s).to(x.dtype)     # f32 math on exactly representable inputs, rounded once


@pytest.mark.parametrize("backends", [("reference",), ("reference", "hip:gfx942:emulated"), ("cuda", "reference")],
                         ids=["reference", "mixed", "cuda"])
def test_eight_threads_with_different_shapes_and_dtypes(backends):
    k = hk.kernel(_scale, name="threads_scale")
    if "hip:gfx942:emulated" in backends and not registry.load("hip").target("gfx942", emulated=True).has("run"):
        pytest.skip("the hip emulator cannot run here")
    if "cuda" in backends and not registry.load("cuda").status().available:
        pytest.skip(f"cuda backend unusable here: {registry.load('cuda').status().reason}")
    jobs = [(i, backends[i % len(backends)]) for i in range(THREADS)]

    def call(i, backend):
        outs = []
        for rep in range(3):
            x, y, s = _case(i)
            if backend == "cuda":                       # cuda threads launch on the GPU, each on torch's stream
                x, y = x.cuda(), y.cuda()
            k(x, y, s, grid=_grid(x), backend=backend)
            outs.append((x.cpu(), y.cpu(), s))
        return outs

    for outs in _run_together(call, jobs):
        for x, y, s in outs:
            torch.testing.assert_close(y, _expected(x, s), rtol=0, atol=0)


@pytest.fixture
def counted(monkeypatch):
    """Counts traces and reference compiles; each compile sleeps, so racing callers overlap it."""
    traces, compiles = [], []
    real_trace = kernel_mod.trace

    def trace(*a, **kw):
        traces.append(a[1])
        time.sleep(0.05)
        return real_trace(*a, **kw)

    be = registry.load("reference")
    real_compile = type(be).compile

    def compile(self, program, *a, **kw):
        compiles.append(program.hash)
        time.sleep(0.05)
        return real_compile(self, program, *a, **kw)

    monkeypatch.setattr(kernel_mod, "trace", trace)
    monkeypatch.setattr(type(be), "compile", compile)
    return traces, compiles


def test_racing_first_calls_compile_once(counted):
    traces, compiles = counted
    k = hk.kernel(_scale, name="race_once")
    x = torch.randn(40, 70)
    ys = [torch.full_like(x, float("nan")) for _ in range(THREADS)]
    _run_together(lambda y: k(x, y, 2.0, grid=_grid(x), backend="reference"), [(y,) for y in ys])
    assert len(traces) == 1 and len(compiles) == 1
    for y in ys:
        torch.testing.assert_close(y, _expected(x, 2.0), rtol=0, atol=0)


def test_racing_first_calls_of_different_specialisations_compile_each_once(counted):
    traces, compiles = counted
    k = hk.kernel(_scale, name="race_each")
    dtypes = (torch.float32, torch.bfloat16)
    jobs = [(torch.randn(40, 70).to(dtypes[i % 2]), i % 2 == 0) for i in range(THREADS)]

    def call(x, wide):
        y = torch.full_like(x, float("nan"))
        k(x, y, 3.0, grid=_grid(x, bn=64 if wide else 32), backend="reference", **({"BN": 64} if wide else {}))
        return x, y

    for x, y in _run_together(call, jobs):
        torch.testing.assert_close(y, _expected(x, 3.0), rtol=0, atol=0)
    # 2 dtypes x BN in {32, 64}, paired: i even -> (f32, BN=64), i odd -> (bf16, BN=32): two specialisations
    assert len(traces) == 2 and len(set(compiles)) == 2 and len(compiles) == 2


def test_a_failed_first_compile_is_retried_not_cached(monkeypatch):
    k = hk.kernel(_scale, name="retry_after_failure")
    be = registry.load("reference")
    real_compile, failures = type(be).compile, []

    def flaky(self, program, *a, **kw):
        if not failures:
            failures.append(1)
            raise RuntimeError("transient")
        return real_compile(self, program, *a, **kw)

    monkeypatch.setattr(type(be), "compile", flaky)
    x = torch.randn(16, 32)
    y = torch.full_like(x, float("nan"))
    with pytest.raises(RuntimeError, match="transient"):
        k(x, y, 1.0, grid=(1, 1), backend="reference")
    k(x, y, 1.0, grid=(1, 1), backend="reference")
    torch.testing.assert_close(y, x)
