// hk_hip/elementwise.h -- fills, broadcasts and elementwise ops over register tiles and vectors (the
// functors are the portable core's, hk_core/functors.h).
namespace hk {

// arithmetic happens in float for float storage types, in int for int, in bool for masks
template<class T> struct calc_t { using type = float; };
template<> struct calc_t<int> { using type = int; };
template<> struct calc_t<bool> { using type = bool; };
template<class T> HK_DEV typename calc_t<T>::type calc(T x) { return to_float(x); }
HK_DEV int calc(int x) { return x; }
HK_DEV bool calc(bool x) { return x; }
template<class T> HK_DEV T uncalc(float x) { return from_float<T>(x); }
template<class T> HK_DEV T uncalc(int x) { return (T)x; }
template<class T> HK_DEV T uncalc(bool x) { return x; }

// ================================================================================ fills, elementwise
template<class Tile, class V> HK_DEV void fill(Tile& dst, V v) {
  const typename Tile::dtype x = convert<typename Tile::dtype>(v);
#pragma unroll
  for (int e = 0; e < Tile::NE; ++e) dst.data[e] = x;
}

template<class T, int R, int C> HK_DEV void broadcast(rt<T, R, C>& dst, const rv<T, R, ROW>& v) {
  using D = rt<T, R, C>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s)
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k) dst.data[(s * D::CB + cb) * 4 + k] = v.data[s * 4 + k];
}
template<class T, int R, int C> HK_DEV void broadcast(rt<T, R, C>& dst, const rv<T, C, COL>& v) {
  using D = rt<T, R, C>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s)
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k) dst.data[(s * D::CB + cb) * 4 + k] = v.data[cb];
}

// element e of a wave-grid tile D broadcast from a grid row or column vector (broadcast, and store_each's epilogues)
template<class D, class T, int N, int WM, int WN>
HK_DEV T broadcast_at(const rv<T, N, ROW, grid<WM, WN>>& v, int e) { return v.data[(e / (D::CBW * 4)) * 4 + e % 4]; }
template<class D, class T, int N, int WM, int WN>
HK_DEV T broadcast_at(const rv<T, N, COL, grid<WM, WN>>& v, int e) { return v.data[(e / 4) % D::CBW]; }
template<class T, int R, int C, int WM, int WN>
HK_DEV void broadcast(rt<T, R, C, grid<WM, WN>>& dst, const rv<T, R, ROW, grid<WM, WN>>& v) {
  using D = rt<T, R, C, grid<WM, WN>>;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = broadcast_at<D>(v, e);
}
template<class T, int R, int C, int WM, int WN>
HK_DEV void broadcast(rt<T, R, C, grid<WM, WN>>& dst, const rv<T, C, COL, grid<WM, WN>>& v) {
  using D = rt<T, R, C, grid<WM, WN>>;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = broadcast_at<D>(v, e);
}

template<class T, int R, int C> HK_DEV void broadcast(rt<T, R, C, tfrag>& dst, const rv<T, R, ROW, tfrag>& v) {
  using D = rt<T, R, C, tfrag>;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = v.data[e / (D::CB * 4)];
}

template<class T, int R, int C> HK_DEV void broadcast(rt<T, R, C, tfrag>& dst, const rv<T, C, COL, tfrag>& v) {
  using D = rt<T, R, C, tfrag>;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = v.data[e % (D::CB * 4)];
}

template<class T, int R, int C, int WR>
HK_DEV void broadcast(rt<T, R, C, strip<WR>>& dst, const rv<T, R, ROW, strip<WR>>& v) {
  using D = rt<T, R, C, strip<WR>>;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = v.data[e / (D::CS * 8)];
}
template<class T, int R, int C, int WR>
HK_DEV void broadcast(rt<T, R, C, strip<WR>>& dst, const rv<T, C, COL, strip<WR>>& v) {
  using D = rt<T, R, C, strip<WR>>;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = v.data[e % (D::CS * 8)];
}

