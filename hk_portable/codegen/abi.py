"""The kernel argument ABI on the host, once for both runtimes and both emulators.

Parameters come in Program order. A tensor is the device library's `hk::gl<T, RANK>` passed by value,

    struct gl { T* ptr; int shape[RANK]; long long stride[RANK]; };

with natural C alignment (8 bytes: after an odd number of ints come 4 bytes of padding); an i32 scalar is
`int`, an f32 scalar `float`; each parameter starts at its own alignment, as the CUDA and AMDGPU kernel
argument ABIs lay them out. Everything a host packs derives from GL_MEMBERS and SCALAR_CODE below: the
`struct` formats (the cuda parameter buffer, the hip emulator's blobs), the ctypes mirror (the argument
segment hip-python copies) and the values in order (`gl_values`).
"""
from __future__ import annotations

import ctypes
import struct
from functools import lru_cache
from typing import Any, Sequence

from ..interface.errors import ArgumentError
from ..interface.ir import GlobalType, ScalarType

# hk::gl<T, RANK>, member by member: (name, struct code, whether it is an array of RANK)
GL_MEMBERS = (("ptr", "Q", False), ("shape", "i", True), ("stride", "q", True))
GL_ALIGN = 8
SCALAR_CODE = {"i32": "i", "f32": "f"}          # any other scalar is passed as a float, as i32/f32 are all
_CTYPE = {"Q": ctypes.c_void_p, "i": ctypes.c_int, "q": ctypes.c_longlong}


def _codes(rank: int) -> list[str]:
    return [code for _, code, per_dim in GL_MEMBERS for _ in range(rank if per_dim else 1)]


