"""Source -> binary for the hip backend.

Offline, without ROCm: the pinned clang (PyPI ziglang 0.17.1 carries clang 22.1.8, which targets both
archs) turns the generated source into AMDGPU assembly and a code object (hsaco), and the assembly's
`.amdgpu_metadata` block into a resource report. On a ROCm host, hiprtc compiles the same source for the
device's arch (`hiprtc_compile`, through hip-python) with the same flags.

Register counts depend on the LLVM version (ROCm's hiprtc is AMD's own LLVM), which is why the
compiler is pinned and part of the compile cache key. HK_HIP_CLANG may name another clang (for example
Debian's /usr/bin/clang-19, gfx942 only); its version then enters the cache key instead.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from ...interface.errors import BackendError
from . import hipapi
from .archs import NAMES as ARCHS
from .options import DEFAULT

PINNED_ZIGLANG = "0.17.1"
# what every device compile uses by default (HipOptions.device_flags): offline clang and hiprtc alike
DEVICE_FLAGS = DEFAULT.device_flags()
RESOURCE_KEYS = {           # metadata key -> report key
    "vgpr_count": "vgpr", "agpr_count": "agpr", "sgpr_count": "sgpr", "vgpr_spill_count": "vgpr_spill",
    "sgpr_spill_count": "sgpr_spill", "group_segment_fixed_size": "lds_bytes",
    "private_segment_fixed_size": "scratch_bytes", "max_flat_workgroup_size": "max_flat_workgroup_size",
    "kernarg_segment_size": "kernarg_bytes", "wavefront_size": "wavefront_size",
    "uses_dynamic_stack": "dynamic_stack",
}


class OfflineCompileError(BackendError):
    """The offline clang rejected the source (the message carries its diagnostics)."""


@lru_cache(maxsize=1)
def clang() -> tuple[list[str], str] | None:
    """(command prefix, version line) of the offline clang, or None if there is none."""
    override = os.environ.get("HK_HIP_CLANG")
    if override:
        cmd = [override]
    else:
        try:
            import ziglang  # noqa: F401 - only to see whether the pinned compiler is installed
        except ImportError:
            return None
        cmd = [sys.executable, "-m", "ziglang", "clang"]
    try:
        out = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    line = (out.stdout or "").splitlines()[0] if out.returncode == 0 and out.stdout else ""
    return (cmd, line) if "clang" in line else None


def available() -> tuple[bool, str]:
    if clang() is None:
        if os.environ.get("HK_HIP_CLANG"):
            return False, f"HK_HIP_CLANG={os.environ['HK_HIP_CLANG']!r} is not a working clang"
        return False, (f"no offline AMDGPU compiler: pip install ziglang=={PINNED_ZIGLANG} (the [hip] extra), "
                       "whose clang 22.1.8 targets gfx942 and gfx950")
    return True, "ok"


def version() -> str:
    c = clang()
    return c[1] if c else "none"


def _require() -> list[str]:
    ok, why = available()
    if not ok:
        raise BackendError(why)
    return clang()[0]


def _run(cmd: list[str], what: str, cwd: str) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if p.returncode != 0:
        log = (p.stdout + p.stderr).strip()
        if len(log) > 6000:
            log = log[:3000] + "\n...\n" + log[-3000:]
        raise OfflineCompileError(f"{what} failed (exit {p.returncode}): {' '.join(cmd)}\n{log}")


def _check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise BackendError(f"the offline compiler targets {', '.join(ARCHS)}; got {arch!r}")


def compile_asm(source: str, arch: str, name: str = "kernel", flags: tuple[str, ...] = DEVICE_FLAGS) -> str:
    """AMDGPU assembly (with its .amdgpu_metadata) of a header-free HIP source."""
    _check_arch(arch)
    cc = _require()
    with tempfile.TemporaryDirectory(prefix="hk-hip-") as d:
        src, out = Path(d) / "kernel.hip", Path(d) / "kernel.s"     # `name` is for messages only
        src.write_text(source)
        # -fuse-cuid=none: no random __hip_cuid_* symbol, so the same source gives the same bytes
        _run(cc + ["-x", "hip", f"--offload-arch={arch}", "-nogpulib", "-nogpuinc", "--cuda-device-only",
                   "-fuse-cuid=none", *flags, "-S", str(src), "-o", str(out)], f"compiling {name} for {arch}", d)
        return out.read_text()


def assemble(asm: str, arch: str, name: str = "kernel") -> bytes:
    """A code object (hsaco: an AMDGPU ELF shared object) from compile_asm's output: assemble, then link
    with ld.lld -shared (clang's HIP device link step needs an lld the ziglang wheel does not expose
    under that name, so the two steps run explicitly)."""
    _check_arch(arch)
    cc = _require()
    with tempfile.TemporaryDirectory(prefix="hk-hip-") as d:
        s, o, so = Path(d) / "kernel.s", Path(d) / "kernel.o", Path(d) / "kernel.hsaco"
        s.write_text(asm)
        _run(cc + ["--target=amdgcn-amd-amdhsa", f"-mcpu={arch}", "-c", str(s), "-o", str(o)],
             f"assembling {name} for {arch}", d)
        _run(_lld(cc) + ["-shared", str(o), "-o", str(so)], f"linking {name} for {arch}", d)
        return so.read_bytes()


def _lld(cc: list[str]) -> list[str]:
    if cc[-2:] == ["ziglang", "clang"]:
        return cc[:-1] + ["ld.lld"]
    lld = shutil.which("ld.lld") or shutil.which("ld.lld-19")
    if not lld:
        raise BackendError("linking a code object needs ld.lld (apt-get install lld-19, or use the pinned ziglang)")
    return [lld]


# -------------------------------------------------------------------------------------------- hiprtc
def hiprtc_compile(source: str, arch: str, name: str, flags: tuple[str, ...] = DEVICE_FLAGS) -> bytes:
    """A code object for `arch` from the generated source, through hiprtc (needs ROCm)."""
    hiprtc = hipapi.hiprtc()
    prog = hipapi.ok(hiprtc.hiprtcCreateProgram(source.encode(), b"kernel.hip", 0, [], []),
                     "hiprtcCreateProgram")
    try:
        opts = [f"--offload-arch={arch}".encode()] + [f.encode() for f in flags]
        result = hiprtc.hiprtcCompileProgram(prog, len(opts), opts)
        err = result[0] if isinstance(result, tuple) else result
        if hipapi.is_error(err):
            raise hipapi.HipError(f"hiprtc could not compile {name} for {arch}: {hipapi.error_text(err)}\n"
                                  f"{_log(hiprtc, prog)}")
        size = hipapi.ok(hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
        code = bytearray(int(size))
        hipapi.ok(hiprtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
        return bytes(code)
    finally:
        hiprtc.hiprtcDestroyProgram(prog)


def _log(hiprtc, prog) -> str:
    try:
        n = hipapi.ok(hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
        buf = bytearray(int(n))
        hipapi.ok(hiprtc.hiprtcGetProgramLog(prog, buf), "hiprtcGetProgramLog")
        return buf.decode(errors="replace").rstrip("\0")
    except Exception as e:  # noqa: BLE001
        return f"(no log: {e})"


# ------------------------------------------------------------------------------------------- metadata
_META = re.compile(r"^\s*\.amdgpu_metadata\s*$(.*?)^\s*\.end_amdgpu_metadata", re.M | re.S)


def _scalar(v: str):
    v = v.strip()
    if v in ("true", "false"):
        return v == "true"
    try:
        return int(v)
    except ValueError:
        return v


def parse_metadata(asm: str) -> dict[str, dict]:
    """Kernel name -> resource report, from the assembly's .amdgpu_metadata block (YAML, read here
    line by line: kernel-level keys sit at indent 4, argument keys deeper)."""
    m = _META.search(asm)
    if not m:
        raise BackendError("the assembly has no .amdgpu_metadata block")
    kernels: list[dict] = []
    args_of: list[list[dict]] = []
    for line in m.group(1).splitlines():
        km = re.match(r"^(  - |    )\.(\w+):\s*(.*)$", line)
        am = re.match(r"^      (- |  )\.(\w+):\s*(.*)$", line)
        if km:
            if km.group(1) == "  - ":
                kernels.append({})
                args_of.append([])
            kernels[-1][km.group(2)] = _scalar(km.group(3))
        elif am and kernels:
            if am.group(1) == "- ":
                args_of[-1].append({})
            args_of[-1][-1][am.group(2)] = _scalar(am.group(3))
    out = {}
    for k, args in zip(kernels, args_of):
        rep = {RESOURCE_KEYS[key]: k[key] for key in RESOURCE_KEYS if key in k}
        rep["args"] = [{"offset": a.get("offset"), "size": a.get("size"), "kind": a.get("value_kind")}
                       for a in args if not str(a.get("value_kind", "")).startswith("hidden_")]
        out[str(k.get("name"))] = rep
    return out


def isa_summary(asm: str) -> dict:
    """Counts of the instructions CI checks for: MFMA variants, LDS and global memory ops, scratch."""
    mfma: dict[str, int] = {}
    for name in re.findall(r"^\s+(v_mfma_\w+)", asm, re.M):
        mfma[name] = mfma.get(name, 0) + 1
    count = lambda pat: len(re.findall(pat, asm, re.M))  # noqa: E731
    return {"mfma": mfma, "ds_ops": count(r"^\s+ds_\w+"), "global_ops": count(r"^\s+(global|buffer)_\w+"),
            "flat_ops": count(r"^\s+flat_\w+"), "scratch_ops": count(r"^\s+scratch_\w+"),
            "lines": asm.count("\n")}


def report(asm: str, kernel: str) -> dict:
    """The resource report of one kernel plus its instruction summary (the Artifact's `resources`)."""
    meta = parse_metadata(asm)
    if kernel not in meta:
        raise BackendError(f"kernel {kernel!r} not in the assembly's metadata (found {sorted(meta)})")
    return {**meta[kernel], **isa_summary(asm)}


def format_report(res: dict) -> str:
    """The resource report as assembly comments (shown at the top of `hk compile --emit asm`)."""
    keys = ("vgpr", "agpr", "sgpr", "vgpr_spill", "sgpr_spill", "lds_bytes", "scratch_bytes",
            "max_flat_workgroup_size", "kernarg_bytes")
    lines = ["; hk_portable resource report (from .amdgpu_metadata)"]
    lines += [f";   {k:<24} {res.get(k)}" for k in keys if k in res]
    if res.get("mfma"):
        lines.append(";   mfma                     " + ", ".join(f"{k} x{v}" for k, v in sorted(res["mfma"].items())))
    for k in ("waves", "schedule", "compiler"):
        if k in res:
            lines.append(f";   {k:<24} {res[k]}")
    return "\n".join(lines) + "\n"
