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
  int sro, sco;        // as given (scalar registers): what band() reads
  HK_DEV bool at(int r, int c) const { return (long long)ro + r >= (long long)co + c; }
};
struct bounds_pred {
  int ro, co, nr, nc;
  int sro, sco, snr, snc;
  HK_DEV bool at(int r, int c) const {
    const long long rr = (long long)ro + r, cc = (long long)co + c;
    return rr >= 0 && rr < nr && cc >= 0 && cc < nc;
  }
};
HK_DEV causal_pred causal_at(int ro, int co) { return {detail::uni(ro), detail::uni(co), ro, co}; }
HK_DEV bounds_pred bounds_at(int ro, int co, int nr, int nc) {
  return {detail::uni(ro), detail::uni(co), detail::uni(nr), detail::uni(nc), ro, co, nr, nc};
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

// A conjunction of causal, anti-causal (!causal) and bounds masks (codegen.py HipEmitter.op_where): per tile row r
// the kept columns are one interval [max(r + dl, l0), min(r + dh, h0)], and no column of a row outside [rlo, rhi).
// Offsets are clamped to +-2^24 (tiles are below 2^16 a side, so no comparison changes; the +-1 on a clamped
// value moves an open side by one, still beyond every column) and compared in 32 bits, the band built in scalar
// registers once per select from the predicates' arguments as given: the predicates' 64-bit compares and short-circuit `&&`
// became per-element branches in the edge loops.
struct band_pred {
  int dl, l0, dh, h0, rlo, rhi;
};
namespace detail {
constexpr long long BAND_OPEN = 1 << 24;
HK_DEV int imax(int a, int b) { return a > b ? a : b; }
HK_DEV int imin(int a, int b) { return a < b ? a : b; }
// clamp(x) to [-2^24, 2^24], written as a test of x's top bits rather than a min and a max: LLVM makes those a
// v_med3_i32 even of a wave-uniform x, and a v_readfirstlane to bring it back (8 VALU an edge trip)
HK_DEV int band_clamp(int x) {
  const int top = x >> 24;                 // 0 or -1: x in [-2^24, 2^24), kept as it is
  return top == 0 || top == -1 ? x : x < 0 ? -(int)BAND_OPEN : (int)BAND_OPEN;
}
// clamp(a - b) in 32-bit scalar arithmetic (no 64-bit compare: gfx9 has none in SALU, LLVM moves it to the VALU)
HK_DEV int band_sub(int a, int b) {
  const int d = (int)((unsigned)a - (unsigned)b);
  if (((a ^ b) & (a ^ d)) < 0) return a >= 0 ? (int)BAND_OPEN : -(int)BAND_OPEN;   // a - b overflowed
  return band_clamp(d);
}
}  // namespace detail
HK_DEV band_pred band(const causal_pred& p) {       // ro + r >= co + c: c <= r + (ro - co)
  const int o = (int)detail::BAND_OPEN;
  return {-o, -o, detail::band_sub(p.sro, p.sco), o, -o, o};
}
HK_DEV band_pred anti_band(const causal_pred& p) {  // !(ro + r >= co + c): c >= r + (ro - co) + 1
  const int o = (int)detail::BAND_OPEN;
  return {detail::band_sub(p.sro, p.sco) + 1, -o, o, o, -o, o};
}
HK_DEV band_pred band(const bounds_pred& p) {       // 0 <= ro + r < nr and 0 <= co + c < nc
  const int o = (int)detail::BAND_OPEN;
  return {-o, detail::band_sub(0, p.sco), o, detail::band_sub(p.snc, p.sco) - 1, detail::band_sub(0, p.sro),
          detail::band_sub(p.snr, p.sro)};
}
HK_DEV band_pred operator&(const band_pred& x, const band_pred& y) {
  using detail::imax;
  using detail::imin;
  return {imax(x.dl, y.dl), imax(x.l0, y.l0), imin(x.dh, y.dh), imin(x.h0, y.h0), imax(x.rlo, y.rlo), imin(x.rhi, y.rhi)};
}
// dst = band(r, c) ? a : b on a tfrag tile. A lane holds one row per row block and four adjacent columns per 16x16
// block: its kept columns are [lo, hi] (relative to its first column), so an element costs two compares and a
// select. A row block every lane keeps whole (most of a diagonal band's), or else a 16x16 block, is a wave-uniform
// branch to a plain copy. Whether every lane keeps a block is decided in scalar registers from the band alone: the
// 64 lanes hold every pair of a row q in 0..15 and a first column f in {0, 4, 8, 12}, so all keep columns
// [c0, c1] of rows r0 .. r0+15 exactly when the extreme pairs do (q = 15 for the left ends, q - f = -12 for the
// right ends, f = 0 / 12 for l0 / h0) -- the lanes' own lo and hi are computed only for blocks that are cut.
template<class T, int R, int C>
HK_DEV void where_band(rt<T, R, C, tfrag>& dst, const band_pred& m, const rt<T, R, C, tfrag>& a,
                       const rt<T, R, C, tfrag>& b) {
  using D = rt<T, R, C, tfrag>;
  const bool rows_all = m.rlo <= 0 && m.rhi >= R;        // every row of the tile in bounds (known at compile time)
  const int w = detail::wave();
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) {
    const int r0 = 16 * ((w + s * NW) % D::RB);           // detail::blk, the wave read once
    // every lane keeps columns [c0, c1] (relative to its first) of this row block: scalar compares
    const bool rows_in = rows_all || (r0 >= m.rlo && r0 + 15 < m.rhi);
    const auto kept = [&](int c0, int c1) {
      return rows_in && r0 + m.dl + 15 <= c0 && m.l0 <= c0 && r0 + m.dh - 12 >= c1 && m.h0 - 12 >= c1;
    };
    if (kept(0, 16 * (D::CB - 1) + 3)) {
#pragma unroll
      for (int e = s * D::CB * 4; e < (s + 1) * D::CB * 4; ++e) dst.data[e] = a.data[e];
      continue;
    }
    asm volatile("");              // real branches: LLVM would evaluate the compares on both paths and select
    // the lane's interval, from an opaque lane id: a DPP move is not speculated, so neither is this arithmetic
    // (LLVM hoisted it above the branch, 5 VALU on the path that copies)
    const int ln = detail::opaque_lane(), first = detail::tcol_in_blk(0, ln);
    const int q = detail::trow_in_blk(ln) - first, l0 = m.l0 - first, h0 = m.h0 - first;
    const int lo = detail::imax(q + (r0 + m.dl), l0);
    int hi = detail::imin(q + (r0 + m.dh), h0);
    if (!rows_all) {
      const int r = r0 + detail::trow_in_blk(ln);
      hi = r >= m.rlo && r < m.rhi ? hi : lo - 1;
    }
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb) {
      const int e0 = (s * D::CB + cb) * 4;
      if (kept(16 * cb, 16 * cb + 3)) {
#pragma unroll
        for (int k = 0; k < 4; ++k) dst.data[e0 + k] = a.data[e0 + k];
        continue;
      }
      asm volatile("");
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int c = 16 * cb + k;
        dst.data[e0 + k] = (c >= lo) & (c <= hi) ? a.data[e0 + k] : b.data[e0 + k];
      }
    }
  }
}

// keep iff (word g mod 4 of philox(g / 4) >> 8) >= floor(p * 2^24), g = offset + (ro + r) * stride + (co + c)
// mod 2^64 (hk_core/philox.h); a lane's consecutive elements of one group share a call (dropout_stream)
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
  dropout_stream rng((unsigned)seed_lo, (unsigned)seed_hi, dropout_threshold(p));
  const unsigned long long off = (unsigned long long)(unsigned)off_lo | ((unsigned long long)(unsigned)off_hi << 32);
  detail::each_pos(dst, [&](int r, int c) {
    const unsigned long long g = off + (unsigned long long)(((long long)ro + r) * (long long)stride) +
                                 (unsigned long long)((long long)co + c);
    return rng.keep(g);
  });
}

}  // namespace hk
