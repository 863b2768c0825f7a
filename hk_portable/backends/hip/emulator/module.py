"""A compiled source (Module): its kernels' parameter descriptions, the per-worker copies of each
kernel's shared object, and launch (argument checks, guarded memory, the runtime call, its statistics)."""
from __future__ import annotations

import ctypes
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ....runtime import cachefiles
from .args import Blob, pack
from .build import lock, runtime
from .errors import EmulatorError
from .memory import Memory, describe_tensor
from .runtime_abi import ABI, ARCHS, PARAM_KINDS, CLaunch, CModInfo, CParam
from .symbolize import ALIASES, symbolize


@dataclass(frozen=True)
class Param:
    """One kernel parameter as the compiled kernel sees it."""
    size: int
    align: int
    kind: str   # "pointer", "int", "uint", "float", "bool", "other" (struct / vector: pass bytes or Blob)


@dataclass
class KernelInfo:
    name: str
    params: list = field(default_factory=list)
    bounds: tuple | None = None     # amdgpu_flat_work_group_size(lo, hi), evaluated; None: (1, 1024)
    static_lds: int = 0             # bytes of __shared__ variables the kernel reaches


@dataclass
class LaunchStats:
    blocks: int
    wave_ops: int       # cross-lane operations resolved (MFMA, bpermute, DPP, ...)
    barriers: int       # s_barrier releases
    switches: int       # fiber switches
    lds_accesses: int   # checked LDS accesses
    seconds: float
    workers: int


_copy_counter = [0]


class Module:
    """A compiled source. ``launch`` runs one of its kernels; ``kernels`` lists them.

    Each kernel is its own shared object (linked with --gc-sections, so its static LDS is exactly the
    __shared__ variables it reaches); each worker thread gets its own copy of that object."""

    def __init__(self, directory: Path, arch: str, kernels: dict[str, dict], name: str):
        self.directory = directory
        self.arch = arch
        self.name = name
        self._rt, _ = runtime()
        self._libs: dict[str, list[ctypes.CDLL]] = {}
        self._infos: dict[str, list[CModInfo]] = {}
        self.kernels: dict[str, KernelInfo] = {}
        for k, meta in kernels.items():
            self.kernels[k] = self._kernel_info(k, meta)

    def __repr__(self):
        return f"<emulator.Module {self.name} {self.arch} kernels={list(self.kernels)}>"

    def _kernel_info(self, k: str, meta: dict) -> KernelInfo:
        """What the compiled kernel says about itself: parameters, evaluated bounds, static LDS."""
        lib = self._copy(k, 0)
        info = KernelInfo(k)
        fn = getattr(lib, f"hk_emu_params_{k}")
        fn.restype = ctypes.c_int
        arr = (CParam * 64)()
        n = fn(arr, 64)
        if n > 64:
            raise EmulatorError(f"kernel {k} has {n} parameters; at most 64 are supported")
        info.params = [Param(arr[i].size, arr[i].align, PARAM_KINDS.get(arr[i].kind, "other")) for i in range(n)]
        if meta.get("bounds"):
            b = (ctypes.c_int * 2)()
            getattr(lib, f"hk_emu_bounds_{k}")(b)
            info.bounds = (b[0], b[1])
        mi = self._infos[k][0]
        info.static_lds = (mi.lds_hi - mi.lds_lo) if mi.lds_lo else 0
        return info

    def _copy(self, kernel: str, i: int) -> ctypes.CDLL:
        """Kernel's object for worker i (each worker thread needs its own static-LDS section). Copies
        beyond the first are written into this process's private directory (never into the cache, which may be
        read-only), loaded, and unlinked at once (the mapping stays; glibc identifies loaded objects by name, so
        names are never reused)."""
        with lock:
            libs = self._libs.setdefault(kernel, [])
            infos = self._infos.setdefault(kernel, [])
            while len(libs) <= i:
                j = len(libs)
                base = self.directory / f"{kernel}.so"
                path = str(base)
                if j:
                    _copy_counter[0] += 1
                    path = str(cachefiles.private_dir() / f"{kernel}.{_copy_counter[0]}.so")
                    shutil.copyfile(base, path)
                try:
                    lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
                finally:
                    if j:
                        os.unlink(path)
                        ALIASES[path] = str(base)
                info = CModInfo()
                lib.hk_emu_module_info_get(ctypes.byref(info))
                if info.abi != ABI:
                    raise EmulatorError(f"{path}: module ABI {info.abi} != {ABI}")
                libs.append(lib)
                infos.append(info)
            return libs[i]

    def launch(self, kernel: str, grid=(1, 1, 1), block=(64, 1, 1), args=(), shared_bytes: int = 0, *,
               tensors=(), threads: int | None = None, timeout: float | None = None,
               race_check: bool = True, poison_lds: bool = True) -> LaunchStats:
        """Run ``kernel`` over ``grid`` workgroups of ``block`` work-items.

        args: one per kernel parameter -- torch CPU tensors (pointer parameters; the kernel works on a
        guarded copy that is written back after a successful launch), ``None`` (null pointer), Python
        ints / floats / bools (converted to the parameter's C type), explicitly typed values
        (``i32(x)``, ``f32(x)``, ``u64(x)``, ...), or ``bytes`` / :class:`Blob` for by-value structs.
        shared_bytes: dynamic LDS (``extern __shared__`` arrays). tensors: extra tensors that struct
        arguments point into. threads: worker threads (default: CPUs, or HK_EMU_THREADS).
        timeout: seconds (default HK_EMU_TIMEOUT_S, else none). Raises EmulatorError on any fault.
        """
        if kernel not in self.kernels:
            raise EmulatorError(f"no kernel '{kernel}' in {self.name}; kernels: {sorted(self.kernels)}")
        info = self.kernels[kernel]
        grid, block = _dim3(grid, "grid"), _dim3(block, "block")
        _check_block(kernel, info, block)
        args = list(args)
        if len(args) != len(info.params):
            raise EmulatorError(f"kernel '{kernel}' takes {len(info.params)} arguments "
                                f"({', '.join(p.kind for p in info.params)}), got {len(args)}")
        items = _guarded_tensors(args, tensors)
        nw = _workers(threads, grid[0] * grid[1] * grid[2])
        if timeout is None and os.environ.get("HK_EMU_TIMEOUT_S"):
            timeout = float(os.environ["HK_EMU_TIMEOUT_S"])
        for i in range(nw):
            self._copy(kernel, i)
        flags = (0 if race_check else 1) | (0 if poison_lds else 2)
        with lock:
            mem = Memory(self._rt, items)
            try:
                return self._run(kernel, info, args, grid, block, nw, mem, shared_bytes, flags, timeout)
            finally:
                mem.free()

    def _run(self, kernel: str, info: KernelInfo, args: list, grid, block, nw: int, mem: Memory,
             shared_bytes: int, flags: int, timeout: float | None) -> LaunchStats:
        """Pack the arguments, fill the launch record and call the runtime. Every ctypes buffer the record
        points at is a local of this function, so it outlives the call."""
        bufs = [pack(a, p, mem, i, kernel) for i, (a, p) in enumerate(zip(args, info.params))]
        params = (ctypes.c_void_p * max(1, len(bufs)))(*[ctypes.addressof(b) for b in bufs])
        libs, infos = self._libs[kernel], self._infos[kernel]
        entries = (ctypes.c_void_p * nw)(*[
            ctypes.cast(getattr(libs[i], f"hk_emu_entry_{kernel}"), ctypes.c_void_p).value
            for i in range(nw)])
        mods = (ctypes.c_void_p * nw)(*[ctypes.addressof(infos[i]) for i in range(nw)])
        err = ctypes.create_string_buffer(16384)
        arch_id, lds_limit = ARCHS[self.arch]
        L = CLaunch()
        L.abi, L.nworkers = ABI, nw
        L.entries, L.mods = ctypes.addressof(entries), ctypes.addressof(mods)
        L.params = ctypes.addressof(params)
        L.grid[:], L.block[:] = grid, block
        L.dyn_lds, L.arch, L.lds_limit = int(shared_bytes), arch_id, lds_limit
        L.flags = flags
        kname = kernel.encode()
        L.kernel = kname
        L.regions, L.nregions = ctypes.addressof(mem.regions), len(mem.groups)
        L.timeout_ms = int(timeout * 1000) if timeout else 0
        L.err, L.errcap = ctypes.addressof(err), len(err)
        if shared_bytes < 0:
            raise EmulatorError("shared_bytes must be >= 0")
        rc = self._rt.hk_emu_launch_kernel(ctypes.addressof(L))
        if rc != 0:
            raise EmulatorError(symbolize(err.value.decode(errors="replace")) or f"launch failed ({rc})")
        mem.check_redzones(kernel)
        mem.copy_back()
        s = L.stats
        return LaunchStats(blocks=s[0], wave_ops=s[1], barriers=s[2], switches=s[3],
                           lds_accesses=s[4], seconds=s[5] / 1e9, workers=nw)


