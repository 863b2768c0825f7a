"""The cuda backend's plan (backends/cuda/plan.py): schedule.plan alone decides, each decision with its reason, and
the Plan it hands the emitter is frozen (issue 38: one schedule.py decides, the emitter renders). Offline: planning
needs neither NVRTC nor a GPU."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hk_portable.backends.cuda import archs, schedule
from hk_portable.backends.cuda.plan import DECISIONS, describe
from hk_portable.kernels import attention, layernorm
from hk_portable.kernels.gemm import candidates as gemm_candidates
from hk_portable.kernels.gemm import gemm_kernel


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _attention(d: int, masked: bool, bn: int | None = None):
    """The first candidate on two consumer warpgroups (FA3 can take it), its key block `bn` where given."""
    q = _meta(2, 4, 256, d)
    cfg = next(c for c in attention.candidates({"D": d, "MASKED": masked}) if c.get("num_warps") == 8)
    return attention.attention_fwd_kernel.trace(q, q, q, q, _meta(2, 4, 256, dtype=torch.float32), 0.1, 0, 0, 0,
                                                **{**cfg, **({"BN": bn} if bn else {})})


def _gemm():
    return gemm_kernel.trace(_meta(300, 256), _meta(256, 520), _meta(300, 520, dtype=torch.float32),
                             **gemm_candidates({})[0])


def _layernorm():
    args, consts = layernorm.example_args()
    return layernorm.dropout_residual_layernorm_kernel.trace(*args, **consts)


PROGRAMS = {"attention": lambda: _attention(128, False), "attention_causal": lambda: _attention(128, True),
            "attention_d64": lambda: _attention(64, True), "gemm": _gemm, "layernorm": _layernorm}
VARIANTS = {"base": schedule.BASE, "base_plain": schedule.Base(tma_store=False, one_ring=False, heavy_first=False),
            "fa3": schedule.FA3(), "fa3_one_q": schedule.FA3(prologue_stages=1, longest_first=0)}


@pytest.fixture(scope="module")
def programs():
    return {k: make() for k, make in PROGRAMS.items()}


def _target(arch: str):
    return archs.make_target(arch, runs=False)


def test_the_plan_is_frozen(programs):
    """Nothing changes a plan once schedule.plan made it: its fields, its pipelines' and their overlaps, and what its
    collections hold (tuples, frozensets, read-only mappings)."""
    plan = schedule.plan(programs["attention_causal"], _target("sm_90a"), schedule.FA3())
    assert plan.persistent and plan.pingpong, "FA3's plan: every part of it to look at"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.prologue_stages = 1
    with pytest.raises(TypeError):
        plan.prologue[0] = 0
    with pytest.raises(TypeError):
        plan.layouts[0] = None
    pp = next(iter(plan.pipelines.values()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        pp.schedule = "cp_async"
    with pytest.raises(TypeError):
        pp.tma_loads[0] = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        pp.overlap.head = None
    values = [getattr(plan, f.name) for f in dataclasses.fields(plan)]
    values += [getattr(p, f.name) for p in plan.pipelines.values() for f in dataclasses.fields(p)]
    assert not [v for v in values if isinstance(v, (list, dict, set))], "a mutable collection in the plan"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("kernel", sorted(PROGRAMS))
def test_every_decision_has_a_reason(programs, kernel, arch, variant):
    """Each decision of the plan is recorded with its reason where it is taken (Plan.reasons, once each), every
    pipeline's schedule with its own (PipelinePlan.why), and describe (`hk compile --emit lowered`) prints them."""
    program, target = programs[kernel], _target(arch)
    plan = schedule.plan(program, target, VARIANTS[variant])
    taken = [name for name, _ in plan.reasons]
    assert sorted(taken) == sorted(DECISIONS) and len(taken) == len(set(taken))
    assert all(why.strip() for _, why in plan.reasons) and all(pp.why for pp in plan.pipelines.values())
    text = describe(program, plan, target)
    assert all(why in text for _, why in plan.reasons)
    assert all(pp.why in text for pp in plan.pipelines.values())


def test_what_shared_memory_cannot_hold_is_given_up_in_the_schedule():
    """A block too large for the prologue's second copy and the TMA stores' staging area (attention D128 with
    128-key blocks widened to 176) keeps one copy and plain stores: decided by the schedule, with why."""
    plan = schedule.plan(_attention(128, False, bn=176), _target("sm_90a"), schedule.FA3())
    assert plan.variant == "fa3" and plan.prologue and plan.prologue_stages == 1
    assert plan.why("prologue_stages").startswith("shared memory cannot hold a second copy")
    assert not plan.tma_stores and not any(m.store for m in plan.tensor_maps)
    assert plan.why("tma_stores").startswith("shared memory cannot hold the staging area of the TMA stores")


def test_the_build_search_knobs_are_decided_in_the_plan(programs):
    """The build's knobs (backend._build) reach the emitter through the plan: a specialised block's launch bounds ask
    for one block whatever the build asked, and its register hand-over is off where the build turned it off."""
    program, target = programs["gemm"], _target("sm_90a")
    plan = schedule.plan(program, target, min_blocks=3)
    assert plan.producer_warps and plan.min_blocks == 1 and plan.hand_over.consumer > plan.hand_over.block
    off = schedule.plan(program, target, hand_over=False, fast_exp2=False)
    assert off.hand_over is None and "the build's" in off.why("hand_over") and not off.fast_exp2
    plain = schedule.plan(programs["layernorm"], _target("sm_80"), min_blocks=3)
    assert plain.min_blocks == 3 and plain.hand_over is None


def test_fa3_falls_back_to_the_base_plan_with_its_reason(programs):
    """FA3 asked of a Program that cannot take all of it (a GEMM: one product, nothing to overlap) gets the base plan,
    which says why."""
    plan = schedule.plan(programs["gemm"], _target("sm_90a"), schedule.FA3())
    assert plan.variant == "base" and not plan.persistent
    assert plan.why("variant").startswith("FA3's schedule asked, but this Program cannot take all of it")