template<class F, class D, class X> HK_DEV void unary(D& dst, const X& x) {
#pragma unroll
  for (int e = 0; e < D::NE; ++e)
    dst.data[e] = detail::put(uncalc<typename D::dtype>(F::apply(calc(x.data[e]))));
}
template<class F, class D, class X> HK_DEV void binary(D& dst, const X& a, const X& b) {
#pragma unroll
  for (int e = 0; e < D::NE; ++e)
    dst.data[e] = detail::put(uncalc<typename D::dtype>(F::apply(calc(a.data[e]), calc(b.data[e]))));
}
// A mask of a tfrag row vector (a few words a lane: attention's new_m == -inf): plain 0/1 words, which LLVM folds
// into the compare at each use (a v_cmp and a v_cndmask where the opaque word of a mask tile, register_tiles.h put,
// costs three more)
template<class F, int N, class X>
HK_DEV void binary(rv<bool, N, ROW, tfrag>& dst, const X& a, const X& b) {
#pragma unroll
  for (int e = 0; e < X::NE; ++e) dst.data[e] = F::apply(calc(a.data[e]), calc(b.data[e])) ? 1 : 0;
}
// f32 add, sub and mul of tfrag tiles two elements at a time: v_pk_add_f32 / v_pk_mul_f32 (CDNA3 and CDNA4: one
// full-rate instruction for two IEEE operations, rounded as the scalar ones -- the same bits)
namespace detail {
typedef float f32x2 __attribute__((ext_vector_type(2)));
template<class F> struct packed2 { static constexpr bool ok = false; };
template<> struct packed2<op_add> { static constexpr bool ok = true; HK_DEV static f32x2 apply(f32x2 a, f32x2 b) { return a + b; } };
template<> struct packed2<op_sub> { static constexpr bool ok = true; HK_DEV static f32x2 apply(f32x2 a, f32x2 b) { return a - b; } };
template<> struct packed2<op_mul> { static constexpr bool ok = true; HK_DEV static f32x2 apply(f32x2 a, f32x2 b) { return a * b; } };
}  // namespace detail
template<class F, int R, int C>
HK_DEV void binary(rt<float, R, C, tfrag>& dst, const rt<float, R, C, tfrag>& a, const rt<float, R, C, tfrag>& b) {
  using D = rt<float, R, C, tfrag>;
  if constexpr (detail::packed2<F>::ok) {
#pragma unroll
    for (int e = 0; e < D::NE; e += 2) {
      const detail::f32x2 r = detail::packed2<F>::apply(detail::f32x2{a.data[e], a.data[e + 1]},
                                                        detail::f32x2{b.data[e], b.data[e + 1]});
      dst.data[e] = r[0];
      dst.data[e + 1] = r[1];
    }
  } else {
#pragma unroll
    for (int e = 0; e < D::NE; ++e) dst.data[e] = F::apply(a.data[e], b.data[e]);
  }
}
// dst = x * c - v[:, None] rounded once (v_pk_fma_f32): a softmax's scaled scores minus the row max, where
// exp2 is the only reader (codegen.py folded_scales; the backend's one contraction)
template<int R, int C>
HK_DEV void fms_rows(rt<float, R, C, tfrag>& dst, const rt<float, R, C, tfrag>& x, float c,
                     const rv<float, R, ROW, tfrag>& v) {
  using D = rt<float, R, C, tfrag>;
#pragma unroll
  for (int e = 0; e < D::NE; e += 2) {
    const float m = -v.data[e / (D::CB * 4)];
    const detail::f32x2 r = __builtin_elementwise_fma(detail::f32x2{x.data[e], x.data[e + 1]}, detail::f32x2{c, c},
                                                      detail::f32x2{m, m});
    dst.data[e] = r[0];
    dst.data[e + 1] = r[1];
  }
}
// dst = exp2(x) of a tfrag row vector whose entries are mostly 0 (attention's alpha = exp2(m_old - m_new) in a
// step where no row's max moved; codegen.py HipEmitter.op_unary): exp2(+-0) is 1 exactly, so a wave whose
// entries are all 0 skips v_exp_f32 (a wave-uniform ballot), and the rescale it feeds is then skipped too. (On
// gfx942 the branch cost a spilled VGPR until P's conversion lost its NaN arm, 2026-12-07: elementwise.h
// cast_finite.)
template<int N> HK_DEV void exp2_lazy(rv<float, N, ROW, tfrag>& dst, const rv<float, N, ROW, tfrag>& x) {
  using V = rv<float, N, ROW, tfrag>;
  {
  bool zeros = true;
#pragma unroll
  for (int s = 0; s < V::NE; ++s) zeros = zeros && x.data[s] == 0.0f;
  if (__builtin_amdgcn_ballot_w64(!zeros) == 0) {
#pragma unroll
    for (int s = 0; s < V::NE; ++s) dst.data[s] = 1.0f;
    return;
  }
  asm volatile("");                // a real branch: LLVM would run v_exp_f32 on both paths and select
  }
  unary<op_exp2>(dst, x);
}
template<class D, class M> HK_DEV void where(D& dst, const M& mask, const D& a, const D& b) {
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = mask.data[e] ? a.data[e] : b.data[e];
}
template<class D, class X> HK_DEV void cast(D& dst, const X& x) {
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = convert<typename D::dtype>(x.data[e]);
}

