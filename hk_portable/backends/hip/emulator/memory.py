"""Guarded copies of tensor arguments: each tensor storage a launch reaches is copied into a region the
runtime maps between guard pages, with 0xFF padding around the data; after a clean launch the padding is
checked and the data copied back."""
from __future__ import annotations

import ctypes

import torch

from .errors import EmulatorError
from .runtime_abi import PAGE, CRegion


def span(t: torch.Tensor) -> tuple[int, int]:
    """[lo, hi) host addresses of the bytes the tensor's view can reach."""
    lo = t.data_ptr()
    if t.numel() == 0:
        return lo, lo
    extent = sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0) + 1
    return lo, lo + extent * t.element_size()


def describe_tensor(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')} tensor of shape {tuple(t.shape)}"


def _group_by_storage(items: list[tuple[torch.Tensor, str]]) -> dict[int, list]:
    """storage data_ptr -> [lo, hi, names]: the span of all views of one storage, so aliases share a copy."""
    groups: dict[int, list] = {}
    for t, name in items:
        if t.device.type != "cpu":
            raise EmulatorError(f"{name} is on {t.device}; the emulator runs on CPU tensors")
        key = t.untyped_storage().data_ptr()
        lo, hi = span(t)
        g = groups.setdefault(key, [lo, hi, []])
        g[0], g[1] = min(g[0], lo), max(g[1], hi)
        if name not in g[2]:
            g[2].append(name)
    return groups


class Memory:
    """The guarded copies of one launch's tensors; ``regions`` is the table the runtime checks against."""

    def __init__(self, rt, items: list[tuple[torch.Tensor, str]]):
        self.rt = rt
        self.groups = []   # [lo, hi, name, base, maplen, data]
        groups = _group_by_storage(items)
        self._by_storage: dict[int, int] = {}   # storage data_ptr -> index into self.groups
        try:
            for key, (lo, hi, names) in groups.items():
                self._by_storage[key] = len(self.groups)
                self.groups.append(self._map(lo, hi, names))
        except BaseException:
            self.free()
            raise
        self._names = [ctypes.create_string_buffer(g[2].encode()) for g in self.groups]
        self.regions = (CRegion * max(1, len(self.groups)))()
        for i, g in enumerate(self.groups):
            r = self.regions[i]
            r.lo, r.hi = g[5], g[5] + (g[1] - g[0])
            r.map_lo, r.map_hi = g[3], g[3] + g[4]
            r.name = ctypes.cast(self._names[i], ctypes.c_char_p)

    def _map(self, lo: int, hi: int, names: list[str]) -> list:
        """Copy host bytes [lo, hi) into a fresh guarded region: the group record for self.groups."""
        off, maplen = ctypes.c_uint64(), ctypes.c_uint64()
        base = self.rt.hk_emu_region_alloc(hi - lo, ctypes.byref(off), ctypes.byref(maplen))
        if not base:
            raise EmulatorError(f"cannot map {hi - lo} bytes for {names[0]}")
        data = base + off.value
        if hi > lo:
            ctypes.memmove(data, lo, hi - lo)
        # the bytes between the leading guard page and the data, and the alignment tail after it,
        # hold 0xFF: reads there give NaN / -1, and writes there are found after the launch
        pre_lo, tail_hi = base + PAGE, data + ((hi - lo + 15) & ~15 if hi > lo else 16)
        ctypes.memset(pre_lo, 0xFF, data - pre_lo)
        ctypes.memset(data + (hi - lo), 0xFF, tail_hi - data - (hi - lo))
        return [lo, hi, " = ".join(names), base, maplen.value, data]

    def check_redzones(self, kernel: str):
        """Out-of-bounds writes that hit no guard page: the 0xFF fill before and after each tensor."""
        for lo, hi, name, base, _m, data in self.groups:
            n = hi - lo
            pre = ctypes.string_at(base + PAGE, data - base - PAGE)
            tail = ctypes.string_at(data + n, ((n + 15) & ~15 if n else 16) - n)
            bad_pre = [i for i, b in enumerate(pre) if b != 0xFF]
            bad_tail = [i for i, b in enumerate(tail) if b != 0xFF]
            if bad_pre:
                raise EmulatorError(
                    f"kernel '{kernel}': out-of-bounds write {len(pre) - bad_pre[0]} bytes before the start of "
                    f"{name} ({n} bytes): found after the launch in the padding before the tensor's copy, so "
                    "the writing lane is not known (reads there return 0xFF bytes; a write further before the "
                    "start hits a guard page and is reported with its lane)")
            if bad_tail:
                raise EmulatorError(
                    f"kernel '{kernel}': out-of-bounds write {bad_tail[0]} bytes past the end of {name} "
                    f"({n} bytes): found after the launch in the alignment padding after the tensor's copy, "
                    "so the writing lane is not known")

    def translate(self, addr: int, tensor: torch.Tensor | None = None) -> int | None:
        """The guarded-copy address for a host address (of `tensor`, if given: exact, by its storage)."""
        if tensor is not None:
            g = self.groups[self._by_storage[tensor.untyped_storage().data_ptr()]]
            return g[5] + (addr - g[0])
        for lo, hi, _n, _b, _m, data in self.groups:      # strictly inside first: spans may abut
            if lo <= addr < hi:
                return data + (addr - lo)
        for lo, hi, _n, _b, _m, data in self.groups:      # then one past the end (or an empty tensor)
            if addr == hi:
                return data + (addr - lo)
        return None

    def copy_back(self):
        for lo, hi, _n, _b, _m, data in self.groups:
            if hi > lo:
                ctypes.memmove(lo, data, hi - lo)

    def free(self):
        for g in self.groups:
            if g[3]:
                self.rt.hk_emu_region_free(g[3], g[4])
                g[3] = 0
