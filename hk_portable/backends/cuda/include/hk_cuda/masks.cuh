// hk_cuda/masks.cuh -- mask tiles: causal, bounds and dropout (Philox from hk_core/philox.h).
namespace hk {

// =========================================================================================== masks
// Generic over the layout: element i of the tile sits at (RT_::row_of(i), RT_::col_of(i)).
template <int R, int C, class L>
HK_DEV void causal_mask(rt<bool, R, C, L>& dst, int row_off, int col_off) {
    typedef rt<bool, R, C, L> RT_;
#pragma unroll
    for (int i = 0; i < RT_::SIZE; ++i)
        dst.d[i] = (long long)row_off + RT_::row_of(i) >= (long long)col_off + RT_::col_of(i);
}

template <int R, int C, class L>
HK_DEV void bounds_mask(rt<bool, R, C, L>& dst, int row_off, int col_off, int n_rows, int n_cols) {
    typedef rt<bool, R, C, L> RT_;
#pragma unroll
    for (int i = 0; i < RT_::SIZE; ++i) {
        const long long r = (long long)row_off + RT_::row_of(i);
        const long long c = (long long)col_off + RT_::col_of(i);
        dst.d[i] = r >= 0 && r < n_rows && c >= 0 && c < n_cols;
    }
}

// g = offset + (row_off + r) * row_stride + (col_off + c) in 64-bit two's complement.
// Philox is ~40 dependent integer ops per element: the loop over elements is only partly unrolled so
// the mask costs a few registers, not one Philox state per element in flight.
template <int R, int C, class L>
HK_DEV void dropout_mask(rt<bool, R, C, L>& dst, float p, int seed_lo, int seed_hi, int off_lo, int off_hi,
                         int row_off, int col_off, int row_stride) {
    typedef rt<bool, R, C, L> RT_;
    const float thr = dropout_threshold(p);
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
            word |= (u32)dropout_keep(g, (u32)seed_lo, (u32)seed_hi, thr) << b;
        }
        dst.d.w[wi] = word;
    }
}

}  // namespace hk
