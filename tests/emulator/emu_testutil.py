"""Shared bits of the emulator self-tests: the header-free prelude every test kernel starts with, and the
skip conditions (no host clang++ -> the tests skip with the reason; no ziglang -> offline checks skip)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hk_portable.backends.hip import emulator

OK, WHY = emulator.available()
needs_emulator = pytest.mark.skipif(not OK, reason=f"HIP emulator unavailable: {WHY}")

# Every test kernel is header-free HIP: this guard makes the same text compile under hiprtc, offline
# clang for amdgcn, and the emulator (which force-includes hk_emu.h and defines HK_EMULATOR).
PRELUDE = r"""
#if defined(HK_EMULATOR)
/* the emulator's hk_emu.h provides everything */
#elif !defined(__HIPCC_RTC__)
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#endif
#ifndef HK_LDS_LOAD
#define HK_LDS_LOAD(T, p) (*(const T*)(p))
#define HK_LDS_STORE(T, p, v) (*(T*)(p) = (v))
#endif
typedef short short4_t __attribute__((ext_vector_type(4)));
typedef float float4_t __attribute__((ext_vector_type(4)));
typedef float float16_t __attribute__((ext_vector_type(16)));
typedef int int4_t __attribute__((ext_vector_type(4)));
typedef int int16_t_ __attribute__((ext_vector_type(16)));
typedef _Float16 half4_t __attribute__((ext_vector_type(4)));
typedef _Float16 half8_t __attribute__((ext_vector_type(8)));
typedef __bf16 bf16x8_t __attribute__((ext_vector_type(8)));
typedef unsigned uint2_t __attribute__((ext_vector_type(2)));
typedef unsigned uint4_t __attribute__((ext_vector_type(4)));
static __device__ inline unsigned tid() { return __builtin_amdgcn_workitem_id_x(); }
"""


def ziglang_available() -> bool:
    try:
        import ziglang  # noqa: F401
        return True
    except ImportError:
        return False


def offline_compile(source: str, arch: str) -> str:
    """Compile `source` for the real device with ziglang's clang 22 (-S) and return the assembly."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.hip"
        f.write_text(source)
        out = Path(d) / "k.s"
        p = subprocess.run([sys.executable, "-m", "ziglang", "clang", "-x", "hip", f"--offload-arch={arch}",
                            "-nogpulib", "-nogpuinc", "--cuda-device-only", "-O3", "-S", str(f), "-o", str(out)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise AssertionError(f"offline compile for {arch} failed:\n{p.stderr}")
        return out.read_text()
