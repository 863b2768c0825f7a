"""Host C++ programs for the tests that check the device libraries' plain integer maps and arithmetic on the host
(hk_core's block orders and dividers, the cuda library's tile orders): build one with the host compiler and run it.
A test calling `run` skips where no host compiler exists."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CXX = shutil.which("g++") or shutil.which("clang++")


def run(source: str, workdir: Path, name: str, *, what: str, flags=(), stdin: str | None = None) -> str:
    """The standard output of `source`, built as C++17 at -O1 with `flags` into workdir/name and run (reading
    `stdin`). Skips the calling test where no host compiler exists; `what` says what it would have built."""
    if CXX is None:
        pytest.skip(f"no host C++ compiler (g++/clang++) to build {what}")
    src, exe = workdir / f"{name}.cpp", workdir / name
    src.write_text(source)
    subprocess.run([CXX, "-std=c++17", "-O1", *flags, str(src), "-o", str(exe)], check=True, capture_output=True)
    return subprocess.run([str(exe)], input=stdin, check=True, capture_output=True, text=True).stdout
