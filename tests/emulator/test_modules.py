"""The emulator package is split into modules, one concern each: every module imports on its own (nothing
else of the package loaded, not even its __init__), and the package's public face is the same as before
the split."""
from __future__ import annotations

import subprocess
import sys

from hk_portable.backends.hip import emulator

PKG = "hk_portable.backends.hip.emulator"
MODULES = ["errors", "runtime_abi", "toolchain", "elf", "source", "build", "memory", "args", "symbolize",
           "module", "loader"]

PUBLIC = [
    "EmulatorError", "CompileError", "load", "available", "compiler", "Module", "KernelInfo", "Param",
    "LaunchStats", "Scalar", "Blob", "blob", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64",
    "f32", "f64", "ptr", "ARCHS",
]


# Imports each module with the package object in place but its __init__ NOT run, so only what the module
# itself imports is loaded; one interpreter for all (torch is slow to import), emulator modules purged
# between them.
_ON_ITS_OWN = """
import importlib, importlib.util, sys, types
PKG = sys.argv[1]
where = importlib.util.find_spec(PKG).submodule_search_locations
for name in sys.argv[2:]:
    for k in [k for k in sys.modules if k == PKG or k.startswith(PKG + ".")]:
        del sys.modules[k]
    pkg = types.ModuleType(PKG)
    pkg.__path__, pkg.__package__ = list(where), PKG
    sys.modules[PKG] = pkg
    importlib.import_module(PKG + "." + name)
    loaded = sorted(k[len(PKG) + 1:] for k in sys.modules if k.startswith(PKG + ".") and k != PKG + "." + name)
    print(name, *loaded)
"""

LEAVES = {"errors", "runtime_abi", "elf"}   # they import nothing from the package


def test_each_module_imports_on_its_own():
    p = subprocess.run([sys.executable, "-c", _ON_ITS_OWN, PKG, *MODULES], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    deps = {line.split()[0]: line.split()[1:] for line in p.stdout.splitlines()}
    assert sorted(deps) == sorted(MODULES)
    for leaf in LEAVES:
        assert deps[leaf] == [], (leaf, deps[leaf])
    # the inline-asm rewrite reports unmodelled asm as a CompileError and reads the modelled archs' capabilities
    assert deps["source"] == ["errors", "runtime_abi"]
    assert "loader" not in deps["module"]      # layering: load() builds Modules, not the other way round


def test_the_modelled_archs_are_the_hip_backends():
    """The emulator's own arch table (it imports nothing outside its package) agrees with the backend's."""
    from hk_portable.backends.hip import archs
    from hk_portable.backends.hip.emulator import runtime_abi
    assert runtime_abi.ARCHS == {a.name: (a.emulator_id, a.lds_bytes) for a in archs.ARCHS.values()}
    assert runtime_abi.LDS_DMA_WIDE == {a.name for a in archs.ARCHS.values() if a.lds_dma_wide}


def test_public_api_is_unchanged():
    assert emulator.__all__ == PUBLIC
    for name in PUBLIC:
        assert getattr(emulator, name) is not None, name


def test_public_names_are_the_defining_modules_objects():
    from hk_portable.backends.hip.emulator import args, errors, loader, module, runtime_abi, source, toolchain
    assert emulator.load is loader.load
    assert emulator.Module is module.Module and emulator.LaunchStats is module.LaunchStats
    assert emulator.EmulatorError is errors.EmulatorError and issubclass(emulator.CompileError, errors.EmulatorError)
    assert emulator.blob is args.blob and emulator.i32 is args.i32
    assert emulator.available is toolchain.available and emulator.compiler is toolchain.compiler
    assert emulator.ARCHS is runtime_abi.ARCHS
    assert emulator.rewrite_source is source.rewrite_source    # tests/emulator/test_source.py imports it
