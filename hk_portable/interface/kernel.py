"""@hk.kernel: signature handling, specialisation, argument checks, compile and launch."""
from __future__ import annotations

import inspect
import os
import threading
from typing import Any, Callable

import torch

from . import dtypes as D
from .errors import ArgumentError, TraceError
from .ir import GlobalType, Program, ScalarType
from .tracer import trace
from .verify import verify
from .types import GL, const


class _ParamSpec:
    __slots__ = ("name", "kind", "rank", "default")

    def __init__(self, name, kind, rank=None, default=inspect.Parameter.empty):
        self.name, self.kind, self.rank, self.default = name, kind, rank, default


def _classify(fn) -> tuple[list[_ParamSpec], list[_ParamSpec]]:
    runtime, consts = [], []
    try:
        sig = inspect.signature(fn, eval_str=True)     # files with `from __future__ import annotations`
    except NameError as e:
        raise TypeError(f"kernel '{fn.__name__}': an annotation could not be resolved ({e})") from None
    for p in sig.parameters.values():
        ann = p.annotation
        if ann is const:
            consts.append(_ParamSpec(p.name, "const", default=p.default))
        elif ann is GL or isinstance(ann, GL):
            runtime.append(_ParamSpec(p.name, "gl", rank=getattr(ann, "rank", None)))
        elif ann is int:
            runtime.append(_ParamSpec(p.name, "i32"))
        elif ann is float:
            runtime.append(_ParamSpec(p.name, "f32"))
        else:
            raise TypeError(f"kernel parameter '{p.name}' needs an annotation: GL (tensor), int or float "
                            f"(runtime scalar) or hk.const (compile-time); got {p.annotation!r}")
    return runtime, consts


_GRIDS: dict = {}


def _registry():
    """The registry module, imported once (the interface must not import backends at load time)."""
    global _REGISTRY
    if _REGISTRY is None:
        from ..backends import registry as _r
        _REGISTRY = _r
    return _REGISTRY


_REGISTRY = None


def _grid3(grid) -> tuple[int, int, int]:
    """grid as three ints, validated; memoised because it is on every launch's path."""
    try:
        return _GRIDS[grid]
    except (KeyError, TypeError):
        g = _check_grid(grid)
    if isinstance(grid, (int, tuple)) and len(_GRIDS) < 4096:
        _GRIDS[grid] = g
    return g


def _check_grid(grid) -> tuple[int, int, int]:
    if isinstance(grid, int):
        grid = (grid,)
    if not isinstance(grid, (tuple, list)) or not 1 <= len(grid) <= 3:
        raise ArgumentError(f"grid must be an int or a tuple of 1 to 3 ints, got {grid!r}")
    g = tuple(grid) + (1,) * (3 - len(grid))
    for k, x in enumerate(g):
        if isinstance(x, bool) or not isinstance(x, int) or x < 0 or x >= 2**31:
            raise ArgumentError(f"grid[{k}] must be an int in [0, 2**31), got {x!r}")
    return g


