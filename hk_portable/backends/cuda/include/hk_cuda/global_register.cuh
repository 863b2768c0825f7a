// hk_cuda/global_register.cuh -- global <-> registers: converting tile/vector loads and stores, f32 atomics.
namespace hk {

// ---- GL -> registers (converting to the tile's dtype). One 64-bit row pointer per row a lane holds;
// columns are immediate offsets from it (unit stride), pairs load as one access where aligned.
template <class U> struct pair_io {
    static constexpr bool VEC = sizeof(U) == 4 || sizeof(U) == 2;
    static HK_DEV void load(const U* p, U& a, U& b) {
        if constexpr (sizeof(U) == 4) {
            const uint2 v = *reinterpret_cast<const uint2*>(p);
            a = from_bits<U>(v.x);
            b = from_bits<U>(v.y);
        } else if constexpr (sizeof(U) == 2) {
            const u32 v = *reinterpret_cast<const u32*>(p);
            a = from_bits<U>(v & 0xFFFFu);
            b = from_bits<U>(v >> 16);
        }
    }
    static HK_DEV void store(U* p, U a, U b) {
        if constexpr (sizeof(U) == 4) *reinterpret_cast<uint2*>(p) = make_uint2(to_bits(a), to_bits(b));
        else if constexpr (sizeof(U) == 2) *reinterpret_cast<u32*>(p) = to_bits(a) | (to_bits(b) << 16);
    }
};

// The part of a 2-D tile origin a lane needs for its two columns per column block
template <class U, int RANK> struct lane_cols {
    long long climit;       // columns j*8 + e (relative to the lane's first) are valid iff < climit
    int lane_c;
    template <class O> HK_DEV lane_cols(const O& o) {
        lane_c = 2 * (lane_id() & 3);
        climit = o.col0 >= 0 ? o.ncols - o.col0 - lane_c : 0;   // a negative tile index: nothing valid
    }
};

template <bool UNIT, class T, class U, int R, int C, class O, class G>
HK_DEV void load_rows(rt<T, R, C>& dst, const G& g, const O& o, T fv) {
    typedef rt<T, R, C> RT_;
    const lane_cols<U, 0> lc(o);
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = RT_::L::row(k, h);
            const bool rok = o.row_ok(r);
            const U* rp = rok ? o.at(g, r, lc.lane_c) : g.ptr;
            const bool vec = UNIT && pair_io<U>::VEC && aligned(rp, 2 * (int)sizeof(U));
#pragma unroll
            for (int j = 0; j < RT_::CB; ++j) {
                T* out = &dst.d[RT_::idx(k, j, 2 * h)];
                const bool ok0 = rok && j * 8 < lc.climit, ok1 = rok && j * 8 + 1 < lc.climit;
                const long long c0 = UNIT ? j * 8 : (long long)(j * 8) * o.cstride;
                const long long c1 = UNIT ? j * 8 + 1 : (long long)(j * 8 + 1) * o.cstride;
                if (vec && ok1) {
                    U a, b;
                    pair_io<U>::load(rp + c0, a, b);
                    out[0] = convert<T>(a);
                    out[1] = convert<T>(b);
                } else {
                    out[0] = ok0 ? convert<T>(rp[c0]) : fv;
                    out[1] = ok1 ? convert<T>(rp[c1]) : fv;
                }
            }
        }
    }
}

template <class T, class U, int R, int C, int RANK, class... I>
HK_DEV void load(rt<T, R, C>& dst, const gl<U, RANK>& g, float fill, I... idx) {
    origin<2, U, RANK> o(g, R, C, idx...);
    const T fv = convert<T>(fill);                 // the fill is rounded to the tile's dtype
    if (o.cstride == 1) load_rows<true, T, U>(dst, g, o, fv);
    else load_rows<false, T, U>(dst, g, o, fv);
}

// A vector's elements from one pointer, at this lane's first element: with unit stride every other element is an
// immediate offset from it (pos(i) - pos(0) is a constant >= 0 in every layout). Per-element 64-bit addresses and
// columns were computed ahead by the compiler and held: a 64-long column vector's 16 held 32-64 registers across
// the attention backward's products, which spilled for them.
template <bool UNIT, class T, class U, int N, class AX, class L, class O>
HK_DEV void load_vector(rv<T, N, AX, L>& dst, const U* p, const O& o, T fv) {
    typedef rv<T, N, AX, L> RV_;
    const long long cs = UNIT ? 1 : unhoisted(o.cstride);
    const int c0 = RV_::pos(0);
    const U* p0 = p + c0 * cs;
    // element i is inside iff pos(i) - c0 < climit (offsets from the first are >= 0): one 64-bit bound, not a
    // 64-bit column per element held for the compares (lane_cols' scheme)
    const long long climit = o.row_ok(0) && o.col0 >= 0 ? o.ncols - o.col0 - c0 : 0;
#pragma unroll
    for (int i = 0; i < RV_::SIZE; ++i) {
        const int off = RV_::pos(i) - c0;
        dst.d[i] = RV_::held(i) && off < climit ? convert<T>(p0[off * cs]) : fv;
    }
}

