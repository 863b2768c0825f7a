// hk_hip/shared_tiles.h -- shared tiles st<T, R, C> (row-major, XOR-swizzled 16-byte chunks), staged buffers
// sbuf, and the scratch LDS of exchanges between waves.
namespace hk {

// Shared tiles: a view of R*C elements in LDS. Storage tags (codegen/layouts.py chooses): rowmajor, rows of
// XOR-swizzled 16-byte chunks; colmajor, the transpose stored that way (element (r, c) where the row-major
// tile of C rows and R columns keeps (c, r)), for mma operands whose K runs down the rows.
struct rowmajor {};
struct colmajor {};
template<class T, int R, int C, class L = rowmajor> struct st;
template<class T, int R, int C> struct st<T, R, C, rowmajor> {
  using dtype = T;
  using layout = rowmajor;
  static constexpr bool COL = false, FNUZ = false;
  static constexpr int rows = R, cols = C, BYTES = R * C * (int)sizeof(T);
  static constexpr int ROWB = C * (int)sizeof(T), NCH = ROWB / 16;
  static constexpr bool SWZ = ROWB % 16 == 0 && NCH >= 2 && (NCH & (NCH - 1)) == 0;
  // rows that share one pass over the banks get different chunk rotations
  static constexpr int RP = SWZ && LDS_BANK_BYTES / ROWB > 1 ? LDS_BANK_BYTES / ROWB : 1;
  unsigned char* p;
  HK_DEV static int offset(int r, int c) {
    const int b = c * (int)sizeof(T);
    if constexpr (SWZ) return r * ROWB + ((((b >> 4) ^ (r / RP)) & (NCH - 1)) << 4) + (b & 15);
    else return r * ROWB + b;
  }
  HK_DEV T get(int r, int c) const { return HK_LDS_LOAD(T, p + offset(r, c)); }
  HK_DEV void set(int r, int c, T v) const { HK_LDS_STORE(T, p + offset(r, c), v); }
};
template<class T, int R, int C> struct st<T, R, C, colmajor> {
  using dtype = T;
  using layout = colmajor;
  using STORED = st<T, C, R, rowmajor>;
  static constexpr bool COL = true, FNUZ = false;
  static constexpr int rows = R, cols = C, BYTES = R * C * (int)sizeof(T);
  static constexpr int ROWB = STORED::ROWB;   // bytes of one stored line (a column)
  unsigned char* p;
  HK_DEV static int offset(int r, int c) { return STORED::offset(c, r); }
  HK_DEV T get(int r, int c) const { return HK_LDS_LOAD(T, p + offset(r, c)); }
  HK_DEV void set(int r, int c, T v) const { HK_LDS_STORE(T, p + offset(r, c), v); }
};
// fnuz<L>: L's storage, the tile's OCP e4m3 codes kept as gfx942's FNUZ codes of half their values (codegen.py,
// fnuz_storage: a tile whose only uses are copies in from global memory and e4m3 x e4m3 mma operands). Every
// write maps its codes once (set, and the chunk stores of global_shared.h); the MFMA then reads the bytes as
// they are (mma.h) instead of every wave mapping every fragment it reads. Nothing else reads such a tile.
template<class L> struct fnuz {};
template<class T, int R, int C, class L> struct st<T, R, C, fnuz<L>> : st<T, R, C, L> {
  static_assert(same<T, fp8e4m3>::value, "FNUZ storage holds e4m3 tiles");
  using layout = fnuz<L>;
  static constexpr bool FNUZ = true;
  HK_DEV void set(int r, int c, T v) const {
    v.bits = detail::fnuz_of_e4m3<unsigned>(v.bits) & 0xFF;
    st<T, R, C, L>::set(r, c, v);
  }
};
template<class X> struct bare { using type = X; };
template<class X> struct bare<const X> { using type = X; };
template<class X> struct is_st { static constexpr bool value = false; };
template<class T, int R, int C, class L> struct is_st<st<T, R, C, L>> { static constexpr bool value = true; };

template<class T, int R, int C, int S, class L = rowmajor> struct sbuf {
  unsigned char* p;
  HK_DEV explicit sbuf(unsigned char* q) : p(q) {}
  HK_DEV st<T, R, C, L> stage(int s) const { return st<T, R, C, L>{p + s * (R * C * (int)sizeof(T))}; }
};

// LDS the library needs for exchanges between waves (column reductions, register operands of mma);
// the code generator sizes HK_SCRATCH_BYTES per kernel and each use static_asserts it fits.
namespace detail {
HK_DEV unsigned char* scratch() {
  __shared__ __attribute__((aligned(16))) unsigned char hk_scratch[HK_SCRATCH_BYTES];
  return hk_scratch;
}
}  // namespace detail

}  // namespace hk
