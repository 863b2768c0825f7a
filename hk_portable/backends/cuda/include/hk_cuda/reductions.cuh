// hk_cuda/reductions.cuh -- row and column reductions: quad shuffles within a warp, partials of the
// warps through the scratch area.
namespace hk {

// How a reduction combines two values: the functor's own rule, except that max/min of floats take the
// hardware's NaN-ignoring fmaxf/fminf (one instruction; a row of NaNs reduces to a NaN).
template <class F> struct combine : F {};
template <> struct combine<op_maximum> : op_maximum {
    using op_maximum::apply;
    static HK_DEV float apply(float a, float b) { return fmaxf(a, b); }
};
template <> struct combine<op_minimum> : op_minimum {
    using op_minimum::apply;
    static HK_DEV float apply(float a, float b) { return fminf(a, b); }
};

// ROW: over the columns of each row; the row lives in one warp (4 lanes of a quad). `at` reads element i
// (in the compute type) of x: the plain reduction reads it as it is, reduce_scaled scales it.
template <class F, class T, int R, int C, class AT>
HK_DEV void reduce_rows(rv<T, R, ROW>& dst, const rt<T, R, C>& x, AT at) {
    typedef rt<T, R, C> RT_;
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            auto v = at(RT_::idx(k, 0, 2 * h));
            v = combine<F>::apply(v, at(RT_::idx(k, 0, 2 * h + 1)));
#pragma unroll
            for (int j = 1; j < RT_::CB; ++j) {
                v = combine<F>::apply(v, at(RT_::idx(k, j, 2 * h)));
                v = combine<F>::apply(v, at(RT_::idx(k, j, 2 * h + 1)));
            }
            v = combine<F>::apply(v, shfl_xor(v, 1));
            v = combine<F>::apply(v, shfl_xor(v, 2));
            dst.d[k * 2 + h] = convert<T>(v);
        }
    }
}
template <class F, class AX, class T, int R, int C>
HK_DEV void reduce(rv<T, R, ROW>& dst, const rt<T, R, C>& x) {
    static_assert(same<AX, ROW>::value, "a row reduction gives a row vector");
    reduce_rows<F>(dst, x, [&](int i) { return up<T>(x.d[i]); });
}

// The row max of x * c (codegen/patterns.py folded_scales): for 0 < c < inf, x -> x * c and rounding are both
// monotone, so max(x) * c is max(x * c) bit for bit (NaN ignored alike), one multiply a row; any other c
// multiplies first.
template <int R, int C> HK_DEV void reduce_scaled(rv<float, R, ROW>& dst, const rt<float, R, C>& x, float c) {
    if (c > 0.0f && c < HK_INF) {
        reduce<op_maximum, ROW>(dst, x);
#pragma unroll
        for (int i = 0; i < rv<float, R, ROW>::SIZE; ++i) dst.d[i] = dst.d[i] * c;
    } else {
        reduce_rows<op_maximum>(dst, x, [&](int i) { return x.d[i] * c; });
    }
}

// COL: over the rows of each column; rows are spread over warps, so partials meet in shared memory
template <class F, class AX, class T, int R, int C>
HK_DEV void reduce(rv<T, C, COL>& dst, const rt<T, R, C>& x) {
    static_assert(same<AX, COL>::value, "a column reduction gives a column vector");
    typedef rt<T, R, C> RT_;
    typedef typename compute_t<T>::type A;
    A part[RT_::CB * 2];
#pragma unroll
    for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            A v = combine<F>::apply(up<T>(x.d[RT_::idx(0, j, e)]), up<T>(x.d[RT_::idx(0, j, e + 2)]));
#pragma unroll
            for (int k = 1; k < RT_::SLOTS; ++k)
                if (RT_::L::valid(k))
                    v = combine<F>::apply(v, combine<F>::apply(up<T>(x.d[RT_::idx(k, j, e)]), up<T>(x.d[RT_::idx(k, j, e + 2)])));
            v = combine<F>::apply(v, shfl_xor(v, 4));
            v = combine<F>::apply(v, shfl_xor(v, 8));
            v = combine<F>::apply(v, shfl_xor(v, 16));
            part[j * 2 + e] = v;
        }
    constexpr int DW = RT_::L::DISTINCT;
    if constexpr (DW > 1) {
        A* sh = reinterpret_cast<A*>(scratch<0, NUM_WARPS * C * 4>());
        sync();                                            // earlier users of the scratch are done
        if (warp_id() < DW && lane_id() < 4) {
#pragma unroll
            for (int i = 0; i < RT_::CB * 2; ++i) sh[warp_id() * C + rv<T, C, COL>::pos(i)] = part[i];
        }
        sync();
#pragma unroll
        for (int i = 0; i < RT_::CB * 2; ++i) {
            const int c = rv<T, C, COL>::pos(i);
            A v = sh[c];
            for (int w = 1; w < DW; ++w) v = combine<F>::apply(v, sh[w * C + c]);       // fixed order: deterministic
            part[i] = v;
        }
    }
