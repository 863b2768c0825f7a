// hk_cuda/elementwise.cuh -- elementwise and broadcast ops over register tiles and vectors (the functors
// are the portable core's, hk_core/functors.h).
namespace hk {

// The compute type of an element type: float for floats (16-bit/fp8 round once on the way back)
template <class T> struct compute_t { typedef float type; };
template <> struct compute_t<int> { typedef int type; };
template <> struct compute_t<bool> { typedef bool type; };

template <class T, class R> struct back_t { static HK_DEV T apply(R x) { return convert<T>(x); } };
template <class T> struct back_t<T, bool> { static HK_DEV bool apply(bool x) { return x; } };
template <> struct back_t<bool, bool> { static HK_DEV bool apply(bool x) { return x; } };

template <class T> HK_DEV typename compute_t<T>::type up(T x) { return to_float(x); }
template <> HK_DEV int up<int>(int x) { return x; }
template <> HK_DEV bool up<bool>(bool x) { return x; }

template <class F, class D, class S>
HK_DEV void unary(D& dst, const S& x) {
    typedef typename S::dtype T;
#pragma unroll
    for (int i = 0; i < S::SIZE; ++i) {
        auto r = F::apply(up<T>(x.d[i]));
        dst.d[i] = back_t<typename D::dtype, decltype(r)>::apply(r);
    }
}

template <class F, class D, class S>
HK_DEV void binary(D& dst, const S& a, const S& b) {
    typedef typename S::dtype T;
#pragma unroll
    for (int i = 0; i < S::SIZE; ++i) {
        auto r = F::apply(up<T>(a.d[i]), up<T>(b.d[i]));
        dst.d[i] = back_t<typename D::dtype, decltype(r)>::apply(r);
    }
}

template <class D, class M, class S>
HK_DEV void where(D& dst, const M& mask, const S& a, const S& b) {
#pragma unroll
    for (int i = 0; i < S::SIZE; ++i) dst.d[i] = mask.d[i] ? a.d[i] : b.d[i];
}

template <class D, class S>
HK_DEV void cast(D& dst, const S& x) {
#pragma unroll
    for (int i = 0; i < S::SIZE; ++i) dst.d[i] = convert<typename D::dtype>(x.d[i]);
}

template <class D, class V>
HK_DEV void fill(D& dst, V v) {
    const typename D::dtype x = convert<typename D::dtype>(v);
#pragma unroll
    for (int i = 0; i < D::SIZE; ++i) dst.d[i] = x;
}

// f(i, r, c) for every element of a fragment-layout tile: its index in d and the slots of its row and column
// in this thread's row and column vectors (the mma.sync m16n8 accumulator map)
template <class RT_, class F> HK_DEV void each_fragment(F f) {
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k)
#pragma unroll
        for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) f(RT_::idx(k, j, e), k * 2 + (e >> 1), j * 2 + (e & 1));
}

template <class T, int R, int C, int N>
HK_DEV void broadcast(rt<T, R, C>& dst, const rv<T, N, ROW>& v) {
    static_assert(N == R, "a row vector broadcasts over a tile with as many rows");
    each_fragment<rt<T, R, C>>([&](int i, int r, int) { dst.d[i] = v.d[r]; });
}
template <class T, int R, int C, int N>
HK_DEV void broadcast(rt<T, R, C>& dst, const rv<T, N, COL>& v) {
    static_assert(N == C, "a column vector broadcasts over a tile with as many columns");
    each_fragment<rt<T, R, C>>([&](int i, int, int c) { dst.d[i] = v.d[c]; });
}

// strip tiles: element idx(k, j, e) sits in row slot k and chunk slot j
template <class T, int R, int C, int WR, int LR>
HK_DEV void broadcast(rt<T, R, C, strip<WR, LR>>& dst, const rv<T, R, ROW, strip<WR, LR>>& v) {
    typedef rt<T, R, C, strip<WR, LR>> RT_;
#pragma unroll
    for (int i = 0; i < RT_::SIZE; ++i) dst.d[i] = v.d[i / (RT_::CS * RT_::V)];
}
template <class T, int R, int C, int WR, int LR>
HK_DEV void broadcast(rt<T, R, C, strip<WR, LR>>& dst, const rv<T, C, COL, strip<WR, LR>>& v) {
    typedef rt<T, R, C, strip<WR, LR>> RT_;
#pragma unroll
    for (int i = 0; i < RT_::SIZE; ++i) dst.d[i] = v.d[i % (RT_::CS * RT_::V)];
}

// dst = x * c - v[:, None] rounded once (one FFMA): a softmax's scaled scores minus the row max where exp2 is
// the only reader (codegen/patterns.py folded_scales; the backend's one contraction).
template <int R, int C>
HK_DEV void fms_rows(rt<float, R, C>& dst, const rt<float, R, C>& x, float c, const rv<float, R, ROW>& v) {
    each_fragment<rt<float, R, C>>([&](int i, int r, int) { dst.d[i] = fmaf(x.d[i], c, -v.d[r]); });
}

}  // namespace hk
