"""A kernel's definition: its signature, how a call's arguments bind, and the Programs it traces to.

Pure interface: nothing here selects a backend, compiles or launches. The callable kernel that
`hk.kernel` returns (hk_portable.runtime.launch.Kernel) builds on KernelDef."""
from __future__ import annotations

import inspect
import threading
from typing import Any, Callable

import torch

from . import dtypes as D
from .errors import ArgumentError
from .ir import GlobalType, Program, ScalarType
from .tracer import trace
from .tunables import WARPS, Tunables
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
        if p.name == "num_warps":
            raise TypeError(f"kernel '{fn.__name__}': 'num_warps' is reserved (the launch option that sets the "
                            "block size); name the parameter otherwise")
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


class KernelDef:
    """A tile kernel written against the interface: its runtime and compile-time parameters, and one
    Program per specialisation (tensor dtypes and ranks, consts), traced once."""

    def __init__(self, fn: Callable, num_warps: int = 4, name: str | None = None, tunable: dict | None = None):
        self.fn = fn
        self.name = fn.__name__ if name is None else name
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"hk.kernel: name must be a non-empty str, got {self.name!r}")
        self.num_warps = num_warps
        self.runtime_params, self.const_params = _classify(fn)
        # the consts a backend may choose (interface/tunables.py); None: every const is as the caller writes it
        self.tunables = None if tunable is None else Tunables(self.name, tunable, self.defaults())
        self._programs: dict[tuple, Program] = {}
        self._lock = threading.Lock()
        self._gates: dict[tuple, threading.Lock] = {}     # key -> lock held while its value is made
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<hk.kernel {self.name}>"

    def defaults(self) -> dict:
        """The consts' declared defaults (those with one) and num_warps: the configuration of a call passing none."""
        out = {c.name: c.default for c in self.const_params if c.default is not inspect.Parameter.empty}
        out[WARPS] = self.num_warps
        return out

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
        if "num_warps" in kwargs:                  # a launch option, not a const: the block size of this call
            nw = kwargs.pop("num_warps")
            if isinstance(nw, bool) or not isinstance(nw, int) or not 1 <= nw <= 32:
                raise ArgumentError(f"{self.name}: 'num_warps' must be an int from 1 to 32, got {nw!r}")
            consts["num_warps"] = nw
        if kwargs:
            raise ArgumentError(f"{self.name}: unknown argument(s) {sorted(kwargs)}")
        for k, v in consts.items():
            try:
                hash(v)
            except TypeError:
                raise ArgumentError(f"{self.name}: hk.const '{k}' must be hashable, got {v!r}") from None
        if self.tunables is not None:
            self.tunables.check(consts)
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
                if dt is D.bool_:               # masks live in registers; no backend loads or stores bool memory
                    raise ArgumentError(f"{self.name}: argument '{p.name}' has dtype torch.bool, which no backend "
                                        f"stores; expected one of {STORABLE}")
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

        def make():                                  # num_warps: a launch option carried with the consts

            c = dict(consts)
            return trace(self.fn, self.name, params, c, c.pop("num_warps", self.num_warps))
        return self._once(self._programs, key, make)

    def _once(self, table: dict, key, make):
        """table[key], made by make() once even when threads race to it first (the others wait for it);
        different keys are made concurrently. A make() that raises is retried by the next caller."""
        with self._lock:
            value = table.get(key)
            if value is not None:
                return value
            gate = self._gates.setdefault((id(table), key), threading.Lock())
        with gate:
            with self._lock:
                value = table.get(key)
            if value is None:
                value = make()
                with self._lock:
                    table[key] = value
                    self._gates.pop((id(table), key), None)
        return value


STORABLE = [str(d.torch) for d in D.ALL if d is not D.bool_]
_STORES = ("register_to_global", "shared_to_global")   # atomic_add is well defined on aliased elements


def stored_params(program) -> tuple[int, ...]:
    """The positions of the tensor parameters `program` stores to (plain stores, not atomic adds)."""
    args = {id(a): i for i, a in enumerate(program.body.args)}
    return tuple(sorted({args[id(v)] for op in program.body.walk() if op.opcode in _STORES
                         for v in op.operands if id(v) in args}))


def check_outputs(name: str, params, runtime, stored: tuple[int, ...]) -> None:
    """ArgumentError when a tensor the kernel stores to has a zero stride (an expanded view) or strides whose
    elements overlap: two blocks would write one element (a race on a GPU)."""
    for i in stored:
        error = sharing_error(name, params[i].name, runtime[i])
        if error is not None:
            raise error


def sharing_error(name: str, param: str, t) -> ArgumentError | None:
    """The ArgumentError for an output tensor whose elements share memory, or None (also for a non-tensor).
    Launch paths that refuse such a tensor elsewhere (the compiled launcher) explain it with this."""
    if not isinstance(t, torch.Tensor) or _elements_distinct(t):
        return None
    return ArgumentError(f"{name}: output '{param}' (shape {tuple(t.shape)}, stride {t.stride()}) has a zero or "
                         "overlapping stride, so several elements share memory; pass a tensor with distinct "
                         "elements (e.g. .contiguous() or .clone())")


def _elements_distinct(t: torch.Tensor) -> bool:
    """Whether every element of t has its own memory: with the dims of size > 1 sorted by stride, each stride
    exceeds the span of the smaller ones (sufficient; exotic interleavings are refused too)."""
    if t.is_contiguous():       # the common case, on the call fast path: no sort
        return True
    span = 0
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1)
    for stride, size in dims:
        if stride <= span:
            return False
        span += (size - 1) * stride
    return True


def check_no_overlap(name: str, outputs: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]) -> None:
    """ArgumentError if an output tensor shares memory with any other argument. Each tensor's byte span is
    computed once: the wrappers call this on every call, and computed per pair it was most of attention_fwd's
    host time (32-54 us a call on a 2-core machine, 16 us with spans computed once)."""
    items = [(n, _span(t)) for n, t in (*outputs.items(), *inputs.items())]
    for i, (on, o) in enumerate(items[:len(outputs)]):
        if o is None:
            continue
        for jn, t in items[i + 1:]:
            if t is not None and o[0] == t[0] and o[1] < t[2] and t[1] < o[2]:
                raise ArgumentError(f"{name}: output '{on}' overlaps argument '{jn}' in memory; pass separate "
                                    "tensors (in-place use is not supported)")


def _span(t: torch.Tensor):
    """(device, first byte, one past the last byte) a tensor's elements cover; None for one without memory
    (meta tensors all have data_ptr() 0, empty ones cover nothing)."""
    device = t.device
    if device.type == "meta" or not t.numel():
        return None
    lo, size = t.data_ptr(), t.element_size()
    if t.is_contiguous():
        return device, lo, lo + t.numel() * size
    return device, lo, lo + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) * size + size
