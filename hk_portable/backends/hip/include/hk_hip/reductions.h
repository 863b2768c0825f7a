// hk_hip/reductions.h -- row and column reductions: DPP within a row of 16 lanes, ds_bpermute across
// row groups, partials of the waves through scratch LDS.
namespace hk {

// ====================================================================================== reductions
namespace detail {
template<class F, class A> struct red;       // identity and combine, in the accumulation type A
template<class A> struct red<op_add, A> {
  HK_DEV static A id() { return A(0); }
  HK_DEV static A op(A a, A b) { return op_add::apply(a, b); }
};
template<> struct red<op_maximum, float> {   // NaN is the identity of maxNum/minNum (all-NaN stays NaN)
  HK_DEV static float id() { return HK_NAN; }
  HK_DEV static float op(float a, float b) { return __builtin_fmaxf(a, b); }
};
template<> struct red<op_minimum, float> {
  HK_DEV static float id() { return HK_NAN; }
  HK_DEV static float op(float a, float b) { return __builtin_fminf(a, b); }
};
template<> struct red<op_maximum, int> {
  HK_DEV static int id() { return (int)0x80000000u; }
  HK_DEV static int op(int a, int b) { return a > b ? a : b; }
};
template<> struct red<op_minimum, int> {
  HK_DEV static int id() { return 0x7FFFFFFF; }
  HK_DEV static int op(int a, int b) { return a < b ? a : b; }
};
template<class A> HK_DEV unsigned to_word(A x) { return __builtin_bit_cast(unsigned, x); }
template<class A> HK_DEV A from_word(unsigned w) { return __builtin_bit_cast(A, w); }

// combine over the 16 lanes of a DPP row (commutative steps: every lane ends with the same value)
template<class F, class A> HK_DEV A reduce16(A x) {
  using Rd = red<F, A>;
  x = Rd::op(x, from_word<A>(dpp<DPP_XOR1>(to_word(x))));
  x = Rd::op(x, from_word<A>(dpp<DPP_XOR2>(to_word(x))));
  x = Rd::op(x, from_word<A>(dpp<DPP_HALF_MIRROR>(to_word(x))));
  x = Rd::op(x, from_word<A>(dpp<DPP_MIRROR>(to_word(x))));
  return x;
}
// combine over lanes l, l^16, l^32, l^48 (the four row groups of a column)
template<class F, class A> HK_DEV A reduce_groups(A x) {
  using Rd = red<F, A>;
  x = Rd::op(x, from_word<A>(bperm(lane() ^ 16, to_word(x))));
  x = Rd::op(x, from_word<A>(bperm(lane() ^ 32, to_word(x))));
  return x;
}
// the same over lanes l, l^16, l^32, l^48 with gfx950's permlane swaps (VALU, no LDS traffic): swapping a
// value with itself leaves each lane its own and its partner's value, in an order that differs between the
// two lanes only by commutation
#if HK_GFX950
template<class F, class A> HK_DEV A reduce_groups_valu(A x) {
  using Rd = red<F, A>;
  const auto h = __builtin_amdgcn_permlane16_swap(to_word(x), to_word(x), false, false);
  x = Rd::op(from_word<A>(h[0]), from_word<A>(h[1]));
  const auto w = __builtin_amdgcn_permlane32_swap(to_word(x), to_word(x), false, false);
  return Rd::op(from_word<A>(w[0]), from_word<A>(w[1]));
}
// two rows' combines at once (a lane's slots s and s+1): swapping a's odd lane groups with b's even ones
// leaves a's pairs in groups 0 and 2, b's in 1 and 3, so one op and two swaps fewer than reduce_groups_valu
// twice; the last swap hands every lane both results. Each lane computes op(op(g0, g1), op(g2, g3)).
template<class F, class A> HK_DEV void reduce_groups_valu2(A& a, A& b) {
  using Rd = red<F, A>;
  const auto h = __builtin_amdgcn_permlane16_swap(to_word(a), to_word(b), false, false);
  const A x = Rd::op(from_word<A>(h[0]), from_word<A>(h[1]));       // groups: a01, b01, a23, b23
  const auto w = __builtin_amdgcn_permlane32_swap(to_word(x), to_word(x), false, false);
  const A y = Rd::op(from_word<A>(w[0]), from_word<A>(w[1]));       // groups: a, b, a, b
  const auto r = __builtin_amdgcn_permlane16_swap(to_word(y), to_word(y), false, false);
  a = from_word<A>(r[0]);
  b = from_word<A>(r[1]);
}
#else
template<class F, class A> HK_DEV A reduce_groups_valu(A x) { return reduce_groups<F>(x); }
#endif
}  // namespace detail

// ROW: over the columns of each row; COL: over the rows of each column.
template<class F, class AX, class T, int N, class X> HK_DEV void reduce(rv<T, N, AX>& dst, const X& x) {
  using A = typename calc_t<typename X::dtype>::type;
  using Rd = detail::red<F, A>;
  constexpr int R = X::rows, C = X::cols, RB = X::RB, CB = X::CB, RBW = X::RBW;
  if constexpr (same<AX, ROW>::value) {
#pragma unroll
    for (int s = 0; s < RBW; ++s)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        A acc = Rd::id();
#pragma unroll
        for (int cb = 0; cb < CB; ++cb) {
          const bool in = C % 16 == 0 || 16 * cb + detail::col_in_blk() < C;
          const A v = calc(x.data[(s * CB + cb) * 4 + k]);
          acc = in ? Rd::op(acc, v) : acc;
        }
        dst.data[s * 4 + k] = uncalc<T>(detail::reduce16<F>(acc));
      }
  } else {
    A part[CB];
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) {
      A acc = Rd::id();
#pragma unroll
      for (int s = 0; s < RBW; ++s) {
        const int row0 = 16 * detail::blk<RB>(s);
        const bool own = RB == 1 || detail::owner<RB>(s);    // replicas would count rows twice
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const bool in = own && (R % 16 == 0 || row0 + detail::row_in_blk(k) < R);
          const A v = calc(x.data[(s * CB + cb) * 4 + k]);
          acc = in ? Rd::op(acc, v) : acc;
        }
      }
      part[cb] = detail::reduce_groups<F>(acc);
    }
    if constexpr (RB > 1) {             // rows live in several waves: combine partials through LDS
      static_assert(NW * CB * 16 * 4 <= HK_SCRATCH_BYTES, "HK_SCRATCH_BYTES too small for a column reduction");
      unsigned char* sc = detail::scratch();
      const int w = detail::wave();     // wave-level ops stay outside the lane < 16 branch
      sync();
      if (detail::lane() < 16)
#pragma unroll
        for (int cb = 0; cb < CB; ++cb)
          HK_LDS_STORE(A, sc + ((w * CB + cb) * 16 + detail::lane()) * 4, part[cb]);
      sync();
#pragma unroll
      for (int cb = 0; cb < CB; ++cb) {
        A acc = Rd::id();
        for (int w = 0; w < NW; ++w)    // the same order in every wave: identical results
          acc = Rd::op(acc, HK_LDS_LOAD(A, sc + ((w * CB + cb) * 16 + detail::col_in_blk()) * 4));
        part[cb] = acc;
      }
      sync();
    }
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) dst.data[cb] = uncalc<T>(part[cb]);
  }
}

