// hk_cuda/shared_register.cuh -- shared <-> registers: ldmatrix loads into the fragment layout, stores.
namespace hk {

// ---- ST <-> registers
template <class T> struct is16 { static constexpr bool value = same<T, bf16>::value || same<T, f16>::value; };

template <class T> HK_DEV u32 pack2(T a, T b) { return (u32)a.bits | ((u32)b.bits << 16); }
template <class T> HK_DEV void unpack2(u32 v, T& a, T& b) {
    a.bits = (unsigned short)(v & 0xFFFFu);
    b.bits = (unsigned short)(v >> 16);
}

template <class T, class S, int R, int C>
HK_DEV void load(rt<T, R, C>& dst, const st<S, R, C>& src) {
    typedef rt<T, R, C> RT_;
    const int lane = lane_id();
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
        if constexpr (is16<T>::value && same<T, S>::value) {
            // ldmatrix: matrices (rows 0-7 | 8-15) x (column block j | j+1) -> elements (0,1) (2,3)
            const int r = RT_::L::block(k) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int j = 0; j + 1 < RT_::CB; j += 2) {
                u32 v[4];
                ldsm_x4(v, src.at(r, (j + (lane >> 4)) * 8));
                unpack2(v[0], dst.d[RT_::idx(k, j, 0)], dst.d[RT_::idx(k, j, 1)]);
                unpack2(v[1], dst.d[RT_::idx(k, j, 2)], dst.d[RT_::idx(k, j, 3)]);
                unpack2(v[2], dst.d[RT_::idx(k, j + 1, 0)], dst.d[RT_::idx(k, j + 1, 1)]);
                unpack2(v[3], dst.d[RT_::idx(k, j + 1, 2)], dst.d[RT_::idx(k, j + 1, 3)]);
            }
            if constexpr (RT_::CB % 2 == 1) {
                constexpr int j = RT_::CB - 1;
                u32 v[2];
                ldsm_x2(v, src.at(r, j * 8));
                unpack2(v[0], dst.d[RT_::idx(k, j, 0)], dst.d[RT_::idx(k, j, 1)]);
                unpack2(v[1], dst.d[RT_::idx(k, j, 2)], dst.d[RT_::idx(k, j, 3)]);
            }
        } else {
#pragma unroll
            for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dst.d[RT_::idx(k, j, e)] = convert<T>(*src.at(RT_::L::row(k, e >> 1), RT_::col(j, e)));
        }
    }
}

template <class T, int R, int C>
HK_DEV void store(const st<T, R, C>& dst, const rt<T, R, C>& src) {
    typedef rt<T, R, C> RT_;
    if (!RT_::L::primary()) return;                 // replicas hold the same values: one writer
    // the swizzled offsets are the same in every call: computed here, not held from before a loop around the store
    const int z = unhoisted(0);
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
#pragma unroll
        for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                T* p = dst.at(RT_::L::row(k, h) + z, RT_::col(j, 0));
                if constexpr (is16<T>::value) {
                    *reinterpret_cast<u32*>(p) = pack2(src.d[RT_::idx(k, j, 2 * h)], src.d[RT_::idx(k, j, 2 * h + 1)]);
                } else {
                    p[0] = src.d[RT_::idx(k, j, 2 * h)];
                    p[1] = src.d[RT_::idx(k, j, 2 * h + 1)];
                }
            }
    }
}

}  // namespace hk
