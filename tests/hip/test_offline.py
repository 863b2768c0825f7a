"""compiler.py's metadata parser and report, on a canned .amdgpu_metadata block (no compiler needed),
and its error when no offline compiler is installed."""
from __future__ import annotations

import pytest

from hk_portable.backends.hip import compiler
from hk_portable.interface.errors import BackendError

ASM = """\
\tv_mfma_f32_16x16x32_bf16 v[2:5], v[6:9], v[10:13], v[2:5]
\tds_read_b128 v[6:9], v1
\tglobal_load_dwordx4 v[10:13], v[14:15], off
\tv_mfma_f32_16x16x32_bf16 v[2:5], v[6:9], v[10:13], v[2:5]
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     4
    .args:
      - .offset:         0
        .size:           32
        .value_kind:     by_value
      - .offset:         32
        .size:           4
        .value_kind:     by_value
      - .offset:         40
        .size:           4
        .value_kind:     hidden_block_count_x
    .group_segment_fixed_size: 16384
    .kernarg_segment_size: 288
    .max_flat_workgroup_size: 256
    .name:           gemm_kernel
    .private_segment_fixed_size: 0
    .sgpr_count:     46
    .sgpr_spill_count: 0
    .uses_dynamic_stack: false
    .vgpr_count:     107
    .vgpr_spill_count: 0
    .wavefront_size: 64
amdhsa.target:   amdgcn-amd-amdhsa--gfx950
...
\t.end_amdgpu_metadata
"""


def test_parse_metadata():
    meta = compiler.parse_metadata(ASM)["gemm_kernel"]
    assert meta["vgpr"] == 107 and meta["agpr"] == 4 and meta["sgpr"] == 46
    assert meta["vgpr_spill"] == meta["sgpr_spill"] == meta["scratch_bytes"] == 0
    assert meta["lds_bytes"] == 16384 and meta["max_flat_workgroup_size"] == 256 and meta["dynamic_stack"] is False
    assert meta["args"] == [{"offset": 0, "size": 32, "kind": "by_value"}, {"offset": 32, "size": 4, "kind": "by_value"}]


def test_report_and_format():
    rep = compiler.report(ASM, "gemm_kernel")
    assert rep["mfma"] == {"v_mfma_f32_16x16x32_bf16": 2} and rep["ds_ops"] == 1 and rep["global_ops"] == 1
    text = compiler.format_report(rep)
    assert ";   vgpr                     107" in text and "v_mfma_f32_16x16x32_bf16 x2" in text
    with pytest.raises(BackendError, match="not in the assembly's metadata"):
        compiler.report(ASM, "other")
    with pytest.raises(BackendError, match="no .amdgpu_metadata"):
        compiler.parse_metadata("v_nop")


def test_missing_compiler_is_explained(monkeypatch):
    monkeypatch.setenv("HK_HIP_CLANG", "/nonexistent/clang")
    compiler.clang.cache_clear()
    try:
        ok, why = compiler.available()
        assert not ok and "HK_HIP_CLANG" in why
        with pytest.raises(BackendError, match="HK_HIP_CLANG"):
            compiler.compile_asm("", "gfx942")
    finally:
        monkeypatch.delenv("HK_HIP_CLANG")
        compiler.clang.cache_clear()


def test_unknown_arch_refused():
    with pytest.raises(BackendError, match="targets gfx942, gfx950"):
        compiler.compile_asm("", "gfx90a")
