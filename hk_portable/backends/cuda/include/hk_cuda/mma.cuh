// hk_cuda/mma.cuh -- matrix multiply-accumulate: fragments from shared or register operands,
// mma.sync m16n8k16 with f32 accumulation (wgmma on sm_90a where the operands allow: wgmma.cuh; fp8
// operands: mma_fp8.cuh).
namespace hk {

// ============================================================================================= mma
// A fragment (16 rows x k16) for slot k, k-step kk, from a shared tile.
// TA = false: st is M x K (row-major A); TA = true: st is K x M (A transposed), read with .trans.
template <bool TA, class T, int SR, int SC>
HK_DEV void a_frag(u32 (&a)[4], const st<T, SR, SC>& s, int row_block, int kk) {
    const int lane = lane_id(), m = lane >> 3, i = lane & 7;
    if (!TA) {
        ldsm_x4(a, s.at(row_block * 16 + (m & 1) * 8 + i, kk * 16 + (m >> 1) * 8));
    } else {
        ldsm_x4_t(a, s.at(kk * 16 + (m >> 1) * 8 + i, row_block * 16 + (m & 1) * 8));
    }
}
// A fragment from registers (the tile's layout is the fragment layout: no data movement)
template <class T, int R, int C>
HK_DEV void a_frag_rt(u32 (&a)[4], const rt<T, R, C>& x, int k, int kk) {
    typedef rt<T, R, C> RT_;
    a[0] = pack2(x.d[RT_::idx(k, 2 * kk, 0)], x.d[RT_::idx(k, 2 * kk, 1)]);
    a[1] = pack2(x.d[RT_::idx(k, 2 * kk, 2)], x.d[RT_::idx(k, 2 * kk, 3)]);
    a[2] = pack2(x.d[RT_::idx(k, 2 * kk + 1, 0)], x.d[RT_::idx(k, 2 * kk + 1, 1)]);
    a[3] = pack2(x.d[RT_::idx(k, 2 * kk + 1, 2)], x.d[RT_::idx(k, 2 * kk + 1, 3)]);
}
// B fragments (k16 x n8) for all N/8 column blocks of k-step kk.
// TB = false: st is K x N (read with .trans); TB = true: st is N x K (B transposed, plain ldmatrix).
template <bool TB, int N, class T, int SR, int SC>
HK_DEV void b_frags(u32 (&b)[N / 8][2], const st<T, SR, SC>& s, int kk) {
    const int lane = lane_id(), m = lane >> 3, i = lane & 7;
#pragma unroll
    for (int j = 0; j + 1 < N / 8; j += 2) {
        u32 v[4];
        if (TB) ldsm_x4(v, s.at(j * 8 + (m >> 1) * 8 + i, kk * 16 + (m & 1) * 8));
        else ldsm_x4_t(v, s.at(kk * 16 + (m & 1) * 8 + i, j * 8 + (m >> 1) * 8));
        b[j][0] = v[0]; b[j][1] = v[1]; b[j + 1][0] = v[2]; b[j + 1][1] = v[3];
    }
    if constexpr ((N / 8) % 2 == 1) {
        constexpr int j = N / 8 - 1;
        u32 v[2];
        if (TB) ldsm_x2(v, s.at(j * 8 + i, kk * 16 + (m & 1) * 8));
        else ldsm_x2_t(v, s.at(kk * 16 + (m & 1) * 8 + i, j * 8));
        b[j][0] = v[0]; b[j][1] = v[1];
    }
}

// Register operands that the fragments cannot read in place (a transposed A, any B) go through a
// scratch shared tile: written by the primary warps, then read like any shared operand.
template <int OFFSET, class T, int R, int C>
HK_DEV st<T, R, C> to_scratch(const rt<T, R, C>& x) {
    st<T, R, C> s{scratch<OFFSET, R * C * (int)sizeof(T)>()};
    store(s, x);
    return s;
}
HK_HD constexpr int round128(int x) { return (x + 127) / 128 * 128; }

template <class X> struct operand;
template <class T, int R, int C> struct operand<st<T, R, C>> {
    typedef T dtype; static constexpr bool reg = false; static constexpr int ROWS = R, COLS = C;
};
template <class T, int R, int C> struct operand<rt<T, R, C>> {
    typedef T dtype; static constexpr bool reg = true; static constexpr int ROWS = R, COLS = C;
};

template <bool TA, bool TB, class T, int M, int N, class AOp, class BOp>
HK_DEV void mma_core(rt<float, M, N>& dst, const AOp& a, const BOp& b, int K) {
    typedef rt<float, M, N> ACC;
    for (int kk = 0; kk < K / 16; ++kk) {
        u32 bf[N / 8][2];
        b_frags<TB, N>(bf, b, kk);
#pragma unroll
        for (int k = 0; k < ACC::SLOTS; ++k) {
            if (!ACC::L::valid(k)) continue;
            u32 af[4];
            if constexpr (operand<AOp>::reg) a_frag_rt(af, a, k, kk);
            else a_frag<TA>(af, a, ACC::L::block(k), kk);
#pragma unroll
            for (int j = 0; j < N / 8; ++j) mma_op<T>::run(*reinterpret_cast<float(*)[4]>(&dst.d[ACC::idx(k, j, 0)]), af, bf[j]);
        }
    }
}

// The core for shared (or scratch) operands: fp8 in k-steps of 32 (mma_fp8.cuh), 16-bit in steps of 16
template <bool TA, bool TB, int M, int N, class AOp, class BOp>
HK_DEV void mma_shared(rt<float, M, N>& dst, const AOp& a, const BOp& b, int K) {
    typedef typename operand<AOp>::dtype T;
    if constexpr (is_fp8<T>::value) mma_core_fp8<TA, TB>(dst, a, b, K);
    else mma_core<TA, TB, T>(dst, a, b, K);
}

// dst = acc + op(a) op(b): f32 accumulation with mma.sync (m16n8k16 for bf16/f16, m16n8k32 for fp8)
// MODE (schedule.py): 0 standalone; 1 staged (operands are stages a pipeline has published); 2 staged and
// asynchronous (a wgmma is left in flight for the pipeline to retire). mma.sync ignores it.
template <bool TA, bool TB, int MODE = 0, int M, int N, class AOp, class BOp>
HK_DEV void mma(rt<float, M, N>& dst, const AOp& a, const BOp& b, const rt<float, M, N>& acc) {
    typedef operand<AOp> OA;
    typedef operand<BOp> OB;
    typedef typename OA::dtype T;
    constexpr bool FP8 = is_fp8<T>::value;
    static_assert(FP8 ? is_fp8<typename OB::dtype>::value : (is16<T>::value && same<T, typename OB::dtype>::value),
                  "mma operands are bf16 or f16 of one dtype, or fp8 (any two formats)");
    constexpr int K = TA ? OA::ROWS : OA::COLS, KSTEP = FP8 ? 32 : 16;
    static_assert(K % KSTEP == 0, "mma needs K to be a multiple of 16 (32 for fp8)");
    static_assert((TA ? OA::COLS : OA::ROWS) == M && (TB ? OB::ROWS : OB::COLS) == N, "mma shapes");
    // fp8 register operands always go through scratch: the rt's fragment layout is a 16-bit one
    constexpr bool A_SCR = OA::reg && (TA || FP8), B_SCR = OB::reg;
    constexpr int A_BYTES = A_SCR ? round128(OA::ROWS * OA::COLS * (int)sizeof(T)) : 0;
    dst = acc;
    if constexpr (A_SCR || B_SCR) sync();               // earlier readers of the scratch are done
    if constexpr (A_SCR && B_SCR) {
        const auto as = to_scratch<0>(a);
        const auto bs = to_scratch<A_BYTES>(b);
        sync();
        mma_shared<TA, TB>(dst, as, bs, K);
    } else if constexpr (A_SCR) {
        const auto as = to_scratch<0>(a);
        sync();
        mma_shared<TA, TB>(dst, as, b, K);
    } else if constexpr (B_SCR) {
        const auto bs = to_scratch<A_BYTES>(b);
        sync();
        mma_shared<TA, TB>(dst, a, bs, K);
    } else {
#ifdef HK_WGMMA
        if constexpr (wgmma_fits<TA, TB, M, N, AOp, BOp>::value) {
            mma_wgmma<TA, TB, K, MODE>(dst, a, b);
            return;
        }
#endif
        if constexpr (OA::reg) mma_core<TA, TB, T>(dst, a, b, K);   // 16-bit A in its fragment layout
        else mma_shared<TA, TB>(dst, a, b, K);
    }
}

}  // namespace hk
