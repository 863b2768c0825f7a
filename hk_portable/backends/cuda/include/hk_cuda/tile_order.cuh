// hk_cuda/tile_order.cuh -- the order in which blocks walk a grid's tiles (schedule.py decides, the
// generated code names it by HK_BLOCK_GROUPED and HK_WORK_AXIS). Plain integer maps, host-compilable:
// tests/test_tile_order.py checks on the host that each is a bijection of the grid.

namespace hk {

// The block's tile indices. HK_BLOCK_GROUPED (the schedule pass, for GEMM-like grids): hk_core's grouped order
// (hardware order otherwise).
#ifndef HK_BLOCK_GROUPED
#define HK_BLOCK_GROUPED 0
#endif
// (BLOCK_GROUP, plain_div, grouped_xy: hk_core/block_order.h)
// The k-th tile a persistent block b of g walks: rounds of g consecutive tiles dealt forwards and backwards in
// turn (b, then g-1-b), so a block's tiles add up to about the same work where work grows along the tile order
// (causal attention's query blocks). Dealt forwards only, the stride g beat against a head's block count: at
// N16384 one SM got 3x another's keys (H200, 2026-12-03). Every tile is dealt once; a block's tiles increase.
HK_HD long long dealt_tile(long long k, int b, int g) { return k * g + ((k & 1) ? g - 1 - b : b); }
// A persistent kernel's block indices: tile t of a logical gx x gy x gz grid (64-bit: the grid may hold more
// tiles than an int counts). HK_WORK_AXIS >= 0 (schedule.work_axis: tiles differ in work along that axis) and
// that axis HK_LONGEST_FIRST_MIN blocks or longer (schedule.LONGEST_FIRST_MIN, why that many): that axis slowest
// and from its last index, longest tiles first. Otherwise the order block_idx walks: a short ramp dealt forwards
// and backwards is balanced already and keeps a head's keys in L2; a long one beats against the SM count.
#ifndef HK_WORK_AXIS
#define HK_WORK_AXIS -1
#endif
#ifndef HK_LONGEST_FIRST_MIN
#define HK_LONGEST_FIRST_MIN 64
#endif
// Every divisor a walk of a gx x gy x gz grid divides by, fixed once.
template <class U, class Div> struct grid_divisors {
    U n[3];
    Div x, plane, group, tail, rest, fast;      // rest and fast: the work axis's walk (HK_WORK_AXIS >= 0)
    HK_HD grid_divisors(U gx, U gy, U gz)
        : n{gx, gy, gz}, x(gx), plane(gx * gy), group(BLOCK_GROUP * gy), tail(group_tail(gx)) {
        if constexpr (HK_WORK_AXIS >= 0) {
            constexpr int W = HK_WORK_AXIS, P = W == 0 ? 1 : 0, Q = W == 2 ? 1 : 2;   // P faster than Q
            rest = Div(n[P] * n[Q]);
            fast = Div(n[P]);
        }
    }
};
template <int A, class U, class Div> HK_HD int tile_idx_as(U t, const grid_divisors<U, Div>& g) {
    if constexpr (HK_WORK_AXIS >= 0) {
        constexpr int W = HK_WORK_AXIS, P = W == 0 ? 1 : 0;
        if (g.n[W] >= (U)HK_LONGEST_FIRST_MIN) {
            const U q = g.rest.quot(t), r = t - q * g.rest.d;
            if constexpr (A == W) return (int)(g.n[W] - 1 - q);
            return (int)(A == P ? g.fast.rem(r) : g.fast.quot(r));
        }
    }
    const U z = g.plane.quot(t), r = t - z * g.plane.d;
    if constexpr (A == 2) return (int)z;
    U x = g.x.rem(r), y = g.x.quot(r);
    if constexpr (HK_BLOCK_GROUPED) grouped_xy(r, g.n[0], g.group, g.tail, x, y);
    return (int)(A == 0 ? x : y);
}

// A persistent block's walk over a logical gx x gy x gz grid, built once before its tile loop: every division by
// an extent (or a product of two) a udivider wherever the grid allows 32 bits (every product and quotient,
// BLOCK_GROUP rows included, below 2^32); in 64 bits otherwise (a long software routine per division). Each tile
// of a persistent attention block started with five divisions by runtime values, some 5 % of its stall samples at
// N=1024 (ncu, H200, 2026-12-04).
struct tile_grid {
    typedef unsigned long long U64;
    long long count;                              // tiles in the grid
    bool narrow;                                  // div32 applies
    grid_divisors<u32, udivider> div32;
    grid_divisors<U64, plain_div<U64>> div64;
    HK_HD tile_grid(int x, int y, int z)
        : count((long long)x * y * z), narrow((U64)x * (U64)y * (U64)z * BLOCK_GROUP <= 0xFFFFFFFFull),
          div32(narrow ? (u32)x : 1u, narrow ? (u32)y : 1u, narrow ? (u32)z : 1u), div64(x, y, z) {}
    template <int A> HK_HD int idx(long long t) const {
        return narrow ? tile_idx_as<A>((u32)t, div32) : tile_idx_as<A>((U64)t, div64);
    }
};
// A grid the hardware dispatches (not persistent) whose blocks' work grows along HK_DISPATCH_AXIS (the schedule
// pass: schedule.work_axis; causal attention's query blocks): block l of the launch runs tile heavy_first_idx(l).
// The hardware starts blocks in launch order as others finish, so in plain order the heaviest blocks of the last
// heads start last and the grid ends on a long tail (simulated: 0.84 of balanced for the 64x64 block at D64 causal
// N1024, 5 blocks on each of 132 SMs). Here the other two axes (P faster than Q) are taken in runs of G rows,
// G * (the work axis's extent) >= HK_DISPATCH_RUN blocks, and each run is dispatched heaviest first, the run's rows
// fastest: the last blocks to start are light (0.98 simulated), and the blocks running together still share a
// run's rows (a few dozen heads' keys in L2, as in plain order; the work axis slowest over the whole grid would
// stream every head's keys at once). Plain order where l does not fit 32 bits. The walk assumes the work grows with
// the index (a causal band's forward blocks); where it shrinks (the backward's key blocks) each run goes lightest
// first, which the same simulation puts at 0.85 against hardware order's 0.84: no loss, the gain only where it grows.
#ifndef HK_DISPATCH_AXIS
#define HK_DISPATCH_AXIS -1
#endif
constexpr unsigned HK_DISPATCH_RUN = 1024;
template <int A> HK_HD int heavy_first_idx(unsigned l, unsigned gx, unsigned gy, unsigned gz) {
    constexpr int W = HK_DISPATCH_AXIS < 0 ? 0 : HK_DISPATCH_AXIS, P = W == 0 ? 1 : 0, Q = W == 2 ? 1 : 2;
    const unsigned n[3] = {gx, gy, gz};
    const unsigned nw = n[W], rows = n[P] * n[Q];
    const unsigned g = (HK_DISPATCH_RUN + nw - 1) / nw < rows ? (HK_DISPATCH_RUN + nw - 1) / nw : rows;
    const unsigned run = l / (g * nw), within = l - run * (g * nw);
    const unsigned in_run = rows - run * g < g ? rows - run * g : g;       // the last run may be shorter
    const unsigned w = within / in_run, row = run * g + (within - w * in_run);
    if constexpr (A == W) return (int)(nw - 1 - w);
    return (int)(A == P ? row % n[P] : row / n[P]);
}
// The tile of launched block (bx, by, bz) of a gx x gy x gz grid: heavy_first_idx where HK_DISPATCH_AXIS names an
// axis and the grid fits 32 bits, else the block's own indices.
template <int A> HK_HD int dispatched_idx(unsigned bx, unsigned by, unsigned bz, unsigned gx, unsigned gy, unsigned gz) {
    if constexpr (HK_DISPATCH_AXIS >= 0) {
        if ((unsigned long long)gx * gy * gz <= 0xFFFFFFFFull)
            return heavy_first_idx<A>(bx + gx * (by + gy * bz), gx, gy, gz);
    }
    return (int)(A == 0 ? bx : (A == 1 ? by : bz));
}
// One tile's indices without a tile_grid kept (the host tests; a kernel builds its tile_grid once).
template <int A> HK_HD int tile_idx(long long t, int gx, int gy, int gz) { return tile_grid(gx, gy, gz).idx<A>(t); }

}  // namespace hk
