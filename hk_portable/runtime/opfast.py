"""Op replay: the host path of a `torch.ops.hk.*` call on a GPU in C++ (opfast.cpp says how it works and why).

This module builds opfast.cpp with the host C++ compiler against the running torch's headers at the first op call
on a GPU (about 10 s once; cached beside the compiled launcher, keyed by the source, torch's version and the Python
ABI), enables replay for the library's ops, and records a signature's Python path the second time it is called:

  record(fn, args)  runs the implementation with the compiled launcher's record list set (every launch: its
                    Launcher, packed buffer, grid and stream) and a dispatch mode watching every torch op inside; the
                    plan it hands opfast.cpp names, per launch, which buffer words are this call's pointers (an
                    argument's or a fresh allocation's, plus an offset) and which allocations the outputs are.
                    It refuses (the signature stays on the Python path for good) when the implementation ran any
                    torch op but an allocation or a view (a copy, a fill, a read of a value such as .item()), launched
                    through a path other than the compiled launcher, used another stream, or passed a pointer it
                    cannot attribute to exactly one argument or allocation.

Where there is no C++ compiler, no compiled launcher, or HK_OP_REPLAY=0, every call keeps the Python path and
`reason()` says why (`hk backends` prints it).
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import sysconfig
import threading
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import clauncher, precompile

SOURCE = Path(__file__).with_name("opfast.cpp")
ENV = "HK_OP_REPLAY"
ABI = 1
MODULE = "_hk_opfast"
CXX = ("c++", "g++", "clang++", "clang++-21", "clang++-20", "clang++-19", "clang++-18")
CXXFLAGS = ("-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-w")
BUILD_TIMEOUT_S = 300

log = logging.getLogger("hk_portable.opfast")
_lock = threading.Lock()
_module = None
_reason: str | None = None
_ops: list[str] = []           # ops whose implementation went through recordable(): enabled at load, or when
                               # defined where load() ran first
_open_blocks = 0               # use_backend() blocks open now (replay is off while any is)


# ------------------------------------------------------------------------------------------- build
def enabled() -> bool:
    return clauncher.switched_on(ENV) and clauncher.enabled()


def compiler() -> list[str] | None:
    """The host C++ compiler as a command: $CXX, else the first of CXX on PATH."""
    return clauncher.find_compiler("CXX", CXX)


def _torch_dirs() -> tuple[list[str], str]:
    """torch's header directories and its library directory (torch.utils.cpp_extension's, without importing it:
    that import looks for a CUDA toolkit and warns when there is none)."""
    root = os.path.dirname(torch.__file__)
    inc = os.path.join(root, "include")
    return [inc, os.path.join(inc, "torch", "csrc", "api", "include")], os.path.join(root, "lib")


def key() -> str:
    parts = [hashlib.sha256(SOURCE.read_bytes()).hexdigest(), torch.__version__, torch.__file__,
             sysconfig.get_config_var("EXT_SUFFIX") or "", sys.version, " ".join(CXXFLAGS)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


_path: Path | None = None
_builder: threading.Thread | None = None


def path() -> Path:
    global _path
    if _path is None:
        _path = clauncher.cache_root() / f"{MODULE}-{key()}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    return _path


def _first_gpu_call() -> None:
    """At an op's first calls on a GPU: load op replay when it is built; else build it in a background thread
    (about 10 s), the calls keeping the Python path until a later call finds it built, so a cold first call waits
    for no C++ compiler. `hk precompile` and load() build it in the foreground."""
    global _builder
    if _builder is not None and _builder.is_alive():
        return
    if clauncher.load() is None or not enabled():
        load(build_if_missing=False)            # sets the reason
        return
    if clauncher.ensure_built(path(), build, False) is not None:
        load(build_if_missing=False)
        return
    if _builder is None:
        def build_quietly():
            global _reason
            try:
                clauncher.ensure_built(path(), build, True)
            except Exception as e:  # noqa: BLE001 - kept as the reason; every call stays on the Python path
                _reason = clauncher.failure_reason(e)
        _builder = threading.Thread(target=build_quietly, name="hk-op-replay-build", daemon=True)
        _builder.start()


def build(dest: Path) -> None:
    cxx = compiler()
    if cxx is None:
        raise RuntimeError(f"no host C++ compiler ($CXX or one of {', '.join(CXX)})")
    inc = clauncher.python_include()
    if inc is None:
        raise RuntimeError("no Python headers (Python.h); install python3-dev")
    includes, lib = _torch_dirs()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    cmd = [*cxx, *CXXFLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I", str(inc),
           *[f"-I{p}" for p in includes], str(SOURCE)]
    clauncher.compile_shared(cmd, [f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}"],
                             dest, BUILD_TIMEOUT_S)


def load(build_if_missing: bool = True):
    """The compiled module with every recordable op enabled, or None (reason() says why)."""
    global _module, _reason
    if _module is not None or _reason is not None:
        return _module
    with _lock:
        if _module is not None or _reason is not None:
            return _module
        if not enabled():
            _reason = f"disabled by {ENV}={os.environ.get(ENV)}" if os.environ.get(ENV) else \
                "the compiled launcher is disabled"
            return None
        launcher = clauncher.load(build_if_missing)
        if launcher is None:
            if clauncher.reason() is not None:
                _reason = f"no compiled launcher: {clauncher.reason()}"
            return None
        try:
            p = clauncher.ensure_built(path(), build, build_if_missing)
            if p is None:
                return None
            mod = clauncher.import_extension(p, MODULE)
            if getattr(mod, "ABI", None) != ABI:
                raise RuntimeError(f"{p} has op-replay ABI {getattr(mod, 'ABI', None)}, expected {ABI}")
            mod.configure(launcher.Launcher, launcher._C_API)
            mod.set_bypass(_open_blocks)
            for name in _ops:
                mod.enable(name)
        except Exception as e:  # noqa: BLE001 - any failure means the Python path, with the reason kept
            _reason = clauncher.failure_reason(e)
            log.debug("hk_portable: op replay unavailable: %s", _reason)
            return None
        _module = mod
        return mod


def reason() -> str | None:
    return _reason


def describe() -> str:
    mod = load(build_if_missing=False)
    if mod is not None:
        return f"op replay in C++ ({mod.__file__})"
    return f"op calls on the Python path: {_reason or 'op replay not built yet (built at the first GPU op call)'}"


def stats() -> dict:
    """Replays, recordings, refusals and plans per op so far (all zero without the module)."""
    return _module.stats() if _module is not None else {"replays": 0, "records": 0, "refusals": 0, "plans": {}}


def block_opened(delta: int) -> None:
    """A use_backend() block opened (+1) or closed (-1): replay is off while any is open (its choice of backend
    is the Python path's to make)."""
    global _open_blocks
    _open_blocks += delta
    if _module is not None:
        _module.set_bypass(delta)


# ------------------------------------------------------------------------------------------- recording
def recordable(name: str, fn):
    """The implementation hk::name registers: `fn`, which records itself when opfast.cpp asks and loads op
    replay at the first call with a GPU tensor. An op defined after op replay loaded (hk bench, hk.precompile or a
    profile loading it before the model's modules are imported) is enabled here, at once."""
    with _lock:                     # load() enables _ops and sets _module under the same lock
        _ops.append(name)
        if _module is not None:
            _module.enable(name)

    def impl(*args):
        mod = _module
        if mod is not None:
            if mod.recording() and precompile.recording() is None:     # (no launches while precompiling)
                return record(mod, fn, args)
        elif _reason is None and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            _first_gpu_call()
        return fn(*args)

    impl.__name__, impl.__doc__ = fn.__name__, fn.__doc__
    return impl


_constants: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def constant(t: torch.Tensor) -> torch.Tensor:
    """Declares `t` a table a library wrapper made once and passes to its kernels unchanged on every call (an iota,
    a vector of ones): a recording may then keep pointing at it (its plan holds `t`). Returns t."""
    _constants[id(t)] = t
    return t


_ALLOCATING = frozenset(("empty.memory_format", "empty_strided.default", "new_empty.default",
                         "new_empty_strided.default", "empty_like.default"))
_METADATA = frozenset(("sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous", "dim", "size",
                       "stride", "numel", "storage_offset", "is_non_overlapping_and_dense", "is_same_size"))


class _Watch(TorchDispatchMode):
    """Every torch op the implementation runs: allocations kept, views and metadata let through, anything else
    (the first one named in `foreign`) makes the recording refuse."""

    def __init__(self):
        super().__init__()
        self.allocations: list[torch.Tensor] = []
        self.foreign: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = f"{func._schema.name.split('::')[-1]}.{func._overloadname}"
        if name in _ALLOCATING:
            self.allocations.append(out)
        elif not (_is_view(func) or func._schema.name.split("::")[-1] in _METADATA) and self.foreign is None:
            self.foreign = str(func)
        return out


def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def record(mod, fn, args):
    """Runs fn(*args) recording its launches and allocations, hands opfast.cpp the plan (or its refusal)."""
    launches: list = []
    watch = _Watch()
    lib = clauncher.load(False)
    lib.record_into(launches)
    outer, _recording.launches = getattr(_recording, "launches", None), launches
    try:
        with watch:
            out = fn(*args)
    finally:
        lib.record_into(None)
        _recording.launches = outer
    try:
        plan = _plan(args, out, launches, watch)
    except _Refused as e:
        plan, _recording.refused = None, f"{getattr(fn, '__name__', fn)}: {e}"
        log.debug("hk_portable: op replay refused %s", _recording.refused)
    except Exception as e:  # noqa: BLE001 - a plan that cannot be made is a refusal, never a failed call
        plan, _recording.refused = None, f"{getattr(fn, '__name__', fn)}: {type(e).__name__}: {e}"
        log.debug("hk_portable: op replay refused %s", _recording.refused)
    mod.set_plan(plan)
    return out


class _Refused(Exception):
    """Why a recording cannot become a plan (last_refusal() keeps the latest on this thread)."""


def last_refusal() -> str | None:
    """Why this thread's latest recording was refused (tests, debugging)."""
    return getattr(_recording, "refused", None)


def _extent(t: torch.Tensor) -> int:
    """Bytes from t's first element to one past its last."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _resolve(p: int, sources: list[tuple[int, torch.Tensor]]) -> tuple[int, int] | None:
    """(source, delta) of a pointer: the source whose data pointer it is (the first such), else the one source
    whose elements it points into; None when none or several do."""
    for s, t in sources:
        if t.data_ptr() == p:
            return s, 0
    inside = [(s, p - t.data_ptr()) for s, t in sources if t.data_ptr() < p < t.data_ptr() + _extent(t)]
    return inside[0] if len(inside) == 1 else None


def _plan(args, out, launches, watch):
    """The spec opfast.cpp's set_plan takes; _Refused says why there is none."""
    outs = out if isinstance(out, tuple) else (out,)
    tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if watch.foreign:
        raise _Refused(f"it runs {watch.foreign}, not only allocations and views")
    if not launches or None in launches:
        raise _Refused("it launched nothing, or through a path the compiled launcher does not record")
    if not tensors or not all(isinstance(o, torch.Tensor) for o in outs):
        raise _Refused("it takes no tensor or returns something else than tensors")
    device = tensors[0][1].device
    stream_fn = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    stream = stream_fn(-1 if device.index is None else device.index) if stream_fn is not None else 0
    allocs = watch.allocations
    storage = {a.untyped_storage()._cdata: j for j, a in enumerate(allocs)}
    if len(storage) != len(allocs) or any(a.storage_offset() != 0 for a in allocs):
        raise _Refused("an allocation is a view")
    outputs = []
    for o in outs:
        j = storage.get(o.untyped_storage()._cdata)
        if j is None or o.device != device or o.dtype != allocs[j].dtype:
            raise _Refused("an output is not one of its allocations")
        a = allocs[j]
        whole = (o.shape, o.stride(), o.storage_offset()) == (a.shape, a.stride(), 0)
        outputs.append((j, tuple(o.shape), tuple(o.stride()), o.storage_offset(), whole))
    sources = tensors + [(-1 - j, a) for j, a in enumerate(allocs)]
    tables = [t for t in list(_constants.values()) if t.device == device]
    keep: list[torch.Tensor] = []
    specs = []
    for launcher, buf, grid, handle in launches:
        if not launcher.replayable:
            raise _Refused("a launch's tail is made in Python")
        if handle != stream:
            raise _Refused("a launch ran on another stream than the current one")
        slots = []
        for off in launcher.data_offsets:
            p = int.from_bytes(buf[off:off + 8], "little")
            if p == 0:
                continue
            found = _resolve(p, sources)
            if found is None:
                table = _resolve(p, list(enumerate(tables)))
                if table is None:
                    raise _Refused(f"a pointer (parameter at byte {off}) is no argument's, allocation's or "
                                   "declared constant table's")
                keep.append(tables[table[0]])          # the pointer stays as recorded; the plan keeps the table
                continue
            slots.append((off, *found))
        specs.append((launcher, buf, grid, tuple(slots)))
    return (str(device), stream, tuple((tuple(a.shape), tuple(a.stride()), a.dtype) for a in allocs),
            tuple(outputs), tuple(specs), tuple(keep))


_recording = threading.local()     # .launches: the record list of the recording running on this thread


def untracked_launch() -> None:
    """A launch outside the compiled launcher (the ctypes path): a recording running now must refuse."""
    launches = getattr(_recording, "launches", None)
    if launches is not None:
        launches.append(None)
