"""Run header-free HIP kernels for AMD gfx942 / gfx950 on the CPU: a lane-accurate wave64 emulator.

    from hk_portable.backends.hip import emulator
    mod = emulator.load(source, arch="gfx942")
    mod.launch("kernel_name", grid=(gx, gy, gz), block=(bx, by, bz), args=[a, b, c, 128], shared_bytes=0)

The source is compiled for the host by clang++ against ``hk_emu.h`` (every AMD builtin the device code
uses, under its real name) and linked with the emulator runtime; each work-item runs as a fiber, the lanes
of a wave meet at every wave-level instruction (MFMA, ds_bpermute, DPP, ballot, ...), waves meet at
``s_barrier``. Out-of-bounds global or LDS accesses, LDS races between barriers, divergent wave operations
and barrier deadlocks raise :class:`EmulatorError` with the kernel, block, wave, lane and address.
README.md beside this file documents the API, the contract device code follows, the modeled semantics
and their sources.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
HEADERS = ("hk_emu.h", "hk_emu_common.h", "hk_emu_runtime.h")
ABI = 4
_PAGE = 4096

# arch -> (numeric id the runtime uses, LDS bytes per workgroup)
ARCHS = {"gfx942": (942, 64 * 1024), "gfx950": (950, 160 * 1024)}

__all__ = [
    "EmulatorError", "CompileError", "load", "available", "compiler", "Module", "KernelInfo", "Param",
    "LaunchStats", "Scalar", "Blob", "blob", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64",
    "f32", "f64", "ptr", "ARCHS",
]


class EmulatorError(RuntimeError):
    """A kernel misbehaved under emulation (out-of-bounds access, LDS race, divergent wave operation,
    barrier deadlock, trap, timeout), or the launch itself is invalid. The message is the report."""


class CompileError(EmulatorError):
    """The source did not compile for the emulator; ``.log`` holds the compiler output."""

    def __init__(self, msg: str, log: str = ""):
        super().__init__(msg + ("\n" + log if log else ""))
        self.log = log


# ---------------------------------------------------------------------------------------------------
# Explicitly typed arguments
# ---------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------
# Compiler and cache
# ---------------------------------------------------------------------------------------------------
_lock = threading.RLock()
_compiler_cache: dict = {}


def compiler() -> tuple[str, str] | None:
    """(path, version line) of the host clang++ used, or None. HK_EMU_CXX overrides the search for
    clang++-19 then clang++."""
    if "c" in _compiler_cache:
        return _compiler_cache["c"]
    cands = [os.environ["HK_EMU_CXX"]] if os.environ.get("HK_EMU_CXX") else ["clang++-19", "clang++"]
    found = None
    for c in cands:
        path = shutil.which(c)
        if not path:
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        line = out.splitlines()[0] if out else c
        if "clang" in line:
            found = (path, line)
            break
    _compiler_cache["c"] = found
    return found


def available() -> tuple[bool, str]:
    """Whether the emulator can run here, and why not."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        return False, f"the emulator's fiber switch is x86-64 only (this machine: {platform.machine()})"
    if compiler() is None:
        return False, ("no host clang++ found (install clang-19: `apt-get install clang-19`, "
                       "or set HK_EMU_CXX to a clang++ >= 15)")
    return True, "ok"


def _cache_root() -> Path:
    try:
        from ....runtime.cache import cache_dir
        root = cache_dir() / "hip-emulator"
    except Exception:  # pragma: no cover - the package's cache module is the normal path
        root = Path(tempfile.gettempdir()) / "hk_portable-hip-emulator"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root


_headers_snapshot: dict[str, bytes] = {}


def _headers() -> dict[str, bytes]:
    """The emulator headers as this process first read them: builds use this snapshot (written into the
    build dir), so editing or upgrading the files on disk never mixes two versions into one process."""
    with _lock:
        if not _headers_snapshot:
            for name in HEADERS:
                _headers_snapshot[name] = (HERE / name).read_bytes()
        return _headers_snapshot


def _header_digest() -> str:
    h = hashlib.sha256()
    for name, text in _headers().items():
        h.update(name.encode())
        h.update(text)
    return h.hexdigest()


def _write_headers(tmp: Path) -> Path:
    inc = tmp / "include"
    inc.mkdir(exist_ok=True)
    for name, text in _headers().items():
        (inc / name).write_bytes(text)
    return inc


