"""What the hip code generator decides and refuses, and an end-to-end run of library kernels through
Kernel.__call__ with CPU tensors (the emulator) on both archs."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.backends.hip import HipBackend, codegen, schedule
from hk_portable.backends.hip.archs import make_target
from hk_portable.interface import GL, RT, ST, UnsupportedError, f32


@hk.kernel(name="big_lds")
def big_lds(x: GL[2], y: GL[2], *, R: hk.const = 128, C: hk.const = 128, S: hk.const = 2):
    buf = hk.shared(ST[x.dtype, R, C], stages=S)
    hk.load(buf[0], x, (0, 0))
    hk.store(y, hk.load(RT[x.dtype, R, C], buf[0]), (0, 0))


def _trace(**consts):
    x = torch.zeros(4, 4)
    return big_lds.trace(x, x.clone(), **consts)


def test_lds_over_the_limit_is_refused_with_the_numbers():
    prog = _trace()                                   # 2 x 128x128 f32 = 128 KiB
    t942, t950 = make_target("gfx942", runs=False), make_target("gfx950", runs=False)
    with pytest.raises(UnsupportedError, match=r"131072 bytes of LDS on gfx942 .* 65536 \(64 KiB\)"):
        HipBackend().check(prog, t942)
    HipBackend().check(prog, t950)                    # 160 KiB on gfx950


def test_waves_and_arch_are_validated():
    prog = _trace(R=16, C=16, S=1)
    with pytest.raises(UnsupportedError, match="17 waves per block"):
        schedule.make_plan(prog, make_target("gfx942", runs=False), {"waves": 17})
    bad = make_target("gfx942", runs=False).__class__(backend="hip", arch="gfx90a")
    with pytest.raises(UnsupportedError, match="gfx942, gfx950, not 'gfx90a'"):
        HipBackend().check(prog, bad)


def test_source_is_header_free_and_bounded():
    prog = _trace(R=16, C=16, S=1)
    plan = schedule.make_plan(prog, make_target("gfx950", runs=False), {"waves": 2})
    src = codegen.emit(prog, plan).source
    assert "#include" not in src and "#elif !defined(__HIPCC_RTC__)" in src
    assert "amdgpu_flat_work_group_size(1, 128)" in src and "#define HK_NUM_WARPS 2" in src


def test_scratch_is_planned_for_cross_wave_exchanges():
    @hk.kernel(name="colsum_mma")
    def k(a: GL[2], y: GL[2]):
        t = hk.load(RT[a.dtype, 64, 32], a, (0, 0))
        acc = hk.mma(t, hk.load(RT[a.dtype, 32, 32], a, (0, 0)), hk.zeros(RT[f32, 64, 32]))   # B in registers
        hk.store(y, acc + hk.col_sum(acc)[None, :], (0, 0))
    a = torch.zeros(64, 32, dtype=torch.bfloat16)
    plan = schedule.make_plan(k.trace(a, torch.zeros(64, 32)), make_target("gfx942", runs=False))
    assert plan.scratch_bytes == max(4 * 2 * 16 * 4, 32 * 32 * 2)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_library_kernels_run_emulated_through_the_public_api(arch):
    from hk_portable.backends.hip import emulator
    if not emulator.available()[0]:
        pytest.skip(emulator.available()[1])
    from hk_portable.kernels.attention import attention_fwd, reference
    from hk_portable.kernels.gemm import gemm
    be = HipBackend()
    tgt = make_target(arch, runs=True, emulated=True)

    class Pinned(HipBackend):
        def default_target(self):
            return tgt

    pinned = Pinned()
    torch.manual_seed(0)
    a, b = torch.randn(70, 90, dtype=torch.bfloat16), torch.randn(90, 50, dtype=torch.bfloat16)
    c = gemm(a, b, out_dtype=torch.float32, backend=pinned)
    ref = a.double() @ b.double()
    assert ((c.double() - ref).abs() <= 2.0 ** -20 * 90 * (a.double().abs() @ b.double().abs())).all()
    q, kk, v = (torch.randn(1, 2, 40, 64, dtype=torch.bfloat16) for _ in range(3))
    o, lse = attention_fwd(q, kk, v, causal=True, backend=pinned)
    o_ref, lse_ref = reference(q, kk, v, causal=True)
    assert (o.double() - o_ref).abs().max() < 2e-2 and (lse.double() - lse_ref).abs().max() < 1e-4
    assert be.name == "hip"
