"""Compile and inspect a kernel without running it: `Kernel.compile(*example_args, backend=SPEC)` for every
backend and target (including emulated ones), and `hk compile MODULE:KERNEL` for a user's module."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hk_portable.cli import main
from hk_portable.interface import BackendError
from hk_portable.kernels.gemm import gemm_kernel

META = dict(device="meta")
USER = str(Path(__file__).parent / "data" / "user_kernel.py")


def _gemm_args():
    a, b = torch.empty(256, 128, dtype=torch.bfloat16, **META), torch.empty(128, 64, dtype=torch.bfloat16, **META)
    return a, b, torch.empty(256, 64, dtype=torch.float32, **META)


def test_reference_artifact_is_the_program():
    art = gemm_kernel.compile(*_gemm_args(), backend="reference")
    assert art.source == str(gemm_kernel.trace(*_gemm_args())) and "mma" in art.source


@pytest.mark.parametrize("spec,mfma", [("hip:gfx942", "v_mfma_f32_16x16x16"), ("hip:gfx950", "v_mfma_f32_16x16x32")])
def test_hip_artifact_has_the_isa_and_resources(spec, mfma):
    art = gemm_kernel.compile(*_gemm_args(), backend=spec)
    if art.asm is None:
        pytest.skip(f"no offline AMDGPU compiler: {art.resources.get('offline')}")
    assert mfma in art.asm
    assert art.resources["vgpr_spill"] == 0 and art.resources["lds_bytes"] > 0


def test_emulated_and_compile_only_targets_are_different_artifacts():
    a = gemm_kernel.compile(*_gemm_args(), backend="hip:gfx942:emulated")
    b = gemm_kernel.compile(*_gemm_args(), backend="hip:gfx942")
    assert a.target == b.target == "gfx942" and a.source == b.source
    assert a is not b                           # keyed by target.spec: the emulated one runs on the CPU
    # target= takes the spelling the "no target" error lists ('gfx942:emulated') as backend= does
    assert gemm_kernel.compile(*_gemm_args(), backend="hip", target="gfx942:emulated") is a


def test_cuda_artifact_has_ptx():
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    art = gemm_kernel.compile(*_gemm_args(), backend="cuda:sm_80")
    if art.asm is None:
        pytest.skip("NVRTC unavailable")
    assert "mma.sync.aligned.m16n8k16" in art.asm and art.resources["spill_stores"] == 0


def test_meta_tensors_need_a_named_backend():
    with pytest.raises(BackendError, match="meta"):
        gemm_kernel.compile(*_gemm_args())


def test_hk_compile_a_users_module(capsys):
    assert main(["compile", f"{USER}:scale_rows", "--backend", "reference", "--emit", "ir"]) == 0
    assert "kernel @scale_rows" in capsys.readouterr().out
    assert main(["compile", f"{USER}:scale_rows", "--backend", "hip:gfx942",
                 "--emit", "source"]) == 0
    assert 'extern "C"' in capsys.readouterr().out


@pytest.mark.parametrize("spec,match", [
    (f"{USER}:nope", "has no hk.kernel named 'nope'"),
    (USER.replace("user_kernel", "missing") + ":k", "cannot import"),
    ("hk_portable.kernels.gemm:gemm", "has no hk.kernel named 'gemm'"),
])
def test_hk_compile_names_what_is_wrong(spec, match, capsys):
    assert main(["compile", spec, "--backend", "reference", "--emit", "ir"]) != 0
    assert match in capsys.readouterr().err


def test_precompile_records_a_steps_kernels_and_compiles_them_before_it_runs(tmp_path, monkeypatch):
    """hk.precompile runs the step with launches recorded (nothing compiled or run during it), compiles each
    distinct build in worker processes through the cache, and leaves them in the kernels' memos: the real step
    that follows compiles nothing."""
    import hk_portable as hk
    import hk_portable.torch_ops  # noqa: F401  (registers torch.ops.hk)
    from hk_portable.runtime import launch
    monkeypatch.setenv("HK_CACHE_DIR", str(tmp_path))
    a = torch.randn(40, 24, dtype=torch.bfloat16)
    w = torch.randn(16, 24, dtype=torch.bfloat16)
    step = lambda: torch.ops.hk.gemm(a, w.t())        # noqa: E731  (the kernel's B_NK form)
    with hk.use_backend("cuda:sm_80:emulated"):
        report = hk.precompile(step, workers=2)
        assert [(r["kernel"], r["target"], r["error"]) for r in report] == [
            ("gemm_kernel", "cuda:sm_80:emulated", None)]
        compiled = []
        monkeypatch.setattr(launch, "compile_program", lambda *x: compiled.append(x) or 1 / 0)
        out = step()
    assert not compiled
    assert torch.allclose(out.float(), a.float() @ w.float().t(), atol=1e-1, rtol=1e-2)
