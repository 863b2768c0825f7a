"""Source -> binary for the cuda backend: NVRTC (through cupy's low-level binding) turns the generated
CUDA C++ into PTX and a cubin, ptxas's -v report into a resource report, and cuobjdump/nvdisasm a cubin
into SASS. NVRTC needs no GPU (the `nvidia-cuda-nvrtc` wheel is enough), so this works on a CPU-only
machine. The emulated target's host build is emulator.py's.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ...interface.errors import BackendError, UnsupportedError
from .options import DEFAULT

# The numerics policy's flags: part of every Artifact's options and of the cache key (compiler_version()).
NUMERICS = DEFAULT.numerics()
FLAGS = DEFAULT.nvrtc_flags()


class CompileError(BackendError):
    """NVRTC rejected the generated source; the message carries its log."""


# ---------------------------------------------------------------------------------------------- nvrtc
def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as e:  # pragma: no cover - depends on the install
        raise BackendError(f"cupy is not installed or has no NVRTC binding ({e}); install hk-portable[cuda]") from e
    return nvrtc


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    major, minor = _nvrtc().getVersion()
    return f"{major}.{minor}"


@lru_cache(maxsize=1)
def nvrtc_identity() -> str:
    """NVRTC's identity for the cache key, cheap enough for a cache hit: the libnvrtc file of the
    nvidia-cuda-nvrtc wheel (which cupy loads first, through cuda-pathfinder) by name, size and mtime.
    Without the wheel, NVRTC's own version (this loads cupy: about half a second)."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia")
        roots = list(spec.submodule_search_locations or []) if spec else []
    except (ImportError, ValueError):
        roots = []
    for root in roots:
        for sub in ("cu13/lib", "cu12/lib", "cuda_nvrtc/lib"):
            d = os.path.join(root, sub)
            if not os.path.isdir(d):
                continue
            libs = sorted(f for f in os.listdir(d) if f.startswith("libnvrtc.so"))
            if libs:
                st = os.stat(os.path.join(d, libs[-1]))
                return f"{sub}/{libs[-1]}:{st.st_size}:{int(st.st_mtime)}"
    return f"nvrtc {nvrtc_version()}"


@dataclass
class Compiled:
    ptx: str
    cubin: bytes
    log: str
    options: list[str]


def loaded_nvrtc() -> list[str]:
    """The libnvrtc files mapped into this process (Linux; [] elsewhere): which NVRTC built a kernel, when a
    process may hold another than the wheel's that `nvrtc_identity` names (torch's, a toolkit's)."""
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split(None, 5)[5].strip() for line in f
                           if "libnvrtc" in line and len(line.split(None, 5)) == 6})
    except OSError:
        return []


def compile_source(source: str, name: str, arch: str, flags: tuple[str, ...] = FLAGS) -> Compiled:
    """NVRTC: source -> (PTX, cubin for `arch`, log). CompileError carries the log and the options."""
    nvrtc = _nvrtc()
    options = [f"-arch={arch}", *flags]
    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC {nvrtc_version()} could not compile kernel '{name}' for {arch} "
                               f"({e}); options {options}\n{log}") from None
        log = nvrtc.getProgramLog(prog)
        return Compiled(nvrtc.getPTX(prog).decode().rstrip("\0"), whole_elf(bytes(nvrtc.getCUBIN(prog))), log, options)
    finally:
        nvrtc.destroyProgram(prog)


def whole_elf(image: bytes) -> bytes:
    """The ELF image padded with zeros to the extent its header declares. CuPy's getCUBIN returns one byte
    less than NVRTC wrote (it sizes the cubin as it sizes the NUL-terminated PTX), which cuts the last program
    header short: the driver loads it, nvdisasm rejects it as an invalid ELF file."""
    if len(image) < 64 or image[:4] != b"\x7fELF" or image[4] != 2:        # ELF64 only (every cubin)
        return image
    phoff, shoff = struct.unpack_from("<QQ", image, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", image, 0x36)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    return image + bytes(end - len(image)) if end > len(image) else image


_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "barriers": re.compile(r"used (\d+) barriers"),
    "static_shared_bytes": re.compile(r"(\d+) bytes smem"),
}


# ptxas' C7519/C7520 (and older C7514) notes: it ran every wgmma of the kernel synchronously (a register written
# where it had to insert a warpgroup.arrive on a divergent path, an accumulator read in flight, ...)
WGMMA_SERIALIZED = "wgmma.mma_async instructions are serialized"


def wgmma_serialized(log: str) -> bool:
    """Whether ptxas serialised the kernel's wgmma (the FA3 attention kernel lost 30 % on the H200 to it)."""
    return WGMMA_SERIALIZED in log