#if !HK_GFX950
// f32 -> bf16 of a tfrag tile on gfx942 (no conversion instruction), two elements at a time with the portable
// core's bits (hk_core/conversions.h soft::bf16_bits_from_float, RNE, a NaN quieted with its sign and top
// payload): per element the rounding add and a NaN select, then one v_perm_b32 keeps both high halves.
// SELECT (cast_select): both results first, then the select -- written `f != f ? a : rounding` the rounding arm
// (3 instructions) is past SimplifyCFG's speculation limit and the select stays a branch, an EXEC-masked
// diamond per element that splits the basic block. cast_select is what an interleaved mma's A takes (mma.h
// mma_tfrag_regs<IL = true>: its VALU must share the MFMAs' block); elsewhere the branch form is kept (the
// select form's compares cost gfx942's causal attention a spilled SGPR).
// NAN_ARM: NAN_BRANCH writes the NaN test as a branch, NAN_SELECT computes both results then selects, NAN_NONE
// rounds alone (cast_finite, below)
enum { NAN_BRANCH, NAN_SELECT, NAN_NONE };
template<int NAN_ARM, int R, int C> HK_DEV void cast_bf16(rt<bf16, R, C, tfrag>& dst, const rt<float, R, C, tfrag>& x) {
  using D = rt<bf16, R, C, tfrag>;
#pragma unroll
  for (int e = 0; e < D::NE; e += 2) {
    unsigned r[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float f = x.data[e + h];
      const unsigned u = __builtin_bit_cast(unsigned, f);
      if constexpr (NAN_ARM == NAN_SELECT) {
        const unsigned quiet = u | 0x400000u, rounded = u + 0x7FFFu + ((u >> 16) & 1u);
        r[h] = f != f ? quiet : rounded;
      } else if constexpr (NAN_ARM == NAN_BRANCH) {
        r[h] = f != f ? (u | 0x400000u) : u + 0x7FFFu + ((u >> 16) & 1u);
      } else {
        r[h] = u + 0x7FFFu + ((u >> 16) & 1u);
      }
    }
    const unsigned both = __builtin_amdgcn_perm(r[1], r[0], 0x07060302u);   // r0 >> 16 | (r1 & 0xFFFF0000)
    dst.data[e].bits = (unsigned short)both;
    dst.data[e + 1].bits = (unsigned short)(both >> 16);
  }
}
template<int R, int C> HK_DEV void cast(rt<bf16, R, C, tfrag>& dst, const rt<float, R, C, tfrag>& x) {
  cast_bf16<NAN_BRANCH>(dst, x);
}
template<class T, int R, int C> HK_DEV void cast_select(rt<T, R, C, tfrag>& dst, const rt<float, R, C, tfrag>& x) {
  if constexpr (same<T, bf16>::value) cast_bf16<NAN_SELECT>(dst, x);
  else cast(dst, x);                          // f16: v_cvt_f16_f32, no branch
}
// f32 -> bf16 RNE without the NaN arm (codegen.py nan_row_casts): u + 0x7FFF + lsb, then one v_perm_b32 a pair
// -- 2.5 VALU an element where cast_bf16 takes 5.5. Bit for bit the core's conversion for every value but a NaN;
// a NaN's bits become an infinity, a zero or a NaN. Only for P of an mma whose rows with a NaN the caller makes
// NaN afterwards (hk::nan_rows), which is what a NaN in row i of A makes of row i of the product.
template<int R, int C> HK_DEV void cast_finite(rt<bf16, R, C, tfrag>& dst, const rt<float, R, C, tfrag>& x) {
  cast_bf16<NAN_NONE>(dst, x);
}
template<int R, int C> HK_DEV void cast_finite(rt<f16, R, C, tfrag>& dst, const rt<float, R, C, tfrag>& x) {
  cast(dst, x);                               // v_cvt_f16_f32: exact, NaN included
}
#else
template<class T, int R, int C> HK_DEV void cast_finite(rt<T, R, C, tfrag>& dst, const rt<float, R, C, tfrag>& x) {
  cast(dst, x);                               // v_cvt_pk_bf16_f32 / v_cvt_f16_f32: exact, NaN included
}
template<class T, int R, int C> HK_DEV void cast_select(rt<T, R, C, tfrag>& dst, const rt<float, R, C, tfrag>& x) {
  cast(dst, x);                               // v_cvt_pk_bf16_f32 / v_cvt_f16_f32, no branch
}
#endif

}  // namespace hk
