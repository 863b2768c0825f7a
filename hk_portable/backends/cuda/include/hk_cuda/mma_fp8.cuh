// hk_cuda/mma_fp8.cuh -- mma of fp8 operands (OCP e4m3/e5m2, any pair): m16n8k32 fragments from shared
// tiles, run natively (mma.sync ... e4m3/e5m2, sm_89 and later) or, on sm_80 and the emulator, widened
// exactly to f16 for two m16n8k16 steps. Either way every product is exact and sums in f32.
//
// Fragments (PTX ISA, mma.m16n8k32 for .e4m3/.e5m2): thread (g = lane / 4, t = lane % 4) holds four
// consecutive k per 32-bit register -- A: a0 (row g, k 4t..4t+3), a1 (row g + 8), a2/a3 the same at
// k + 16; B: b0 (k 4t..4t+3, column g), b1 at k + 16. Four consecutive bytes are one b16 pair of ldmatrix,
// so a k-contiguous tile (A as M x K, B as N x K) reads them with ldmatrix; the other orientation gathers
// bytes.
namespace hk {

// four bytes s(k0 .. k0+3, m) of a tile stored K x M (the k-strided orientation)
template <class T, int SR, int SC> HK_DEV u32 gather4_k(const st<T, SR, SC>& s, int k0, int m) {
    u32 w = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) w |= (u32)s.at(k0 + e, m)->bits << (8 * e);
    return w;
}

// A fragment for row block rb, k-step kk (32 k). TA = false: s is M x K; TA = true: s is K x M.
template <bool TA, class T, int SR, int SC>
HK_DEV void a_frag8(u32 (&a)[4], const st<T, SR, SC>& s, int rb, int kk) {
    const int lane = lane_id();
    if constexpr (!TA) {
        const int m = lane >> 3, i = lane & 7;
        ldsm_x4(a, s.at(rb * 16 + (m & 1) * 8 + i, kk * 32 + (m >> 1) * 16));
    } else {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int j = 0; j < 4; ++j) a[j] = gather4_k(s, kk * 32 + (j >> 1) * 16 + 4 * t, rb * 16 + (j & 1) * 8 + g);
    }
}

// B fragments of all N/8 column blocks, k-step kk. TB = true: s is N x K; TB = false: s is K x N.
template <bool TB, int N, class T, int SR, int SC>
HK_DEV void b_frags8(u32 (&b)[N / 8][2], const st<T, SR, SC>& s, int kk) {
    const int lane = lane_id();
    if constexpr (TB) {
        const int m = lane >> 3, i = lane & 7;
#pragma unroll
        for (int j = 0; j + 1 < N / 8; j += 2) {
            u32 v[4];
            ldsm_x4(v, s.at((j + (m >> 1)) * 8 + i, kk * 32 + (m & 1) * 16));
            b[j][0] = v[0]; b[j][1] = v[1]; b[j + 1][0] = v[2]; b[j + 1][1] = v[3];
        }
        if constexpr ((N / 8) % 2 == 1) {
            constexpr int j = N / 8 - 1;
            u32 v[2];
            ldsm_x2(v, s.at(j * 8 + i, kk * 32 + (m & 1) * 16));
            b[j][0] = v[0]; b[j][1] = v[1];
        }
    } else {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
            b[j][0] = gather4_k(s, kk * 32 + 4 * t, j * 8 + g);
            b[j][1] = gather4_k(s, kk * 32 + 16 + 4 * t, j * 8 + g);
        }
    }
}

#if defined(HK_PTX) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define HK_FP8_MMA_NATIVE 1
template <class TA_, class TB_> struct mma_fp8_op;
#define HK_MMA_FP8_OP(TA_, TB_, SA, SB)                                                                    \
    template <> struct mma_fp8_op<TA_, TB_> {                                                              \
        static HK_DEV void run(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {                      \
            asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." SA "." SB ".f32 {%0,%1,%2,%3}, "         \
                         "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                          \
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                   \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));               \
        }                                                                                                  \
    };
HK_MMA_FP8_OP(fp8e4m3, fp8e4m3, "e4m3", "e4m3")
HK_MMA_FP8_OP(fp8e4m3, fp8e5m2, "e4m3", "e5m2")
HK_MMA_FP8_OP(fp8e5m2, fp8e4m3, "e5m2", "e4m3")
HK_MMA_FP8_OP(fp8e5m2, fp8e5m2, "e5m2", "e5m2")
#undef HK_MMA_FP8_OP
#else
// Bytes 2h, 2h+1 of w as an f16 pair (every e4m3/e5m2 value is an f16: exact)
template <class T> HK_DEV u32 widen_pair(u32 w, int h) {
    T x0, x1;
    x0.bits = (unsigned char)(w >> (16 * h));
    x1.bits = (unsigned char)(w >> (16 * h + 8));
    return pack2(from_float<f16>(to_float(x0)), from_float<f16>(to_float(x1)));
}
// One k32 step as two m16n8k16 f16 steps over a permutation of k applied to A and B alike: the f16
// fragment's k pair (2t, 2t+1) takes fp8 k (4t, 4t+1) and the pair (8+2t, 9+2t) takes (4t+2, 4t+3).
template <class TA_, class TB_> struct mma_fp8_op {
    static HK_DEV void run(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const u32 a0 = a[2 * half], a1 = a[2 * half + 1], b0 = b[half];
            const u32 ah[4] = {widen_pair<TA_>(a0, 0), widen_pair<TA_>(a1, 0), widen_pair<TA_>(a0, 1),
                               widen_pair<TA_>(a1, 1)};
            const u32 bh[2] = {widen_pair<TB_>(b0, 0), widen_pair<TB_>(b0, 1)};
            mma_op<f16>::run(d, ah, bh);
        }
    }
};
#endif

// dst += op(a) op(b), both shared fp8 tiles, K a multiple of 32
template <bool TA, bool TB, int M, int N, class TA_, int AR, int AC, class TB_, int BR, int BC>
HK_DEV void mma_core_fp8(rt<float, M, N>& dst, const st<TA_, AR, AC>& a, const st<TB_, BR, BC>& b, int K) {
    typedef rt<float, M, N> ACC;
    for (int kk = 0; kk < K / 32; ++kk) {
        u32 bf[N / 8][2];
        b_frags8<TB, N>(bf, b, kk);
#pragma unroll
        for (int k = 0; k < ACC::SLOTS; ++k) {
            if (!ACC::L::valid(k)) continue;
            u32 af[4];
            a_frag8<TA>(af, a, ACC::L::block(k), kk);
#pragma unroll
            for (int j = 0; j < N / 8; ++j)
                mma_fp8_op<TA_, TB_>::run(*reinterpret_cast<float(*)[4]>(&dst.d[ACC::idx(k, j, 0)]), af, bf[j]);
        }
    }
}

}  // namespace hk
