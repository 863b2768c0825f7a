// hk_cuda/register_tiles.cuh -- register tiles rt<T, R, C>: per-lane storage and which 16-row blocks a
// warp holds (the layout at the top of hk_cuda.cuh).
namespace hk {

// Per-lane storage of a tile's elements; masks (bool) are packed 32 to a register.
template <class T, int SIZE> struct store_t {
    T v[SIZE];
    HK_DEV T& operator[](int i) { return v[i]; }
    HK_DEV const T& operator[](int i) const { return v[i]; }
};
template <int SIZE> struct store_t<bool, SIZE> {
    u32 w[(SIZE + 31) / 32];
    struct ref {
        u32& word;
        int bit;
        HK_DEV operator bool() const { return (word >> bit) & 1u; }
        HK_DEV ref& operator=(bool x) { word = (word & ~(1u << bit)) | ((u32)x << bit); return *this; }
        HK_DEV ref& operator=(const ref& o) { return *this = (bool)o; }
    };
    HK_DEV ref operator[](int i) { return ref{w[i >> 5], i & 31}; }
    HK_DEV bool operator[](int i) const { return (w[i >> 5] >> (i & 31)) & 1u; }
};

// Which 16-row blocks of an R-row tile this warp holds (see the top of the file).
template <int R> struct rows {
    static_assert(R % 16 == 0, "register tiles and row vectors need a multiple of 16 rows");
    static constexpr int RB = R / 16;
    static constexpr int SLOTS = RB >= NUM_WARPS ? (RB + NUM_WARPS - 1) / NUM_WARPS : 1;
    static constexpr bool ALL_VALID = RB < NUM_WARPS || RB % NUM_WARPS == 0;
    static constexpr int DISTINCT = RB < NUM_WARPS ? RB : NUM_WARPS;   // warps holding distinct rows
    static HK_DEV int block(int k) { return (RB < NUM_WARPS ? warp_id() % RB : warp_id()) + k * NUM_WARPS; }
    static HK_DEV bool valid(int k) { return ALL_VALID || block(k) < RB; }
    static HK_DEV bool primary() { return RB >= NUM_WARPS || warp_id() < RB; }
    // tile row of element e (0..3) of slot k: rows g and g + 8
    static HK_DEV int row(int k, int half) { return block(k) * 16 + (lane_id() >> 2) + half * 8; }
};

template <class T, int R, int C> struct rt {
    static_assert(C % 8 == 0, "register tiles need a multiple of 8 columns");
    typedef T dtype;
    typedef rows<R> L;
    static constexpr int ROWS = R, COLS = C, CB = C / 8, SLOTS = L::SLOTS, SIZE = SLOTS * CB * 4;
    store_t<T, SIZE> d;
    static HK_DEV constexpr int idx(int k, int j, int e) { return (k * CB + j) * 4 + e; }
    static HK_DEV int col(int j, int e) { return j * 8 + 2 * (lane_id() & 3) + (e & 1); }
};

}  // namespace hk
