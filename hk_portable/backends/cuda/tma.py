"""Tensor maps for the TMA schedule (sm_90a), encoded on the host at launch.

A kernel whose pipelines schedule.py put on TMA takes, after its Program parameters, one
`const __grid_constant__ hk::tmap` per TmaLoad (128 bytes, 64-byte aligned) and an `int` flag: bit 0 when
every map it reads through was encoded, 0 when a tensor cannot be described (the kernel then runs its cp.async
ring, so any strided view still works, only slower); bit 1 as well when every map it stores through (the
epilogue's TMA stores, `store` specs) was encoded too (else those tiles go out by plain stores); bits 2 and 3 when
the map of an f32 tensor the kernel adds tiles into (`reduce`: TMA reduce-add instead of atomics) was encoded as the
parameter views it (bit 2) or, for a transposed view, of the tensor it views (`transpose`, bit 3). TMA's rules (CUDA driver API, cuTensorMapEncodeTiled):
a 16-byte-aligned base, a unit innermost stride, every other stride a multiple of 16 bytes (< 2^40),
each dimension < 2^32. Out-of-bounds box elements read as zero (OOB fill NONE), as the library's loads
do. Encodings are cached per (tensor address, shape, strides, map), so a repeat launch costs a dict hit.
"""
from __future__ import annotations

import ctypes
from collections import OrderedDict

from ...codegen.resources import round_up
from . import cudrv

TMAP_BYTES, TMAP_ALIGN = 128, 64
DTYPE = {"f16": 6, "bf16": 9, "fp8e4m3": 0, "fp8e5m2": 0, "f32": 7}   # CUtensorMapDataType (fp8 as UINT8)
INTERLEAVE_NONE, SWIZZLE_128B, L2_PROMOTION_256B, OOB_FILL_NONE = 0, 3, 3, 0
ELEMENT_BYTES = {"f16": 2, "bf16": 2, "fp8e4m3": 1, "fp8e5m2": 1, "f32": 4}
CACHE_ENTRIES = 256
# the flag's bits (hk_tma_ok in the kernel): every read map; the stores' maps; a reduce's map as viewed / transposed
LOADS_OK, STORES_OK, REDUCE_OK, REDUCE_T_OK = 1, 2, 4, 8


def layout(param_size: int, n_maps: int) -> tuple[int, int, int]:
    """(offset of the first map, offset of the flag, total parameter bytes) after `param_size` bytes of
    Program parameters, as the CUDA ABI lays out the extra parameters."""
    first = round_up(param_size, TMAP_ALIGN)
    flag = first + TMAP_BYTES * n_maps
    return first, flag, flag + 4


def describe(tensor, spec: dict) -> tuple | None:
    """(dims, strides in bytes, box) innermost first for cuTensorMapEncodeTiled, or None when TMA cannot
    describe this tensor (the kernel then takes its cp.async path)."""
    esize = ELEMENT_BYTES[spec["dtype"]]
    shape, stride = list(tensor.shape), list(tensor.stride())
    if spec.get("transpose") and tensor.dim() >= 2:      # the tensor a transposed view views
        shape[-2:], stride[-2:] = shape[:-3:-1], stride[:-3:-1]
    if tensor.dim() != spec["rank"] or stride[-1] != 1 or tensor.data_ptr() % 16:
        return None
    dims = shape[::-1]
    strides = [s * esize for s in stride[::-1][1:]]
    if any(d >= 2 ** 32 or d <= 0 for d in dims) or any(s % 16 or s <= 0 or s >= 2 ** 40 for s in strides):
        return None
    box = [spec["box_cols"], spec["box_rows"]] + [1] * (spec["rank"] - 2)
    return dims, strides, box


def _bit(spec: dict) -> int:
    """The flag bit a written map sets (dataflow.TmaLoad.flag_bit), 0 for a read map."""
    return spec.get("bit", STORES_OK if spec.get("store") else 0)


