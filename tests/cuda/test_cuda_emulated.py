"""The cuda backend's generated code and device library on the CPU emulation (no GPU): a sample of the
conformance suite, two cases of every op family plus small kernel cases, judged exactly as on a GPU
(exact tier bit for bit, against float64 math and the reference backend). The emulation runs one thread
per CUDA thread with lane-accurate ldmatrix / mma.sync / shfl, so layouts, swizzles, bounds and pipelines
are what is checked; the real instructions are checked by `hk conformance --backend cuda` on a GPU."""
from __future__ import annotations

import collections
import functools
import shutil

import pytest
import torch

import hk_portable as hk
from hk_portable.backends.cuda import CudaBackend
from hk_portable.conformance import runner
from hk_portable.conformance.cases import all_cases
from hk_portable.interface import GL, RT, f32

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                                reason="no host C++ compiler for the cuda emulation")

KERNEL_CASES = ("kernel/gemm/bf16-f32/17x33x65", "kernel/gemm/f16-f16/100x70x130",
                "kernel/attention_fwd/bf16/B1_Hq2_Hkv1_N77_D64_causal",
                "kernel/dropout_residual_layernorm/bf16/33x1000_p0.1",
                "kernel/layernorm_bwd/bf16/ln_33x1000_p0.1_bias_dh",
                "kernel/attention_varlen/bf16/q113-0-50_k203-5-20_Hq2_Hkv1_D64_causal_bottom_right",
                "kernel/attention_kvcache/bf16/L1-77-300_Nq1_Hq8_Hkv2_D128_page16_splits3")


@functools.cache
def _cases() -> dict:
    return {c.id: c for c in all_cases()}


def _sample() -> list[str]:
    per_family = collections.defaultdict(list)
    for c in _cases().values():
        fam = "/".join(c.id.split("/")[:2])
        if c.kind == "op" and len(per_family[fam]) < 2:
            per_family[fam].append(c.id)
    return [i for ids in per_family.values() for i in ids] + list(KERNEL_CASES)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HK_CACHE_DIR", str(tmp_path_factory.mktemp("hk_emu_cache")))
        yield runner.Session(CudaBackend(), "sm_80", emulate=True, seed=7)


@pytest.mark.parametrize("case_id", _sample())
def test_conformance_case_on_emulated_cuda(session, case_id):
    r = session.run_case(_cases()[case_id])
    assert r.status == runner.PASSED, r.reason


@hk.kernel
def twice(x: GL[2], y: GL[2]):
    hk.store(y, hk.load(RT[f32, 16, 16], x, (0, 0)) * 2.0, (0, 0))


def test_the_emulator_is_an_emulated_target_of_cuda():
    be = CudaBackend()
    t = be.target("sm_80", emulated=True)
    assert t.spec == "cuda:sm_80:emulated" and t.has("run") and not t.compile_only
    cpu = torch.device("cpu")
    assert be.accepts_device(cpu) and not be.claims_device(cpu)
    x = torch.randn(16, 16)
    y = torch.zeros(16, 16)
    twice(x, y, grid=(1,), backend=be, target=t)
    assert torch.equal(y, x * 2)


def test_gemm_blocks_in_grouped_order_cover_the_grid():
    """The schedule pass orders a GEMM's blocks in runs of 8 x-rows (HK_BLOCK_GROUPED); on a 10 x 3 grid (a
    whole run and a partial one) every output tile is still written exactly once."""
    from hk_portable.backends.cuda import schedule
    from hk_portable.kernels.gemm import gemm, gemm_kernel
    be = CudaBackend()
    tgt = be.target("sm_80", emulated=True)
    a, b = torch.randn(640, 64, dtype=torch.bfloat16), torch.randn(64, 192, dtype=torch.bfloat16)
    assert schedule.plan(gemm_kernel.trace(a, b, torch.empty(640, 192)), tgt).grouped_blocks
    out = torch.full((640, 192), float("nan"))
    gemm(a, b, out, backend=be.name + ":sm_80:emulated", BM=64, BN=64, BK=32, STAGES=2)
    torch.testing.assert_close(out, a.float() @ b.float(), rtol=2e-3, atol=2e-3)
