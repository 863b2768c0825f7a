"""load(): compile a header-free HIP source for the emulator (through the build cache) and return its
Module; one Module per distinct source, arch, name, flags, headers and compiler in a process."""
from __future__ import annotations

import hashlib

from ....runtime import cachefiles
from .build import KERNEL_LIST, LINK_VERSION, build_module, header_digest, lock, place, read_kernel_list, runtime
from .errors import EmulatorError
from .module import Module
from .runtime_abi import ABI, ARCHS
from .source import REWRITE_VERSION
from .toolchain import module_flags, require_compiler

_modules: dict[str, Module] = {}


def load(source: str, arch: str = "gfx942", *, name: str = "kernel.hip", opt_level: int = 2,
         fp_contract: str = "fast", extra_flags=()) -> Module:
    """Compile header-free HIP ``source`` for the emulated ``arch`` ("gfx942" or "gfx950"; feature
    suffixes such as ":sramecc+:xnack-" are ignored) and return its :class:`Module`.

    The shared object is cached under the hk cache dir by sha256 of source, arch, flags, header and
    compiler. fp_contract: "fast" (HIP's default: a*b+c may fuse into an FMA, as on the device),
    "on" or "off". name: the file name used in diagnostics and reports.
    """
    arch = _check_options(arch, fp_contract, name)
    cxx, ver = require_compiler()
    flags = module_flags(opt_level, fp_contract, extra_flags)
    key = hashlib.sha256("\0".join([source, arch, name, header_digest(), ver, " ".join(flags),
                                    str(ABI), str(REWRITE_VERSION), str(LINK_VERSION)]).encode()).hexdigest()[:24]
    with lock:
        if key in _modules:
            return _modules[key]
        _, rt_path = runtime()
        dest, root = place("mod", key)
        final_dir = cachefiles.built_dir(dest, lambda tmp: build_module(tmp, source, name, arch, cxx, flags, rt_path),
                                         root)   # every file checked against the manifest; rebuilt if off
        mod = Module(final_dir, arch, read_kernel_list(final_dir / KERNEL_LIST), name)
        _modules[key] = mod
        return mod


def _check_options(arch: str, fp_contract: str, name: str) -> str:
    """The plain arch name, after refusing options the emulator does not model."""
    arch = arch.split(":")[0].strip().lower()
    if arch not in ARCHS:
        raise EmulatorError(f"unknown arch {arch!r}; the emulator models {sorted(ARCHS)}")
    if fp_contract not in ("fast", "on", "off"):
        raise EmulatorError("fp_contract must be 'fast', 'on' or 'off'")
    if "/" in name or not name:
        raise EmulatorError("name must be a plain file name")
    return arch
