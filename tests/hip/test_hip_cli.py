"""`hk compile KERNEL --backend hip --target gfx942|gfx950 --emit source|asm|hsaco` on a machine without
ROCm (the pinned offline clang), and `hk backends` listing hip with its reason and targets."""
from __future__ import annotations

import json

import pytest

from hk_portable.backends.hip import compiler
from hk_portable.cli import main

needs_clang = pytest.mark.skipif(not compiler.available()[0], reason=compiler.available()[1])
MFMA = {"gfx942": "v_mfma_f32_16x16x16_bf16", "gfx950": "v_mfma_f32_16x16x32_bf16"}
# the MFMA of the configuration hk compile launches: gemm's 256x256 blocks step K by 16 on gfx942 (16x16x16) and
# by 32 on gfx950 (16x16x32, the hip tuning table's rule)
KERNEL_MFMA = {("gemm", "gfx942"): MFMA["gfx942"], ("gemm", "gfx950"): MFMA["gfx950"],
               ("attention_fwd", "gfx942"): MFMA["gfx942"], ("attention_fwd", "gfx950"): MFMA["gfx950"]}


@needs_clang
@pytest.mark.parametrize("kernel", ["gemm", "attention_fwd"])
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_compile_emit_asm(kernel, arch, capsys):
    assert main(["compile", kernel, "--backend", "hip", "--target", arch, "--emit", "asm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("; hk_portable resource report")
    for key in ("vgpr", "agpr", "sgpr", "vgpr_spill", "sgpr_spill", "lds_bytes", "scratch_bytes",
                "max_flat_workgroup_size"):
        assert f";   {key} " in out
    assert KERNEL_MFMA[kernel, arch] in out and f'.amdgcn_target "amdgcn-amd-amdhsa--{arch}"' in out
    assert ";   vgpr_spill               0" in out and ";   sgpr_spill               0" in out


@needs_clang
def test_compile_emit_hsaco_and_source(tmp_path, capsys):
    path = tmp_path / "gemm.hsaco"
    assert main(["compile", "gemm", "--backend", "hip", "--target", "gfx950", "--emit", "hsaco", "-o", str(path)]) == 0
    elf = path.read_bytes()
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 0xE0     # EM_AMDGPU
    assert b"gemm_kernel" in elf
    assert main(["compile", "gemm", "--backend", "hip", "--target", "gfx942", "--emit", "source"]) == 0
    src = capsys.readouterr().out
    assert "#elif !defined(__HIPCC_RTC__)" in src and "amdgpu_flat_work_group_size(1, 512)" in src   # 8 waves
    assert "#include" not in src                           # header-free


def test_backends_lists_hip_with_reason_and_targets(capsys):
    assert main(["backends", "--json"]) == 0
    hip = next(b for b in json.loads(capsys.readouterr().out) if b["name"] == "hip")
    if hip["available"]:
        pytest.skip("a ROCm device is present")
    assert hip["reason"].startswith("no ROCm runtime")
    assert "gfx942 (compile-only)" in hip["targets"] and "gfx950 (compile-only)" in hip["targets"]
