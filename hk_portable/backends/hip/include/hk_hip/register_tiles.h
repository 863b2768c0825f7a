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
template<class T, int R, int C> struct rt {
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

}  // namespace hk