template <class T, class U, int N, class AX, class L, int RANK, class... I>
HK_DEV void load(rv<T, N, AX, L>& dst, const gl<U, RANK>& g, float fill, I... idx) {
    origin<1, U, RANK> o(g, 1, N, idx...);
    const T fv = convert<T>(fill);
    const U* p = g.ptr + (o.base + o.col0 * o.cstride);
    if (o.cstride == 1) load_vector<true>(dst, p, o, fv);
    else load_vector<false>(dst, p, o, fv);
}

// ---- registers / ST -> GL (converting to the tensor dtype; out-of-bounds elements dropped)
// Whether a whole R x C tile lies inside the tensor with every row's first element aligned for pair stores:
// the epilogue then stores without a check per row or pair (one test per tile, not per element).
template <class U, int R, int C, class O, class G>
HK_DEV bool whole_aligned(const G& g, const O& o) {
    return o.lead_ok && o.row0 >= 0 && o.row0 + R <= o.nrows && o.col0 >= 0 && o.col0 + C <= o.ncols
           && o.rstride % 2 == 0 && aligned(o.at(g, 0, 0), 2 * (int)sizeof(U));
}

template <bool UNIT, class U, class T, int R, int C, class O, class G>
HK_DEV void store_rows(const G& g, const O& o, const rt<T, R, C>& src) {
    typedef rt<T, R, C> RT_;
    const lane_cols<U, 0> lc(o);
    // 2-byte outputs only: with f32 pairs (64-bit stores straight from the accumulator) ptxas serialises the
    // GEMM's wgmma chain (C7514, test_no_wgmma_serialisation_in_the_async_chain)
    if constexpr (UNIT && pair_io<U>::VEC && sizeof(U) == 2) {
        if (whole_aligned<U, R, C>(g, o)) {
#pragma unroll
            for (int k = 0; k < RT_::SLOTS; ++k) {
                if (!RT_::L::valid(k)) continue;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    U* rp = o.at(g, RT_::L::row(k, h), lc.lane_c);
#pragma unroll
                    for (int j = 0; j < RT_::CB; ++j)
                        pair_io<U>::store(rp + j * 8, convert<U>(src.d[RT_::idx(k, j, 2 * h)]),
                                          convert<U>(src.d[RT_::idx(k, j, 2 * h + 1)]));
                }
            }
            return;
        }
    }
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = RT_::L::row(k, h);
            if (!o.row_ok(r)) continue;
            U* rp = o.at(g, r, lc.lane_c);
            const bool vec = UNIT && pair_io<U>::VEC && aligned(rp, 2 * (int)sizeof(U));
#pragma unroll
            for (int j = 0; j < RT_::CB; ++j) {
                const U a = convert<U>(src.d[RT_::idx(k, j, 2 * h)]);
                const U b = convert<U>(src.d[RT_::idx(k, j, 2 * h + 1)]);
                const bool ok0 = j * 8 < lc.climit, ok1 = j * 8 + 1 < lc.climit;
                const long long c0 = UNIT ? j * 8 : (long long)(j * 8) * o.cstride;
                const long long c1 = UNIT ? j * 8 + 1 : (long long)(j * 8 + 1) * o.cstride;
                if (vec && ok1) {
                    pair_io<U>::store(rp + c0, a, b);
                } else {
                    if (ok0) rp[c0] = a;
                    if (ok1) rp[c1] = b;
                }
            }
        }
    }
}

template <class U, class T, int R, int C, int RANK, class... I>
HK_DEV void store(const gl<U, RANK>& g, const rt<T, R, C>& src, I... idx) {
    if (!rt<T, R, C>::L::primary()) return;       // replicas hold the same values: one writer
    origin<2, U, RANK> o(g, R, C, idx...);
    if (o.cstride == 1) store_rows<true, U>(g, o, src);
    else store_rows<false, U>(g, o, src);
}