def _encoder():
    return cudrv.lib().cuTensorMapEncodeTiled


def encoder_address() -> int | None:
    """cuTensorMapEncodeTiled's address, for the compiled launcher to encode maps itself (None without a driver
    that has it: the launcher then calls TensorMaps.tail)."""
    try:
        return ctypes.cast(_encoder(), ctypes.c_void_p).value
    except (AttributeError, OSError):
        return None


def encode(tensor, spec: dict) -> bytes | None:
    """The 128-byte tensor map of `tensor` for `spec` (a TmaLoad as JSON), or None if TMA cannot read it."""
    d = describe(tensor, spec)
    if d is None:
        return None
    dims, strides, box = d
    rank = len(dims)
    out = (ctypes.c_uint8 * TMAP_BYTES)()
    rc = _encoder()(ctypes.addressof(out), DTYPE[spec["dtype"]], rank, tensor.data_ptr(),
                    (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * max(rank - 1, 1))(*strides),
                    (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*([1] * rank)),
                    INTERLEAVE_NONE, SWIZZLE_128B, L2_PROMOTION_256B, OOB_FILL_NONE)
    return bytes(out) if rc == 0 else None


class TensorMaps:
    """The tensor-map part of one kernel's parameter buffer: fills the maps and the flag for a launch."""

    def __init__(self, specs: list[dict], param_size: int):
        self.specs = specs
        self.first, self.flag, self.size = layout(param_size, len(specs))
        self.cache: OrderedDict = OrderedDict()

    def _map(self, tensor, i: int) -> bytes | None:
        key = (i, tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        hit = self.cache.get(key)
        if hit is None and key not in self.cache:
            hit = self.cache[key] = encode(tensor, self.specs[i])
            if len(self.cache) > CACHE_ENTRIES:
                self.cache.popitem(last=False)
        return hit

    def c_specs(self, params: list[dict]) -> tuple | None:
        """The maps as the compiled launcher takes them (clauncher.c's TMap): (param index, CUtensorMapDataType,
        element bytes, box_cols, box_rows, the flag bit of a written map or 0, transpose), so a launch whose tensors
        changed encodes in C, not here; None where a map's rank is not its parameter's (describe() refuses every
        tensor then: tail's path)."""
        if any(params[s["param"]].get("rank") != s["rank"] for s in self.specs):
            return None
        return tuple((s["param"], DTYPE[s["dtype"]], ELEMENT_BYTES[s["dtype"]], s["box_cols"], s["box_rows"],
                      _bit(s), bool(s.get("transpose"))) for s in self.specs)

    def offsets(self) -> list[int]:
        """Where each map, then the flag, sits in the parameter buffer."""
        return [self.first + i * TMAP_BYTES for i in range(len(self.specs))] + [self.flag]

    def tail(self, args) -> bytes:
        """The bytes from the first map to the end (every map, then the flag), as fill() writes them: the
        compiled launcher's `tail_fn` (it reuses the last result while the packed parameters are the same).
        A tensor read through TMA that it cannot describe gives all zeros: flag 0, the kernel's cp.async path;
        a written one, a zero map and its bit clear: plain stores (or atomics)."""
        flag = LOADS_OK
        for spec in self.specs:
            flag |= _bit(spec)
        parts = []
        for i, spec in enumerate(self.specs):
            m = self._map(args[spec["param"]], i)
            if m is None and not _bit(spec):
                return bytes(self.size - self.first)
            if m is None:
                flag &= ~_bit(spec)
            parts.append(m or bytes(TMAP_BYTES))
        parts.append(flag.to_bytes(4, "little"))
        return b"".join(parts)

    def fill(self, args, buf) -> None:
        """Writes every map and the flag into `buf` (a ctypes buffer of at least self.size bytes)."""
        ctypes.memmove(ctypes.addressof(buf) + self.first, self.tail(args), self.size - self.first)