def ptxas_report(log: str) -> bool:
    """Whether NVRTC's log holds ptxas' resource report (-v): every kernel uses registers."""
    return _PTXAS["registers"].search(log) is not None


# the cubin's own record of a kernel's resources (.nv.info attributes, keyed by symbol index): what the ptxas report
# says, for a log that lacks it
_EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT = 0x11, 0x2F


def cubin_resources(cubin: bytes, kernel_name: str) -> dict | None:
    """Registers and stack frame of `kernel_name` from the cubin (ELF64: the .nv.info section's REGCOUNT and
    FRAME_SIZE attributes of the kernel's symbol), in parse_ptxas' keys; None where the cubin does not say. A frame
    counts as spills (the ELF keeps no split of a frame into spills and local arrays; the kernels here have none)."""
    try:
        sections = _elf_sections(cubin)
        text = sections.get(f".text.{kernel_name}")
        info = sections.get(".nv.info")
        if text is None or info is None:
            return None
        symbol = text[7] & 0xFFFFFF                      # a .text section's sh_info: its function's symbol index
        values: dict[int, int] = {}
        for attr, value in _nv_info(cubin[info[4]:info[4] + info[5]]):
            if attr in (_EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT) and len(value) == 8:
                sym, v = struct.unpack("<II", value)
                if sym == symbol:
                    values[attr] = v
    except (struct.error, ValueError, IndexError):
        return None
    if _EIATTR_REGCOUNT not in values:
        return None
    frame = values.get(_EIATTR_FRAME_SIZE, 0)
    return {"registers": values[_EIATTR_REGCOUNT], "stack_bytes": frame, "spill_stores": frame, "spill_loads": frame,
            "barriers": 0, "static_shared_bytes": 0}


def _elf_sections(elf: bytes) -> dict[str, tuple]:
    """An ELF64 (little-endian) file's section headers by name: (name, type, flags, addr, offset, size, link,
    info, align, entsize)."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * entsize) for i in range(count)]
    strtab = headers[names][4]
    return {elf[strtab + h[0]:elf.index(b"\0", strtab + h[0])].decode(): h for h in headers}


def _nv_info(data: bytes):
    """(attribute, value bytes) of an .nv.info section: a format byte (1: no value, 2: one byte, 3: two, 4: a
    16-bit size and that many bytes), then the attribute byte."""
    i = 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == 4:
            size, = struct.unpack_from("<H", data, i + 2)
            yield attr, data[i + 4:i + 4 + size]
            i += 4 + size
        elif fmt in (1, 2, 3):                           # no value, a byte, two bytes
            yield attr, data[i + 2:i + fmt + 1]
            i += fmt + 1
        else:
            return


def parse_ptxas(log: str) -> dict:
    """Registers, spills, stack frame, barriers (and static shared memory) from ptxas -v output."""
    out = {}
    for key, rx in _PTXAS.items():
        m = rx.search(log)
        out[key] = int(m.group(1)) if m else 0
    return out


# --------------------------------------------------------------------------------------------- sass
def find_disassembler() -> list[str] | None:
    """cuobjdump (or nvdisasm) from PATH, CUDA_HOME, the usual toolkit folder or Triton's bundled copy."""
    dirs = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for tool, args in (("cuobjdump", ["-sass"]), ("nvdisasm", ["-c"])):
        cands = [shutil.which(tool)] + [str(Path(d) / "bin" / tool) for d in dirs if d]
        try:
            import triton
            cands.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool))
        except Exception:  # noqa: BLE001 - triton is optional
            pass
        for c in cands:
            if c and os.path.isfile(c) and os.access(c, os.X_OK):
                return [c, *args]
    return None


def disassemble(cubin: bytes | None) -> str:
    if not cubin:
        raise UnsupportedError("cuda backend: this artifact has no cubin to disassemble")
    cmd = find_disassembler()
    if cmd is None:
        raise UnsupportedError("cuda backend: --emit sass needs a disassembler, and neither cuobjdump nor nvdisasm was "
                               "found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, triton's bundled tools); install the "
                               "CUDA toolkit or triton, or use --emit ptx")
    with tempfile.TemporaryDirectory(prefix="hk-sass-") as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(whole_elf(cubin))          # a cubin cached before whole_elf padded it
        res = subprocess.run([*cmd, path], capture_output=True, text=True)
    if res.returncode != 0:
        raise UnsupportedError(f"cuda backend: {' '.join(cmd)} failed: {res.stderr.strip()}")
    return res.stdout


