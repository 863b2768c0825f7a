"""The orders in which blocks walk a grid (hk_cuda/tile_order.cuh), compiled for the host: every order the
schedule pass can name is a bijection of the grid, a persistent grid's dealing reaches every tile once, and
longest first walks the work axis from its last index where that axis is long enough (schedule.work_axis)."""
from __future__ import annotations

from pathlib import Path

import pytest

from hk_portable.backends.cuda import schedule
from hk_portable.testing import host_cxx

HEADER = Path(__file__).parents[1] / "hk_portable" / "backends" / "cuda" / "include" / "hk_cuda.cuh"
ORDERS = "the tile orders"
LONGEST = 16                 # HK_LONGEST_FIRST_MIN for these builds: some grids below it on each axis, some above

# each grid as gx gy gz; per grid the program prints, for the persistent walk over `sms` blocks, how often each
# tile was reached (must be once), the first tile's three indices, and whether every index was in range
WALK = r"""
#include <cstdio>
#include <vector>
#include "%s"
int main() {
  const int grids[][3] = {{8, 16, 16}, {16, 16, 4}, {17, 24, 8}, {128, 16, 1}, {3, 24, 8}, {20, 17, 19}, {1, 1, 1}};
  for (int sms : {1, 7, 132}) for (const auto& s : grids) {
    const int gx = s[0], gy = s[1], gz = s[2];
    const long long tiles = (long long)gx * gy * gz;
    std::vector<int> hits(tiles, 0);
    bool in_range = true;
    int first[3] = {-1, -1, -1};
    for (int b = 0; b < sms; ++b)
      for (long long k = 0;; ++k) {
        const long long t = hk::dealt_tile(k, b, sms);
        if (t >= tiles) break;
        const int x = hk::tile_idx<0>(t, gx, gy, gz), y = hk::tile_idx<1>(t, gx, gy, gz), z = hk::tile_idx<2>(t, gx, gy, gz);
        in_range = in_range && x >= 0 && x < gx && y >= 0 && y < gy && z >= 0 && z < gz;
        if (in_range) ++hits[((long long)z * gy + y) * gx + x];
        if (t == 0) { first[0] = x; first[1] = y; first[2] = z; }
      }
    int once = 1;
    for (int h : hits) once = once && h == 1;
    std::printf("%%d %%d %%d %%d %%d %%d %%d %%d %%d\n", sms, gx, gy, gz, once, (int)in_range, first[0], first[1], first[2]);
  }
}
"""


def _walk(tmp_path, work_axis: int, grouped: int) -> list[list[int]]:
    out = host_cxx.run(WALK % HEADER, tmp_path, f"walk{work_axis}{grouped}", what=ORDERS,
                       flags=(f"-DHK_WORK_AXIS={work_axis}", f"-DHK_BLOCK_GROUPED={grouped}",
                              f"-DHK_LONGEST_FIRST_MIN={LONGEST}"))
    return [list(map(int, line.split())) for line in out.splitlines()]


@pytest.mark.parametrize("work_axis,grouped", [(-1, 0), (-1, 1), (0, 0), (1, 0), (2, 0)])
def test_every_order_reaches_each_tile_once(tmp_path, work_axis, grouped):
    rows = _walk(tmp_path, work_axis, grouped)
    assert len(rows) == 21
    for sms, gx, gy, gz, once, in_range, *first in rows:
        assert in_range and once, (sms, gx, gy, gz, work_axis, grouped)
        n = (gx, gy, gz)
        if work_axis >= 0 and n[work_axis] >= LONGEST:       # longest tiles first
            assert first[work_axis] == n[work_axis] - 1, (n, first)
        else:                                                 # block order: tile 0 is block (0, 0, 0)
            assert first == [0, 0, 0], (n, first)


def test_the_schedule_names_the_work_axis_of_a_causal_band_only():
    """schedule.work_axis: the one block_idx axis the pipelines' trip counts depend on (causal attention's
    query block); none for a band every block walks whole (unmasked attention)."""
    import hk_portable as hk
    from hk_portable.kernels import attention

    be = hk.get_backend("cuda")
    target = be.target("sm_90a")
    for causal, axis in ((True, 0), (False, None)):
        args, consts = attention.example_args(D=128, causal=causal)
        program = attention.attention_fwd_kernel.trace(*args, **attention.candidates({**consts})[0])
        plan = schedule.plan(program, target, schedule.FA3())
        assert plan.persistent and plan.work_axis == axis and plan.longest_first == schedule.LONGEST_FIRST_MIN
        assert schedule.plan(program, target, schedule.FA3(longest_first=0)).work_axis is None