def _have_fma() -> bool:
    try:
        return " fma " in (" " + Path("/proc/cpuinfo").read_text().replace("\n", " ") + " ")
    except OSError:
        return False


def _run(cmd, cwd, what):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise CompileError(f"{what} failed (exit {p.returncode}): {' '.join(map(str, cmd))}",
                           (p.stdout + p.stderr).strip())
    return p


def _atomic_build(dest: Path, build) -> Path:
    """Build into a private temp dir, then os.replace into place (two processes may race; both win)."""
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=dest.parent))
    try:
        out = build(tmp)
        os.replace(out, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


_runtime_lib = {}


def _runtime() -> tuple[ctypes.CDLL, Path]:
    with _lock:
        cxx, ver = _require_compiler()
        key = hashlib.sha256(("rt|" + _header_digest() + "|" + ver).encode()).hexdigest()[:20]
        if key in _runtime_lib:
            return _runtime_lib[key]
        dest = _cache_root() / "rt" / f"libhk_emu_rt-{key}.so"

        def build(tmp: Path) -> Path:
            src = tmp / "hk_emu_rt.cpp"
            src.write_text('#include "hk_emu_runtime.h"\n')
            out = tmp / dest.name
            _run([cxx, "-std=c++17", "-O2", "-g", "-fPIC", "-shared", "-fno-omit-frame-pointer",
                  "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0", "-fvisibility=hidden", "-pthread",
                  "-I", str(_write_headers(tmp)), str(src), "-o", str(out), "-ldl"], tmp,
                 "compiling the emulator runtime")
            return out

        _atomic_build(dest, build)
        lib = ctypes.CDLL(str(dest), mode=os.RTLD_NOW | os.RTLD_LOCAL)   # modules bind to the runtime they were linked with
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
        _runtime_lib[key] = (lib, dest)
        return lib, dest


def _require_compiler() -> tuple[str, str]:
    ok, why = available()
    if not ok:
        raise EmulatorError(f"the HIP emulator is unavailable: {why}")
    return compiler()


# ---------------------------------------------------------------------------------------------------
# Source rewriting and kernel discovery
# ---------------------------------------------------------------------------------------------------
_QUALIFIER_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(__global__|__device__|__shared__|__host__|__constant__)\b.*$",
                               re.M)
_RAW_ATTR = {"global": "__global__", "shared": "__shared__", "device": "__device__"}
_EXTERN_SHARED = re.compile(r'\bextern(\s+"C")?\s+__shared__\b([^;{}]*?\[\s*\])\s*;')
_STATIC_SHARED = re.compile(r"\bstatic\s+__shared__\b|\b__shared__\s+static\b")
_AMDGPU_ATTR = re.compile(
    r"(?P<ns>\bclang::)?\b(?P<name>amdgpu_flat_work_group_size|amdgpu_waves_per_eu|amdgpu_num_vgpr|"
    r"amdgpu_num_sgpr|amdgpu_max_num_work_groups|launch_bounds)\s*\((?P<args>[^()]*(?:\([^()]*\)[^()]*)*)\)")


def rewrite_source(src: str) -> str:
    """The three source rewrites load() applies before preprocessing (README: what load() does)."""
    src = _QUALIFIER_DEFINE.sub(lambda m: f"/* hk_emu: the emulator header defines {m.group(1)} */", src)
    src = re.sub(r"__attribute__\s*\(\(\s*(global|shared|device)\s*\)\)", lambda m: _RAW_ATTR[m.group(1)], src)
    src = _EXTERN_SHARED.sub(lambda m: f'extern{m.group(1) or ""} {m.group(2).strip()} __asm__("hk_emu_dyn_lds");',
                             src)
    src = _STATIC_SHARED.sub("__shared__", src)
    return src


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [x.strip() for x in out]


