// hk_hip/masks.h -- mask tiles: causal, bounds and dropout (Philox from hk_core/philox.h).
namespace hk {

// ============================================================================================ masks
namespace detail {
template<int R, int C, class Fn> HK_DEV void each_pos(rt<bool, R, C>& dst, Fn fn) {
  using D = rt<bool, R, C>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s)
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        dst.data[(s * D::CB + cb) * 4 + k] = put(fn(16 * blk<D::RB>(s) + row_in_blk(k), 16 * cb + col_in_blk()));
}
template<int R, int C, class Fn> HK_DEV void each_pos(rt<bool, R, C, tfrag>& dst, Fn fn) {
  using D = rt<bool, R, C, tfrag>;
  const int ln = lane();
#pragma unroll
  for (int s = 0; s < D::RBW; ++s)
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        dst.data[(s * D::CB + cb) * 4 + k] = put(fn(16 * blk<D::RB>(s) + trow_in_blk(ln), 16 * cb + tcol_in_blk(k, ln)));
}
template<int R, int C, int WR, class Fn> HK_DEV void each_pos(rt<bool, R, C, strip<WR>>& dst, Fn fn) {
  using D = rt<bool, R, C, strip<WR>>;
  const int ln = lane();
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = put(fn(D::row_of(e), D::col_of(e, ln)));
}
}  // namespace detail

template<int R, int C, class L> HK_DEV void causal_mask(rt<bool, R, C, L>& dst, int ro, int co) {
  ro = detail::uni(ro);
  co = detail::uni(co);
  detail::each_pos(dst, [&](int r, int c) { return (long long)ro + r >= (long long)co + c; });
}
template<int R, int C, class L> HK_DEV void bounds_mask(rt<bool, R, C, L>& dst, int ro, int co, int nr, int nc) {
  ro = detail::uni(ro);
  co = detail::uni(co);
  nr = detail::uni(nr);
  nc = detail::uni(nc);
  detail::each_pos(dst, [&](int r, int c) {
    const long long rr = (long long)ro + r, cc = (long long)co + c;
    return rr >= 0 && rr < nr && cc >= 0 && cc < nc;
  });
}
// Masks a select evaluates where it writes (codegen.py fused_masks): the same rules as the two above, one
// position at a time, so the mask tile never exists.
struct causal_pred {
  int ro, co;
  HK_DEV bool at(int r, int c) const { return (long long)ro + r >= (long long)co + c; }
};
struct bounds_pred {
  int ro, co, nr, nc;
  HK_DEV bool at(int r, int c) const {
    const long long rr = (long long)ro + r, cc = (long long)co + c;
    return rr >= 0 && rr < nr && cc >= 0 && cc < nc;
  }
};
HK_DEV causal_pred causal_at(int ro, int co) { return {detail::uni(ro), detail::uni(co)}; }
HK_DEV bounds_pred bounds_at(int ro, int co, int nr, int nc) {
  return {detail::uni(ro), detail::uni(co), detail::uni(nr), detail::uni(nc)};
}
// dst = pred(r, c) ? a : b at every position of a tfrag tile
template<class T, int R, int C, class P>
HK_DEV void where_at(rt<T, R, C, tfrag>& dst, P pred, const rt<T, R, C, tfrag>& a, const rt<T, R, C, tfrag>& b) {
  using D = rt<T, R, C, tfrag>;
  const int ln = detail::lane();
#pragma unroll
  for (int s = 0; s < D::RBW; ++s)
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int e = (s * D::CB + cb) * 4 + k;
        dst.data[e] = pred(16 * detail::blk<D::RB>(s) + detail::trow_in_blk(ln), 16 * cb + detail::tcol_in_blk(k, ln))
                          ? a.data[e] : b.data[e];
      }
}

// keep iff (philox(g)[0] >> 8) >= floor(p * 2^24), g = offset + (ro + r) * stride + (co + c) mod 2^64
template<int R, int C, class L>
HK_DEV void dropout_mask(rt<bool, R, C, L>& dst, float p, int seed_lo, int seed_hi, int off_lo, int off_hi, int ro,
                         int co, int stride) {
  // scalars through uni(): the hoisted Philox key schedule alone would take 20 scalar registers
  seed_lo = detail::uni(seed_lo);
  seed_hi = detail::uni(seed_hi);
  ro = detail::uni(ro);
  co = detail::uni(co);
  stride = detail::uni(stride);
  off_lo = detail::uni(off_lo);
  off_hi = detail::uni(off_hi);
  const float thr = dropout_threshold(p);
  const unsigned long long off = (unsigned long long)(unsigned)off_lo | ((unsigned long long)(unsigned)off_hi << 32);
  detail::each_pos(dst, [&](int r, int c) {
    const unsigned long long g = off + (unsigned long long)(((long long)ro + r) * (long long)stride) +
                                 (unsigned long long)((long long)co + c);
    return dropout_keep(g, (unsigned)seed_lo, (unsigned)seed_hi, thr);
  });
}

}  // namespace hk
