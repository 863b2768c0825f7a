"""hk_core/divider.h, compiled for the host: a udivider's quotient and remainder equal the hardware's for every
divisor class (1, powers of two and their neighbours, the largest 32-bit values) against edge and random
numerators, and a divider keeps Python's floor semantics for negative operands (where it falls back)."""
from __future__ import annotations

from pathlib import Path

from hk_portable.testing import host_cxx

HEADER = Path(__file__).parents[1] / "hk_portable" / "backends" / "cuda" / "include" / "hk_cuda.cuh"

PROGRAM = r"""
#include <cstdio>
#include <vector>
#include "%s"
int main() {
  std::vector<unsigned> ds = {1u, 2u, 3u, 5u, 7u, 8u, 9u, 127u, 128u, 129u, 1000u, 65535u, 65536u, 65537u,
                              0x7FFFFFFFu, 0x80000000u, 0x80000001u, 0xFFFFFFFEu, 0xFFFFFFFFu};
  unsigned long long x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 2000; ++i) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; ds.push_back((unsigned)(x >> (x & 31)) | 1u); }
  long long bad = 0, checked = 0;
  for (unsigned d : ds) {
    const hk::udivider u(d);
    std::vector<unsigned> ns = {0u, 1u, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFEu, 0xFFFFFFFFu};
    for (int i = 0; i < 500; ++i) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; ns.push_back((unsigned)x); }
    for (unsigned n : ns) { ++checked; bad += u.quot(n) != n / d || u.rem(n) != n %% d; }
  }
  for (int b : {-7, -1, 1, 3, 64, 2147483647}) {
    const hk::divider v(b);
    for (int a : {-2147483647 - 1, -65, -64, -1, 0, 1, 63, 64, 65, 2147483647}) {
      ++checked; bad += v.floordiv(a) != hk::floordiv(a, b) || v.floormod(a) != hk::floormod(a, b);
    }
  }
  const hk::divider zero(0);                  // scalar.h's rule: a zero divisor gives 0
  bad += zero.floordiv(5) != 0 || zero.floormod(5) != 0;
  std::printf("%%lld %%lld\n", checked, bad);
}
"""


def test_dividers_match_hardware_division(tmp_path):
    checked, bad = map(int, host_cxx.run(PROGRAM % HEADER, tmp_path, "div", what="the dividers").split())
    assert checked > 1_000_000 and bad == 0, (checked, bad)