def _dim3(d, what) -> tuple[int, int, int]:
    if isinstance(d, int):
        d = (d,)
    d = tuple(int(x) for x in d)
    if not 1 <= len(d) <= 3 or any(x < 0 for x in d):
        raise EmulatorError(f"{what} must be 1 to 3 non-negative ints, got {d}")
    return d + (1,) * (3 - len(d))


def _check_block(kernel: str, info: KernelInfo, block: tuple[int, int, int]):
    """The work-group size the hardware would accept: 1..1024 and within the kernel's declared bounds."""
    n = block[0] * block[1] * block[2]
    lo, hi = info.bounds or (1, 1024)
    if not (1 <= n <= 1024):
        raise EmulatorError(f"kernel '{kernel}': block {block} has {n} work-items; AMD allows 1..1024")
    if not (lo <= n <= hi):
        raise EmulatorError(
            f"kernel '{kernel}': block {block} has {n} work-items but the kernel declares "
            f"amdgpu_flat_work_group_size({lo}, {hi}); the hardware refuses such a launch")


def _guarded_tensors(args: list, tensors) -> list[tuple[torch.Tensor, str]]:
    """Every tensor the launch reaches (arguments, those inside Blobs, the extra ones), with its name
    for reports."""
    items: list[tuple[torch.Tensor, str]] = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            items.append((a, f"argument {i} ({describe_tensor(a)})"))
        elif isinstance(a, Blob):
            items += [(t, f"a tensor in struct argument {i} ({describe_tensor(t)})") for t in a.tensors]
    items += [(t, f"extra tensor {j} ({describe_tensor(t)})") for j, t in enumerate(tensors)]
    return items


def _workers(threads: int | None, nblocks: int) -> int:
    """Worker threads: as asked (default HK_EMU_THREADS, else the CPUs), at most one per block, at most 64."""
    if threads is None:
        threads = int(os.environ.get("HK_EMU_THREADS", "0")) or (os.cpu_count() or 1)
    return max(1, min(int(threads), nblocks, 64))
