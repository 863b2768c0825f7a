// hk_hip/register_vectors.h -- register vectors rv<T, N, ROW> (the rows of a tile as its lanes hold them) and
// rv<T, N, COL> (its columns).
namespace hk {

template<class T, int N, class AX, class LAYOUT = frag> struct rv;
template<class T, int N> struct rv<T, N, ROW, frag> {        // one value per row of an rt<_, N, _>
  using dtype = T;
  static constexpr int n = N, RB = (N + 15) / 16, RBW = (RB + NW - 1) / NW, NE = RBW * 4;
  typename storage<T>::type data[NE];
  static HK_DEV int pos(int i, int ln) { return 16 * detail::blk<RB>(i / 4) + detail::row_in_blk(i % 4, ln); }
};
template<class T, int N> struct rv<T, N, COL, frag> {        // one value per column of an rt<_, _, N>
  using dtype = T;
  static constexpr int n = N, CB = (N + 15) / 16, NE = CB;
  typename storage<T>::type data[NE];
  static HK_DEV int pos(int i, int ln) { return 16 * i + detail::col_in_blk(ln); }
};

// tfrag: the rows of a tfrag tile, one per lane: lane l holds row 16*blk(slot) + l%16 (the four lane groups
// hold the same values)
template<class T, int N> struct rv<T, N, ROW, tfrag> {
  static_assert(N % 16 == 0, "a tfrag row vector is whole 16-row blocks");
  using dtype = T;
  static constexpr int n = N, RB = N / 16, RBW = (RB + NW - 1) / NW, NE = RBW;
  typename storage<T>::type data[NE];
  static HK_DEV int pos(int i, int ln) { return 16 * detail::blk<RB>(i) + detail::trow_in_blk(ln); }
};

// tfrag: the columns of a tfrag tile as its lanes hold them: lane l holds columns 16*cb + 4*(l/16) + k, k < 4, of
// every column block (the 16 lanes of a lane group hold the same values): attention_bwd's lse and delta, per query,
// along the columns of Sᵀ
template<class T, int N> struct rv<T, N, COL, tfrag> {
  static_assert(N % 16 == 0, "a tfrag column vector is whole 16-column blocks");
  using dtype = T;
  static constexpr int n = N, CB = N / 16, NE = CB * 4;
  typename storage<T>::type data[NE];
  static HK_DEV int pos(int i, int ln) { return 16 * (i / 4) + detail::tcol_in_blk(i % 4, ln); }
};

// strip<WR>: a row vector holds this wave-row's rows (replicated over its lanes and wave-columns), a column
// vector this lane's chunks (replicated over the wave-rows)
template<class T, int N, int WR> struct rv<T, N, ROW, strip<WR>> {
  static_assert(N % WR == 0, "a strip row vector has whole wave-rows");
  using dtype = T;
  static constexpr int n = N, NE = N / WR;
  typename storage<T>::type data[NE];
  static HK_DEV int pos(int i, int) { return i * WR + strip<WR>::wr(); }
  static HK_DEV bool owner(int, int ln) { return strip<WR>::wc() == 0 && ln == 0; }
};
template<class T, int N, int WR> struct rv<T, N, COL, strip<WR>> {
  using S = strip<WR>;
  static_assert(N % (S::V * S::TC) == 0, "a strip column vector is whole chunks on every lane");
  using dtype = T;
  static constexpr int n = N, CS = N / (S::V * S::TC), NE = CS * S::V;
  typename storage<T>::type data[NE];
  static HK_DEV int pos(int i, int ln) { return S::chunk(i / S::V, ln) * S::V + i % S::V; }
  static HK_DEV bool owner(int, int) { return S::wr() == 0; }
};

// grid<WM, WN>: the vectors a wave-grid tile's broadcast reads (an epilogue's bias or per-row scale): a row vector
// holds this wave's RBW row blocks in the tile's lane map (data[i * 4 + k]: row 16 * (wm * RBW + i) +
// row_in_blk(k)), a column vector its CBW column blocks (data[j]: column 16 * (wn * CBW + j) + col_in_blk)
template<class T, int N, int WM, int WN> struct rv<T, N, ROW, grid<WM, WN>> {
  static_assert(N % (16 * WM) == 0, "a wave-grid row vector is whole 16-row blocks per wave row");
  using dtype = T;
  static constexpr int n = N, RBW = N / 16 / WM, NE = RBW * 4;
  typename storage<T>::type data[NE];
  static HK_DEV int pos(int i, int ln) { return 16 * (RBW * grid<WM, WN>::wm() + i / 4) + detail::row_in_blk(i % 4, ln); }
};
template<class T, int N, int WM, int WN> struct rv<T, N, COL, grid<WM, WN>> {
  static_assert(N % (16 * WN) == 0, "a wave-grid column vector is whole 16-column blocks per wave column");
  using dtype = T;
  static constexpr int n = N, CBW = N / 16 / WN, NE = CBW;
  typename storage<T>::type data[NE];
  static HK_DEV int pos(int i, int ln) { return 16 * (CBW * grid<WM, WN>::wn() + i) + detail::col_in_blk(ln); }
};

}  // namespace hk