#pragma unroll
    for (int i = 0; i < RT_::CB * 2; ++i) dst.d[i] = convert<T>(part[i]);
}

// strip, ROW: a lane folds its chunks, the row's LR lanes theirs (shuffles: xor offsets below LR stay inside a
// narrow strip's lane group), then the WC warps of a warp-row meet in the scratch area in a fixed order
// (deterministic; a narrow strip has one warp across a row)
template <class F, class AX, class T, int R, int C, int WR, int LR>
HK_DEV void reduce(rv<T, R, ROW, strip<WR, LR>>& dst, const rt<T, R, C, strip<WR, LR>>& x) {
    static_assert(same<AX, ROW>::value, "a row reduction gives a row vector");
    typedef rt<T, R, C, strip<WR, LR>> RT_;
    typedef strip<WR, LR> S;
    typedef typename compute_t<T>::type A;
    constexpr int PER_ROW = RT_::CS * RT_::V;
    A part[RT_::RS];
#pragma unroll
    for (int k = 0; k < RT_::RS; ++k) {
        A v = up<T>(x.d[k * PER_ROW]);
#pragma unroll
        for (int i = 1; i < PER_ROW; ++i) v = combine<F>::apply(v, up<T>(x.d[k * PER_ROW + i]));
#pragma unroll
        for (int m = S::LR / 2; m >= 1; m >>= 1) v = combine<F>::apply(v, shfl_xor(v, m));
        part[k] = v;
    }
    if constexpr (S::WC > 1) {
        A* sh = reinterpret_cast<A*>(scratch<0, NUM_WARPS * RT_::RS * 4>());
        sync();                                            // earlier users of the scratch are done
        if (lane_id() == 0) {
#pragma unroll
            for (int k = 0; k < RT_::RS; ++k) sh[warp_id() * RT_::RS + k] = part[k];
        }
        sync();
#pragma unroll
        for (int k = 0; k < RT_::RS; ++k) {
            A v = sh[S::wr() * S::WC * RT_::RS + k];
            for (int w = 1; w < S::WC; ++w) v = combine<F>::apply(v, sh[(S::wr() * S::WC + w) * RT_::RS + k]);
            part[k] = v;
        }
    }
#pragma unroll
    for (int k = 0; k < RT_::RS; ++k) dst.d[k] = convert<T>(part[k]);
}

// strip, COL: a lane folds its rows (each lane holds distinct columns), then the WR warp-rows meet in the
// scratch area
template <class F, class AX, class T, int R, int C, int WR>
HK_DEV void reduce(rv<T, C, COL, strip<WR>>& dst, const rt<T, R, C, strip<WR>>& x) {
    static_assert(same<AX, COL>::value, "a column reduction gives a column vector");
    typedef rt<T, R, C, strip<WR>> RT_;
    typedef rv<T, C, COL, strip<WR>> RV_;
    typedef typename compute_t<T>::type A;
    constexpr int PER_ROW = RT_::CS * RT_::V;
    A part[PER_ROW];
#pragma unroll
    for (int i = 0; i < PER_ROW; ++i) {
        A v = up<T>(x.d[i]);
#pragma unroll
        for (int k = 1; k < RT_::RS; ++k) v = combine<F>::apply(v, up<T>(x.d[k * PER_ROW + i]));
        part[i] = v;
    }
    if constexpr (WR > 1) {
        A* sh = reinterpret_cast<A*>(scratch<0, WR * C * 4>());
        sync();
#pragma unroll
        for (int i = 0; i < PER_ROW; ++i) sh[strip<WR>::wr() * C + RV_::pos(i)] = part[i];
        sync();
#pragma unroll
        for (int i = 0; i < PER_ROW; ++i) {
            A v = sh[RV_::pos(i)];
            for (int w = 1; w < WR; ++w) v = combine<F>::apply(v, sh[w * C + RV_::pos(i)]);
            part[i] = v;
        }
    }
#pragma unroll
    for (int i = 0; i < PER_ROW; ++i) dst.d[i] = convert<T>(part[i]);
}

}  // namespace hk
