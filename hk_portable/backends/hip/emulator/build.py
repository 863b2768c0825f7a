"""Building for the emulator: the per-process snapshot of the emulator headers, the build cache (under the
hk cache dir, keyed by sha256), atomic builds that racing processes may both win, the runtime library,
and the compile and link of a module (one shared object per kernel)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from ....runtime import cachefiles
from . import elf
from .errors import CompileError, EmulatorError
from .runtime_abi import ABI, PAGE
from .source import find_kernels, rewrite_inline_asm, rewrite_source, strip_amdgpu_attrs
from .toolchain import require_compiler

HERE = Path(__file__).resolve().parent
HEADERS = ("hk_emu.h", "hk_emu_common.h", "hk_emu_runtime.h")
LINK_VERSION = 2   # 2: modules name the runtime by soname (part of the runtime's and the modules' cache keys)

lock = threading.RLock()   # guards every cache of the emulator and each launch's ctypes state


def cache_base() -> Path | None:
    """The checked `<cache>/hip-emulator` directory, or None when the cache is unusable (unsafe or unwritable
    and empty): builds then go to this process's private directory (runtime/cachefiles.py), never a shared,
    guessable path (the shared objects here are loaded)."""
    from ....runtime.cache import cache_dir
    base = cache_dir()
    if base is None:
        return None
    try:
        return cachefiles.subdir(base, "hip-emulator")
    except (OSError, cachefiles.UnsafeCacheDir):
        return None


def place(*parts: str) -> tuple[Path, Path | None]:
    """Where a build named by `parts` belongs, and the root it is checked from (None: private)."""
    base = cache_base()
    root = base if base is not None else cachefiles.private_dir() / "hip-emulator"
    return root.joinpath(*parts), base


_headers_snapshot: dict[str, bytes] = {}


def headers() -> dict[str, bytes]:
    """The emulator headers as this process first read them: builds use this snapshot (written into the
    build dir), so editing or upgrading the files on disk never mixes two versions into one process."""
    with lock:
        if not _headers_snapshot:
            for name in HEADERS:
                _headers_snapshot[name] = (HERE / name).read_bytes()
        return _headers_snapshot


def header_digest() -> str:
    h = hashlib.sha256()
    for name, text in headers().items():
        h.update(name.encode())
        h.update(text)
    return h.hexdigest()


def write_headers(tmp: Path) -> Path:
    """Write the header snapshot into tmp/include; returns that include dir."""
    inc = tmp / "include"
    inc.mkdir(exist_ok=True)
    for name, text in headers().items():
        (inc / name).write_bytes(text)
    return inc


def run(cmd, cwd, what):
    """Run a build step; CompileError with its output when it fails."""
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise CompileError(f"{what} failed (exit {p.returncode}): {' '.join(map(str, cmd))}",
                           (p.stdout + p.stderr).strip())
    return p


# ---------------------------------------------------------------------------------------------------
# The runtime library
# ---------------------------------------------------------------------------------------------------
_runtime_lib = {}


def runtime() -> tuple[ctypes.CDLL, Path]:
    """The runtime library (built once per header snapshot and compiler) and its path."""
    with lock:
        cxx, ver = require_compiler()
        key = hashlib.sha256((f"rt{LINK_VERSION}|" + header_digest() + "|" + ver).encode()).hexdigest()[:20]
        if key in _runtime_lib:
            return _runtime_lib[key]
        dest, root = place("rt", f"libhk_emu_rt-{key}.so")

        def build(tmp: Path) -> Path:
            src = tmp / "hk_emu_rt.cpp"
            src.write_text('#include "hk_emu_runtime.h"\n')
            out = tmp / dest.name
            run([cxx, "-std=c++17", "-O2", "-g", "-fPIC", "-shared", "-fno-omit-frame-pointer",
                 "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0", "-fvisibility=hidden", "-pthread",
                 f"-Wl,-soname,{dest.name}", "-I", str(write_headers(tmp)), str(src), "-o", str(out), "-ldl"], tmp,
                "compiling the emulator runtime")
            return out

        dest = cachefiles.built_file(dest, build, root)   # checked against its recorded hash; rebuilt if off
        _runtime_lib[key] = (_bind_runtime(dest), dest)
        return _runtime_lib[key]


def _bind_runtime(path: Path) -> ctypes.CDLL:
    """Load the runtime library, check its ABI and declare the entry points Python calls."""
    lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)   # modules bind to the runtime they were linked with
    lib.hk_emu_abi.restype = ctypes.c_int
    if lib.hk_emu_abi() != ABI:
        raise EmulatorError(f"emulator runtime ABI {lib.hk_emu_abi()} != {ABI}")
    lib.hk_emu_region_alloc.restype = ctypes.c_void_p
    lib.hk_emu_region_alloc.argtypes = [ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64),
                                        ctypes.POINTER(ctypes.c_uint64)]
    lib.hk_emu_region_free.restype = None
    lib.hk_emu_region_free.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    lib.hk_emu_launch_kernel.restype = ctypes.c_int
    lib.hk_emu_launch_kernel.argtypes = [ctypes.c_void_p]
    return lib


# ---------------------------------------------------------------------------------------------------
# Modules: preprocess, find the kernels, add the export glue, compile once, link each kernel
# ---------------------------------------------------------------------------------------------------
# Gathers the per-variable hk_lds.<n> sections that survive --gc-sections into one range between two
# pages reserved as guards (made PROT_NONE at load); hk_emu_lds_pad (set by a second link) shifts the
# variables so that they end at the upper guard.
LDS_SCRIPT = """SECTIONS
{
  hk_lds_guard_lo ALIGN(4096) (NOLOAD) : { hk_emu_lds_guard_lo = .; . += 4096; }
  hk_lds ALIGN(4096) : { . += DEFINED(hk_emu_lds_pad) ? hk_emu_lds_pad : 0; hk_emu_lds_begin = .; *(hk_lds.*) hk_emu_lds_end = .; }
  hk_lds_guard_hi ALIGN(4096) (NOLOAD) : { hk_emu_lds_guard_hi = .; . += 4096; }
}
INSERT AFTER .data;
"""

KERNEL_LIST = "kernels.txt"   # name<TAB>lo\x01hi per kernel: what a cached module dir holds


def build_module(tmp: Path, source: str, name: str, arch: str, cxx: str, flags: list[str], rt_path: Path) -> Path:
    """Compile ``source`` in tmp into a directory holding <kernel>.so per kernel and the kernel list."""
    src_file = tmp / name
    src_file.write_text(rewrite_source(source))
    ii = tmp / "module.ii"
    defs = ["-DHK_EMULATOR=1", f"-D__{arch}__=1"]
    run([cxx, "-E", "-std=c++17", "-x", "c++", *defs, "-I", str(write_headers(tmp)), "-include", "hk_emu.h",
         name, "-o", str(ii)], tmp, f"preprocessing {name} for the emulator")
    text = rewrite_inline_asm(ii.read_text(), arch)
    kernels = find_kernels(text)
    if not kernels:
        raise CompileError(f"{name}: no kernel definitions found (kernels are functions declared "
                           "__global__, e.g. `extern \"C\" __global__ void k(...) {{...}}`)")
    ii.write_text(strip_amdgpu_attrs(text) + "\n".join(_export_glue(kernels)) + "\n")
    obj = tmp / "module.o"
    run([cxx, "-std=c++17", *flags, "-g1", "-fPIC", "-c", "-fno-omit-frame-pointer", "-fvisibility=hidden",
         "-fstack-clash-protection",
         "-ffunction-sections", "-fdata-sections", "-Wno-unused-command-line-argument",
         "-Wno-ignored-attributes", "-Wno-unknown-attributes", "-x", "c++-cpp-output", str(ii),
         "-o", str(obj)], tmp, f"compiling {name} for the emulator")
    out_dir = tmp / "out"
    out_dir.mkdir()
    _link_kernels(cxx, obj, kernels, out_dir, rt_path, tmp, name)
    (out_dir / KERNEL_LIST).write_text(
        "\n".join(f"{k}\t{'' if not m['bounds'] else m['bounds'][0] + chr(1) + m['bounds'][1]}"
                  for k, m in kernels.items()) + "\n")
    if os.environ.get("HK_EMU_KEEP_SOURCE"):
        shutil.copyfile(ii, out_dir / "module.ii")    # the preprocessed source, for debugging
    return out_dir


def read_kernel_list(path: Path) -> dict[str, dict]:
    """The kernel list build_module wrote: name -> {"bounds": (lo_expr, hi_expr) | None}."""
    kernels = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        k, _, b = line.partition("\t")
        kernels[k] = {"bounds": tuple(b.split(chr(1))) if b else None}
    return kernels


def _export_glue(kernels: dict[str, dict]) -> list[str]:
    """Lines appended to the preprocessed source: per kernel, its entry point, parameter description and
    (when declared) its work-group bounds, under names the runtime and Module look up."""
    glue = ["\n// ---- hk_emu export block (added by emulator.load) ----"]
    for k, meta in kernels.items():
        glue.append(f'extern "C" __attribute__((visibility("default"))) void hk_emu_entry_{k}(void** p) '
                    f'{{ ::hk_emu::call(&{k}, p); }}')
        glue.append(f'extern "C" __attribute__((visibility("default"))) int hk_emu_params_{k}'
                    f'(hk_emu_param* o, int n) {{ return ::hk_emu::describe(&{k}, o, n); }}')
        if meta["bounds"]:
            lo, hi = meta["bounds"]
            glue.append(f'extern "C" __attribute__((visibility("default"))) void hk_emu_bounds_{k}'
                        f'(int* b) {{ b[0] = (int)({lo}); b[1] = (int)({hi}); }}')
    return glue


def _link_kernels(cxx, obj: Path, kernels: dict[str, dict], out_dir: Path, rt_path: Path, tmp: Path, name: str):
    """One shared object per kernel, exporting only that kernel's symbols (so --gc-sections keeps only
    the __shared__ variables it reaches)."""
    script = tmp / "hk_lds.ld"
    script.write_text(LDS_SCRIPT)
    max_align = max([al for nm, al, _sz in elf.sections(obj)[2] if nm.startswith("hk_lds.")] or [1])
    for k in kernels:
        vmap = tmp / f"{k}.map"
        syms = [f"hk_emu_entry_{k}", f"hk_emu_params_{k}", f"hk_emu_bounds_{k}", "hk_emu_module_info_get"]
        vmap.write_text("{ global: " + " ".join(x + ";" for x in syms) + " local: *; };\n")
        link_kernel(cxx, obj, out_dir / f"{k}.so", rt_path, vmap, script, max_align, tmp,
                    f"linking kernel {k} of {name}")


def link_kernel(cxx, obj: Path, out: Path, rt_path: Path, vmap: Path, script: Path, max_align: int, tmp: Path,
                what: str):
    """Link one kernel's object; relink with hk_emu_lds_pad so its static LDS ends at the upper guard."""
    # the runtime by its soname, not its path: the loader matches the soname to the runtime this process already
    # loaded, wherever the cache (or a private fallback) put either file, so one process never holds two copies
    base = [cxx, "-shared", "-o", str(out), str(obj), f"-L{rt_path.parent}", f"-l:{rt_path.name}",
            "-Wl,--gc-sections", f"-Wl,--version-script={vmap}", f"-Wl,-T,{script}"]
    run(base, tmp, what)
    syms = elf.symbols(out, {"hk_emu_lds_begin", "hk_emu_lds_end"})
    size = syms.get("hk_emu_lds_end", 0) - syms.get("hk_emu_lds_begin", 0)
    pad = (-size) % PAGE
    pad -= pad % max(1, min(max_align, PAGE))
    if size and pad:
        run(base + [f"-Wl,--defsym=hk_emu_lds_pad={pad}"], tmp, what)
        again = elf.symbols(out, {"hk_emu_lds_begin", "hk_emu_lds_end"})
        if again.get("hk_emu_lds_end", 0) - again.get("hk_emu_lds_begin", 0) != size:
            run(base, tmp, what)   # the layout moved: keep the unpadded object (bounds stay page-granular)
