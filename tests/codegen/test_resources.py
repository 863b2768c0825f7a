"""Shared-memory sizing (codegen/resources.py): one arena layout and one mma scratch formula for both
backends, with each backend's own alignment; the byte counts each backend reports are unchanged."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.backends.cuda import codegen as cuda_codegen
from hk_portable.backends.cuda import footprint as cuda_footprint
from hk_portable.backends.cuda import schedule as cuda_schedule
from hk_portable.backends.cuda.archs import make_target as cuda_target
from hk_portable.backends.hip import schedule as hip_schedule
from hk_portable.backends.hip.archs import make_target as hip_target
from hk_portable.codegen import resources
from hk_portable.interface import GL, RT, ST, bf16, f32


class _T:
    def __init__(self, rows, cols, space, nbytes=0, dtype=bf16):
        self.rows, self.cols, self.space, self.nbytes, self.dtype = rows, cols, space, nbytes, dtype


def test_round_up_and_arena_layout():
    assert [resources.round_up(x, 16) for x in (0, 1, 16, 17)] == [0, 16, 16, 32]
    offsets, total = resources.arena_layout([_T(0, 0, "st", 100), _T(0, 0, "st", 300), _T(0, 0, "st", 8)])
    assert offsets == [0, 128, 512] and total == 520
    assert resources.scratch_offset(total) == 640 and resources.shared_bytes(total, 64) == 704
    assert resources.shared_bytes(0, 64) == 64


def test_mma_scratch_formula_with_each_backends_alignment():
    a_t, b_rt, b_st = _T(24, 24, "rt"), _T(32, 8, "rt"), _T(32, 8, "st")
    # transposed register A: 24*24*2 = 1152 bytes, rounded to the library's alignment; then register B
    assert resources.mma_scratch_bytes(a_t, b_rt, True, 128) == 1152 + 512
    assert resources.mma_scratch_bytes(_T(24, 20, "rt"), b_rt, True, 128) == 1024 + 512
    assert resources.mma_scratch_bytes(_T(24, 20, "rt"), b_rt, True, 16) == 960 + 512
    assert resources.mma_scratch_bytes(a_t, b_st, False, 128) == 0
    assert resources.scratch_bytes([1, 2, 3], lambda op: 10 * op, 16) == 32
    assert resources.scratch_bytes([1], lambda op: 0, 16) == 0


@hk.kernel(name="two_buffers_colsum")
def two_buffers(a: GL[2], y: GL[2]):
    s1 = hk.shared(ST[f32, 16, 20])                       # 1280 bytes
    s2 = hk.shared(ST[f32, 32, 32])                       # 4096 bytes, at 1280
    hk.load(s1, a, (0, 0))
    hk.load(s2, a, (0, 0))
    t = hk.load(RT[f32, 64, 32], a, (0, 0))
    hk.store(y, t + hk.col_sum(t)[None, :], (0, 0))


def test_both_backends_size_the_same_program_as_before():
    prog = two_buffers.trace(torch.zeros(64, 32), torch.zeros(64, 32))
    assert resources.arena_bytes(prog) == 1280 + 4096
    # cuda: buffers start 1024-aligned (the 128-byte swizzle atom), so s2 sits at 2048; 4 warps, a 64-row
    # column sum -> 4 * 32 * 4 = 512 bytes scratch after the arena rounded to 128
    assert resources.arena_layout([v.type for v in (op.result for op in prog.shared_buffers())],
                                  cuda_footprint.BUFFER_ALIGN) == ([0, 2048], 2048 + 4096)
    sm80, sm90 = cuda_target("sm_80", runs=False), cuda_target("sm_90a", runs=False)
    emitted, total = cuda_codegen.emit(prog, sm80, cuda_schedule.plan(prog, sm80))
    assert emitted.shared_bytes == 6144 and total == 6144 + 512
    assert "#define HK_SCRATCH_OFFSET 6144" in emitted.source and "#define HK_SCRATCH_BYTES 512" in emitted.source
    # sm_90a also reserves the slack smem_base() rounds the window up by
    _, total90 = cuda_codegen.emit(prog, sm90, cuda_schedule.plan(prog, sm90))
    assert total90 == total + cuda_footprint.base_slack(sm90) == total + 1024
    # hip: 4 waves x 2 column blocks x 16 x 4 = 512 bytes, 16-byte granule
    plan = hip_schedule.make_plan(prog, hip_target("gfx942", runs=False))
    assert (plan.arena_bytes, plan.scratch_bytes, plan.lds_bytes) == (5376, 512, 5376 + 512)
