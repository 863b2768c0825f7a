"""gfx950's LDS-DMA loads are inline assembly in the device library (hk_hip/global_shared.h, dma16); the
emulator executes that asm from its operands (emulator README, "Inline assembly"), so the operand binding the
device runs -- M0 (the LDS address), the VGPR offset, the soffset, the s_nop before the M0 read -- is what the
emulated kernel runs too. A gemm whose gfx950 build takes the asm path matches the reference; bugs planted in
the asm's binding, which the emulator did not see while it substituted the builtin, are caught."""
from __future__ import annotations

import copy

import pytest

from test_schedules import _emulated

TEMPLATE = 'asm volatile("s_nop 0\\n\\tbuffer_load_dwordx4 %0, %1, 0 offen lds"'
BINDING = '"v"(off), "s"(r), "{m0}"(m0)'

PLANTED = {
    # M0 one 16-byte chunk high: each wave's lanes write one slot on, into LDS other waves read
    "m0_one_chunk_high": (BINDING, '"v"(off), "s"(r), "{m0}"(m0 + 16)', "EmulatorError", "LDS race"),
    # the VGPR offset one chunk on: the last lane of the tile's last row reads past the tensor (inside
    # num_records, which spans whole rows from the tile's origin)
    "voffset_one_chunk_on": (BINDING, '"v"(off + 16), "s"(r), "{m0}"(m0)', "EmulatorError", "past the end"),
    # soffset 16 instead of 0 (added to the address, not range-checked)
    "soffset_16": ('0 offen lds"', '16 offen lds"', "EmulatorError", "past the end"),
    # no wait state between the compiler's M0 write and the LDS-DMA that reads it
    "no_s_nop": ('"s_nop 0\\n\\tbuffer_load', '"buffer_load', "CompileError", "wait state"),
    # without the memory clobber the device compiler may move LDS accesses across the load
    "no_memory_clobber": (BINDING + ' : "memory");', BINDING + ");", "CompileError", "memory"),
}


def test_gfx950_gemm_takes_the_asm_path_and_matches_the_reference():
    be, art, (a, b, c) = _emulated("gfx950", "double_buffer", M=256, N=128)
    assert art.source.count(TEMPLATE) == 1 and art.source.count(BINDING) == 1
    assert "__builtin_amdgcn_raw_ptr_buffer_load_lds" not in art.source     # no builtin stands in for it
    be.launch(art, [a, b, c], (2, 2, 1))
    ref = a.double() @ b.double()
    bound = 4 * 2.0 ** -24 * a.shape[1] * (a.double().abs() @ b.double().abs())
    assert ((c.double() - ref).abs() <= bound).all()


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_bugs_planted_in_the_asm_binding_are_caught(name):
    from hk_portable.backends.hip import emulator
    old, new, err, what = PLANTED[name]
    be, art, (a, b, c) = _emulated("gfx950", "double_buffer", M=256, N=128)
    assert art.source.count(old) == 1, old
    art.source = art.source.replace(old, new)
    with pytest.raises(getattr(emulator, err), match=what):
        be.launch(art, [a, b, c], (2, 2, 1))


@pytest.mark.parametrize("case_id", ["kernel/attention_fwd/bf16/B2_Hq4_Hkv2_N130_D128_full",
                                     "kernel/gemm/bf16-f32/256x256x256"])
def test_library_kernels_on_gfx950_run_the_asm_and_a_wrong_m0_fails_them(case_id, monkeypatch):
    """The conformance case passes as generated, through the asm (its source holds the binding once and the
    launch runs it); with M0 one chunk high the same case fails in the emulator (gemm's chosen 256x256x32 block, which
    the case runs since the conformance runner forwards the backend's choice, fails by its values, not the race check)."""
    from hk_portable.backends.hip import backend as hip_backend, emulator
    from hk_portable.conformance.cases import all_cases
    from hk_portable.conformance.runner import PASSED, Session
    ok, why = emulator.available()
    if not ok:
        pytest.skip(why)
    case = next(c for c in all_cases() if c.id == case_id)
    launch, launched = hip_backend.HipBackend.launch, []

    def plant(wrong_m0):
        def patched(self, art, *a, **k):
            launched.append(art.source.count(BINDING))
            if wrong_m0:     # on a copy: the artifact may be cached for later tests of this process
                art = copy.copy(art)
                art.source = art.source.replace(BINDING, '"v"(off), "s"(r), "{m0}"(m0 + 16)')
            return launch(self, art, *a, **k)
        monkeypatch.setattr(hip_backend.HipBackend, "launch", patched)

    plant(False)
    r = Session("hip", "gfx950", emulate=True, seed=11).run_case(case)
    assert r.status == PASSED, r.reason
    assert launched and all(n == 1 for n in launched)
    plant(True)
    r = Session("hip", "gfx950", emulate=True, seed=11).run_case(case)
    # caught by the emulator's race check or, where the misplaced copy lands in a buffer read later, by the values
    assert r.status != PASSED and ("LDS race" in r.reason or "outside the bound" in r.reason), r.reason