class Kernel:
    """A tile kernel written against the interface. Call it with its arguments and `grid=`."""

    def __init__(self, fn: Callable, num_warps: int = 4, name: str | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        self.num_warps = num_warps
        self.runtime_params, self.const_params = _classify(fn)
        self._programs: dict[tuple, Program] = {}
        self._artifacts: dict[tuple, Any] = {}
        self._launches: dict[tuple, tuple] = {}     # fast path: call signature -> (backend, artifact)
        self._lock = threading.Lock()
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<hk.kernel {self.name}>"

    # ------------------------------------------------------------------ binding and specialisation
    def bind(self, args: tuple, kwargs: dict) -> tuple[list[Any], dict[str, Any]]:
        """Split a call's arguments into runtime values (in order) and consts (with defaults)."""
        kwargs = dict(kwargs)
        runtime: list[Any] = []
        pos = list(args)
        for p in self.runtime_params:
            if pos:
                runtime.append(pos.pop(0))
            elif p.name in kwargs:
                runtime.append(kwargs.pop(p.name))
            else:
                raise ArgumentError(f"{self.name}: missing argument '{p.name}'")
        if pos:
            raise ArgumentError(f"{self.name}: too many positional arguments; compile-time parameters "
                                f"({', '.join(c.name for c in self.const_params)}) are passed by keyword")
        consts = {}
        for c in self.const_params:
            if c.name in kwargs:
                consts[c.name] = kwargs.pop(c.name)
            elif c.default is not inspect.Parameter.empty:
                consts[c.name] = c.default
            else:
                raise ArgumentError(f"{self.name}: missing compile-time parameter '{c.name}'")
        if kwargs:
            raise ArgumentError(f"{self.name}: unknown argument(s) {sorted(kwargs)}")
        for k, v in consts.items():
            try:
                hash(v)
            except TypeError:
                raise ArgumentError(f"{self.name}: hk.const '{k}' must be hashable, got {v!r}") from None
        return runtime, consts

    def _param_types(self, runtime: list[Any]) -> list[tuple[str, Any]]:
        out = []
        for p, v in zip(self.runtime_params, runtime):
            if p.kind == "gl":
                if not isinstance(v, torch.Tensor):
                    raise ArgumentError(f"{self.name}: argument '{p.name}' must be a torch.Tensor, got "
                                        f"{type(v).__name__}")
                if not 1 <= v.dim() <= 4:
                    raise ArgumentError(f"{self.name}: argument '{p.name}' must have rank 1 to 4, got shape "
                                        f"{tuple(v.shape)}")
                if p.rank is not None and v.dim() != p.rank:
                    raise ArgumentError(f"{self.name}: argument '{p.name}' must have rank {p.rank}, got shape "
                                        f"{tuple(v.shape)}")
                try:
                    dt = D.from_torch(v.dtype)
                except TypeError as e:
                    raise ArgumentError(f"{self.name}: argument '{p.name}': {e}") from None
                out.append((p.name, GlobalType(dt, v.dim())))
            elif p.kind == "i32":
                if isinstance(v, bool) or not isinstance(v, int) or not -2**31 <= v < 2**31:
                    raise ArgumentError(f"{self.name}: argument '{p.name}' must be an int32 Python int, got {v!r}")
                out.append((p.name, ScalarType(D.i32)))
            else:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ArgumentError(f"{self.name}: argument '{p.name}' must be a Python float, got {v!r}")
                out.append((p.name, ScalarType(D.f32)))
        return out

    def trace(self, *args, **kwargs) -> Program:
        """The Program for these arguments (dtype/rank of tensors and the consts specialise it)."""
        runtime, consts = self.bind(args, kwargs)
        return self._program(runtime, consts)

    def _program(self, runtime, consts) -> Program:
        params = self._param_types(runtime)
        key = (tuple((n, str(t)) for n, t in params), tuple(sorted(consts.items(), key=lambda kv: kv[0])))
        with self._lock:
            prog = self._programs.get(key)
        if prog is None:
            prog = trace(self.fn, self.name, params, consts, self.num_warps)
            with self._lock:
                self._programs[key] = prog
        return prog

    # ---------------------------------------------------------------------------------- launching
    def __call__(self, *args, grid, backend=None, target: str | None = None, stream=None, **kwargs):
        fast = self._fast_key(args, kwargs, backend, target)
        hit = self._launches.get(fast) if fast is not None else None
        if hit is None:
            be, art, runtime = self._prepare(args, kwargs, backend, target)
            if fast is not None:
                self._launches[fast] = (be, art)
        else:
            _check_scalars(self.name, self.runtime_params, args)
            (be, art), runtime = hit, list(args)
        grid3 = _grid3(grid)
        if 0 in grid3:
            return
        be.launch(art, runtime, grid3, stream)

    def _prepare(self, args, kwargs, backend, target):
        """The slow path of a call: bind, specialise, select the backend, check devices, compile.
        Returns (backend, artifact, runtime arguments in order)."""
        runtime, consts = self.bind(args, kwargs)
        prog = self._program(runtime, consts)
        tensors = [v for v in runtime if isinstance(v, torch.Tensor)]
        be = _registry().select(backend, tensors)
        _check_devices(self.name, self.runtime_params, runtime, be)
        return be, self.compile_for(prog, be, target), runtime

    def _fast_key(self, args, kwargs, backend, target):
        """A key for calls whose launch is fully decided by the arguments' kinds: every runtime argument
        passed positionally, consts by keyword. Selection inputs (context, HK_BACKEND) are part of it,
        so a change of backend never reuses a stale choice. None when the call does not qualify."""
        if len(args) != len(self.runtime_params):
            return None
        registry = _registry()
        sig = []
        for a in args:
            if isinstance(a, torch.Tensor):
                sig.append((a.dtype, a.dim(), a.device))
            else:
                sig.append(type(a))
        try:
            return (tuple(sig), tuple(kwargs.items()),
                    backend if backend is None or isinstance(backend, str) else id(backend), target,
                    registry.current_context(), os.environ.get(registry.ENV))
        except TypeError:       # an unhashable const: the slow path reports it
            return None

    def compile_for(self, prog: Program, be, target: str | None = None):
        tgt = be.target(target)
        key = (be.name, tgt.arch, prog.hash)
        with self._lock:
            art = self._artifacts.get(key)
        if art is None:
            verify(prog)
            be.check(prog, tgt)
            from .. import cache
            art = cache.compile_cached(be, prog, tgt)
            with self._lock:
                self._artifacts[key] = art
        return art


def _check_scalars(name, params, args) -> None:
    """The per-value checks the fast path still owes: int32 range of int arguments."""
    for p, v in zip(params, args):
        if p.kind == "i32" and (isinstance(v, bool) or not -2**31 <= v < 2**31):
            raise ArgumentError(f"{name}: argument '{p.name}' must be an int32 Python int, got {v!r}")


def _check_devices(name, params, runtime, be) -> None:
    devs = {}
    for p, v in zip(params, runtime):
        if isinstance(v, torch.Tensor):
            devs.setdefault(v.device, p.name)
            if not be.accepts_device(v.device):
                raise ArgumentError(f"{name}: argument '{p.name}' is on {v.device}, which the '{be.name}' backend "
                                    "cannot use; move it or pick another backend")
    if len(devs) > 1:
        desc = ", ".join(f"'{n}' on {d}" for d, n in devs.items())
        raise ArgumentError(f"{name}: tensor arguments are on different devices ({desc}); expected one device")


def kernel(fn: Callable | None = None, *, num_warps: int = 4, name: str | None = None):
    """Decorate a tile kernel. `num_warps` is a hint; each backend may choose its own per target."""
    if fn is None:
        return lambda f: Kernel(f, num_warps=num_warps, name=name)
    return Kernel(fn, num_warps=num_warps, name=name)


def check_no_overlap(name: str, outputs: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]) -> None:
    """ArgumentError if an output tensor shares memory with any other argument."""
    items = list(outputs.items()) + list(inputs.items())
    for i, (on, o) in enumerate(outputs.items()):
        for jn, t in items[i + 1:]:
            # meta tensors have no memory (data_ptr() is 0 for all of them): nothing can overlap
            if o.device == t.device and o.device.type != "meta" and o.numel() and t.numel() and _overlaps(o, t):
                raise ArgumentError(f"{name}: output '{on}' overlaps argument '{jn}' in memory; pass separate "
                                    "tensors (in-place use is not supported)")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    def span(t):
        lo = t.data_ptr()
        hi = lo + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) * t.element_size() + t.element_size()
        return lo, hi
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1
