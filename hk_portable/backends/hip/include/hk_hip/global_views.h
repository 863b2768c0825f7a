// hk_hip/global_views.h -- global views gl<T, RANK> (the hk::gl ABI), their uniform copies, and where a
// tile sits in one (spans, clamped reads, modes).
namespace hk {

// =========================================================================== global memory: indexing
template<class T, int RANK> struct gl {
  T* ptr;
  int shape[RANK];
  long long stride[RANK];
};


namespace detail {
template<class T, int RANK> HK_DEV gl<T, RANK> uniform(const gl<T, RANK>& g) {
  gl<T, RANK> u;
  u.ptr = (T*)(unsigned long long)uni64((long long)(unsigned long long)g.ptr);
#pragma unroll
  for (int d = 0; d < RANK; ++d) {
    u.shape[d] = uni(g.shape[d]);
    u.stride[d] = uni64(g.stride[d]);
  }
  return u;
}
}  // namespace detail

namespace detail {
// Where a tile of ND dims (the last ND of the tensor) sits: leading indices are elements, tile
// indices are in tile units. Rows [rlo, rhi) and cols [clo, chi) of the tile fall inside the tensor.
// `full` (whole tile inside) and `empty` are block-uniform: the common full case runs without a
// predicate per element; a partial tile reads clamped addresses and selects the fill.
struct span {
  long long base, sr, sc;
  int rlo, rhi, clo, chi;
  bool full, empty;
};

HK_DEV int clamp_lim(long long v, int n) { return v < 0 ? 0 : (v > n ? n : (int)v); }

template<class T, int RANK> HK_DEV span locate_(const gl<T, RANK>& g, const int* ix, int nd, int R, int C) {
  span s;
  bool lead_ok = true;
  s.base = 0;
#pragma unroll
  for (int d = 0; d < RANK - nd; ++d) {
    lead_ok = lead_ok && ix[d] >= 0 && ix[d] < g.shape[d];
    s.base += (long long)ix[d] * g.stride[d];
  }
  const long long r0 = nd == 2 ? (long long)ix[RANK - 2] * R : 0, c0 = (long long)ix[RANK - 1] * C;
  s.sr = nd == 2 ? g.stride[RANK - 2] : 0;
  s.sc = g.stride[RANK - 1];
  s.base += r0 * s.sr + c0 * s.sc;
  s.rlo = clamp_lim(-r0, R);
  s.rhi = lead_ok ? clamp_lim(nd == 2 ? (long long)g.shape[RANK - 2] - r0 : 1, R) : 0;
  s.clo = clamp_lim(-c0, C);
  s.chi = clamp_lim((long long)g.shape[RANK - 1] - c0, C);
  s.full = s.rlo == 0 && s.rhi == R && s.clo == 0 && s.chi == C;
  s.empty = s.rlo >= s.rhi || s.clo >= s.chi;
  return s;
}
template<class T, int RANK> HK_DEV span locate2(const gl<T, RANK>& g, const int* ix, int R, int C) {
  static_assert(RANK >= 2, "a 2-D tile needs a tensor of rank >= 2");
  return locate_(g, ix, 2, R, C);
}
template<class T, int RANK> HK_DEV span locate1(const gl<T, RANK>& g, const int* ix, int N) {
  return locate_(g, ix, 1, 1, N);
}
HK_DEV bool inside(const span& s, int r, int c) { return r >= s.rlo && r < s.rhi && c >= s.clo && c < s.chi; }
HK_DEV long long at(const span& s, int r, int c) { return s.base + r * s.sr + c * s.sc; }
// whole tile inside, rows contiguous and every chunk 16-byte aligned: one 16-byte access per chunk
template<class T> HK_DEV bool vec_ok(const T* ptr, const span& sp) {
  return sp.full && sp.sc == 1 && ((unsigned long long)(ptr + sp.base) & 15) == 0 &&
         ((unsigned long long)sp.sr * sizeof(T)) % 16 == 0;
}
HK_DEV int clampi(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }

template<class T> HK_DEV T gload(const T* p) { return *p; }
// Buffer resources (issue 10, item 2): a raw resource (stride 0) over the `bytes` bytes from `base`. A
// buffer load at a byte offset of `bytes` or more reads 0, dword by dword: the hardware's range check, which
// the pipeline cursors use for a tile's rows past the tensor's end (global_shared.h). The check covers the
// lane's offset (voffset) only, not soffset, so a cursor moves the resource's base from step to step and
// keeps the range relative to the step's tile. The last word is DATA_FORMAT = 32 (bits 18:15 = 4), the word
// AMD's own CDNA libraries put there: 0 is the "invalid" data format.
constexpr int RSRC_WORD3 = 0x00020000;
HK_DEV __amdgpu_buffer_rsrc_t rsrc(const void* base, unsigned bytes) {
  return __builtin_amdgcn_make_buffer_rsrc(const_cast<void*>(base), (short)0, (int)bytes, RSRC_WORD3);
}
// 16 bytes at byte offset voff (0 where out of range): buffer_load_dwordx4, a vector memory load counted on
// vmcnt alone (a flat load also counts on lgkmcnt, and every wait for it is lgkmcnt(0)), so the compiler's
// wait before the first use of the registers is a vmcnt by count (the register-staged pipeline loads)
HK_DEV u32x4 bload16(__amdgpu_buffer_rsrc_t r, unsigned voff) {
  return __builtin_amdgcn_raw_buffer_load_b128(r, (int)voff, 0, 0);
}
template<class T> HK_DEV void gstore(T* p, T v) { *p = v; }

// All-ones when a < b, else 0 (|a|, |b| < 2^30). Integer arithmetic rather than a compare: a compare
// makes a 64-bit lane mask in scalar registers, and LLVM hoists loop-invariant ones out of pipeline
// loops until the scalar registers spill.
HK_DEV unsigned lt_mask(int a, int b) { return (unsigned)((int)((unsigned)a - (unsigned)b) >> 31); }
HK_DEV unsigned inside_mask(const span& s, int r, int c) {
  return lt_mask(r, s.rhi) & ~lt_mask(r, s.rlo) & lt_mask(c, s.chi) & ~lt_mask(c, s.clo);
}
template<class T> struct bits_of;
template<> struct bits_of<float> { using type = unsigned; };
template<> struct bits_of<int> { using type = unsigned; };
template<> struct bits_of<bf16> { using type = unsigned short; };
template<> struct bits_of<f16> { using type = unsigned short; };
template<> struct bits_of<fp8e4m3> { using type = unsigned char; };
template<> struct bits_of<fp8e5m2> { using type = unsigned char; };
template<class T> HK_DEV T select_bits(unsigned m, T a, T b) {      // m ? a : b, with m all-ones or 0
  using B = typename bits_of<T>::type;
  const B x = __builtin_bit_cast(B, a), y = __builtin_bit_cast(B, b);
  return __builtin_bit_cast(T, (B)((x & (B)m) | (y & (B)~m)));
}
// Element (r, c) of a non-empty tile: read at a clamped (always valid) address, then select the fill.
template<class T, class F> HK_DEV F read_or(const T* ptr, const span& sp, int r, int c, F fill) {
  const T v = gload(ptr + at(sp, clampi(r, sp.rlo, sp.rhi - 1), clampi(c, sp.clo, sp.chi - 1)));
  return select_bits(inside_mask(sp, r, c), convert<F>(v), fill);
}
// Runs fn(mode) with mode 0 (whole tile inside), 1 (partial) or 2 (empty): each mode is its own
// straight-line code under one block-uniform branch.
template<int M> struct mode_t { static constexpr int value = M; };
template<class Fn> HK_DEV void by_mode(const span& sp, Fn fn) {
  if (sp.full) fn(mode_t<0>{}, lane());
  else if (!sp.empty) fn(mode_t<1>{}, opaque_lane());
  else fn(mode_t<2>{}, lane());
}
template<class T, class F, class Mode> HK_DEV F read_mode(Mode, const T* ptr, const span& sp, int r, int c, F fill) {
  if constexpr (Mode::value == 0) return convert<F>(gload(ptr + at(sp, r, c)));
  else if constexpr (Mode::value == 1) return read_or(ptr, sp, r, c, fill);
  else return fill;
}
}  // namespace detail

// global_to_scalar: element idx... (all in elements) of an int tensor, the same for every lane; an index
// outside the tensor reads `fill` and touches no memory. The value goes to a scalar register (it is a
// loop bound or a tile index: cu_seqlens, block tables).
template<class T, int RANK, class... I> HK_DEV int load_scalar(const gl<T, RANK>& g, int fill, I... idx) {
  static_assert(sizeof...(I) == RANK, "one index per tensor dimension");
  const int ix[RANK] = {idx...};
  long long off = 0;
  bool ok = true;
#pragma unroll
  for (int d = 0; d < RANK; ++d) {
    ok = ok && ix[d] >= 0 && ix[d] < g.shape[d];
    off += (long long)ix[d] * g.stride[d];
  }
  return detail::sgpr(ok ? (int)g.ptr[off] : fill);
}

}  // namespace hk
