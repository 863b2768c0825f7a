// hk_core/block_order.h -- the orders in which blocks take their tiles, as plain integer maps over a grid, shared
// by both vendor libraries (their hk::block_idx, cuda's persistent walk) and compiled on the host by
// tests/test_block_order.py, which checks every order is a bijection of the grid.
namespace hk {

// Grouped order over (x, y): the x-y plane is walked in runs of BLOCK_GROUP x-rows that sweep y, so blocks running
// together share operand tiles in L2.
constexpr unsigned BLOCK_GROUP = 8;
// Division by a divisor a grid fixes: U's own / and % (plain_div), or a udivider (divider.h) where a persistent
// block divides by the same extents at every tile.
template <class U> struct plain_div {
    U d = 1;
    plain_div() = default;
    HK_CORE_FN explicit plain_div(U divisor) : d(divisor) {}
    HK_CORE_FN U quot(U n) const { return n / d; }
    HK_CORE_FN U rem(U n) const { return n % d; }
};
template <class U> HK_CORE_FN U group_tail(U gx) { return gx % BLOCK_GROUP ? gx % BLOCK_GROUP : BLOCK_GROUP; }
// The walk in two forms, the same map (tests/test_tile_order.py checks they agree on every tile of many grids):
// - with the divisions fixed beforehand: `group` divides by BLOCK_GROUP * gy (a group's tiles), `tail` by the last
//   group's width (group_tail), the others being BLOCK_GROUP wide (cuda's block_idx and persistent walks);
template <class U, class Div> HK_CORE_FN void grouped_xy(U l, U gx, const Div& group, const Div& tail, U& x, U& y) {
    const U k = group.quot(l), first = k * BLOCK_GROUP, r = l - k * group.d;
    const bool whole = gx - first >= BLOCK_GROUP;
    x = first + (whole ? r % BLOCK_GROUP : tail.rem(r));
    y = whole ? r / BLOCK_GROUP : tail.quot(r);
}
// - directly, one division by this group's width (hip's block_idx, after its XCD remap).
template <class U> HK_CORE_FN void grouped_xy(U l, U gx, U gy, U& x, U& y) {
    const U in_group = BLOCK_GROUP * gy, first = (l / in_group) * BLOCK_GROUP;
    const U size = (gx - first) < BLOCK_GROUP ? (gx - first) : BLOCK_GROUP;
    const U r = l % in_group;
    x = first + r % size;
    y = r / size;
}

// Chiplet-contiguous numbering: a device that deals blocks round-robin over `chiplets` dies, each with its own L2
// (AMD's XCDs: die = id % chiplets), renumbered so that consecutive logical blocks run on one die. A bijection of
// [0, n): die c takes a contiguous range.
HK_CORE_FN unsigned chiplet_remap(unsigned id, unsigned n, unsigned chiplets) {
    const unsigned per = n / chiplets, extra = n % chiplets, die = id % chiplets;
    return die * per + (die < extra ? die : extra) + id / chiplets;
}

}  // namespace hk
