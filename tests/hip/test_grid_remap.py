"""The XCD-aware block remap with grouped ordering (hk_core/block_order.h, composed by hk_hip/block_order.h) must be
a bijection of the grid, else blocks would be skipped or run twice: the core's maps compiled for the host and
checked for many grids, then the device code on the emulator checked against them."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from hk_portable.backends.hip import archs, codegen
from hk_portable.testing import host_cxx

CORE = Path(__file__).parents[2] / "hk_portable" / "codegen" / "include" / "hk_core" / "block_order.h"
XCDS = archs.ARCHS["gfx942"].xcds
GRIDS = [(1, 1, 1), (7, 1, 1), (8, 1, 1), (9, 1, 1), (5, 3, 2), (16, 16, 1), (3, 17, 1), (17, 3, 4),
         (64, 5, 1), (1, 9, 3), (13, 13, 13)]
DEVICE_GRIDS = [(5, 3, 2), (9, 1, 1), (17, 3, 1), (1, 1, 1)]
ALL_GRIDS = list(dict.fromkeys(GRIDS + DEVICE_GRIDS + [(37, 1, 1)] + [
    (gx, gy, 1) for gx, gy in itertools.product((1, 2, 7, 8, 9, 24), repeat=2)]))

# per line of stdin "gx gy gz": for each hardware block id in order, its logical id and the x y z hk::block_idx gives
# it (hk_hip/block_order.h's composition: chiplet_remap over the whole grid, then the grouped order in each plane)
HOST = r"""
#include <cstdio>
#define HK_CORE_FN inline
#include "%s"
int main() {
  unsigned gx, gy, gz;
  while (std::scanf("%%u %%u %%u", &gx, &gy, &gz) == 3) {
    for (unsigned hw = 0; hw < gx * gy * gz; ++hw) {
      const unsigned l = hk::chiplet_remap(hw, gx * gy * gz, %d), z = l / (gx * gy);
      unsigned x, y;
      hk::grouped_xy<unsigned>(l - z * gx * gy, gx, gy, x, y);
      std::printf("%%u %%u %%u %%u ", l, x, y, z);
    }
    std::printf("\n");
  }
}
"""


@pytest.fixture(scope="module")
def remap(tmp_path_factory):
    """grid -> [(logical id, x, y, z) of hardware block id 0, 1, ...], from the core's maps built for the host."""
    stdin = "".join(f"{gx} {gy} {gz}\n" for gx, gy, gz in ALL_GRIDS)
    lines = host_cxx.run(HOST % (CORE, XCDS), tmp_path_factory.mktemp("remap"), "remap",
                         what="hk_core/block_order.h", stdin=stdin).splitlines()
    table = {}
    for grid, line in zip(ALL_GRIDS, lines):
        v = list(map(int, line.split()))
        table[grid] = [tuple(v[i:i + 4]) for i in range(0, len(v), 4)]
    return table.__getitem__


@pytest.mark.parametrize("grid", ALL_GRIDS)
def test_remap_is_a_bijection(remap, grid):
    n = grid[0] * grid[1] * grid[2]
    seen = [xyz for _, *xyz in remap(grid)]
    assert len(seen) == n and len(set(map(tuple, seen))) == n
    assert sorted(l for l, *_ in remap(grid)) == list(range(n))
    assert all(0 <= x < grid[0] and 0 <= y < grid[1] and 0 <= z < grid[2] for x, y, z in seen)


def test_xcd_ranges_are_contiguous(remap):
    """The blocks one XCD runs (hardware ids xcd, xcd + XCDS, ...) take consecutive logical ids."""
    logical = [l for l, *_ in remap((37, 1, 1))]
    for xcd in range(XCDS):
        mine = sorted(logical[xcd::XCDS])
        assert mine == list(range(mine[0], mine[0] + len(mine)))


def test_grouped_ordering_keeps_neighbours_together(remap):
    """The first 8*gy logical ids cover x-rows 0..7 only: eight blocks of A rows share one B column tile."""
    gx, gy = 24, 9
    xs = {x for l, x, _, _ in remap((gx, gy, 1)) if l < 8 * gy}
    assert xs == set(range(8))


SOURCE = """
#define HK_NUM_WARPS 1
#define HK_NUM_THREADS 64
#define HK_XCDS {xcds}
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
def test_device_remap_matches_the_host_build(remap, arch):
    from hk_portable.backends.hip import emulator
    ok, why = emulator.available()
    if not ok:
        pytest.skip(why)
    mod = emulator.load(SOURCE.format(header=codegen.header_text(), xcds=archs.ARCHS[arch].xcds), arch,
                        name="remap.hip", fp_contract="off")
    for grid in DEVICE_GRIDS:
        n = grid[0] * grid[1] * grid[2]
        out = torch.full((n, 3), -1, dtype=torch.int32)
        mod.launch("remap", grid=grid, block=(64, 1, 1), args=[out])
        assert torch.equal(out, torch.tensor([xyz for _, *xyz in remap(grid)], dtype=torch.int32)), grid