class _Builder:
    """A little-endian struct format built field by field, each at its natural alignment."""

    def __init__(self):
        self.fmt, self.off = "<", 0

    def align(self, a: int) -> int:
        start = -(-self.off // a) * a
        self.fmt += "x" * (start - self.off)
        self.off = start
        return start

    def put(self, code: str) -> None:
        size = struct.calcsize("<" + code)
        self.align(size)
        self.fmt += code
        self.off += size


def gl_format(rank: int) -> str:
    """The struct format of one hk::gl<T, rank> (little-endian, explicit padding)."""
    b = _Builder()
    for code in _codes(rank):
        b.put(code)
    return b.fmt


def gl_size(rank: int) -> int:
    return struct.calcsize(gl_format(rank))


@lru_cache(maxsize=None)
def gl_offsets(rank: int) -> tuple[int, int, int]:
    """Byte offsets of ptr, shape[0] and stride[0] inside one hk::gl<T, rank>, from the same builder as
    gl_format (the compiled launcher, runtime/clauncher.py, packs at these)."""
    b, starts = _Builder(), {}
    for name, code, per_dim in GL_MEMBERS:
        for k in range(rank if per_dim else 1):
            size = struct.calcsize("<" + code)
            starts.setdefault(name, b.align(size))
            b.put(code)
    return starts["ptr"], starts.get("shape", b.off), starts.get("stride", b.off)


def gl_values(t) -> tuple:
    """A tensor's hk::gl fields in order: data pointer, shape, strides (in elements). make_packer
    spells the same order as source."""
    return (t.data_ptr(), *t.shape, *t.stride())


@lru_cache(maxsize=None)
def gl_struct(rank: int) -> type:
    """The ctypes mirror of hk::gl<T, rank> (ctypes applies the same C alignment rules)."""
    fields = [(name, _CTYPE[code] * rank if per_dim else _CTYPE[code]) for name, code, per_dim in GL_MEMBERS]
    return type(f"hk_gl{rank}", (ctypes.Structure,), {"_fields_": fields})


def _pairs(params) -> list[tuple[str, Any]]:
    """(name, IR type) of Program params or of (name, type) pairs."""
    return [(p.name, p.type) if hasattr(p, "type") else tuple(p) for p in params]


def param_layout(params) -> tuple[str, int, list[dict]]:
    """The struct format, byte size and per-parameter description of a kernel's argument buffer.

    `params`: Program params or (name, IR type) pairs, in ABI order. Each description has name, kind
    ("gl", or the scalar's dtype), offset and size; a gl adds rank and dtype."""
    b, desc = _Builder(), []
    for name, t in _pairs(params):
        if isinstance(t, GlobalType):
            start = b.align(GL_ALIGN)
            for code in _codes(t.rank):
                b.put(code)
            desc.append({"name": name, "kind": "gl", "rank": t.rank, "dtype": t.dtype.name, "offset": start,
                         "size": b.off - start})
        else:
            code = SCALAR_CODE.get(t.dtype.name, "f")
            b.put(code)
            desc.append({"name": name, "kind": t.dtype.name, "offset": b.off - 4, "size": 4})
    return b.fmt, b.off, desc


def kinds(params) -> tuple:
    """Per parameter: the rank of a tensor, or the scalar's dtype ('i32' / 'f32')."""
    out = []
    for name, t in _pairs(params):
        if isinstance(t, GlobalType):
            out.append(t.rank)
        elif isinstance(t, ScalarType):
            out.append(t.dtype.name)
        else:
            raise ArgumentError(f"kernel parameter {name!r} has type {t}, which has no host ABI")
    return tuple(out)


def offsets(params) -> list[tuple[int, int]]:
    """(offset, size) of each parameter in the kernel argument buffer."""
    return [(d["offset"], d["size"]) for d in param_layout(params)[2]]


def arg_values(params, args: Sequence[Any]) -> list:
    """The flat values the argument buffer's format takes: a tensor's gl fields, scalars as they are."""
    out = []
    for (_, t), a in zip(_pairs(params), args):
        if isinstance(t, GlobalType):
            out.extend(gl_values(a))
        else:
            out.append(int(a) if t.dtype.name == "i32" else float(a))
    return out


@lru_cache(maxsize=None)
def args_struct(kinds_: tuple) -> type:
    """The ctypes mirror of a whole argument buffer (fields a0, a1, ...), for APIs that take ctypes."""
    fields = [(f"a{i}", gl_struct(k) if isinstance(k, int) else (ctypes.c_int32 if k == "i32" else ctypes.c_float))
              for i, k in enumerate(kinds_)]
    return type("hk_kernargs", (ctypes.Structure,), {"_fields_": fields})


def pack_struct(params, args: Sequence[Any]) -> ctypes.Structure:
    """The arguments packed into their ctypes mirror (its bytes are param_layout's buffer)."""
    fmt, _, _ = param_layout(params)
    s = args_struct(kinds(params))()
    struct.pack_into(fmt, s, 0, *arg_values(params, args))
    return s


LAUNCHER_KIND = {"gl": 0, "i32": 1}        # any other scalar kind: 2 (a float, as SCALAR_CODE packs it)


def launcher_params(params: Sequence[dict]) -> tuple:
    """param_layout's descriptions as the compiled launcher takes them: per parameter (kind code, offset,
    rank, offset of shape[0], offset of stride[0], stored); kind 0 a gl, 1 an int32, 2 a float32; stored 1 for
    a gl the kernel stores to (the launcher refuses one whose elements share memory)."""
    out = []
    for d in params:
        kind = LAUNCHER_KIND.get(d["kind"], 2)
        if kind == 0:
            _, shape, stride = gl_offsets(d["rank"])
            out.append((0, d["offset"], d["rank"], d["offset"] + shape, d["offset"] + stride,
                        int(d.get("stored", False))))
        else:
            out.append((kind, d["offset"], 0, d["offset"], d["offset"], 0))
    return tuple(out)


def make_packer(kinds_: Sequence[str], fmt: str):
    """A fast packer (args, buf, dev) -> bool for launch paths: packs the arguments into `buf` with no
    intermediate list, or returns False when a tensor is not on device `dev` (the caller then explains).
    `kinds_`: "gl" or a scalar kind per parameter, as in param_layout's descriptions."""
    names = [f"a{i}" for i in range(len(kinds_))]
    check = [f"{n}.get_device() != dev" for n, k in zip(names, kinds_) if k == "gl"]
    parts = [f"{n}.data_ptr(), *{n}.shape, *{n}.stride()" if k == "gl" else n for n, k in zip(names, kinds_)]
    src = ["def pack(args, buf, dev, pack_into=pack_into):",
           f"    {', '.join(names)}{',' if len(names) == 1 else ''} = args" if names else "    pass"]
    if check:
        src.append(f"    if {' or '.join(check)}:")
        src.append("        return False")
    src.append(f"    pack_into(buf, 0, {', '.join(parts)})")
    src.append("    return True")
    scope = {"pack_into": struct.Struct(fmt).pack_into}
    exec("\n".join(src), scope)
    return scope["pack"]
