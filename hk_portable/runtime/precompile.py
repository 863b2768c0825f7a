"""hk.precompile: every kernel a model step will launch, compiled in parallel before the step runs.

    report = hk.precompile(train_step, model, batch)      # then train_step(model, batch) finds each in the cache

The step is run once with launches *recorded*: each kernel call binds, specialises and selects its backend and
target as a real call does, then records (Program, backend, target) and returns without compiling or running
(outputs stay as allocated, so the step must not branch on their values). The recorded builds then go through the
compile cache in worker processes at once (fork: a Program does not survive pickling), and the calling process
reads them back into each kernel's memo, so the next real call of that kernel is a cache hit in memory.
"""
from __future__ import annotations

import contextvars
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from . import cache, registry

_recording: contextvars.ContextVar[dict | None] = contextvars.ContextVar("hk_recording", default=None)
_JOBS: list = []        # (kernel, program, backend name, target) of the recording the forked workers compile


def recording() -> dict | None:
    """The open recording (key -> (kernel, program, backend, target)), or None: Kernel calls record into it."""
    return _recording.get()


def _build(i: int) -> dict:
    kern, prog, be_name, target = _JOBS[i]
    t0 = time.perf_counter()
    try:
        cache.compile_cached(registry.load(be_name), prog, target)
    except Exception as e:  # noqa: BLE001 - reported with the kernel's name; the real call raises it again
        return {"kernel": kern.name, "target": target.spec, "error": f"{type(e).__name__}: {str(e)[:500]}"}
    return {"kernel": kern.name, "target": target.spec, "error": None, "seconds": time.perf_counter() - t0}


def precompile(fn, *args, workers: int | None = None, **kwargs) -> list[dict]:
    """Compile every kernel `fn(*args, **kwargs)` launches, `workers` at a time (default: the CPUs, at most 16);
    returns one entry per distinct build ({kernel, target, error, seconds})."""
    from . import opfast                             # (imports this module)
    seen: dict = {}
    if torch.cuda.is_available():
        opfast.load()                                # built now, not in the background at the first step
    token = _recording.set(seen)
    opfast.block_opened(1)                           # every call takes the Python path, which records
    try:
        fn(*args, **kwargs)
    finally:
        opfast.block_opened(-1)
        _recording.reset(token)
    _JOBS[:] = list(seen.values())
    workers = workers or max(1, min(16, os.cpu_count() or 1))
    if workers == 1 or len(_JOBS) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        results = [_build(i) for i in range(len(_JOBS))]
    else:
        with ProcessPoolExecutor(min(workers, len(_JOBS)), mp_context=multiprocessing.get_context("fork")) as ex:
            results = list(ex.map(_build, range(len(_JOBS))))
    for (kern, prog, be_name, target), r in zip(_JOBS, results):
        if r["error"] is None:      # read back from the disk cache into the kernel's memo
            kern.compile_for(prog, registry.load(be_name), target)
    _JOBS.clear()
    return results
