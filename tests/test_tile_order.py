"""The orders in which blocks walk a grid (hk_cuda/tile_order.cuh), compiled for the host: every order the
schedule pass can name is a bijection of the grid, a persistent grid's dealing reaches every tile once, and
longest first walks the work axis from its last index where that axis is long enough (schedule.work_axis)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hk_portable.backends.cuda import schedule

HEADER = Path(__file__).parents[1] / "hk_portable" / "backends" / "cuda" / "include" / "hk_cuda.cuh"
CXX = shutil.which("g++") or shutil.which("clang++")
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
    if CXX is None:
        pytest.skip("no host C++ compiler (g++/clang++) to build the tile orders")
    src, exe = tmp_path / f"walk{work_axis}{grouped}.cpp", tmp_path / f"walk{work_axis}{grouped}"
    src.write_text(WALK % HEADER)
    subprocess.run([CXX, "-std=c++17", "-O1", f"-DHK_WORK_AXIS={work_axis}", f"-DHK_BLOCK_GROUPED={grouped}",
                    f"-DHK_LONGEST_FIRST_MIN={LONGEST}",
                    str(src), "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
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
        plan = schedule.plan(program, target, **schedule.FA3)
        assert plan.persistent and plan.work_axis == axis and plan.longest_first == schedule.LONGEST_FIRST_MIN
        assert schedule.plan(program, target, **{**schedule.FA3, "longest_first": 0}).work_axis is None


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
    if CXX is None:
        pytest.skip("no host C++ compiler (g++/clang++) to build the tile orders")
    src, exe = tmp_path / "big.cpp", tmp_path / "big"
    src.write_text(BIG % HEADER)
    subprocess.run([CXX, "-std=c++17", "-O1", f"-DHK_WORK_AXIS={work_axis}", f"-DHK_BLOCK_GROUPED={grouped}",
                    f"-DHK_LONGEST_FIRST_MIN={LONGEST}", str(src), "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    rows = [list(map(int, line.split())) for line in out.splitlines()]
    assert len(rows) == 3 and all(ok for *_, ok in rows), rows
