"""The XCD-aware block remap with grouped ordering must be a bijection of the grid (else blocks would
be skipped or run twice): checked for many grids in Python, and on the emulator against the mirror."""
from __future__ import annotations

import itertools

import pytest
import torch

from hk_portable.backends.hip import codegen, schedule

GRIDS = [(1, 1, 1), (7, 1, 1), (8, 1, 1), (9, 1, 1), (5, 3, 2), (16, 16, 1), (3, 17, 1), (17, 3, 4),
         (64, 5, 1), (1, 9, 3), (13, 13, 13)]


@pytest.mark.parametrize("grid", GRIDS + [(gx, gy, 1) for gx, gy in itertools.product((1, 2, 7, 8, 9, 24), repeat=2)])
def test_remap_is_a_bijection(grid):
    n = grid[0] * grid[1] * grid[2]
    seen = {schedule.block_remap(hw, grid) for hw in range(n)}
    assert len(seen) == n
    assert all(0 <= x < grid[0] and 0 <= y < grid[1] and 0 <= z < grid[2] for x, y, z in seen)


def test_xcd_ranges_are_contiguous():
    n = 37
    for xcd in range(8):
        ids = sorted(schedule.xcd_remap(b, n) for b in range(xcd, n, 8))
        assert ids == list(range(ids[0], ids[0] + len(ids)))


def test_grouped_ordering_keeps_neighbours_together():
    # the first 8*gy logical ids cover x-rows 0..7 only: eight blocks of A rows share one B column tile
    gx, gy = 32, 4
    xs = {schedule.grouped(l, gx, gy)[0] for l in range(8 * gy)}
    assert xs == set(range(8))


SOURCE = """
#define HK_NUM_WARPS 1
#define HK_NUM_THREADS 64
{header}
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 64))) void remap(int* out) {{
  if (__builtin_amdgcn_workitem_id_x() == 0) {{
    const unsigned gx = hk::num_blocks<0>(), gy = hk::num_blocks<1>();
    const unsigned hw = __builtin_amdgcn_workgroup_id_x() + gx * (__builtin_amdgcn_workgroup_id_y() +
                                                               gy * __builtin_amdgcn_workgroup_id_z());
    out[3 * hw + 0] = hk::block_idx<0>();
    out[3 * hw + 1] = hk::block_idx<1>();
    out[3 * hw + 2] = hk::block_idx<2>();
  }}
}}
"""


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_device_remap_matches_the_mirror(arch):
    from hk_portable.backends.hip import emulator
    ok, why = emulator.available()
    if not ok:
        pytest.skip(why)
    mod = emulator.load(SOURCE.format(header=codegen.header_text()), arch, name="remap.hip", fp_contract="off")
    for grid in [(5, 3, 2), (9, 1, 1), (17, 3, 1), (1, 1, 1)]:
        n = grid[0] * grid[1] * grid[2]
        out = torch.full((n, 3), -1, dtype=torch.int32)
        mod.launch("remap", grid=grid, block=(64, 1, 1), args=[out])
        want = torch.tensor([schedule.block_remap(hw, grid) for hw in range(n)], dtype=torch.int32)
        assert torch.equal(out, want), grid
