// hk_cuda/masks.cuh -- mask tiles: causal, bounds and dropout (Philox from hk_core/philox.h).
namespace hk {

// =========================================================================================== masks
// Generic over the layout: element i of the tile sits at (RT_::row_of(i), RT_::col_of(i)).
// Each mask is a comparison of the element's position with a threshold computed once per call in 64 bits and
// clamped to +-SPAN: positions are far smaller than SPAN, so the 32-bit comparison per element gives the 64-bit
// rule's answer bit for bit (an element costs one compare, not a 64-bit pair).
namespace detail {
constexpr long long SPAN = 1 << 21;
HK_DEV int span_clamp(long long t) { return (int)(t < -SPAN ? -SPAN : t > SPAN ? SPAN : t); }
}  // namespace detail

// keep iff row_off + r >= col_off + c, i.e. c - r <= row_off - col_off
struct causal_pred {
    int t;
    HK_DEV bool at(int r, int c) const { return c - r <= t; }
};
// keep iff 0 <= row_off + r < n_rows and 0 <= col_off + c < n_cols
struct bounds_pred {
    int r_lo, r_hi, c_lo, c_hi;
    HK_DEV bool at(int r, int c) const { return r >= r_lo && r < r_hi && c >= c_lo && c < c_hi; }
};
HK_DEV causal_pred causal_at(int row_off, int col_off) {
    return {detail::span_clamp((long long)row_off - col_off)};
}
HK_DEV bounds_pred bounds_at(int row_off, int col_off, int n_rows, int n_cols) {
    using detail::span_clamp;
    return {span_clamp(-(long long)row_off), span_clamp((long long)n_rows - row_off),
            span_clamp(-(long long)col_off), span_clamp((long long)n_cols - col_off)};
}

template <int R, int C, class L>
HK_DEV void causal_mask(rt<bool, R, C, L>& dst, int row_off, int col_off) {
    typedef rt<bool, R, C, L> RT_;
    const causal_pred p = causal_at(row_off, col_off);
#pragma unroll
    for (int i = 0; i < RT_::SIZE; ++i) dst.d[i] = p.at(RT_::row_of(i), RT_::col_of(i));
}

template <int R, int C, class L>
HK_DEV void bounds_mask(rt<bool, R, C, L>& dst, int row_off, int col_off, int n_rows, int n_cols) {
    typedef rt<bool, R, C, L> RT_;
    const bounds_pred p = bounds_at(row_off, col_off, n_rows, n_cols);
#pragma unroll
    for (int i = 0; i < RT_::SIZE; ++i) dst.d[i] = p.at(RT_::row_of(i), RT_::col_of(i));
}

// dst = pred(r, c) ? a : b at every element: a select whose mask (a tree of the masks above) is evaluated
// where it writes, so the mask tile never exists (codegen/patterns.py fused_masks)
template <class T, int R, int C, class L, class P>
HK_DEV void where_at(rt<T, R, C, L>& dst, P pred, const rt<T, R, C, L>& a, const rt<T, R, C, L>& b) {
    typedef rt<T, R, C, L> RT_;
#pragma unroll
    for (int i = 0; i < RT_::SIZE; ++i) dst.d[i] = pred(RT_::row_of(i), RT_::col_of(i)) ? a.d[i] : b.d[i];
}

// g = offset + (row_off + r) * row_stride + (col_off + c) in 64-bit two's complement; element g takes word
// g mod 4 of the Philox call g / 4 (hk_core/philox.h). The elements are visited in register order, so a
// strip lane's run of columns shares a call per group, and an mma fragment's column pair (c, c+1) does
// (dropout_stream; the pair's group-mates are on the next lane).
// Philox is ~40 dependent integer ops per call: the loop over elements is only partly unrolled so
// the mask costs a few registers, not one Philox state per element in flight.
template <int R, int C, class L>
HK_DEV void dropout_mask(rt<bool, R, C, L>& dst, float p, int seed_lo, int seed_hi, int off_lo, int off_hi,
                         int row_off, int col_off, int row_stride) {
    typedef rt<bool, R, C, L> RT_;
    dropout_stream rng((u32)seed_lo, (u32)seed_hi, dropout_threshold(p));
    const u64 offset = (u64)(u32)off_lo | ((u64)(u32)off_hi << 32);
    constexpr int WORDS = (RT_::SIZE + 31) / 32;
#pragma unroll
    for (int wi = 0; wi < WORDS; ++wi) {
        u32 word = 0;
        constexpr int NB = RT_::SIZE < 32 ? RT_::SIZE : 32;
#pragma unroll 4
        for (int b = 0; b < NB; ++b) {
            const int i = wi * 32 + b;
            const u64 row = (u64)((long long)row_off + RT_::row_of(i));
            const u64 col = (u64)((long long)col_off + RT_::col_of(i));
            const u64 g = offset + row * (u64)(long long)row_stride + col;
            word |= (u32)rng.keep(g) << b;
        }
        dst.d.w[wi] = word;
    }
}

}  // namespace hk