template <class U, class T, int N, class AX, class L, int RANK, class... I>
HK_DEV void store(const gl<U, RANK>& g, const rv<T, N, AX, L>& src, I... idx) {
    typedef rv<T, N, AX, L> RV_;
    origin<1, U, RANK> o(g, 1, N, idx...);
#pragma unroll
    for (int i = 0; i < RV_::SIZE; ++i) {
        const int c = RV_::pos(i);
        if (RV_::owner(i) && o.row_ok(0) && o.col_ok(c)) *o.at(g, 0, c) = convert<U>(src.d[i]);
    }
}

// ---- atomics (f32): each element added once per block
// One row pointer per row a lane holds (load_rows' scheme): with unit stride, columns are immediate offsets
// from it, not 64-bit offsets per element that a loop around the adds would hoist and hold.
template <bool UNIT, int R, int C, class O, class G>
HK_DEV void atomic_rows(const G& g, const O& o, const rt<float, R, C>& src) {
    typedef rt<float, R, C> RT_;
    const lane_cols<float, 0> lc(o);
    const long long cs = UNIT ? 1 : unhoisted(o.cstride);
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = RT_::L::row(k, h);
            if (!o.row_ok(r)) continue;
            // the row's offset opaque: else base + (lane + column) is split and the 64-bit sums are held
            float* rp = g.ptr + unhoisted(o.base + (o.row0 + r) * o.rstride + (o.col0 + lc.lane_c) * o.cstride);
#pragma unroll
            for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const long long c = UNIT ? j * 8 + e : (long long)(j * 8 + e) * cs;
                    if (j * 8 + e < lc.climit) atomicAdd(rp + c, src.d[RT_::idx(k, j, 2 * h + e)]);
                }
        }
    }
}
template <int R, int C, int RANK, class... I>
HK_DEV void atomic_add(const gl<float, RANK>& g, const rt<float, R, C>& src, I... idx) {
    typedef rt<float, R, C> RT_;
    if (!RT_::L::primary()) return;
    origin<2, float, RANK> o(g, R, C, idx...);
    if (o.cstride == 1) atomic_rows<true>(g, o, src);
    else atomic_rows<false>(g, o, src);
}
template <int N, class AX, class L, int RANK, class... I>
HK_DEV void atomic_add(const gl<float, RANK>& g, const rv<float, N, AX, L>& src, I... idx) {
    typedef rv<float, N, AX, L> RV_;
    origin<1, float, RANK> o(g, 1, N, idx...);
#pragma unroll
    for (int i = 0; i < RV_::SIZE; ++i) {
        const int c = RV_::pos(i);
        if (RV_::owner(i) && o.row_ok(0) && o.col_ok(c)) atomicAdd(o.at(g, 0, c), src.d[i]);
    }
}

// ---- strip tiles: each lane moves whole 8-element chunks, as 16-byte accesses where the chunk is inside
// the tensor, unit-stride and aligned (2- and 4-byte types); element by element otherwise
template <class U> struct chunk_io {
    static constexpr bool VEC = sizeof(U) == 2 || sizeof(U) == 4;
    static constexpr int WORDS = 8 * (int)sizeof(U) / 4;          // u32 words of a chunk: 4 or 8
    static HK_DEV U element(const u32* w, int e) {
        if constexpr (sizeof(U) == 4) return from_bits<U>(w[e]);
        else return from_bits<U>((w[e >> 1] >> (16 * (e & 1))) & 0xFFFFu);
    }
    static HK_DEV void load(const U* p, u32* w) {
#pragma unroll
        for (int q = 0; q < WORDS / 4; ++q) {
            const uint4 v = reinterpret_cast<const uint4*>(p)[q];
            w[4 * q] = v.x; w[4 * q + 1] = v.y; w[4 * q + 2] = v.z; w[4 * q + 3] = v.w;
        }
    }
    static HK_DEV void store(U* p, const u32* w) {
#pragma unroll
        for (int q = 0; q < WORDS / 4; ++q)
            reinterpret_cast<uint4*>(p)[q] = make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
    }
    // the same, spelled out on the GPU: NVVM split rotary's uint4 stores of packed bf16 into four 4-byte
    // stores (narrow strips use this one; the norms' wide strips kept 16-byte stores without it)
    static HK_DEV void store_v4(U* p, const u32* w) {
#ifdef HK_PTX
#pragma unroll
        for (int q = 0; q < WORDS / 4; ++q)
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n"
                         :: "l"(reinterpret_cast<uint4*>(p) + q), "r"(w[4 * q]), "r"(w[4 * q + 1]),
                            "r"(w[4 * q + 2]), "r"(w[4 * q + 3]) : "memory");
#else
        store(p, w);
#endif
    }
};

