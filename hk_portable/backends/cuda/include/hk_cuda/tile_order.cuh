// hk_cuda/tile_order.cuh -- the order in which blocks walk a grid's tiles (schedule.py decides, the
// generated code names it by HK_BLOCK_GROUPED and HK_WORK_AXIS). Plain integer maps, host-compilable:
// tests/test_tile_order.py checks on the host that each is a bijection of the grid.

namespace hk {

// The block's tile indices. HK_BLOCK_GROUPED (the schedule pass, for GEMM-like grids): the x-y plane is
// walked in runs of GROUP x-rows that sweep y, so blocks running together share operand tiles in L2
// (a bijection of the grid; hardware order otherwise).
#ifndef HK_BLOCK_GROUPED
#define HK_BLOCK_GROUPED 0
#endif
constexpr unsigned BLOCK_GROUP = 8;
template <class U> HK_HD void grouped_xy(U l, U gx, U gy, U& x, U& y) {
    const U in_group = BLOCK_GROUP * gy, first = (l / in_group) * BLOCK_GROUP;
    const U size = gx - first < BLOCK_GROUP ? gx - first : BLOCK_GROUP;
    const U r = l % in_group;
    x = first + r % size;
    y = r / size;
}
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
template <int A, class U> HK_HD int tile_idx_as(U t, U gx, U gy, U gz) {
    if constexpr (HK_WORK_AXIS >= 0) {
        constexpr int W = HK_WORK_AXIS, P = W == 0 ? 1 : 0, Q = W == 2 ? 1 : 2;   // P faster than Q
        const U n[3] = {(U)gx, (U)gy, (U)gz}, rest = n[P] * n[Q], r = (U)t % rest;
        if (n[W] >= (U)HK_LONGEST_FIRST_MIN) {
            if constexpr (A == W) return (int)(n[W] - 1 - (U)t / rest);
            return (int)(A == P ? r % n[P] : r / n[P]);
        }
    }
    const U plane = (U)gx * (U)gy, r = (U)t % plane;
    if constexpr (A == 2) return (int)((U)t / plane);
    U x = r % (U)gx, y = r / (U)gx;
    if constexpr (HK_BLOCK_GROUPED) grouped_xy<U>(r, (U)gx, (U)gy, x, y);
    return (int)(A == 0 ? x : y);
}

// A persistent block's walk over a logical gx x gy x gz grid, built once before its tile loop: the orders above
// with every division by an extent (or a product of two) as a udivider (hk_core/divider.h) wherever the grid
// allows 32 bits (every product and quotient, BLOCK_GROUP rows included, below 2^32); in 64 bits otherwise (a
// long software routine per division). Each tile of a persistent attention block started with five divisions by
// runtime values, some 5 % of its stall samples at N=1024 (ncu, H200, 2026-12-04).
struct tile_grid {
    int gx, gy, gz;
    long long count;                  // tiles in the grid
    bool narrow;                      // the udividers apply
    udivider by_x, by_plane, by_rest, by_fast, by_group, by_tail;
    HK_HD tile_grid(int x, int y, int z) : gx(x), gy(y), gz(z), count((long long)x * y * z) {
        typedef unsigned long long U64;
        narrow = (U64)x * (U64)y * (U64)z * BLOCK_GROUP <= 0xFFFFFFFFull;
        if (!narrow) return;
        by_x = udivider((u32)x);
        by_plane = udivider((u32)x * (u32)y);
        by_group = udivider(BLOCK_GROUP * (u32)y);
        by_tail = udivider((u32)x % BLOCK_GROUP ? (u32)x % BLOCK_GROUP : BLOCK_GROUP);
        if constexpr (HK_WORK_AXIS >= 0) {
            constexpr int W = HK_WORK_AXIS, P = W == 0 ? 1 : 0, Q = W == 2 ? 1 : 2;
            const u32 n[3] = {(u32)x, (u32)y, (u32)z};
            by_rest = udivider(n[P] * n[Q]);
            by_fast = udivider(n[P]);
        }
    }
    template <int A> HK_HD int idx(long long t) const {
        if (!narrow) return tile_idx_as<A, unsigned long long>(t, gx, gy, gz);
        const u32 u = (u32)t;
        if constexpr (HK_WORK_AXIS >= 0) {
            constexpr int W = HK_WORK_AXIS, P = W == 0 ? 1 : 0;
            const u32 n[3] = {(u32)gx, (u32)gy, (u32)gz};
            if (n[W] >= (u32)HK_LONGEST_FIRST_MIN) {
                const u32 q = by_rest.quot(u), r = u - q * by_rest.d;
                if constexpr (A == W) return (int)(n[W] - 1 - q);
                return (int)(A == P ? by_fast.rem(r) : by_fast.quot(r));
            }
        }
        const u32 z = by_plane.quot(u), r = u - z * by_plane.d;
        if constexpr (A == 2) return (int)z;
        u32 x = by_x.rem(r), y = by_x.quot(r);
        if constexpr (HK_BLOCK_GROUPED) {          // grouped_xy with its divisions by the group's rows and width
            const u32 g = by_group.quot(r), first = g * BLOCK_GROUP, l = r - g * by_group.d;
            const bool whole = (u32)gx - first >= BLOCK_GROUP;
            x = first + (whole ? l % BLOCK_GROUP : by_tail.rem(l));
            y = whole ? l / BLOCK_GROUP : by_tail.quot(l);
        }
        return (int)(A == 0 ? x : y);
    }
};
// One tile's indices without a tile_grid kept (the host tests; a kernel builds its tile_grid once).
template <int A> HK_HD int tile_idx(long long t, int gx, int gy, int gz) { return tile_grid(gx, gy, gz).idx<A>(t); }

}  // namespace hk
