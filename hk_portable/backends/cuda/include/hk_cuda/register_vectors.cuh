// hk_cuda/register_vectors.cuh -- register vectors rv<T, N, ROW> (the rows a lane holds in a tile) and
// rv<T, N, COL> (its columns).
namespace hk {

template <class T, int N, class AX> struct rv;
template <class T, int N> struct rv<T, N, ROW> {
    typedef T dtype;
    typedef rows<N> L;
    static constexpr int LEN = N, SIZE = L::SLOTS * 2;
    typedef ROW axis;
    store_t<T, SIZE> d;
    static HK_DEV int pos(int i) { return L::row(i >> 1, i & 1); }
    static HK_DEV bool held(int i) { return L::valid(i >> 1); }
    // one thread per element stores: primary warps, lane t == 0
    static HK_DEV bool owner(int i) { return L::primary() && L::valid(i >> 1) && (lane_id() & 3) == 0; }
};
template <class T, int N> struct rv<T, N, COL> {
    static_assert(N % 8 == 0, "column vectors need a multiple of 8 elements");
    typedef T dtype;
    static constexpr int LEN = N, SIZE = (N / 8) * 2;
    typedef COL axis;
    store_t<T, SIZE> d;
    static HK_DEV int pos(int i) { return (i >> 1) * 8 + 2 * (lane_id() & 3) + (i & 1); }
    static HK_DEV bool held(int) { return true; }
    static HK_DEV bool owner(int) { return warp_id() == 0 && lane_id() < 4; }
};

}  // namespace hk
