"""The kernel argument ABI of generated HIP kernels, as the host packs it.

Parameters come in Program order: a tensor is `hk::gl<T, RANK>` passed by value,
`{ T* ptr; int shape[RANK]; long long stride[RANK]; }` with natural C alignment (8 bytes: after an
odd number of ints comes 4 bytes of padding); an i32 scalar is `int`, an f32 scalar is `float`.
The same layout serves the device runtime (a ctypes Structure handed to hipModuleLaunchKernel) and
the emulator (bytes blobs); tests compare it with the offsets in the compiled kernel's metadata.
"""
from __future__ import annotations

import ctypes
import struct
from functools import lru_cache
from typing import Any, Sequence

import torch

from ...interface.errors import ArgumentError
from ...interface.ir import GlobalType, Param, ScalarType


def gl_format(rank: int) -> str:
    """struct format of hk::gl<T, rank> (little-endian, explicit padding)."""
    return "<Q" + "i" * rank + ("4x" if rank % 2 else "") + "q" * rank


def gl_size(rank: int) -> int:
    return struct.calcsize(gl_format(rank))


@lru_cache(maxsize=None)
def gl_struct(rank: int) -> type:
    """ctypes mirror of hk::gl<T, rank> (ctypes applies the C alignment rules)."""
    return type(f"hk_gl{rank}", (ctypes.Structure,),
                {"_fields_": [("ptr", ctypes.c_void_p), ("shape", ctypes.c_int * rank),
                              ("stride", ctypes.c_longlong * rank)]})


@lru_cache(maxsize=None)
def _args_struct(kinds: tuple) -> type:
    fields = []
    for i, k in enumerate(kinds):
        if isinstance(k, int):
            fields.append((f"a{i}", gl_struct(k)))
        else:
            fields.append((f"a{i}", ctypes.c_int32 if k == "i32" else ctypes.c_float))
    return type("hk_kernargs", (ctypes.Structure,), {"_fields_": fields})


def kinds(params: Sequence[Param]) -> tuple:
    """Per parameter: the rank of a tensor, or 'i32' / 'f32'."""
    out = []
    for p in params:
        if isinstance(p.type, GlobalType):
            out.append(p.type.rank)
        elif isinstance(p.type, ScalarType):
            out.append(p.type.dtype.name)
        else:
            raise ArgumentError(f"kernel parameter {p.name!r} has type {p.type}, which has no host ABI")
    return tuple(out)


def offsets(params: Sequence[Param]) -> list[tuple[int, int]]:
    """(offset, size) of each parameter in the kernel argument segment."""
    s = _args_struct(kinds(params))
    return [(getattr(s, f"a{i}").offset, getattr(s, f"a{i}").size) for i in range(len(params))]


def check_args(name: str, params: Sequence[Param], args: Sequence[Any]) -> None:
    if len(args) != len(params):
        raise ArgumentError(f"{name}: {len(params)} arguments expected ({', '.join(p.name for p in params)}), "
                            f"got {len(args)}")
    for p, a in zip(params, args):
        if isinstance(p.type, GlobalType):
            if not isinstance(a, torch.Tensor) or a.dim() != p.type.rank:
                raise ArgumentError(f"{name}: argument {p.name!r} must be a rank-{p.type.rank} tensor")
        elif p.type.dtype.name == "i32" and (isinstance(a, bool) or not isinstance(a, int)):
            raise ArgumentError(f"{name}: argument {p.name!r} must be an int, got {a!r}")


def device_struct(params: Sequence[Param], args: Sequence[Any]) -> ctypes.Structure:
    """All arguments as one ctypes Structure laid out like the kernel argument segment."""
    s = _args_struct(kinds(params))()
    for i, (p, a) in enumerate(zip(params, args)):
        if isinstance(p.type, GlobalType):
            g = getattr(s, f"a{i}")
            g.ptr = a.data_ptr()
            for d in range(a.dim()):
                g.shape[d] = a.shape[d]
                g.stride[d] = a.stride(d)
        elif p.type.dtype.name == "i32":
            setattr(s, f"a{i}", int(a))
        else:
            setattr(s, f"a{i}", float(a))
    return s


def emulator_args(params: Sequence[Param], args: Sequence[Any], emulator) -> list:
    """Arguments for emulator.Module.launch: gl structs as blobs carrying their tensor."""
    out = []
    for p, a in zip(params, args):
        if isinstance(p.type, GlobalType):
            out.append(emulator.blob(gl_format(a.dim()), a, *a.shape, *a.stride()))
        elif p.type.dtype.name == "i32":
            out.append(emulator.i32(int(a)))
        else:
            out.append(emulator.f32(float(a)))
    return out
