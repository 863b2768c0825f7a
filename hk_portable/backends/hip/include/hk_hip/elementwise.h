// hk_hip/elementwise.h -- fills, broadcasts and elementwise ops over register tiles and vectors (the
// functors are the portable core's, hk_core/functors.h).
namespace hk {

// arithmetic happens in float for float storage types, in int for int, in bool for masks
template<class T> struct calc_t { using type = float; };
template<> struct calc_t<int> { using type = int; };
template<> struct calc_t<bool> { using type = bool; };
template<class T> HK_DEV typename calc_t<T>::type calc(T x) { return to_float(x); }
HK_DEV int calc(int x) { return x; }
HK_DEV bool calc(bool x) { return x; }
template<class T> HK_DEV T uncalc(float x) { return from_float<T>(x); }
template<class T> HK_DEV T uncalc(int x) { return (T)x; }
template<class T> HK_DEV T uncalc(bool x) { return x; }

// ================================================================================ fills, elementwise
template<class Tile, class V> HK_DEV void fill(Tile& dst, V v) {
  const typename Tile::dtype x = convert<typename Tile::dtype>(v);
#pragma unroll
  for (int e = 0; e < Tile::NE; ++e) dst.data[e] = x;
}

template<class T, int R, int C> HK_DEV void broadcast(rt<T, R, C>& dst, const rv<T, R, ROW>& v) {
  using D = rt<T, R, C>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s)
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k) dst.data[(s * D::CB + cb) * 4 + k] = v.data[s * 4 + k];
}
template<class T, int R, int C> HK_DEV void broadcast(rt<T, R, C>& dst, const rv<T, C, COL>& v) {
  using D = rt<T, R, C>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s)
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k) dst.data[(s * D::CB + cb) * 4 + k] = v.data[cb];
}

template<class T, int R, int C> HK_DEV void broadcast(rt<T, R, C, tfrag>& dst, const rv<T, R, ROW, tfrag>& v) {
  using D = rt<T, R, C, tfrag>;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = v.data[e / (D::CB * 4)];
}

template<class T, int R, int C, int WR>
HK_DEV void broadcast(rt<T, R, C, strip<WR>>& dst, const rv<T, R, ROW, strip<WR>>& v) {
  using D = rt<T, R, C, strip<WR>>;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = v.data[e / (D::CS * 8)];
}
template<class T, int R, int C, int WR>
HK_DEV void broadcast(rt<T, R, C, strip<WR>>& dst, const rv<T, C, COL, strip<WR>>& v) {
  using D = rt<T, R, C, strip<WR>>;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = v.data[e % (D::CS * 8)];
}

template<class F, class D, class X> HK_DEV void unary(D& dst, const X& x) {
#pragma unroll
  for (int e = 0; e < D::NE; ++e)
    dst.data[e] = detail::put(uncalc<typename D::dtype>(F::apply(calc(x.data[e]))));
}
template<class F, class D, class X> HK_DEV void binary(D& dst, const X& a, const X& b) {
#pragma unroll
  for (int e = 0; e < D::NE; ++e)
    dst.data[e] = detail::put(uncalc<typename D::dtype>(F::apply(calc(a.data[e]), calc(b.data[e]))));
}
template<class D, class M> HK_DEV void where(D& dst, const M& mask, const D& a, const D& b) {
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = mask.data[e] ? a.data[e] : b.data[e];
}
template<class D, class X> HK_DEV void cast(D& dst, const X& x) {
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = convert<typename D::dtype>(x.data[e]);
}

}  // namespace hk
