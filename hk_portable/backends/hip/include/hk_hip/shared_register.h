// hk_hip/shared_register.h -- LDS <-> registers.
namespace hk {

// ================================================================================ LDS <-> registers
template<class T, int R, int C> HK_DEV void load(rt<T, R, C>& dst, const st<T, R, C>& s) {
  using D = rt<T, R, C>;
#pragma unroll
  for (int sl = 0; sl < D::RBW; ++sl)
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int r = 16 * detail::blk<D::RB>(sl) + detail::row_in_blk(k), c = 16 * cb + detail::col_in_blk();
        const bool in = (R % 16 == 0 || r < R) && (C % 16 == 0 || c < C);
        dst.data[(sl * D::CB + cb) * 4 + k] = in ? s.get(r, c) : T{};
      }
}
template<class T, int R, int C> HK_DEV void store(st<T, R, C> dst, const rt<T, R, C>& x) {
  detail::each_owned(x, [&](int r, int c, T v) {
    if ((R % 16 == 0 || r < R) && (C % 16 == 0 || c < C)) dst.set(r, c, v);
  });
}
// a tfrag tile (whole 16x16 blocks): a lane writes 4 consecutive columns of a row
template<class T, int R, int C> HK_DEV void store(st<T, R, C> dst, const rt<T, R, C, tfrag>& x) {
  detail::each_owned(x, [&](int r, int c, T v) { dst.set(r, c, v); });
}

}  // namespace hk