# tile indices in a grid too large for the 32-bit path (2^34 tiles) and in one that takes it: each sampled tile's
# indices in range and, in block order, the tile's own number again
BIG = r"""
#include <cstdio>
#include "%s"
int main() {
  const int grids[][3] = {{1 << 16, 1 << 12, 1 << 6}, {1 << 12, 1 << 10, 1 << 6}, {3, 5, 7}};
  for (const auto& s : grids) {
    const int gx = s[0], gy = s[1], gz = s[2];
    const unsigned long long tiles = (unsigned long long)gx * gy * gz;
    int ok = 1;
    for (unsigned long long i = 0; i < 4096; ++i) {
      const long long t = (long long)((i * 0x9E3779B97F4A7C15ull) %% tiles);
      const int x = hk::tile_idx<0>(t, gx, gy, gz), y = hk::tile_idx<1>(t, gx, gy, gz), z = hk::tile_idx<2>(t, gx, gy, gz);
      ok = ok && x >= 0 && x < gx && y >= 0 && y < gy && z >= 0 && z < gz;
      if (HK_WORK_AXIS < 0 && !HK_BLOCK_GROUPED) ok = ok && ((long long)z * gy + y) * gx + x == t;
    }
    std::printf("%%d %%d %%d %%d\n", gx, gy, gz, ok);
  }
}
"""


@pytest.mark.parametrize("work_axis,grouped", [(-1, 0), (-1, 1), (0, 0)])
def test_tile_indices_hold_past_32_bits(tmp_path, work_axis, grouped):
    """hk::tile_idx divides in 32 bits where the grid (times the group rows) fits below 2^32, in 64 otherwise: a grid
    of 2^34 tiles and one of 2^28 give in-range indices that name the sampled tile again (block order)."""
    out = host_cxx.run(BIG % HEADER, tmp_path, "big", what=ORDERS,
                       flags=(f"-DHK_WORK_AXIS={work_axis}", f"-DHK_BLOCK_GROUPED={grouped}",
                              f"-DHK_LONGEST_FIRST_MIN={LONGEST}"))
    rows = [list(map(int, line.split())) for line in out.splitlines()]
    assert len(rows) == 3 and all(ok for *_, ok in rows), rows


