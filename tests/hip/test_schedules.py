"""Pipeline schedules of the hip backend: which one a pipeline gets and why, and that each runs
correctly (and race-free: the emulator checks every LDS access between barriers) on both archs."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.backends.hip import HipBackend, codegen
from hk_portable.backends.hip.archs import make_target
from hk_portable.interface import GL, RT, ST, UnsupportedError, f32


def _gemm(num_warps: int, with_col_sum: bool = False):
    @hk.kernel(num_warps=num_warps, name=f"gemm_w{num_warps}{'_colsum' if with_col_sum else ''}")
    def k(a: GL[2], b: GL[2], c: GL[2], *, BM: hk.const = 128, BN: hk.const = 64, BK: hk.const = 32,
          STAGES: hk.const = 3):
        m, n = hk.block_idx(0), hk.block_idx(1)
        a_s = hk.shared(ST[a.dtype, BM, BK], stages=STAGES)
        b_s = hk.shared(ST[b.dtype, BK, BN], stages=STAGES)

        def load(kk, s):
            hk.load(a_s[s], a, (m, kk))
            hk.load(b_s[s], b, (kk, n))

        def compute(kk, s, acc):
            acc = hk.mma(a_s[s], b_s[s], acc)
            if with_col_sum:                     # a column reduction talks across waves
                acc = acc + (hk.col_sum(acc) * 0.0)[None, :]
            return acc

        acc = hk.pipeline(hk.cdiv(a.shape[1], BK), load, compute, carry=hk.zeros(RT[f32, BM, BN]), stages=STAGES)
        hk.store(c, acc, (m, n))
    return k


def _program(kern, M=200, N=100, K=160, **consts):
    a = torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(K, N, dtype=torch.bfloat16)
    c = torch.full((M, N), float("nan"))
    return kern.trace(a, b, c, **consts), (a, b, c)


def _schedules(program, options=None):
    plan = codegen.make_plan(program, make_target("gfx942", runs=False), options)
    return [s["schedule"] for s in plan.schedules], plan


def test_pingpong_is_chosen_for_8_waves_and_3_stages():
    prog, _ = _program(_gemm(8))
    scheds, plan = _schedules(prog)
    assert scheds == ["pingpong"] and plan.threads == 512
    assert "hk::pipeline<3, hk::sched::pingpong>" in codegen.emit(prog, plan).source


@pytest.mark.parametrize("warps,consts,why", [(4, {}, "runs 8 waves"), (8, {"STAGES": 2}, "stages >= 3")])
def test_double_buffer_otherwise(warps, consts, why):
    prog, _ = _program(_gemm(warps), **consts)
    scheds, plan = _schedules(prog)
    assert scheds == ["double_buffer"] and why in plan.schedules[0]["why"]
    with pytest.raises(UnsupportedError, match=why.replace("(", r"\(")):
        _schedules(prog, {"schedule": "pingpong"})


def test_compute_that_needs_other_waves_is_not_pingponged():
    prog, _ = _program(_gemm(8, with_col_sum=True))
    scheds, plan = _schedules(prog)
    assert scheds == ["double_buffer"] and "column reduction" in plan.schedules[0]["why"]


def test_schedule_option_validated():
    prog, _ = _program(_gemm(8))
    assert _schedules(prog, {"schedule": "double_buffer"})[0] == ["double_buffer"]
    with pytest.raises(UnsupportedError, match="unknown pipeline schedule"):
        _schedules(prog, {"schedule": "fastest"})


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("schedule", ["pingpong", "double_buffer"])
def test_schedules_run_correctly_on_the_emulator(arch, schedule):
    from hk_portable.backends.hip import emulator
    ok, why = emulator.available()
    if not ok:
        pytest.skip(why)
    be = HipBackend()
    prog, (a, b, c) = _program(_gemm(8))
    art = be.compile(prog, make_target(arch, runs=True, emulated=True), {"schedule": schedule})
    assert [s["schedule"] for s in art.launch["plan"]["schedules"]] == [schedule]
    be.launch(art, [a, b, c], (-(-200 // 128), -(-100 // 64), 1))
    ref = a.double() @ b.double()
    bound = 4 * 2.0 ** -24 * 160 * (a.double().abs() @ b.double().abs())
    assert ((c.double() - ref).abs() <= bound).all()