template <class O> HK_DEV bool whole_chunk(const O& o, int r, int c) {
    return o.row_ok(r) && o.cstride == 1 && o.col0 + c >= 0 && o.col0 + c + 8 <= o.ncols;
}

// Predicated loads: an access whose predicate is false touches no memory and leaves its destination as it was.
#ifdef HK_PTX
HK_DEV void ld_pred_v4(u32* w, const void* p, bool pred) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %4, 0;\n\t@q ld.global.v4.b32 {%0, %1, %2, %3}, [%5];\n\t}\n"
                 : "+r"(w[0]), "+r"(w[1]), "+r"(w[2]), "+r"(w[3]) : "r"((int)pred), "l"(p) : "memory");
}
HK_DEV void ld_pred_b32(u32& w, const void* p, bool pred) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %1, 0;\n\t@q ld.global.b32 %0, [%2];\n\t}\n"
                 : "+r"(w) : "r"((int)pred), "l"(p) : "memory");
}
HK_DEV void ld_pred_u16(u32& w, const void* p, bool pred) {           // zero-extended into a 32-bit word
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %1, 0;\n\t@q ld.global.u16 %0, [%2];\n\t}\n"
                 : "+r"(w) : "r"((int)pred), "l"(p) : "memory");
}
#else
HK_DEV void ld_pred_v4(u32* w, const void* p, bool pred) {
    if (pred) {
        const uint4 v = *reinterpret_cast<const uint4*>(p);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    }
}
HK_DEV void ld_pred_b32(u32& w, const void* p, bool pred) { if (pred) w = *reinterpret_cast<const u32*>(p); }
HK_DEV void ld_pred_u16(u32& w, const void* p, bool pred) { if (pred) w = *reinterpret_cast<const unsigned short*>(p); }
#endif

