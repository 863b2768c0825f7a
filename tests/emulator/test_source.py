"""How load() reads a source: kernels found after preprocessing (macros, declarations, attributes
anywhere), launch bounds as constant expressions, dynamic LDS spellings, user-defined __syncthreads."""
from __future__ import annotations

import pytest
import torch

from hk_portable.backends.hip import emulator
from hk_portable.backends.hip.emulator import rewrite_source

from emu_testutil import PRELUDE, needs_emulator, offline_compile, ziglang_available

pytestmark = needs_emulator

SRC = PRELUDE + r"""
#define NT 128
#define BOUNDS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#define KERNEL(name) extern "C" __global__ BOUNDS(NT) void name
#define __syncthreads() do { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); \
                             __builtin_amdgcn_s_barrier(); \
                             __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup"); } while (0)

extern __shared__ __attribute__((aligned(16))) float dyn_f[];      // namespace scope
extern "C" __global__ void declared_first(int* out);                // a declaration, defined below

static __device__ inline void fill(int n) {
  for (int i = (int)tid(); i < n; i += NT) HK_LDS_STORE(float, &dyn_f[i], (float)i);
}

KERNEL(from_macro)(float* out, int n) {
  fill(n);
  __syncthreads();
  extern __shared__ int dyn_i[];                                     // function scope, another type
  out[tid()] = HK_LDS_LOAD(float, &dyn_f[n - 1 - (int)tid()]) + (float)(HK_LDS_LOAD(int, &dyn_i[0]) == 0);
}

extern "C" __global__ void declared_first(int* out) { out[tid()] = (int)__builtin_amdgcn_workgroup_size_x(); }

__attribute__((amdgpu_flat_work_group_size(64, 64 * 2))) extern "C" __global__ void attr_first(int* out) {
  out[tid()] = 7;
}

extern "C" __attribute__((launch_bounds(256))) __global__ void clang_launch_bounds(int* out) { out[tid()] = 8; }

__global__ void cpp_linkage(int* out) { out[tid()] = 9; }
"""


def test_kernels_bounds_and_dynamic_lds():
    m = emulator.load(SRC, "gfx942", name="source.hip")
    assert sorted(m.kernels) == ["attr_first", "clang_launch_bounds", "cpp_linkage", "declared_first", "from_macro"]
    assert m.kernels["from_macro"].bounds == (1, 128)
    assert m.kernels["attr_first"].bounds == (64, 128)
    assert m.kernels["clang_launch_bounds"].bounds == (1, 256)
    assert m.kernels["declared_first"].bounds is None
    out = torch.zeros(128)
    n = 200
    m.launch("from_macro", 1, 128, [out, n], shared_bytes=4 * n)
    # dyn_i aliases dyn_f (both are the dynamic window): dyn_i[0] holds the bits of 0.0f
    assert torch.equal(out, (n - 1 - torch.arange(128)).float() + 1)
    o = torch.zeros(64, dtype=torch.int32)
    m.launch("declared_first", 1, 64, [o])
    assert (o == 64).all()
    with pytest.raises(emulator.EmulatorError, match=r"amdgpu_flat_work_group_size\(64, 128\)"):
        m.launch("attr_first", 1, 32, [o])
    m.launch("cpp_linkage", 1, 64, [o])
    assert (o == 9).all()


def test_rewrites_are_minimal():
    src = ('#define __shared__ __attribute__((shared))\n'
           'extern "C" __shared__ __attribute__((aligned(16))) float a[];\n'
           'static __shared__ int s[4];\n'
           '__attribute__((global)) void k() {}\n')
    out = rewrite_source(src)
    assert "#define __shared__" not in out
    assert 'extern "C" __attribute__((aligned(16))) float a[] __asm__("hk_emu_dyn_lds");' in out
    assert "static __shared__" not in out and "__shared__ int s[4];" in out
    assert "__global__ void k()" in out


def test_a_source_without_kernels_is_an_error():
    with pytest.raises(emulator.CompileError, match="no kernel definitions found"):
        emulator.load(PRELUDE + "static __device__ int f() { return 1; }\n", "gfx942")


@pytest.mark.skipif(not ziglang_available(), reason="ziglang (clang 22 for amdgcn) not installed")
def test_source_test_kernels_are_real_amd_code():
    asm = offline_compile(SRC, "gfx942")
    for k in ("from_macro", "declared_first", "attr_first"):
        assert f"{k}:" in asm
    assert "_Z11cpp_linkagePi:" in asm
