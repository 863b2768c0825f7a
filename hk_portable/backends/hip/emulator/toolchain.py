"""The host toolchain: which clang++ compiles device code for the emulator, whether the emulator can run
on this machine at all, and the code-generation flags a module is compiled with."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .errors import EmulatorError

_compiler_cache: dict = {}


def compiler() -> tuple[str, str] | None:
    """(path, version line) of the host clang++ used, or None. HK_EMU_CXX overrides the search for
    clang++-19 then clang++."""
    if "c" in _compiler_cache:
        return _compiler_cache["c"]
    cands = [os.environ["HK_EMU_CXX"]] if os.environ.get("HK_EMU_CXX") else ["clang++-19", "clang++"]
    found = None
    for c in cands:
        found = _probe(c)
        if found:
            break
    _compiler_cache["c"] = found
    return found


def _probe(c: str) -> tuple[str, str] | None:
    """(path, version line) when ``c`` is on PATH and says it is clang."""
    path = shutil.which(c)
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.splitlines()[0] if out else c
    return (path, line) if "clang" in line else None


def available() -> tuple[bool, str]:
    """Whether the emulator can run here, and why not."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        return False, f"the emulator's fiber switch is x86-64 only (this machine: {platform.machine()})"
    if compiler() is None:
        return False, ("no host clang++ found (install clang-19: `apt-get install clang-19`, "
                       "or set HK_EMU_CXX to a clang++ >= 15)")
    return True, "ok"


def require_compiler() -> tuple[str, str]:
    """compiler(), or EmulatorError saying why the emulator cannot run here."""
    ok, why = available()
    if not ok:
        raise EmulatorError(f"the HIP emulator is unavailable: {why}")
    return compiler()


def have_fma() -> bool:
    try:
        return " fma " in (" " + Path("/proc/cpuinfo").read_text().replace("\n", " ") + " ")
    except OSError:
        return False


def module_flags(opt_level: int, fp_contract: str, extra_flags) -> list[str]:
    """Code-generation flags of a module (part of its cache key). fp_contract "fast" adds -mfma where the
    CPU has FMA, so that a*b+c fuses on the host as it does on the device."""
    fma = fp_contract == "fast" and have_fma()
    return [f"-O{int(opt_level)}", f"-ffp-contract={fp_contract}"] + (["-mfma"] if fma else []) + list(extra_flags)