# a dispatched grid heaviest first (hk::dispatched_idx): per grid, whether every block maps to a distinct in-range
# tile, whether each run of rows walks the work axis from its last index down, the work index of the last block,
# and how many distinct rows the first HK_DISPATCH_RUN blocks touch
DISPATCH = r"""
#include <cstdio>
#include <set>
#include <vector>
#include "%s"
int main() {
  const unsigned grids[][3] = {{16, 16, 16}, {64, 16, 4}, {8, 16, 16}, {17, 24, 8}, {3, 5, 7}, {1, 1, 1}, {1024, 3, 1},
                               {2000, 1, 1}, {5, 300, 2}};
  for (const auto& s : grids) {
    const unsigned gx = s[0], gy = s[1], gz = s[2], n = gx * gy * gz;
    std::vector<int> hits(n, 0);
    std::set<long long> rows;
    int ok = 1, descending = 1, last_w = -1, prev_w = -1;
    long long prev_row = -1;
    for (unsigned l = 0; l < n; ++l) {
      const int t[3] = {hk::dispatched_idx<0>(l %% gx, l / gx %% gy, l / (gx * gy), gx, gy, gz),
                        hk::dispatched_idx<1>(l %% gx, l / gx %% gy, l / (gx * gy), gx, gy, gz),
                        hk::dispatched_idx<2>(l %% gx, l / gx %% gy, l / (gx * gy), gx, gy, gz)};
      ok = ok && t[0] >= 0 && t[0] < (int)gx && t[1] >= 0 && t[1] < (int)gy && t[2] >= 0 && t[2] < (int)gz;
      if (!ok) break;
      ++hits[((unsigned)t[2] * gy + t[1]) * gx + t[0]];
      const int W = HK_DISPATCH_AXIS < 0 ? 0 : HK_DISPATCH_AXIS;
      const long long row = W == 0 ? t[1] + (long long)gy * t[2] : W == 1 ? t[0] + (long long)gx * t[2]
                                                                          : t[0] + (long long)gx * t[1];
      if (l < hk::HK_DISPATCH_RUN) rows.insert(row);
      // within a run the work index only falls (it may rise only where a new run starts: a row not seen before)
      if (prev_w >= 0 && t[W] > prev_w && row <= prev_row) descending = 0;
      prev_w = t[W]; prev_row = row; last_w = t[W];
    }
    for (int h : hits) ok = ok && h == 1;
    std::printf("%%u %%u %%u %%d %%d %%d %%d\n", gx, gy, gz, ok, descending, last_w, (int)rows.size());
  }
}
"""


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_a_dispatched_grid_starts_its_heaviest_blocks_first_in_runs_of_rows(tmp_path, axis):
    """hk::dispatched_idx is a bijection of the grid; with a dispatch axis each run of rows goes heaviest first (the
    axis from its last index), the grid's last block is the lightest, and the first HK_DISPATCH_RUN blocks stay
    within the rows of one run (a few dozen heads' keys in L2). Without one it is the block's own index."""
    out = host_cxx.run(DISPATCH % HEADER, tmp_path, f"dispatch{axis}", what=ORDERS, flags=(f"-DHK_DISPATCH_AXIS={axis}",))
    rows = [list(map(int, line.split())) for line in out.splitlines()]
    assert len(rows) == 9
    for gx, gy, gz, ok, descending, last_w, first_rows in rows:
        n = (gx, gy, gz)
        assert ok, (n, axis)
        if axis < 0:
            continue
        others = gx * gy * gz // n[axis]
        run_rows = min(others, -(-1024 // n[axis]))
        assert descending and last_w == 0, (n, axis)
        assert first_rows <= min(others, run_rows + 1), (n, axis, first_rows, run_rows)


def test_the_schedule_dispatches_a_causal_band_heaviest_first_where_blocks_are_not_persistent():
    import hk_portable as hk
    from hk_portable.kernels import attention

    be = hk.get_backend("cuda")
    for arch in ("sm_80", "sm_90a"):
        target = be.target(arch)
        for causal, axis in ((True, 0), (False, None)):
            args, consts = attention.example_args(D=64, causal=causal)
            program = attention.attention_fwd_kernel.trace(*args, **consts)       # the 64x64 baseline block
            assert schedule.plan(program, target).dispatch_axis == axis
            assert schedule.plan(program, target, schedule.Base(heavy_first=False)).dispatch_axis is None
    args, consts = attention.example_args(D=128, causal=True)
    program = attention.attention_fwd_kernel.trace(*args, **attention.candidates({**consts})[0])
    assert schedule.plan(program, be.target("sm_90a"), schedule.FA3()).dispatch_axis is None     # persistent


# the grouped walk's two forms (hk_core/block_order.h: divisions fixed beforehand, as cuda's block_idx and persistent
# walks take it, and direct, as hip's block_idx takes it): per grid, the tiles on which they disagree
GROUPED_FORMS = r"""
#include <cstdio>
#include "%s"
int main() {
  long long differ = 0, tiles = 0;
  for (unsigned gx = 1; gx <= 70; ++gx) for (unsigned gy = 1; gy <= 40; ++gy)
    for (unsigned l = 0; l < gx * gy; ++l, ++tiles) {
      unsigned x0, y0, x1, y1;
      hk::grouped_xy<unsigned>(l, gx, hk::plain_div<unsigned>(hk::BLOCK_GROUP * gy),
                               hk::plain_div<unsigned>(hk::group_tail(gx)), x0, y0);
      hk::grouped_xy<unsigned>(l, gx, gy, x1, y1);
      differ += x0 != x1 || y0 != y1;
    }
  std::printf("%%lld %%lld\n", tiles, differ);
}
"""


def test_the_grouped_walks_two_forms_agree(tmp_path):
    """hk_core's grouped order is one map in two forms (the block orders of both libraries): equal on every tile of
    every grid up to 70 x 40 (checked exhaustively to 400 x 400 when the two libraries' copies were folded)."""
    tiles, differ = map(int, host_cxx.run(GROUPED_FORMS % HEADER, tmp_path, "forms", what=ORDERS).split())
    assert tiles > 1_000_000 and differ == 0