def _skip_parens(text: str, i: int) -> int:
    """text[i] == '('; index just past the matching ')'."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


_KMARK = '__attribute__((annotate("hk_emu_kernel")))'
_IDENT = re.compile(r"[A-Za-z_]\w*")


def _find_kernels(ii: str) -> dict[str, dict]:
    """Kernels defined in the preprocessed text: name -> {"bounds": (lo_expr, hi_expr) | None}."""
    kernels: dict[str, dict] = {}
    pos = 0
    while True:
        at = ii.find(_KMARK, pos)
        if at < 0:
            break
        i = at + len(_KMARK)
        pos = i
        name = None
        while i < len(ii):
            while i < len(ii) and ii[i].isspace():
                i += 1
            if ii.startswith("__attribute__", i):
                j = ii.find("(", i)
                i = _skip_parens(ii, j)
                continue
            if ii.startswith("[[", i):
                i = ii.find("]]", i) + 2
                continue
            m = _IDENT.match(ii, i)
            if m:
                i = m.end()
                k = i
                while k < len(ii) and ii[k].isspace():
                    k += 1
                if k < len(ii) and ii[k] == "(":
                    name = m.group(0)
                    i = k
                    break
                continue
            if ii.startswith('"C"', i):
                i += 3
                continue
            i += 1
        if name is None:
            break
        end = _skip_parens(ii, i)
        k = end
        while k < len(ii):
            while k < len(ii) and ii[k].isspace():
                k += 1
            if ii.startswith("__attribute__", k):
                k = _skip_parens(ii, ii.find("(", k))
                continue
            break
        if k >= len(ii) or ii[k] != "{":
            continue  # a declaration
        start = max(ii.rfind(";", 0, at), ii.rfind("}", 0, at), ii.rfind("\n#", 0, at))
        decl = ii[start + 1:k]
        bounds = None
        for m in _AMDGPU_ATTR.finditer(decl):
            if m.group("name") == "amdgpu_flat_work_group_size":
                a = _split_top(m.group("args"))
                if len(a) == 2:
                    bounds = (a[0], a[1])
            elif m.group("name") == "launch_bounds" and bounds is None:
                a = _split_top(m.group("args"))
                if a and a[0]:
                    bounds = ("1", a[0])
        kernels[name] = {"bounds": bounds}
        pos = end
    return kernels


# Gathers the per-variable hk_lds.<n> sections that survive --gc-sections into one range between two
# pages reserved as guards (made PROT_NONE at load); hk_emu_lds_pad (set by a second link) shifts the
# variables so that they end at the upper guard.
_LDS_SCRIPT = """SECTIONS
{
  hk_lds_guard_lo ALIGN(4096) (NOLOAD) : { hk_emu_lds_guard_lo = .; . += 4096; }
  hk_lds ALIGN(4096) : { . += DEFINED(hk_emu_lds_pad) ? hk_emu_lds_pad : 0; hk_emu_lds_begin = .; *(hk_lds.*) hk_emu_lds_end = .; }
  hk_lds_guard_hi ALIGN(4096) (NOLOAD) : { hk_emu_lds_guard_hi = .; . += 4096; }
}
INSERT AFTER .data;
"""


def _elf_sections(path: Path):
    """(name, addralign, size) of every section of a 64-bit little-endian ELF file."""
    b = path.read_bytes()
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    stroff = hdrs[shstrndx][4]
    name = lambda o: b[stroff + o:b.index(b"\0", stroff + o)].decode()  # noqa: E731
    return b, hdrs, [(name(h[0]), h[8], h[5]) for h in hdrs]


def _elf_symbols(path: Path, wanted: set[str]) -> dict[str, int]:
    b, hdrs, secs = _elf_sections(path)
    out = {}
    for (nm, _al, _sz), h in zip(secs, hdrs):
        if nm != ".symtab":
            continue
        strtab = hdrs[h[6]][4]
        for off in range(h[4], h[4] + h[5], 24):
            st_name, _info, _other, _shndx, value, _size = struct.unpack_from("<IBBHQQ", b, off)
            s_ = b[strtab + st_name:b.index(b"\0", strtab + st_name)].decode()
            if s_ in wanted:
                out[s_] = value
    return out


def _link_kernel(cxx, obj: Path, out: Path, rt_path: Path, vmap: Path, script: Path, max_align: int, tmp: Path,
                 what: str):
    base = [cxx, "-shared", "-o", str(out), str(obj), str(rt_path), "-Wl,--gc-sections",
            f"-Wl,--version-script={vmap}", f"-Wl,-T,{script}", f"-Wl,-rpath,{rt_path.parent}"]
    _run(base, tmp, what)
    syms = _elf_symbols(out, {"hk_emu_lds_begin", "hk_emu_lds_end"})
    size = syms.get("hk_emu_lds_end", 0) - syms.get("hk_emu_lds_begin", 0)
    pad = (-size) % _PAGE
    pad -= pad % max(1, min(max_align, _PAGE))
    if size and pad:
        _run(base + [f"-Wl,--defsym=hk_emu_lds_pad={pad}"], tmp, what)
        again = _elf_symbols(out, {"hk_emu_lds_begin", "hk_emu_lds_end"})
        if again.get("hk_emu_lds_end", 0) - again.get("hk_emu_lds_begin", 0) != size:
            _run(base, tmp, what)   # the layout moved: keep the unpadded object (bounds stay page-granular)


def _strip_amdgpu_attrs(ii: str) -> str:
    return _AMDGPU_ATTR.sub(lambda m: "maybe_unused" if m.group("ns") else "unused", ii)


# ---------------------------------------------------------------------------------------------------
# ctypes mirrors of the ABI (hk_emu_common.h)
# ---------------------------------------------------------------------------------------------------
class _Param(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("align", ctypes.c_uint32), ("kind", ctypes.c_uint32)]


class _ModInfo(ctypes.Structure):
    _fields_ = [("abi", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("lds_lo", ctypes.c_void_p),
                ("lds_hi", ctypes.c_void_p), ("dyn", ctypes.c_void_p), ("dyn_cap", ctypes.c_uint64),
                ("guard_lo", ctypes.c_void_p), ("guard_hi", ctypes.c_void_p)]


class _Region(ctypes.Structure):
    _fields_ = [("lo", ctypes.c_uint64), ("hi", ctypes.c_uint64), ("map_lo", ctypes.c_uint64),
                ("map_hi", ctypes.c_uint64), ("name", ctypes.c_char_p)]


class _Launch(ctypes.Structure):
    _fields_ = [("abi", ctypes.c_uint32), ("nworkers", ctypes.c_uint32), ("entries", ctypes.c_void_p),
                ("mods", ctypes.c_void_p), ("params", ctypes.c_void_p), ("grid", ctypes.c_uint32 * 3),
                ("block", ctypes.c_uint32 * 3), ("dyn_lds", ctypes.c_uint32), ("arch", ctypes.c_uint32),
                ("lds_limit", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("kernel", ctypes.c_char_p),
                ("regions", ctypes.c_void_p), ("nregions", ctypes.c_uint32), ("timeout_ms", ctypes.c_uint32),
                ("err", ctypes.c_void_p), ("errcap", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("stats", ctypes.c_uint64 * 8)]


_KIND = {0: "other", 1: "int", 2: "uint", 3: "float", 4: "pointer", 5: "bool"}


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


# ---------------------------------------------------------------------------------------------------
# Guarded copies of tensor arguments
# ---------------------------------------------------------------------------------------------------
def _span(t: torch.Tensor) -> tuple[int, int]:
    lo = t.data_ptr()
    if t.numel() == 0:
        return lo, lo
    extent = sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0) + 1
    return lo, lo + extent * t.element_size()


def _describe_tensor(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')} tensor of shape {tuple(t.shape)}"


class _Memory:
    def __init__(self, rt, items: list[tuple[torch.Tensor, str]]):
        self.rt = rt
        self.groups = []   # [lo, hi, name, base, maplen, data]
        groups: dict[int, list] = {}
        for t, name in items:
            if t.device.type != "cpu":
                raise EmulatorError(f"{name} is on {t.device}; the emulator runs on CPU tensors")
            key = t.untyped_storage().data_ptr()
            lo, hi = _span(t)
            g = groups.setdefault(key, [lo, hi, []])
            g[0], g[1] = min(g[0], lo), max(g[1], hi)
            if name not in g[2]:
                g[2].append(name)
        self._by_storage: dict[int, int] = {}   # storage data_ptr -> index into self.groups
        try:
            for key, (lo, hi, names) in groups.items():
                self._by_storage[key] = len(self.groups)
                off, maplen = ctypes.c_uint64(), ctypes.c_uint64()
                base = rt.hk_emu_region_alloc(hi - lo, ctypes.byref(off), ctypes.byref(maplen))
                if not base:
                    raise EmulatorError(f"cannot map {hi - lo} bytes for {names[0]}")
                data = base + off.value
                if hi > lo:
                    ctypes.memmove(data, lo, hi - lo)
                # the bytes between the leading guard page and the data, and the alignment tail after it,
                # hold 0xFF: reads there give NaN / -1, and writes there are found after the launch
                pre_lo, tail_hi = base + _PAGE, data + ((hi - lo + 15) & ~15 if hi > lo else 16)
                ctypes.memset(pre_lo, 0xFF, data - pre_lo)
                ctypes.memset(data + (hi - lo), 0xFF, tail_hi - data - (hi - lo))
                self.groups.append([lo, hi, " = ".join(names), base, maplen.value, data])
        except BaseException:
            self.free()
            raise
        self._names = [ctypes.create_string_buffer(g[2].encode()) for g in self.groups]
        self.regions = (_Region * max(1, len(self.groups)))()
        for i, g in enumerate(self.groups):
            r = self.regions[i]
            r.lo, r.hi = g[5], g[5] + (g[1] - g[0])
            r.map_lo, r.map_hi = g[3], g[3] + g[4]
            r.name = ctypes.cast(self._names[i], ctypes.c_char_p)

    def check_redzones(self, kernel: str):
        """Out-of-bounds writes that hit no guard page: the 0xFF fill before and after each tensor."""
        for lo, hi, name, base, _m, data in self.groups:
            n = hi - lo
            pre = ctypes.string_at(base + _PAGE, data - base - _PAGE)
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


# ---------------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------------
class Module:
    """A compiled source. ``launch`` runs one of its kernels; ``kernels`` lists them.

    Each kernel is its own shared object (linked with --gc-sections, so its static LDS is exactly the
    __shared__ variables it reaches); each worker thread gets its own copy of that object."""

    def __init__(self, directory: Path, arch: str, kernels: dict[str, dict], name: str):
        self.directory = directory
        self.arch = arch
        self.name = name
        self._rt, _ = _runtime()
        self._libs: dict[str, list[ctypes.CDLL]] = {}
        self._infos: dict[str, list[_ModInfo]] = {}
        self.kernels: dict[str, KernelInfo] = {}
        for k, meta in kernels.items():
            lib = self._copy(k, 0)
            info = KernelInfo(k)
            fn = getattr(lib, f"hk_emu_params_{k}")
            fn.restype = ctypes.c_int
            arr = (_Param * 64)()
            n = fn(arr, 64)
            if n > 64:
                raise EmulatorError(f"kernel {k} has {n} parameters; at most 64 are supported")
            info.params = [Param(arr[i].size, arr[i].align, _KIND.get(arr[i].kind, "other")) for i in range(n)]
            if meta.get("bounds"):
                b = (ctypes.c_int * 2)()
                getattr(lib, f"hk_emu_bounds_{k}")(b)
                info.bounds = (b[0], b[1])
            mi = self._infos[k][0]
            info.static_lds = (mi.lds_hi - mi.lds_lo) if mi.lds_lo else 0
            self.kernels[k] = info

    def __repr__(self):
        return f"<emulator.Module {self.name} {self.arch} kernels={list(self.kernels)}>"

    def _copy(self, kernel: str, i: int) -> ctypes.CDLL:
        """Kernel's object for worker i (each worker thread needs its own static-LDS section). Copies
        beyond the first are written under a name unique to this process, loaded, and unlinked at once
        (the mapping stays; glibc identifies loaded objects by name, so names are never reused)."""
        with _lock:
            libs = self._libs.setdefault(kernel, [])
            infos = self._infos.setdefault(kernel, [])
            while len(libs) <= i:
                j = len(libs)
                base = self.directory / f"{kernel}.so"
                path = str(base)
                if j:
                    _copy_counter[0] += 1
                    path = str(self.directory / f".{kernel}.{os.getpid()}.{_copy_counter[0]}.so")
                    shutil.copyfile(base, path)
                try:
                    lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
                finally:
                    if j:
                        os.unlink(path)
                        _ALIASES[path] = str(base)
                info = _ModInfo()
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
        n = block[0] * block[1] * block[2]
        lo, hi = info.bounds or (1, 1024)
        if not (1 <= n <= 1024):
            raise EmulatorError(f"kernel '{kernel}': block {block} has {n} work-items; AMD allows 1..1024")
        if not (lo <= n <= hi):
            raise EmulatorError(
                f"kernel '{kernel}': block {block} has {n} work-items but the kernel declares "
                f"amdgpu_flat_work_group_size({lo}, {hi}); the hardware refuses such a launch")
        args = list(args)
        if len(args) != len(info.params):
            raise EmulatorError(f"kernel '{kernel}' takes {len(info.params)} arguments "
                                f"({', '.join(p.kind for p in info.params)}), got {len(args)}")
        arch_id, lds_limit = ARCHS[self.arch]
        items: list[tuple[torch.Tensor, str]] = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                items.append((a, f"argument {i} ({_describe_tensor(a)})"))
            elif isinstance(a, Blob):
                items += [(t, f"a tensor in struct argument {i} ({_describe_tensor(t)})") for t in a.tensors]
        items += [(t, f"extra tensor {j} ({_describe_tensor(t)})") for j, t in enumerate(tensors)]
        nblocks = grid[0] * grid[1] * grid[2]
        if threads is None:
            threads = int(os.environ.get("HK_EMU_THREADS", "0")) or (os.cpu_count() or 1)
        nw = max(1, min(int(threads), nblocks, 64))
        if timeout is None and os.environ.get("HK_EMU_TIMEOUT_S"):
            timeout = float(os.environ["HK_EMU_TIMEOUT_S"])
        for i in range(nw):
            self._copy(kernel, i)
        with _lock:
            mem = _Memory(self._rt, items)
            try:
                bufs = [_pack(a, p, mem, i, kernel) for i, (a, p) in enumerate(zip(args, info.params))]
                params = (ctypes.c_void_p * max(1, len(bufs)))(*[ctypes.addressof(b) for b in bufs])
                libs, infos = self._libs[kernel], self._infos[kernel]
                entries = (ctypes.c_void_p * nw)(*[
                    ctypes.cast(getattr(libs[i], f"hk_emu_entry_{kernel}"), ctypes.c_void_p).value
                    for i in range(nw)])
                mods = (ctypes.c_void_p * nw)(*[ctypes.addressof(infos[i]) for i in range(nw)])
                err = ctypes.create_string_buffer(16384)
                L = _Launch()
                L.abi, L.nworkers = ABI, nw
                L.entries, L.mods = ctypes.addressof(entries), ctypes.addressof(mods)
                L.params = ctypes.addressof(params)
                L.grid[:], L.block[:] = grid, block
                L.dyn_lds, L.arch, L.lds_limit = int(shared_bytes), arch_id, lds_limit
                L.flags = (0 if race_check else 1) | (0 if poison_lds else 2)
                kname = kernel.encode()
                L.kernel = kname
                L.regions, L.nregions = ctypes.addressof(mem.regions), len(mem.groups)
                L.timeout_ms = int(timeout * 1000) if timeout else 0
                L.err, L.errcap = ctypes.addressof(err), len(err)
                if shared_bytes < 0:
                    raise EmulatorError("shared_bytes must be >= 0")
                rc = self._rt.hk_emu_launch_kernel(ctypes.addressof(L))
                if rc != 0:
                    raise EmulatorError(_symbolize(err.value.decode(errors="replace")) or f"launch failed ({rc})")
                mem.check_redzones(kernel)
                mem.copy_back()
                s = L.stats
                return LaunchStats(blocks=s[0], wave_ops=s[1], barriers=s[2], switches=s[3],
                                   lds_accesses=s[4], seconds=s[5] / 1e9, workers=nw)
            finally:
                mem.free()


_copy_counter = [0]
_ALIASES: dict[str, str] = {}   # unlinked per-worker copy -> the cached object it was copied from
_PC = re.compile(r"\[pc (\S+)\+0x([0-9a-f]+)\]")


def _symbolizer() -> list[str] | None:
    c = compiler()
    cands = []
    if c and re.search(r"-(\d+)$", c[0]):
        cands.append("llvm-symbolizer-" + re.search(r"-(\d+)$", c[0]).group(1))
    cands.append("llvm-symbolizer")
    for x in cands:
        if shutil.which(x):
            return [shutil.which(x)]
    return None


def _symbolize(msg: str) -> str:
    """Turn "[pc /path/kernel.so+0x1193]" into "[at kernel.hip:12:30 in add]" when a symbolizer exists."""
    m = _PC.search(msg)
    tool = _symbolizer() if m else None
    if not m or not tool:
        return msg
    try:
        obj = _ALIASES.get(m.group(1), m.group(1))
        p = subprocess.run(tool + [f"--obj={obj}", "0x" + m.group(2)], capture_output=True, text=True,
                           timeout=20)
        lines = [x for x in p.stdout.splitlines() if x.strip()]
    except (OSError, subprocess.SubprocessError):
        return msg
    if len(lines) >= 2 and not lines[1].startswith("??"):
        where = re.sub(r"^\S*/\.build-[^/]+/", "", lines[1])   # the build dir is gone: keep the file name
        return msg[:m.start()] + f"[at {where} in {lines[0]}]" + msg[m.end():]
    return msg


def _dim3(d, what) -> tuple[int, int, int]:
    if isinstance(d, int):
        d = (d,)
    d = tuple(int(x) for x in d)
    if not 1 <= len(d) <= 3 or any(x < 0 for x in d):
        raise EmulatorError(f"{what} must be 1 to 3 non-negative ints, got {d}")
    return d + (1,) * (3 - len(d))


def _pack(a, p: Param, mem: _Memory, i: int, kernel: str):
    where = f"kernel '{kernel}' argument {i}"
    buf = (ctypes.c_uint64 * max(1, (p.size + 7) // 8))()
    if p.kind == "pointer":
        if isinstance(a, torch.Tensor):
            v = mem.translate(a.data_ptr(), a)
        elif a is None:
            v = 0
        elif isinstance(a, Scalar) and a.kind in ("ptr", "uint", "int") and a.size == 8:
            v = a.value & (2 ** 64 - 1)
        else:
            raise EmulatorError(f"{where} is a pointer: pass a CPU tensor (or None), not {type(a).__name__}")
        buf[0] = v
        return buf
    if isinstance(a, torch.Tensor):
        raise EmulatorError(f"{where} is a {p.size}-byte {p.kind} parameter, not a pointer; got a tensor")
    if isinstance(a, (Blob, bytes, bytearray, memoryview)):
        data = bytearray(a.data if isinstance(a, Blob) else bytes(a))
        if len(data) != p.size:
            raise EmulatorError(f"{where} is a {p.size}-byte {p.kind} parameter; got {len(data)} bytes")
        own = [(t, *_span(t)) for t in a.tensors] if isinstance(a, Blob) else []
        for off in range(0, len(data) - 7, 8):
            (w,) = struct.unpack_from("<Q", data, off)
            if not w:
                continue
            t = next((mem.translate(w, x) for x, lo, hi in own if lo <= w <= hi), None)   # the blob's own
            if t is None:
                t = mem.translate(w)
            if t is not None:
                struct.pack_into("<Q", data, off, t)
        ctypes.memmove(buf, bytes(data), len(data))
        return buf
    if isinstance(a, Scalar):
        if a.size != p.size:
            raise EmulatorError(f"{where} is a {p.size}-byte {p.kind}; got a {a.size}-byte {a.kind}")
        raw = a.pack()
    elif isinstance(a, (bool, int)) and p.kind in ("int", "uint", "bool"):
        fmt = {1: "b", 2: "h", 4: "i", 8: "q"}[p.size]
        if p.kind in ("uint", "bool"):
            fmt = fmt.upper()
        try:
            raw = struct.pack("<" + fmt, int(a))
        except struct.error:
            raise EmulatorError(f"{where}: {a} does not fit a {p.size}-byte {p.kind}") from None
    elif isinstance(a, (int, float)) and p.kind == "float":
        fmt = {2: "e", 4: "f", 8: "d"}.get(p.size)
        if fmt is None:
            raise EmulatorError(f"{where}: cannot pack a float into a {p.size}-byte float parameter")
        raw = struct.pack("<" + fmt, float(a))
    else:
        raise EmulatorError(f"{where}: cannot pass {type(a).__name__} to a {p.size}-byte {p.kind} parameter "
                            "(wrap it: emulator.i32(x), emulator.f32(x), ... or pass bytes)")
    ctypes.memmove(buf, raw, len(raw))
    return buf


_modules: dict[str, Module] = {}


def load(source: str, arch: str = "gfx942", *, name: str = "kernel.hip", opt_level: int = 2,
         fp_contract: str = "fast", extra_flags=()) -> Module:
    """Compile header-free HIP ``source`` for the emulated ``arch`` ("gfx942" or "gfx950"; feature
    suffixes such as ":sramecc+:xnack-" are ignored) and return its :class:`Module`.

    The shared object is cached under the hk cache dir by sha256 of source, arch, flags, header and
    compiler. fp_contract: "fast" (HIP's default: a*b+c may fuse into an FMA, as on the device),
    "on" or "off". name: the file name used in diagnostics and reports.
    """
    arch = arch.split(":")[0].strip().lower()
    if arch not in ARCHS:
        raise EmulatorError(f"unknown arch {arch!r}; the emulator models {sorted(ARCHS)}")
    if fp_contract not in ("fast", "on", "off"):
        raise EmulatorError("fp_contract must be 'fast', 'on' or 'off'")
    if "/" in name or not name:
        raise EmulatorError("name must be a plain file name")
    cxx, ver = _require_compiler()
    fma = fp_contract == "fast" and _have_fma()
    flags = [f"-O{int(opt_level)}", f"-ffp-contract={fp_contract}"] + (["-mfma"] if fma else []) + list(extra_flags)
    key = hashlib.sha256("\0".join([source, arch, name, _header_digest(), ver, " ".join(flags),
                                    str(ABI)]).encode()).hexdigest()[:24]
    with _lock:
        if key in _modules:
            return _modules[key]
        _, rt_path = _runtime()
        final_dir = _cache_root() / "mod" / key
        meta_path = final_dir / "kernels.txt"

        def build(tmp: Path) -> Path:
            src_file = tmp / name
            src_file.write_text(rewrite_source(source))
            ii = tmp / "module.ii"
            defs = ["-DHK_EMULATOR=1", f"-D__{arch}__=1"]
            _run([cxx, "-E", "-std=c++17", "-x", "c++", *defs, "-I", str(_write_headers(tmp)), "-include", "hk_emu.h",
                  name, "-o", str(ii)], tmp, f"preprocessing {name} for the emulator")
            text = ii.read_text()
            kernels = _find_kernels(text)
            if not kernels:
                raise CompileError(f"{name}: no kernel definitions found (kernels are functions declared "
                                   "__global__, e.g. `extern \"C\" __global__ void k(...) {{...}}`)")
            text = _strip_amdgpu_attrs(text)
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
            ii.write_text(text + "\n".join(glue) + "\n")
            obj = tmp / "module.o"
            _run([cxx, "-std=c++17", *flags, "-g1", "-fPIC", "-c", "-fno-omit-frame-pointer", "-fvisibility=hidden",
                  "-fstack-clash-protection",
                  "-ffunction-sections", "-fdata-sections", "-Wno-unused-command-line-argument",
                  "-Wno-ignored-attributes", "-Wno-unknown-attributes", "-x", "c++-cpp-output", str(ii),
                  "-o", str(obj)], tmp, f"compiling {name} for the emulator")
            out_dir = tmp / "out"
            out_dir.mkdir()
            script = tmp / "hk_lds.ld"
            script.write_text(_LDS_SCRIPT)
            max_align = max([al for nm, al, _sz in _elf_sections(obj)[2] if nm.startswith("hk_lds.")] or [1])
            for k in kernels:
                vmap = tmp / f"{k}.map"
                syms = [f"hk_emu_entry_{k}", f"hk_emu_params_{k}", f"hk_emu_bounds_{k}", "hk_emu_module_info_get"]
                vmap.write_text("{ global: " + " ".join(x + ";" for x in syms) + " local: *; };\n")
                _link_kernel(cxx, obj, out_dir / f"{k}.so", rt_path, vmap, script, max_align, tmp,
                             f"linking kernel {k} of {name}")
            (out_dir / "kernels.txt").write_text(
                "\n".join(f"{k}\t{'' if not m['bounds'] else m['bounds'][0] + chr(1) + m['bounds'][1]}"
                          for k, m in kernels.items()) + "\n")
            if os.environ.get("HK_EMU_KEEP_SOURCE"):
                shutil.copyfile(ii, out_dir / "module.ii")    # the preprocessed source, for debugging
            return out_dir

        if not meta_path.exists():
            final_dir.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final_dir.parent))
            try:
                out_dir = build(tmp)
                try:
                    os.replace(out_dir, final_dir)
                except OSError:
                    if not meta_path.exists():
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        kernels = {}
        for line in meta_path.read_text().splitlines():
            if not line.strip():
                continue
            k, _, b = line.partition("\t")
            kernels[k] = {"bounds": tuple(b.split(chr(1))) if b else None}
        mod = Module(final_dir, arch, kernels, name)
        _modules[key] = mod
        return mod
