"""The cuda backend fills an SM (backends/cuda/occupancy.py): a non-specialised build whose registers, not its
shared memory, keep it below the blocks an SM holds is rebuilt asking ptxas for those blocks, and kept only if
that build does not spill. The arithmetic is checked against the CUDA occupancy rules; the rebuild offline."""
from __future__ import annotations

import pytest
import torch

from hk_portable.backends.cuda import archs, occupancy
from hk_portable.kernels import attention

HOPPER = archs.ARCHS["sm_90a"]          # an H100/H200 SM: 228 KiB shared, 64 Ki registers
NOT_PLANNED = archs.ARCHS["sm_80"]      # sm_80 cubins run on every sm_8x: no one SM to plan for


@pytest.mark.parametrize("registers,threads,blocks", [
    (113, 128, 4),       # 120 a thread as allocated: 3840 a warp, 17 warps -> 16 (groups of four) -> 4 blocks
    (96, 128, 5),        # 3072 a warp: 21 -> 20 warps
    (255, 128, 2), (64, 128, 8), (32, 256, 8), (168, 384, 1),
])
def test_blocks_by_registers_follow_the_allocation_units(registers, threads, blocks):
    assert occupancy.by_registers(registers, threads, HOPPER) == blocks


def test_fill_target_asks_for_what_shared_memory_allows_only_when_registers_hold_the_block_back():
    # the 64x64 attention block: 41 KiB of shared memory (5 an SM), 113 registers (4 an SM)
    assert occupancy.fill_target(113, 128, 41984, HOPPER) == 5
    assert occupancy.fill_target(96, 128, 41984, HOPPER) is None      # already 5
    assert occupancy.fill_target(64, 128, 197632, HOPPER) is None     # shared memory: one block
    assert occupancy.fill_target(32, 1024, 0, HOPPER) is None         # threads: two blocks, as now
    assert occupancy.fill_target(40, 1024, 0, HOPPER) == 2            # 40 registers: one block of 1024
    assert occupancy.fill_target(113, 128, 41984, NOT_PLANNED) is None        # an arch without the table's SM


pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy (with NVRTC) is not installed")


def _block_64x64(left_bound: bool, **options):
    """The 64x64 attention block as the sm_90a backend builds it: causal (no left edge, the library's causal call)
    or with both edges (a sliding window)."""
    q = torch.empty(2, 4, 256, 64, dtype=torch.bfloat16, device="meta")
    args = (q, q, q, q, torch.empty(2, 4, 256, device="meta"), 0.1, 0, 256, 0)
    cfg = {**attention.config_for(64), "MASKED": True, "LEFT_BOUND": left_bound}
    from hk_portable.runtime import cache, registry
    be = registry.load("cuda")
    return cache.compile_cached(be, attention.attention_fwd_kernel.trace(*args, **cfg), be.target("sm_90a"), options)


@pytest.mark.parametrize("left_bound", [False, True])
def test_the_attention_block_is_built_for_the_blocks_its_shared_memory_allows(left_bound):
    art = _block_64x64(left_bound)
    r, threads = art.resources, art.launch["threads"]
    room = occupancy.by_shared(r["shared_bytes"], HOPPER)
    assert occupancy.by_registers(r["registers"], threads, HOPPER) == room == 5
    assert art.options["launch_bounds_min_blocks"] == 5 and f"__launch_bounds__({threads}, 5)" in art.source
    assert r["spill_stores"] == r["stack_bytes"] == 0
    # the causal block keeps the heaviest-first order; the windowed one spills with it at 96 registers (140-152
    # bytes under NVRTC 13.0 / 13.5), so it gives the order up for the fifth block (+11 % against +2.8 %)
    assert art.options["schedule"]["heavy_first"] is (not left_bound)
    assert ("#define HK_DISPATCH_AXIS 0" in art.source) is (not left_bound)
    plain = _block_64x64(left_bound, fill_sm=False)       # ptxas's own choice holds it to four
    assert plain.options["launch_bounds_min_blocks"] is None
    assert occupancy.by_registers(plain.resources["registers"], threads, HOPPER) < room


def test_a_specialised_block_is_never_capped():
    cfg = attention.candidates({"D": 128, "MASKED": False})[0]
    q = torch.empty(2, 4, 256, 128, dtype=torch.bfloat16, device="meta")
    art = attention.attention_fwd_kernel.compile(q, q, q, q, torch.empty(2, 4, 256, device="meta"), 0.1, 0, 0, 0,
                                                 backend="cuda:sm_90a", **cfg)
    assert art.launch.get("hand_over_registers") and art.options["launch_bounds_min_blocks"] is None
