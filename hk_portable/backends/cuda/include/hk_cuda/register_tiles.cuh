// hk_cuda/register_tiles.cuh -- register tiles rt<T, R, C, L>: per-lane storage and, per layout L, which
// elements a lane holds (the layouts at the top of hk_cuda.cuh; codegen/layouts.py chooses L).
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

// Layout tags. frag: the mma fragment layout. strip<WR>: rows over WR warp-rows (row r in warp-row r % WR),
// each row in 8-element chunks dealt to the 32 lanes of WC = NUM_WARPS / WR warps (chunk q: lane q % 32 of
// warp-column (q / 32) % WC); warp w is warp-row w / WC, warp-column w % WC.
// strip<WR, LR> with 0 < LR < 32 (narrow: rows shorter than a warp's chunks; WR == NUM_WARPS, WC == 1): each
// row in chunks dealt to LR lanes, a warp holding 32 / LR rows; thread-row t = warp * (32 / LR) + lane / LR,
// row r in thread-row r % TR, chunk q in lane q % LR of its lane group. LR = 0 is the whole-warp strip.
struct frag {};
template <int WR_, int LR_ = 0> struct strip {
    static_assert(NUM_WARPS % WR_ == 0, "a strip's warp-rows divide the block's warps");
    static_assert(LR_ == 0 || (LR_ < 32 && (LR_ & (LR_ - 1)) == 0 && WR_ == NUM_WARPS),
                  "a narrow strip has a power-of-two lanes per row below the warp and one warp per warp-row");
    static constexpr int WR = WR_, WC = NUM_WARPS / WR_, V = 8;
    static constexpr int LR = LR_ ? LR_ : 32;                    // lanes across a row inside one warp
    static constexpr int RPW = 32 / LR;                          // rows a warp holds at a time
    static constexpr int TR = WR * RPW;                          // thread-rows: rows the block holds at a time
    static constexpr int TC = LR * WC;                           // threads across a row
    static HK_DEV int wr() { return warp_id() / WC; }
    static HK_DEV int wc() { return warp_id() % WC; }
    static HK_DEV int lane() { if constexpr (RPW == 1) return lane_id(); else return lane_id() % LR; }
    static HK_DEV int tr() { if constexpr (RPW == 1) return wr(); else return wr() * RPW + lane_id() / LR; }
    static HK_DEV int chunk(int j) { return j * TC + wc() * 32 + lane(); }   // this lane's j-th chunk
};

template <class T, int R, int C, class LAYOUT = frag> struct rt;

template <class T, int R, int C> struct rt<T, R, C, frag> {
    static_assert(C % 8 == 0, "register tiles need a multiple of 8 columns");
    typedef T dtype;
    typedef rows<R> L;
    static constexpr int ROWS = R, COLS = C, CB = C / 8, SLOTS = L::SLOTS, SIZE = SLOTS * CB * 4;
    store_t<T, SIZE> d;
    static HK_DEV constexpr int idx(int k, int j, int e) { return (k * CB + j) * 4 + e; }
    static HK_DEV int col(int j, int e) { return j * 8 + 2 * (lane_id() & 3) + (e & 1); }
    // element i = idx(k, j, e): its tile coordinates (the layout-generic view the masks use)
    static HK_DEV int row_of(int i) { return L::row(i / (CB * 4), (i & 3) >> 1); }
    static HK_DEV int col_of(int i) { return col((i / 4) % CB, i & 3); }
};

// A strip tile holds whole chunks only (codegen/layouts.py picks WR (and LR) so that R % TR == 0 and
// C % (8 * TC) == 0): no padding, no replicas. Element idx(k, j, e): row k * TR + tr, column chunk(j) * 8 + e.
template <class T, int R, int C, int WR, int LR> struct rt<T, R, C, strip<WR, LR>> {
    typedef strip<WR, LR> S;
    static_assert(R % S::TR == 0 && C % (S::V * S::TC) == 0, "a strip tile is whole chunks on every lane");
    typedef T dtype;
    static constexpr int ROWS = R, COLS = C, V = S::V, RS = R / S::TR, CS = C / (V * S::TC), SIZE = RS * CS * V;
    store_t<T, SIZE> d;
    static HK_DEV constexpr int idx(int k, int j, int e) { return (k * CS + j) * V + e; }
    static HK_DEV int row(int k) { return k * S::TR + S::tr(); }
    static HK_DEV int row_of(int i) { return row(i / (CS * V)); }
    static HK_DEV int col_of(int i) { return S::chunk((i / V) % CS) * V + i % V; }
};

}  // namespace hk
