// hk_hip/register_tiles.h -- register tiles rt<T, R, C>: MFMA accumulator layout, 16-row blocks dealt to the
// waves; masks as 0/1 words.
namespace hk {

// =========================================================================================== tiles
// Masks (bool tiles) are held as 0/1 words in vector registers: as i1 values they would be 64-bit lane
// masks in scalar registers, and a 64x128 mask is 64 of those. The identity DPP move keeps LLVM from
// folding the word back into a compare (it is opaque to it); the compare happens at each use.
template<class T> struct storage { using type = T; };
template<> struct storage<bool> { using type = int; };
namespace detail {
template<class T> HK_DEV T put(T v) { return v; }
HK_DEV int put(bool v) { return __builtin_amdgcn_update_dpp(0, v ? 1 : 0, 0xE4, 0xF, 0xF, false); }
}  // namespace detail
// A register tile; data[(slot * CB + cb) * 4 + k] is row 16*blk(slot) + 4*(lane/16) + k, column
// 16*cb + lane%16, where blk(slot) = (wave + slot*NW) % RB and the slot is a replica when
// wave + slot*NW >= RB.
// Layout tags (codegen/layouts.py chooses): frag, the MFMA layout below; strip<WR>, rows over WR wave-rows
// (row r in wave-row r % WR), each row in 8-element chunks dealt to the 64 lanes of the WC = NW / WR waves
// across it (chunk q: lane q % 64 of wave-column (q / 64) % WC); wave w is wave-row w / WC, column w % WC.
struct frag {};
template<int WR_> struct strip {
  static_assert(NW % WR_ == 0, "a strip's wave-rows divide the block's waves");
  static constexpr int WR = WR_, WC = NW / WR_, V = 8, TC = 64 * WC;   // TC: lanes across a row
  static HK_DEV int wr() { return detail::wave() / WC; }
  static HK_DEV int wc() { return detail::wave() % WC; }
  static HK_DEV int chunk(int j, int ln) { return j * TC + wc() * 64 + ln; }
};

// grid<WM, WN>: an mma accumulator over a WM x WN wave grid; wave w holds the RBW = RB / WM row blocks of
// grid row w / WN and the CBW = CB / WN column blocks of grid column w % WN, each 16x16 block in the MFMA
// lane map: data[(i * CBW + j) * 4 + k] is row 16 * (wm * RBW + i) + row_in_blk(k), column
// 16 * (wn * CBW + j) + col_in_blk.
template<int WM_, int WN_> struct grid {
  static_assert(WM_ * WN_ == NW, "a wave grid covers the block's waves");
  static constexpr int WM = WM_, WN = WN_;
  static HK_DEV int wm() { return detail::wave() / WN; }
  static HK_DEV int wn() { return detail::wave() % WN; }
};

template<class T, int R, int C, class LAYOUT = frag> struct rt;
template<class T, int R, int C> struct rt<T, R, C, frag> {
  using dtype = T;
  static constexpr int rows = R, cols = C;
  static constexpr int RB = (R + 15) / 16, CB = (C + 15) / 16, RBW = (RB + NW - 1) / NW;
  static constexpr int NE = RBW * CB * 4;
  typename storage<T>::type data[NE];
};

namespace detail {
template<int RB> HK_DEV int blk(int slot) { return (wave() + slot * NW) % RB; }
template<int RB> HK_DEV bool owner(int slot) { return wave() + slot * NW < RB; }
HK_DEV int row_in_blk(int k, int ln) { return 4 * (ln >> 4) + k; }
HK_DEV int col_in_blk(int ln) { return ln & 15; }
HK_DEV int row_in_blk(int k) { return row_in_blk(k, lane()); }
HK_DEV int col_in_blk() { return col_in_blk(lane()); }
}  // namespace detail

template<class T, int R, int C, int WM, int WN> struct rt<T, R, C, grid<WM, WN>> {
  using G = grid<WM, WN>;
  static_assert(R % (16 * WM) == 0 && C % (16 * WN) == 0, "a wave-grid tile is whole 16x16 blocks per wave");
  using dtype = T;
  static constexpr int rows = R, cols = C, RB = R / 16, CB = C / 16, RBW = RB / WM, CBW = CB / WN;
  static constexpr int NE = RBW * CBW * 4;
  typename storage<T>::type data[NE];
  static HK_DEV int row0() { return 16 * RBW * G::wm(); }     // this wave's first row and column
  static HK_DEV int col0() { return 16 * CBW * G::wn(); }
};

// tfrag (layouts.py TFragment): the fragment layout of the transpose. Rows in 16-row blocks dealt to the waves
// as frag (block b on wave b % NW, slot b / NW; replicas when RB < NW); inside a 16x16 block element (i, j) in
// lane i + 16*(j/4), register j % 4 -- a lane holds 4 consecutive columns of one row: data[(slot * CB + cb) * 4
// + k] is row 16*blk(slot) + lane%16, column 16*cb + 4*(lane/16) + k. It is the MFMA accumulator of the
// transpose (an mma into it swaps its operands) and, for 16-bit data, the B-operand fragment of an mma that
// takes the tile as A (mma.h).
struct tfrag {};
template<class T, int R, int C> struct rt<T, R, C, tfrag> {
  static_assert(R % 16 == 0 && C % 16 == 0, "a tfrag tile is whole 16x16 blocks (layouts.py)");
  using dtype = T;
  static constexpr int rows = R, cols = C, RB = R / 16, CB = C / 16, RBW = (RB + NW - 1) / NW;
  static constexpr int NE = RBW * CB * 4;
  typename storage<T>::type data[NE];
};
namespace detail {
HK_DEV int trow_in_blk(int ln) { return ln & 15; }
HK_DEV int tcol_in_blk(int k, int ln) { return 4 * (ln >> 4) + k; }
}  // namespace detail

// A strip tile holds whole chunks only (the layout pass picks WR with R % WR == 0 and C % (8 * TC) == 0).
// Element (k * CS + j) * 8 + e: row k * WR + wr, column chunk(j) * 8 + e.
template<class T, int R, int C, int WR> struct rt<T, R, C, strip<WR>> {
  using S = strip<WR>;
  static_assert(R % WR == 0 && C % (S::V * S::TC) == 0, "a strip tile is whole chunks on every lane");
  using dtype = T;
  static constexpr int rows = R, cols = C, RS = R / WR, CS = C / (S::V * S::TC), NE = RS * CS * S::V;
  typename storage<T>::type data[NE];
  static HK_DEV int row(int k) { return k * WR + S::wr(); }
  static HK_DEV int row_of(int e) { return row(e / (CS * S::V)); }
  static HK_DEV int col_of(int e, int ln) { return S::chunk((e / S::V) % CS, ln) * S::V + e % S::V; }
};

}  // namespace hk
