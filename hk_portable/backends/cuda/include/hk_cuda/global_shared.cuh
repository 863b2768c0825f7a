// hk_cuda/global_shared.cuh -- global <-> shared: cp.async tile loads, 16-byte stores.
namespace hk {

// ========================================================================================= memory
// ---- GL -> ST: 16-byte cp.async where a chunk is in bounds and aligned, cp.async zero-fill for ragged
// chunks (fill bits == 0), plain element copies otherwise. Completes at async_wait + sync.
template <class T, int R, int C, int RANK, class... I>
HK_DEV void load(const st<T, R, C>& dst, const gl<T, RANK>& g, float fill, I... idx) {
    origin<2, T, RANK> o(g, R, C, idx...);
    const T fv = convert<T>(fill);
    const bool zero_fill = f2u(fill) == 0u;
    if constexpr (st<T, R, C>::CHUNKED) {
        constexpr int E = 16 / (int)sizeof(T), CPR = C / E, CHUNKS = R * CPR;
        const bool unit = o.cstride == 1;
        for (int q = threadIdx.x; q < CHUNKS; q += NUM_THREADS) {
            const int r = q / CPR, c = (q % CPR) * E;
            T* s = dst.at(r, c);
            const bool rok = o.row_ok(r);
            const long long left = o.ncols - (o.col0 + c);          // valid columns from c on
            if (!rok || left <= 0 || o.col0 + c < 0) {
                if (zero_fill) {
                    *reinterpret_cast<uint4*>(s) = make_uint4(0, 0, 0, 0);
                    continue;
                }
            } else if (unit) {
                const T* src = o.at(g, r, c);
                if (aligned(src, 16)) {
                    if (left >= E) { cp_async16(s, src, 16); continue; }
                    if (zero_fill) { cp_async16(s, src, (int)left * (int)sizeof(T)); continue; }
                }
            }
#pragma unroll
            for (int e = 0; e < E; ++e)
                s[e] = (rok && o.col_ok(c + e)) ? *o.at(g, r, c + e) : fv;
        }
    } else {
        for (int q = threadIdx.x; q < R * C; q += NUM_THREADS) {
            const int r = q / C, c = q % C;
            *dst.at(r, c) = (o.row_ok(r) && o.col_ok(c)) ? *o.at(g, r, c) : fv;
        }
    }
}

// ---- ST -> GL (converting to the tensor dtype; out-of-bounds elements dropped)
template <class U, class T, int R, int C, int RANK, class... I>
HK_DEV void store(const gl<U, RANK>& g, const st<T, R, C>& src, I... idx) {
    origin<2, U, RANK> o(g, R, C, idx...);
    if constexpr (same<T, U>::value && st<T, R, C>::CHUNKED) {
        constexpr int E = 16 / (int)sizeof(T), CPR = C / E, CHUNKS = R * CPR;
        for (int q = threadIdx.x; q < CHUNKS; q += NUM_THREADS) {
            const int r = q / CPR, c = (q % CPR) * E;
            if (!o.row_ok(r)) continue;
            const T* s = src.at(r, c);
            if (o.cstride == 1 && o.col0 + c >= 0 && o.col0 + c + E <= o.ncols) {
                T* p = o.at(g, r, c);
                if (aligned(p, 16)) {
                    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(s);
                    continue;
                }
            }
#pragma unroll
            for (int e = 0; e < E; ++e)
                if (o.col_ok(c + e)) *o.at(g, r, c + e) = s[e];
        }
    } else {
        for (int q = threadIdx.x; q < R * C; q += NUM_THREADS) {
            const int r = q / C, c = q % C;
            if (o.row_ok(r) && o.col_ok(c)) *o.at(g, r, c) = convert<U>(*src.at(r, c));
        }
    }
}

}  // namespace hk