// tfrag, ROW: a lane folds the 4 columns it holds of each column block, then the four lane groups that hold
// one row combine (every lane of the row ends with the same value)
template<class F, class AX, class T, int R, int C>
HK_DEV void reduce(rv<T, R, ROW, tfrag>& dst, const rt<T, R, C, tfrag>& x) {
  static_assert(same<AX, ROW>::value, "a tfrag tile reduces along its rows (layouts.py)");
  using D = rt<T, R, C, tfrag>;
  using A = typename calc_t<T>::type;
  using Rd = detail::red<F, A>;
  A accs[D::RBW];
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) {
    A& acc = accs[s];
    if constexpr (same<F, op_add>::value && same<A, float>::value) {
      // f32 sums as a tree of pairs: v_pk_add_f32, half the instructions of a chain
      detail::f32x2 part[D::CB * 2];
#pragma unroll
      for (int i = 0; i < D::CB * 2; ++i)
        part[i] = detail::f32x2{calc(x.data[s * D::CB * 4 + 2 * i]), calc(x.data[s * D::CB * 4 + 2 * i + 1])};
#pragma unroll
      for (int n = D::CB * 2; n > 1; n /= 2) {
#pragma unroll
        for (int i = 0; i < n / 2; ++i) part[i] = part[i] + part[i + n / 2];
        if (n % 2) part[0] = part[0] + part[n - 1];
      }
      acc = part[0][0] + part[0][1];
    } else {
      acc = calc(x.data[s * D::CB * 4]);
#pragma unroll
      for (int e = 1; e < D::CB * 4; ++e) acc = Rd::op(acc, calc(x.data[s * D::CB * 4 + e]));
    }
  }
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) {
#if HK_GFX950
    if (s + 1 < D::RBW) {
      detail::reduce_groups_valu2<F>(accs[s], accs[s + 1]);
      dst.data[s] = uncalc<T>(accs[s]);
      dst.data[s + 1] = uncalc<T>(accs[s + 1]);
      ++s;
      continue;
    }
#endif
    dst.data[s] = uncalc<T>(detail::reduce_groups_valu<F>(accs[s]));
  }
}

