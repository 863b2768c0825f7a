"""Kernel arguments: explicitly typed scalars (i32(x), f32(x), ...), raw bytes for by-value structs
(Blob, blob), and packing every argument into the buffer the kernel's parameter expects."""
from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .errors import EmulatorError
from .memory import span

if TYPE_CHECKING:
    from .memory import Memory
    from .module import Param


@dataclass(frozen=True)
class Scalar:
    """A kernel argument with an explicit C type (made by i32(), f32(), u64(), ...)."""
    value: object
    fmt: str          # struct format character
    kind: str         # "int", "uint", "float", "ptr"

    @property
    def size(self) -> int:
        return struct.calcsize("<" + self.fmt)

    def pack(self) -> bytes:
        return struct.pack("<" + self.fmt, self.value)


def i8(x): return Scalar(int(x), "b", "int")
def u8(x): return Scalar(int(x), "B", "uint")
def i16(x): return Scalar(int(x), "h", "int")
def u16(x): return Scalar(int(x), "H", "uint")
def i32(x): return Scalar(int(x), "i", "int")
def u32(x): return Scalar(int(x), "I", "uint")
def i64(x): return Scalar(int(x), "q", "int")
def u64(x): return Scalar(int(x), "Q", "uint")
def f32(x): return Scalar(float(x), "f", "float")
def f64(x): return Scalar(float(x), "d", "float")


def ptr(x: int) -> Scalar:
    """A raw address for a pointer parameter. Memory behind it is NOT guarded or copied: prefer tensors."""
    return Scalar(int(x), "Q", "ptr")


@dataclass
class Blob:
    """Raw bytes for a by-value struct parameter. Any 8-byte-aligned word equal to an address inside a
    tensor in ``tensors`` (or passed in ``args`` / ``launch(tensors=...)``) is relocated to that
    tensor's guarded copy, so structs can carry ``tensor.data_ptr()`` fields."""
    data: bytes
    tensors: tuple = ()


def blob(fmt: str, *values) -> Blob:
    """struct.pack(fmt, *values) where a torch.Tensor value stands for its data_ptr() (format 'Q' or
    'q'); the tensors are remembered so the launch guards and relocates them."""
    tensors, vals = [], []
    for v in values:
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            vals.append(v.data_ptr())
        else:
            vals.append(v)
    return Blob(struct.pack(fmt, *vals), tuple(tensors))


def pack(a, p: Param, mem: Memory, i: int, kernel: str):
    """Argument ``a`` for parameter ``p`` (the i-th of ``kernel``) as a parameter buffer, with tensor
    addresses (also those inside struct bytes) moved to their guarded copies in ``mem``."""
    where = f"kernel '{kernel}' argument {i}"
    buf = (ctypes.c_uint64 * max(1, (p.size + 7) // 8))()
    if p.kind == "pointer":
        buf[0] = _pointer(a, mem, where)
        return buf
    if isinstance(a, torch.Tensor):
        raise EmulatorError(f"{where} is a {p.size}-byte {p.kind} parameter, not a pointer; got a tensor")
    if isinstance(a, (Blob, bytes, bytearray, memoryview)):
        data = _relocated_bytes(a, p, mem, where)
        ctypes.memmove(buf, data, len(data))
        return buf
    raw = _scalar_bytes(a, p, where)
    ctypes.memmove(buf, raw, len(raw))
    return buf


def _pointer(a, mem: Memory, where: str) -> int:
    if isinstance(a, torch.Tensor):
        return mem.translate(a.data_ptr(), a)
    if a is None:
        return 0
    if isinstance(a, Scalar) and a.kind in ("ptr", "uint", "int") and a.size == 8:
        return a.value & (2 ** 64 - 1)
    raise EmulatorError(f"{where} is a pointer: pass a CPU tensor (or None), not {type(a).__name__}")


def _relocated_bytes(a, p: Param, mem: Memory, where: str) -> bytes:
    """Struct bytes whose 8-byte words that point into a guarded tensor now point into its copy."""
    data = bytearray(a.data if isinstance(a, Blob) else bytes(a))
    if len(data) != p.size:
        raise EmulatorError(f"{where} is a {p.size}-byte {p.kind} parameter; got {len(data)} bytes")
    own = [(t, *span(t)) for t in a.tensors] if isinstance(a, Blob) else []
    for off in range(0, len(data) - 7, 8):
        (w,) = struct.unpack_from("<Q", data, off)
        if not w:
            continue
        t = next((mem.translate(w, x) for x, lo, hi in own if lo <= w <= hi), None)   # the blob's own
        if t is None:
            t = mem.translate(w)
        if t is not None:
            struct.pack_into("<Q", data, off, t)
    return bytes(data)


def _scalar_bytes(a, p: Param, where: str) -> bytes:
    if isinstance(a, Scalar):
        if a.size != p.size:
            raise EmulatorError(f"{where} is a {p.size}-byte {p.kind}; got a {a.size}-byte {a.kind}")
        return a.pack()
    if isinstance(a, (bool, int)) and p.kind in ("int", "uint", "bool"):
        fmt = {1: "b", 2: "h", 4: "i", 8: "q"}[p.size]
        if p.kind in ("uint", "bool"):
            fmt = fmt.upper()
        try:
            return struct.pack("<" + fmt, int(a))
        except struct.error:
            raise EmulatorError(f"{where}: {a} does not fit a {p.size}-byte {p.kind}") from None
    if isinstance(a, (int, float)) and p.kind == "float":
        fmt = {2: "e", 4: "f", 8: "d"}.get(p.size)
        if fmt is None:
            raise EmulatorError(f"{where}: cannot pack a float into a {p.size}-byte float parameter")
        return struct.pack("<" + fmt, float(a))
    raise EmulatorError(f"{where}: cannot pass {type(a).__name__} to a {p.size}-byte {p.kind} parameter "
                        "(wrap it: emulator.i32(x), emulator.f32(x), ... or pass bytes)")
