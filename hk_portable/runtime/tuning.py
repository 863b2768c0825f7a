"""The autotuner: time a kernel's candidate configurations on the device, keep the winner per shape bucket.

`Kernel.choose_config(candidates, *args, launch=..., bucket=...)` consults this module before asking the
backend for its default. A winner is looked up by (kernel, backend, target, argument kinds, shape bucket,
candidate list); when there is none and tuning is on (`HK_AUTOTUNE=1`, or `tune=True` in the call) and the
target can run, every candidate the target accepts is launched through the wrapper's `launch(config)` and
timed (CUDA events on a GPU, the host clock on the CPU: warm-up, then the median of a few repeats), and the
fastest is stored. Winners live in `tuning.json` in the compile cache directory: plain data read by
`json`, written atomically, checked on load (a malformed or foreign entry is ignored), so the next process
starts with the tuned choice and no timing. Without a device, or with tuning off, nothing is timed.
"""
from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

ENV = "HK_AUTOTUNE"
FILE = "tuning.json"
MAX_BYTES = 64 << 20
WARMUP, REPEATS = 1, 5
_lock = threading.Lock()
_memory: dict[str, dict] = {}          # this process's winners (also when no cache directory is usable)


def enabled(tune: bool | None) -> bool:
    return bool(tune) if tune is not None else os.environ.get(ENV, "") not in ("", "0")


@functools.lru_cache(maxsize=4096)      # every wrapper call asks; a hit is a fraction of the computation
def bucket(*sizes: int) -> tuple[int, ...]:
    """Shape bucket: each size rounded up to a power of two (a tuned choice holds for its bucket)."""
    return tuple(1 << max(int(s) - 1, 0).bit_length() for s in sizes)


def key(kernel: str, backend: str, target: str, signature, bucket_, candidates) -> str:
    return json.dumps([kernel, backend, target, [str(s) for s in signature], list(bucket_),
                       [sorted(c.items()) for c in candidates]], default=str)


def _path() -> Path | None:
    from . import cache
    root = cache.cache_dir()
    return None if root is None else Path(root) / FILE


def _read() -> dict:
    p = _path()
    if p is None:
        return {}
    from . import cachefiles
    try:   # a regular file only (a FIFO would block), bounded in size, its nesting bounded by RecursionError
        data = json.loads(cachefiles.read_regular(p, MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def lookup(k: str, candidates: list[dict]) -> dict | None:
    """The stored winner for key k if it is still one of the candidates."""
    with _lock:
        hit = _memory.get(k)
    if hit is None:
        entry = _read().get(k)
        hit = entry.get("config") if isinstance(entry, dict) else None
    if isinstance(hit, dict) and hit in candidates:
        return dict(hit)
    return None


def store(k: str, winner: dict, times_ms: list[tuple[dict, float]], seconds: float, errors: list[str] = ()) -> None:
    with _lock:
        _memory[k] = dict(winner)
        p = _path()
        if p is None:
            return
        data = _read()
        data[k] = {"config": winner, "ms": [[c, t] for c, t in times_ms], "tuning_seconds": round(seconds, 3),
                   "date": time.strftime("%Y-%m-%d %H:%M:%S"), **({"skipped": list(errors)} if errors else {})}
        try:
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tuning-")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, default=str)
            os.replace(tmp, p)
        except OSError:
            pass                        # a read-only cache: the winner still holds for this process


def _time_ms(run, device: str) -> float:
    import torch
    cuda = device == "cuda"
    for _ in range(WARMUP):
        run()
    times = []
    for _ in range(REPEATS):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def tune(k: str, candidates: list[dict], launch, device: str) -> dict:
    """Time every candidate through launch(config); store and return the fastest. A candidate whose launch
    fails is skipped (its reason kept in the record)."""
    t0 = time.perf_counter()
    ok: list[tuple[dict, float]] = []
    errors = []
    for cfg in candidates:
        try:
            ok.append((cfg, _time_ms(lambda: launch(dict(cfg)), device)))
        except Exception as e:  # noqa: BLE001 - a candidate that cannot run loses
            errors.append(f"{cfg}: {type(e).__name__}: {e}"[:300])
    if not ok:
        raise RuntimeError(f"autotune: no candidate ran: {errors}")
    winner = dict(min(ok, key=lambda ct: ct[1])[0])
    store(k, winner, ok, time.perf_counter() - t0, errors)
    return winner


def forget() -> None:
    """Drop this process's winners (tests)."""
    with _lock:
        _memory.clear()
