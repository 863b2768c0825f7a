"""Pipeline schedules of the hip backend: which one a pipeline gets and why, and that each runs
correctly (and race-free: the emulator checks every LDS access between barriers) on both archs."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.backends.hip import HipBackend, codegen, schedule
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
    plan = schedule.make_plan(program, make_target("gfx942", runs=False), options)
    return [s.schedule for s in plan.schedules], plan


def test_pingpong_is_chosen_for_8_waves_and_3_stages():
    prog, _ = _program(_gemm(8))
    scheds, plan = _schedules(prog)
    assert scheds == ["pingpong"] and plan.threads == 512
    assert "hk::pipeline<3, hk::sched::pingpong, hk::split<" in codegen.emit(prog, plan).source


@pytest.mark.parametrize("warps,consts,why", [(4, {}, "runs 8 waves"), (8, {"STAGES": 2}, "stages >= 3")])
def test_double_buffer_otherwise(warps, consts, why):
    prog, _ = _program(_gemm(warps), **consts)
    scheds, plan = _schedules(prog)
    assert scheds == ["double_buffer"] and why in plan.schedules[0].why
    with pytest.raises(UnsupportedError, match=why.replace("(", r"\(")):
        _schedules(prog, {"schedule": "pingpong"})


def test_compute_that_needs_other_waves_is_not_pingponged():
    prog, _ = _program(_gemm(8, with_col_sum=True))
    scheds, plan = _schedules(prog)
    assert scheds == ["double_buffer"] and "column reduction" in plan.schedules[0].why


def test_schedule_option_validated():
    prog, _ = _program(_gemm(8))
    assert _schedules(prog, {"schedule": "double_buffer"})[0] == ["double_buffer"]
    with pytest.raises(UnsupportedError, match="unknown pipeline schedule"):
        _schedules(prog, {"schedule": "fastest"})


def test_cursor_loads_are_split_around_the_compute_step():
    """Every load of gemm's step is a cursor load, so its reads are issued before the compute step and
    written to LDS after it (hk::split); a load step that runs anything else keeps its loads whole."""
    prog, _ = _program(_gemm(8))
    _, plan = _schedules(prog)
    assert plan.schedules[0].prefetch == "split" and "2 cursor load(s)" in plan.schedules[0].prefetch_why
    src = codegen.emit(prog, plan).source
    assert "hk::split<hk::st<hk::bf16, 128, 32>, hk::st<hk::bf16, 32, 64, hk::colmajor>>" in src
    assert "auto hk_phase" in src and "hk::load_step(hk_phase," in src
    prog1, _ = _program(_gemm(8), STAGES=1)
    plan1 = _schedules(prog1, {"schedule": "double_buffer"})[1]
    assert plan1.schedules[0].prefetch == "whole" and "one stage" in plan1.schedules[0].prefetch_why


def _emulated(arch, schedule, K=160, M=200, N=100):
    from hk_portable.backends.hip import emulator
    ok, why = emulator.available()
    if not ok:
        pytest.skip(why)
    be = HipBackend()
    prog, (a, b, c) = _program(_gemm(8), M=M, N=N, K=K)
    art = be.compile(prog, make_target(arch, runs=True, emulated=True), {"schedule": schedule, "prefetch": "split"})
    assert [s["schedule"] for s in art.launch["plan"]["schedules"]] == [schedule]
    assert art.launch["plan"]["schedules"][0]["prefetch"] == "split"
    return be, art, (a, b, c)


def test_split_loads_that_cost_waves_fall_back_to_whole_loads(monkeypatch):
    """The split build holds a step's tiles in registers across the compute step; where that costs waves
    per SIMD the backend keeps the whole-load build and says why. `prefetch` forces either. (This 128x64 block
    on gfx950 once ran 6 waves split against 7 whole; since its LDS-DMA offsets are computed once, 2026-12-03,
    both run 7, so the occupancy table is narrowed here: one wave fewer above the whole build's VGPRs.)"""
    from hk_portable.backends.hip import backend as hip_backend, compiler
    if not compiler.available()[0]:
        pytest.skip(compiler.available()[1])
    prog, _ = _program(_gemm(8))
    be = HipBackend()
    target = make_target("gfx950", runs=False, compile_only=True)
    occupancy, seen = hip_backend.isa.occupancy, []

    def recording(arch, vgprs, lds, threads):
        seen.append(vgprs)
        return occupancy(arch, vgprs, lds, threads)
    monkeypatch.setattr(hip_backend.isa, "occupancy", recording)
    natural = be.compile(prog, target).launch["plan"]["schedules"][0]
    assert natural["prefetch"] == "split" and seen, natural              # no wave lost: the split stays
    split_vgprs = seen[0]

    def narrower(arch, vgprs, lds, threads):            # one wave fewer at the split build's VGPRs and above
        occ = dict(occupancy(arch, vgprs, lds, threads))
        if vgprs >= split_vgprs:
            occ["waves_per_simd"] -= 1
        return occ
    monkeypatch.setattr(hip_backend.isa, "occupancy", narrower)
    auto = be.compile(prog, target).launch["plan"]["schedules"][0]
    assert auto["prefetch"] == "whole" and auto["prefetch_why"].startswith("registers: split: "), auto
    forced = be.compile(prog, target, {"prefetch": "split"})
    assert forced.launch["plan"]["schedules"][0]["prefetch"] == "split"
    with pytest.raises(UnsupportedError, match="one stage"):
        _schedules(_program(_gemm(8), STAGES=1)[0], {"schedule": "double_buffer", "prefetch": "split"})


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("schedule", ["pingpong", "double_buffer"])
@pytest.mark.parametrize("K", [160, 176])          # 176: the last k-step is partial (element by element)
def test_schedules_run_correctly_on_the_emulator(arch, schedule, K):
    be, art, (a, b, c) = _emulated(arch, schedule, K)
    be.launch(art, [a, b, c], (-(-200 // 128), -(-100 // 64), 1))
    ref = a.double() @ b.double()
    bound = 4 * 2.0 ** -24 * K * (a.double().abs() @ b.double().abs())
    assert ((c.double() - ref).abs() <= bound).all()


# Bugs planted in the schedules' text (the library is inlined into the source): the emulator must catch
# each. gfx950's A tiles arrive by LDS-DMA, which the pipeline waits for by count. 256 x 128 x 160: every
# step of every block whole (a partial step loads element by element and drains the counters, which
# would hide a short wait).
COMMIT = "load(i + AHEAD, (i + AHEAD) % S, phase::commit{})"
PLANTED = {
    # double_buffer waits for one step fewer than it has in flight: tile i is read while it may still land
    "db_wait_one_short": ("double_buffer", "gfx950", "wait_oldest<LD, AHEAD - 1>(", "wait_oldest<LD, AHEAD>(",
                          "missing s_waitcnt"),
    # ping-pong drops the wait after the compute step: the other group computes a tile still landing
    "pp_no_wait": ("pingpong", "gfx950", "async_wait_all();" + " " * 23 + "// tile i+AHEAD's part of this wave has landed",
                   "/* planted: no wait */", "missing s_waitcnt"),
    # the staged registers are written to the stage other waves are computing from
    "db_commit_into_live_stage": ("double_buffer", "gfx942", COMMIT, COMMIT.replace("(i + AHEAD) % S", "i % S"),
                                  "LDS race"),
    "pp_commit_into_live_stage": ("pingpong", "gfx942", COMMIT, COMMIT.replace("(i + AHEAD) % S", "i % S"), "LDS race"),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_wait_and_stage_bugs_in_split_pipelines_are_caught(name):
    from hk_portable.backends.hip import emulator
    schedule, arch, old, new, what = PLANTED[name]
    be, art, (a, b, c) = _emulated(arch, schedule, M=256, N=128)
    assert art.source.count(old) >= 1, old
    be.launch(art, [a, b, c], (2, 2, 1))               # as generated: no error
    art.source = art.source.replace(old, new)
    with pytest.raises(emulator.EmulatorError, match=what):
        be.launch(art, [a, b, c], (2, 2, 1))