// the row max of x * c (codegen.py folded_scales): for 0 < c < inf, x -> x * c and rounding are both monotone,
// so max(x) * c is max(x * c) bit for bit (NaN ignored alike) with one multiply a row; any other c multiplies first
template<int R, int C>
HK_DEV void reduce_scaled(rv<float, R, ROW, tfrag>& dst, const rt<float, R, C, tfrag>& x, float c) {
  if (c > 0.0f && c < HK_INF) {
    reduce<op_maximum, ROW>(dst, x);
#pragma unroll
    for (int s = 0; s < rv<float, R, ROW, tfrag>::NE; ++s) dst.data[s] = dst.data[s] * c;
  } else {
    rt<float, R, C, tfrag> y;
#pragma unroll
    for (int e = 0; e < rt<float, R, C, tfrag>::NE; ++e) y.data[e] = x.data[e] * c;
    reduce<op_maximum, ROW>(dst, y);
  }
}

// strip, ROW: a lane folds its chunks, the wave its 64 lanes (DPP rows, then across row groups), then the WC
// waves of a wave-row meet in the scratch LDS in a fixed order (identical in every wave)
template<class F, class AX, class T, int R, int C, int WR>
HK_DEV void reduce(rv<T, R, ROW, strip<WR>>& dst, const rt<T, R, C, strip<WR>>& x) {
  static_assert(same<AX, ROW>::value, "a row reduction gives a row vector");
  using D = rt<T, R, C, strip<WR>>;
  using S = strip<WR>;
  using A = typename calc_t<T>::type;
  using Rd = detail::red<F, A>;
  constexpr int PER_ROW = D::CS * 8;
  A part[D::RS];
#pragma unroll
  for (int k = 0; k < D::RS; ++k) {
    A acc = calc(x.data[k * PER_ROW]);
#pragma unroll
    for (int i = 1; i < PER_ROW; ++i) acc = Rd::op(acc, calc(x.data[k * PER_ROW + i]));
    part[k] = detail::reduce_groups<F>(detail::reduce16<F>(acc));
  }
  if constexpr (S::WC > 1) {
    static_assert(NW * D::RS * 4 <= HK_SCRATCH_BYTES, "HK_SCRATCH_BYTES too small for a strip row reduction");
    unsigned char* sc = detail::scratch();
    const int w = detail::wave();
    sync();
    if (detail::lane() == 0)
#pragma unroll
      for (int k = 0; k < D::RS; ++k) HK_LDS_STORE(A, sc + (w * D::RS + k) * 4, part[k]);
    sync();
#pragma unroll
    for (int k = 0; k < D::RS; ++k) {
      A acc = HK_LDS_LOAD(A, sc + (S::wr() * S::WC * D::RS + k) * 4);
      for (int c = 1; c < S::WC; ++c) acc = Rd::op(acc, HK_LDS_LOAD(A, sc + ((S::wr() * S::WC + c) * D::RS + k) * 4));
      part[k] = acc;
    }
    sync();
  }
#pragma unroll
  for (int k = 0; k < D::RS; ++k) dst.data[k] = uncalc<T>(part[k]);
}

// strip, COL: a lane folds its rows (every lane holds distinct columns), then the WR wave-rows meet in LDS
template<class F, class AX, class T, int R, int C, int WR>
HK_DEV void reduce(rv<T, C, COL, strip<WR>>& dst, const rt<T, R, C, strip<WR>>& x) {
  static_assert(same<AX, COL>::value, "a column reduction gives a column vector");
  using D = rt<T, R, C, strip<WR>>;
  using V = rv<T, C, COL, strip<WR>>;
  using A = typename calc_t<T>::type;
  using Rd = detail::red<F, A>;
  constexpr int PER_ROW = D::CS * 8;
  A part[PER_ROW];
#pragma unroll
  for (int i = 0; i < PER_ROW; ++i) {
    A acc = calc(x.data[i]);
#pragma unroll
    for (int k = 1; k < D::RS; ++k) acc = Rd::op(acc, calc(x.data[k * PER_ROW + i]));
    part[i] = acc;
  }
  if constexpr (WR > 1) {
    static_assert(WR * C * 4 <= HK_SCRATCH_BYTES, "HK_SCRATCH_BYTES too small for a strip column reduction");
    unsigned char* sc = detail::scratch();
    const int ln = detail::lane();
    sync();
#pragma unroll
    for (int i = 0; i < PER_ROW; ++i) HK_LDS_STORE(A, sc + (strip<WR>::wr() * C + V::pos(i, ln)) * 4, part[i]);
    sync();
#pragma unroll
    for (int i = 0; i < PER_ROW; ++i) {
      A acc = HK_LDS_LOAD(A, sc + V::pos(i, ln) * 4);
      for (int r = 1; r < WR; ++r) acc = Rd::op(acc, HK_LDS_LOAD(A, sc + (r * C + V::pos(i, ln)) * 4));
      part[i] = acc;
    }
    sync();
  }
#pragma unroll
  for (int i = 0; i < PER_ROW; ++i) dst.data[i] = uncalc<T>(part[i]);
}

}  // namespace hk
