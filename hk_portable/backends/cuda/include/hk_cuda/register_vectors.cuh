// hk_cuda/register_vectors.cuh -- register vectors rv<T, N, ROW, L> (the rows a lane holds in a tile of
// layout L) and rv<T, N, COL, L> (its columns).
namespace hk {

template <class T, int N, class AX, class LAYOUT = frag> struct rv;
template <class T, int N> struct rv<T, N, ROW, frag> {
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
template <class T, int N> struct rv<T, N, COL, frag> {
    static_assert(N % 8 == 0, "column vectors need a multiple of 8 elements");
    typedef T dtype;
    static constexpr int LEN = N, SIZE = (N / 8) * 2;
    typedef COL axis;
    store_t<T, SIZE> d;
    static HK_DEV int pos(int i) { return (i >> 1) * 8 + 2 * (lane_id() & 3) + (i & 1); }
    static HK_DEV bool held(int) { return true; }
    static HK_DEV bool owner(int) { return warp_id() == 0 && lane_id() < 4; }
};


// strip<WR, LR>: a row vector holds this thread-row's rows (replicated over its lanes and warp-columns), a
// column vector this lane's chunks (replicated over the thread-rows)
template <class T, int N, int WR, int LR> struct rv<T, N, ROW, strip<WR, LR>> {
    typedef strip<WR, LR> S;
    static_assert(N % S::TR == 0, "a strip row vector has whole thread-rows");
    typedef T dtype;
    static constexpr int LEN = N, SIZE = N / S::TR;
    typedef ROW axis;
    store_t<T, SIZE> d;
    static HK_DEV int pos(int i) { return i * S::TR + S::tr(); }
    static HK_DEV bool held(int) { return true; }
    static HK_DEV bool owner(int) { return S::wc() == 0 && S::lane() == 0; }
};
template <class T, int N, int WR, int LR> struct rv<T, N, COL, strip<WR, LR>> {
    typedef strip<WR, LR> S;
    static_assert(N % (S::V * S::TC) == 0, "a strip column vector is whole chunks on every lane");
    typedef T dtype;
    static constexpr int LEN = N, V = S::V, CS = N / (V * S::TC), SIZE = CS * V;
    typedef COL axis;
    store_t<T, SIZE> d;
    static HK_DEV int pos(int i) { return S::chunk(i / V) * V + i % V; }
    static HK_DEV bool held(int) { return true; }
    static HK_DEV bool owner(int) { return S::tr() == 0; }
};

}  // namespace hk