// One chunk (8 elements at row r, columns c..c+7) of a narrow strip, without a branch: a predicated 16-byte
// access per 4 words where the chunk is whole, unit-stride and aligned, else predicated element accesses;
// the fill goes in by mask afterwards. Branch-free, a block's loads (every tile it loads before its first
// use) are issued back to back: ptxas moves no load above a branch, and a use in the load's own basic
// block (the conversion to the tile's dtype) would wait for it there. The element accesses come first and
// write the words the vector access then writes (odd 16-bit elements: words of their own, merged after),
// so the vector access waits on no access in flight where it is the one taken.
template <class T, class U, class O, class G>
HK_DEV void load_chunk_predicated(T* out, const G& g, const O& o, int r, int c, T fv) {
    static_assert(chunk_io<U>::VEC, "predicated chunks move 2- or 4-byte elements");
    constexpr int W = chunk_io<U>::WORDS;
    // the conditions with & and |, not && and ||: short-circuits become branches
    const long long row = o.row0 + r, col = o.col0 + c;
    const bool rok = o.lead_ok & (row >= 0) & (row < o.nrows);
    const U* p = o.at(g, r, c);
    const bool vec = rok & (o.cstride == 1) & (col >= 0) & (col + 8 <= o.ncols) & aligned(p, 16);
    u32 w[W] = {}, odd[4] = {};
    bool ok[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        ok[e] = vec | (rok & (col + e >= 0) & (col + e < o.ncols));
        const U* pe = p + (long long)e * o.cstride;
        if constexpr (sizeof(U) == 4) ld_pred_b32(w[e], pe, !vec & ok[e]);
        else ld_pred_u16(e % 2 ? odd[e / 2] : w[e / 2], pe, !vec & ok[e]);
    }
#pragma unroll
    for (int q = 0; q < W / 4; ++q) ld_pred_v4(&w[4 * q], p + q * (16 / (int)sizeof(U)), vec);
    if constexpr (sizeof(U) == 2) {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = vec ? w[i] : (w[i] | (odd[i] << 16));
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = ok[e] ? convert<T>(chunk_io<U>::element(w, e)) : fv;
}

template <class T, class U, int R, int C, int WR, int LR, int RANK, class... I>
HK_DEV void load(rt<T, R, C, strip<WR, LR>>& dst, const gl<U, RANK>& g, float fill, I... idx) {
    typedef rt<T, R, C, strip<WR, LR>> RT_;
    origin<2, U, RANK> o(g, R, C, idx...);
    const T fv = convert<T>(fill);
    if constexpr (LR != 0 && chunk_io<U>::VEC) {             // narrow strips: branch-free (see above)
#pragma unroll
        for (int k = 0; k < RT_::RS; ++k)
#pragma unroll
            for (int j = 0; j < RT_::CS; ++j)
                load_chunk_predicated<T, U>(&dst.d[RT_::idx(k, j, 0)], g, o, RT_::row(k), strip<WR, LR>::chunk(j) * 8, fv);
        return;
    }
#pragma unroll
    for (int k = 0; k < RT_::RS; ++k)
#pragma unroll
        for (int j = 0; j < RT_::CS; ++j) {
            const int r = RT_::row(k), c = strip<WR, LR>::chunk(j) * 8;
            T* out = &dst.d[RT_::idx(k, j, 0)];
            if constexpr (chunk_io<U>::VEC) {
                if (whole_chunk(o, r, c) && aligned(o.at(g, r, c), 16)) {
                    u32 w[chunk_io<U>::WORDS];
                    chunk_io<U>::load(o.at(g, r, c), w);
#pragma unroll
                    for (int e = 0; e < 8; ++e) out[e] = convert<T>(chunk_io<U>::element(w, e));
                    continue;
                }
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) out[e] = o.row_ok(r) && o.col_ok(c + e) ? convert<T>(*o.at(g, r, c + e)) : fv;
        }
}

// a narrow strip's column vector: this lane's chunks, branch-free as the tile loads move them (other
// strips: element by element, as every other vector)
template <class T, class U, int N, int WR, int LR, int RANK, class... I>
HK_DEV void load(rv<T, N, COL, strip<WR, LR>>& dst, const gl<U, RANK>& g, float fill, I... idx) {
    typedef rv<T, N, COL, strip<WR, LR>> RV_;
    origin<1, U, RANK> o(g, 1, N, idx...);
    const T fv = convert<T>(fill);
    if constexpr (LR != 0 && chunk_io<U>::VEC) {
#pragma unroll
        for (int j = 0; j < RV_::CS; ++j)
            load_chunk_predicated<T, U>(&dst.d[j * 8], g, o, 0, strip<WR, LR>::chunk(j) * 8, fv);
    } else {
#pragma unroll
        for (int i = 0; i < RV_::SIZE; ++i) {
            const int c = RV_::pos(i);
            dst.d[i] = (RV_::held(i) && o.row_ok(0) && o.col_ok(c)) ? convert<T>(*o.at(g, 0, c)) : fv;
        }
    }
}

template <class U, class T, int R, int C, int WR, int LR, int RANK, class... I>
HK_DEV void store(const gl<U, RANK>& g, const rt<T, R, C, strip<WR, LR>>& src, I... idx) {
    typedef rt<T, R, C, strip<WR, LR>> RT_;
    origin<2, U, RANK> o(g, R, C, idx...);
#pragma unroll
    for (int k = 0; k < RT_::RS; ++k)
#pragma unroll
        for (int j = 0; j < RT_::CS; ++j) {
            const int r = RT_::row(k), c = strip<WR, LR>::chunk(j) * 8;
            const T* in = &src.d[RT_::idx(k, j, 0)];
            if constexpr (chunk_io<U>::VEC) {
                if (whole_chunk(o, r, c) && aligned(o.at(g, r, c), 16)) {
                    u32 w[chunk_io<U>::WORDS] = {};
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        const u32 b = to_bits(convert<U>(in[e]));
                        if constexpr (sizeof(U) == 4) w[e] = b;
                        else w[e >> 1] |= b << (16 * (e & 1));
                    }
                    if constexpr (LR != 0) chunk_io<U>::store_v4(o.at(g, r, c), w);
                    else chunk_io<U>::store(o.at(g, r, c), w);
                    continue;
                }
            }
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (o.row_ok(r) && o.col_ok(c + e)) *o.at(g, r, c + e) = convert<U>(in[e]);
        }
}

template <int R, int C, int WR, int LR, int RANK, class... I>
HK_DEV void atomic_add(const gl<float, RANK>& g, const rt<float, R, C, strip<WR, LR>>& src, I... idx) {
    typedef rt<float, R, C, strip<WR, LR>> RT_;
    origin<2, float, RANK> o(g, R, C, idx...);
#pragma unroll
    for (int i = 0; i < RT_::SIZE; ++i) {
        const int r = RT_::row_of(i), c = RT_::col_of(i);
        if (o.row_ok(r) && o.col_ok(c)) atomicAdd(o.at(g, r, c), src.d[i]);
    }
}

}  // namespace hk
