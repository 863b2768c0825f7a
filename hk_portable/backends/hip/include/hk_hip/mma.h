// hk_hip/mma.h -- matrix multiply-accumulate: operand fragments from LDS or registers, MFMA
// 16x16x16 (16x16x32 on gfx950; 16x16x32 fp8 on both, f8f6f4 16x16x128 on gfx950) with f32 accumulation.
namespace hk {

namespace detail {
// An operand fragment of a 16 x KS step: lane l holds element (m0 + l%16, kbase + KV*(l/16) + s),
// s < KV, of a matrix viewed as [m][k] -- A as op(a), B as op(b) transposed. KV = 32 (gfx950's f8f6f4 MFMA
// on fp8) lays a lane's k out as the instruction does: two runs of 16, 64 apart (slot s: k = kbase +
// 64*(s/16) + 16*(l/16) + s%16; tests/emulator/data/cdna4_f8f6f4_layouts.json). KC: the tile is [m][k]
// rather than [k][m]. Stored k-contiguous (a row-major [m][k] or a column-major [k][m] tile: KC != S::COL)
// a run is one vector read, else scalar reads. Elements outside the tile read 0, so ragged K
// never mixes in stale LDS.
template<bool KC, int KV, class S> struct st_src {
  using T = typename S::dtype;
  using E = raw_bits_t<T>;
  using F = frag<KV, E>;
  static constexpr int RUN = KV > 16 ? 16 : KV, NRUN = KV / RUN;   // a lane's runs of consecutive k
  static constexpr int RUN_BYTES = RUN * (int)sizeof(E);
  static constexpr bool FNUZ = S::FNUZ;      // the fragments are FNUZ codes (shared_tiles.h, fnuz<L>)
  S s;
  static constexpr int MM = KC ? S::rows : S::cols, KK = KC ? S::cols : S::rows;
  HK_DEV F get(int m0, int kbase) const {
    const int m = m0 + col_in_blk();
    F f;
#pragma unroll
    for (int r = 0; r < NRUN; ++r) {
      const int k0 = kbase + 4 * RUN * r + RUN * (lane() >> 4);
      if constexpr (KC != S::COL && S::ROWB % RUN_BYTES == 0) {
        if ((MM % 16 == 0 && KK % (4 * KV) == 0) || (m < MM && k0 + RUN <= KK)) {
          using V = typename vec_bytes<RUN_BYTES>::type;
          const unsigned char* at = s.p + (KC ? S::offset(m, k0) : S::offset(k0, m));
          const auto run = __builtin_bit_cast(frag<RUN, E>, HK_LDS_LOAD(V, at));
#pragma unroll
          for (int e = 0; e < RUN; ++e) f.v[RUN * r + e] = run.v[e];
          continue;
        }
      }
#pragma unroll
      for (int e = 0; e < RUN; ++e) {
        const int k = k0 + e;
        const bool in = (MM % 16 == 0 || m < MM) && (KK % (4 * KV) == 0 || k < KK);
        f.v[RUN * r + e] = in ? (KC ? s.get(m, k) : s.get(k, m)).bits : (E)0;
      }
    }
    return f;
  }
};

// A (not transposed) straight from registers: the rt's rows are the output's rows, so each lane
// gathers its fragment from the col layout with ds_bpermute (pairs of 16-bit values per word).
template<int KV, class T, int M, int K> struct rt_a_src {
  static constexpr bool FNUZ = false;
  const rt<T, M, K>& x;
  HK_DEV frag<KV> get_slot(int slot, int kbase) const {
    using X = rt<T, M, K>;
    const int l = lane(), ii = l & 15, reg = ii & 3;
    constexpr int NCAND = KV == 8 ? 2 : 1;       // 16x16x32: lanes 32..63 take the next column block
    unsigned w[NCAND][2];
#pragma unroll
    for (int cd = 0; cd < NCAND; ++cd) {
      const int cb = kbase / 16 + cd;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned v = 0;
        if (cb < X::CB)
          v = (unsigned)bits16(x.data[(slot * X::CB + cb) * 4 + 2 * h]) |
              ((unsigned)bits16(x.data[(slot * X::CB + cb) * 4 + 2 * h + 1]) << 16);
        w[cd][h] = v;
      }
    }
    frag<KV> f;
#pragma unroll
    for (int e = 0; e < KV; ++e) {
      const int k = kbase + KV * (l >> 4) + e;
      const int src = (k & 15) + 16 * (ii >> 2);
      unsigned val = 0;
#pragma unroll
      for (int cd = 0; cd < NCAND; ++cd) {
        const unsigned t = bperm(src, w[cd][0]), u = bperm(src, w[cd][1]);
        const unsigned word = reg < 2 ? t : u;
        if ((k >> 4) == kbase / 16 + cd) val = (word >> (16 * (reg & 1))) & 0xFFFF;
      }
      f.v[e] = (K % 16 == 0 || k < K) ? (unsigned short)val : (unsigned short)0;
    }
    return f;
  }
};

// Register operands whose rows are not the wave's output rows go through LDS: owners store, barrier.
template<class T, int R, int C> HK_DEV st<T, R, C> stage_rt(const rt<T, R, C>& x, int offset) {
  static_assert(R * C * (int)sizeof(T) <= HK_SCRATCH_BYTES, "HK_SCRATCH_BYTES too small for an mma operand");
  st<T, R, C> s{scratch() + offset};
  store(s, x);
  return s;
}
constexpr int align16(int n) { return (n + 15) / 16 * 16; }

template<class Op, int M, int N, class ASrc, class BSrc>
HK_DEV void mma_core(rt<float, M, N>& d, const ASrc& a, const BSrc& b, int K) {
  using D = rt<float, M, N>;
  constexpr int KS = 4 * Op::KV;
  for (int kbase = 0; kbase < K; kbase += KS) {
    decltype(b.get(0, 0)) bf[D::CB];
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb) bf[cb] = b.get(16 * cb, kbase);
#pragma unroll
    for (int s = 0; s < D::RBW; ++s) {
      const auto af = a.get_slot(s, kbase);
#pragma unroll
      for (int cb = 0; cb < D::CB; ++cb) {
        float* acc = &d.data[(s * D::CB + cb) * 4];
        f32x4 c = {acc[0], acc[1], acc[2], acc[3]};
        c = Op::template run<ASrc::FNUZ, BSrc::FNUZ>(af, bf[cb], c);
        acc[0] = c[0]; acc[1] = c[1]; acc[2] = c[2]; acc[3] = c[3];
      }
    }
  }
}

// A from LDS: the fragment rows of slot s are its row block's
template<class Src, int RB> struct a_rows {
  static constexpr bool FNUZ = Src::FNUZ;
  Src src;
  HK_DEV auto get_slot(int s, int kbase) const { return src.get(16 * blk<RB>(s), kbase); }
};

template<class T, int K> constexpr int kv_for() { return (HK_GFX950 && K % 32 == 0) ? 8 : 4; }

// The MFMA an operand pair takes: KV elements per lane, run(a, b, c), and the accumulator's scale around
// the whole mma (PRE before, POST after: gfx942's halved fp8 codes, instructions.h)
template<class TA_, class TB_, int K, bool FP8 = is_fp8<TA_>::value> struct mfma_for {
  static constexpr int KV = kv_for<TA_, K>();
  static constexpr float PRE = 1.0f, POST = 1.0f;
  template<bool AF = false, bool BF = false> HK_DEV static f32x4 run(const frag<KV>& a, const frag<KV>& b, f32x4 c) {
    return mfma_t<TA_, KV>::run(a, b, c);
  }
};
// fp8: gfx950's f8f6f4 16x16x128 (full rate on CDNA4, twice 16x16x32's) when K is a multiple of 128, else 16x16x32
template<int K> constexpr bool f8f6f4_for() { return HK_GFX950 && K % 128 == 0; }
template<bool C, class X, class Y> struct pick { using type = X; };
template<class X, class Y> struct pick<false, X, Y> { using type = Y; };
template<class TA_, class TB_, int K> struct mfma_for<TA_, TB_, K, true>
    : pick<f8f6f4_for<K>(), mfma_f8f6f4<TA_, TB_>, mfma8<TA_, TB_>>::type {
  static constexpr int KV = f8f6f4_for<K>() ? 32 : 8;
};
template<class TA_, class TB_> constexpr bool mma_pair_ok() {
  return is_fp8<TA_>::value ? is_fp8<TB_>::value
                            : same<TA_, TB_>::value && (same<TA_, bf16>::value || same<TA_, f16>::value);
}
template<class Op, class D> HK_DEV void scale_acc(D& d, float f) {
  if constexpr (Op::PRE != 1.0f) {
#pragma unroll
    for (int i = 0; i < D::NE; ++i) d.data[i] *= f;
  }
}
}  // namespace detail

// The accumulator's domain for an operand pair (Op::PRE, POST: gfx942's e4m3 MFMA sums a quarter of the
// products, instructions.h). An mma scales its accumulator into the domain and back around the MFMAs; a
// k-loop whose carry is such a chain (codegen.py, quartered_carries) enters it once before the loop
// (acc_enter), runs its mma with Q = true (no scaling) and leaves it once after (acc_leave).
template<class TA_, class TB_, class D> HK_DEV void acc_enter(D& d) {
  using Op = detail::mfma_for<TA_, TB_, 32>;
  detail::scale_acc<Op>(d, Op::PRE);
}
template<class TA_, class TB_, class D> HK_DEV void acc_leave(D& d) {
  using Op = detail::mfma_for<TA_, TB_, 32>;
  detail::scale_acc<Op>(d, Op::POST);
}

// dst = acc + op(a) @ op(b) in f32; a, b: st or rt of bf16/f16 (op = transpose when TA / TB). Q: acc and
// dst are in the operand pair's accumulator domain (above).
template<bool TA, bool TB, bool Q = false, class A, class B, int M, int N>
HK_DEV void mma(rt<float, M, N>& dst, const A& a, const B& b, const rt<float, M, N>& acc) {
  using T = typename A::dtype;
  static_assert(detail::mma_pair_ok<T, typename B::dtype>(),
                "mma: operands are bf16 or f16 of one dtype, or fp8 (any two formats)");
  constexpr int K = TA ? A::rows : A::cols;
  using Op = detail::mfma_for<T, typename B::dtype, K>;
  constexpr int KV = Op::KV;
  constexpr int RB = rt<float, M, N>::RB;
  constexpr bool A_RT = !is_st<A>::value;
  constexpr bool B_RT = !is_st<B>::value;
  // fp8 register operands always go through LDS (rt_a_src gathers 16-bit pairs)
  constexpr bool A_STAGE = A_RT && (TA || is_fp8<T>::value), B_STAGE = B_RT;
  constexpr int A_BYTES = A_STAGE ? detail::align16(A::rows * A::cols * (int)sizeof(T)) : 0;
  dst = acc;
  if constexpr (!Q) detail::scale_acc<Op>(dst, Op::PRE);
  if constexpr (A_STAGE || B_STAGE) {
    static_assert(A_BYTES + (B_STAGE ? B::rows * B::cols * (int)sizeof(T) : 0) <= HK_SCRATCH_BYTES,
                  "HK_SCRATCH_BYTES too small for the mma operands");
    sync();                                   // earlier readers of the scratch are done
  }
  const auto a_st = [&]() {
    if constexpr (A_STAGE) return detail::stage_rt(a, 0);
    else if constexpr (!A_RT) return a;
    else return 0;
  }();
  const auto b_st = [&]() {
    if constexpr (B_STAGE) return detail::stage_rt(b, A_BYTES);
    else return b;
  }();
  if constexpr (A_STAGE || B_STAGE) sync();   // staged operands visible to every wave
  const detail::st_src<TB, KV, typename bare<decltype(b_st)>::type> bsrc{b_st};
  if constexpr (A_RT && !A_STAGE) {
    const detail::rt_a_src<KV, T, A::rows, A::cols> asrc{a};
    detail::mma_core<Op>(dst, asrc, bsrc, K);
  } else {
    const detail::a_rows<detail::st_src<!TA, KV, typename bare<decltype(a_st)>::type>, RB> asrc{{a_st}};
    detail::mma_core<Op>(dst, asrc, bsrc, K);
  }
  if constexpr (!Q) detail::scale_acc<Op>(dst, Op::POST);
  if constexpr (A_STAGE || B_STAGE) sync();   // the scratch is free again
}

// A wave-grid accumulator (layouts.py WaveGrid) with A and B in LDS: each wave reads the fragments of its
// own row blocks of op(a) and column blocks of op(b) only, RBW + CBW reads for RBW * CBW MFMAs per step.
template<bool TA, bool TB, bool Q = false, class A, class B, int M, int N, int WM, int WN>
HK_DEV void mma(rt<float, M, N, grid<WM, WN>>& dst, const A& a, const B& b, const rt<float, M, N, grid<WM, WN>>& acc) {
  using D = rt<float, M, N, grid<WM, WN>>;
  using T = typename A::dtype;
  static_assert(is_st<A>::value && is_st<B>::value, "a wave-grid mma reads both operands from LDS (layouts.py)");
  static_assert(detail::mma_pair_ok<T, typename B::dtype>(),
                "mma: operands are bf16 or f16 of one dtype, or fp8 (any two formats)");
  constexpr int K = TA ? A::rows : A::cols;
  using Op = detail::mfma_for<T, typename B::dtype, K>;
  constexpr int KV = Op::KV, KS = 4 * KV;
  const detail::st_src<!TA, KV, A> asrc{a};
  const detail::st_src<TB, KV, B> bsrc{b};
  const int r0 = D::row0(), c0 = D::col0();
  dst = acc;
  if constexpr (!Q) detail::scale_acc<Op>(dst, Op::PRE);
  for (int kbase = 0; kbase < K; kbase += KS) {
    decltype(bsrc.get(0, 0)) bf[D::CBW];
#pragma unroll
    for (int j = 0; j < D::CBW; ++j) bf[j] = bsrc.get(c0 + 16 * j, kbase);
#pragma unroll
    for (int i = 0; i < D::RBW; ++i) {
      const auto af = asrc.get(r0 + 16 * i, kbase);
#pragma unroll
      for (int j = 0; j < D::CBW; ++j) {
        float* d = &dst.data[(i * D::CBW + j) * 4];
        f32x4 c = {d[0], d[1], d[2], d[3]};
        c = Op::template run<A::FNUZ, B::FNUZ>(af, bf[j], c);
        d[0] = c[0]; d[1] = c[1]; d[2] = c[2]; d[3] = c[3];
      }
    }
  }
  if constexpr (!Q) detail::scale_acc<Op>(dst, Op::POST);
}

// ================================================================================ tfrag accumulators
// An accumulator in tfrag (layouts.py TFragment) holds the transpose of the MFMA accumulator layout, so each
// MFMA runs with its operands swapped: D^T = op(B)^T op(A)^T. Both operand fragments have one lane map (lane l:
// row l%16 of the [m][k] view, k = KV*(l/16) + s), so op(B)'s fragment goes in as the MFMA's A and op(A)'s as
// its B. What that buys: an A operand in tfrag registers (attention's P) already is the B fragment of the
// swapped MFMA (lane l: row l%16, columns 4*(l/16) + s), read in place -- no ds_bpermute gather. With KV = 8
// (gfx950's 16x16x32) a lane's 8 slots are its 4 columns of two adjacent column blocks, so the LDS operand is
// read at the same k: two 8-byte reads at kbase + 4*(l/16) and kbase + 16 + 4*(l/16).
namespace detail {
// An A operand ([M][K], not transposed) held in registers: this wave's row blocks as MFMA fragments, read
// from LDS once (hk::preload) and used by every tfrag mma of the pipelines after it (codegen.py preloads).
template<class S, int KV_> struct a_regs {
  using dtype = typename S::dtype;
  using E = raw_bits_t<dtype>;
  static_assert(S::rows % 16 == 0, "a preloaded operand is whole 16-row blocks");
  static constexpr int KV = KV_, KS = 4 * KV, rows = S::rows, cols = S::cols, RB = S::rows / 16;
  static constexpr int RBW = (RB + NW - 1) / NW, NK = (S::cols + KS - 1) / KS;
  frag<KV, E> f[RBW][NK];
};
template<class X> struct is_a_regs { static constexpr bool value = false; };
template<class S, int KV> struct is_a_regs<a_regs<S, KV>> { static constexpr bool value = true; };

// Four k of op(B)'s fragment for the swapped MFMA: lane l holds (n0 + l%16, k0 + 4*(l/16) + s), s < 4.
// gfx950, B [k][n] stored row-major (codegen.py shared_storage keeps it so): ds_read_b64_tr_b16, where in
// each 16-lane block lane 4e + q reads row k0 + 4*(l/16) + e, columns n0 + 4q .. +3, and lane j receives
// the values of lanes 4e + j/4, element j%4 -- column n0 + j at rows k0 + 4*(l/16) + e, e < 4.
template<bool TB, class B> HK_DEV auto b_quad(const B& b, int n0, int k0) {
  using E = raw_bits_t<typename B::dtype>;
#if HK_GFX950
  if constexpr (!TB && !B::COL && B::rows % 16 == 0 && B::cols % 16 == 0 && sizeof(E) == 2) {
    const int l = lane(), j = l & 15;
    const unsigned char* at = b.p + B::offset(k0 + 4 * (l >> 4) + (j >> 2), n0 + 4 * (j & 3));
    typedef short s16x4 __attribute__((ext_vector_type(4)));
    const s16x4 v = __builtin_amdgcn_ds_read_tr16_b64_v4i16((__attribute__((address_space(3))) s16x4*)at);
    return __builtin_bit_cast(frag<4, E>, v);
  } else
#endif
  {
    const st_src<TB, 4, B> half{b};
    return half.get(n0, k0);
  }
}
// op(B)'s fragment for the swapped MFMA, k slots in the order of a tfrag register A (KV = 8: two halves)
template<bool TB, int KV, class B> HK_DEV auto b_frag_split(const B& b, int n0, int kbase) {
  if constexpr (KV == 4) {
    return b_quad<TB>(b, n0, kbase);
  } else {
    using E = raw_bits_t<typename B::dtype>;
    const frag<4, E> lo = b_quad<TB>(b, n0, kbase), hi = b_quad<TB>(b, n0, kbase + 16);
    frag<8, E> f;
#pragma unroll
    for (int e = 0; e < 4; ++e) { f.v[e] = lo.v[e]; f.v[4 + e] = hi.v[e]; }
    return f;
  }
}

// The issue order mma_tfrag_regs<IL = true> asks for.
HK_DEV void interleave_groups() {
  // LLVM's MFMA/exp interleave strategy (AMDGPUIGroupLP, MFMAExpInterleave): from the block's dependence graph
  // it builds the sched groups -- the transcendentals, their conversions and the VALU that feed each MFMA
  // chain -- and issues them between the MFMAs. A hand-written sched_group_barrier pipeline (per MFMA: one
  // MFMA, one transcendental, two VALU, every other MFMA one LDS read) was built first and measured worse on
  // gfx942 (docs/perf-notes.md, 2026-12-03: 18-24 MFMAs in a row, 12-13 % of the VALU under MFMAs, against
  // 9 and 37 % here): LLVM's greedy group solver fills fixed kinds in program order, and P's exp2 come in the
  // tile's element order, not the k-steps'.
  __builtin_amdgcn_iglp_opt(2);
}

// The k-steps of a tfrag mma whose A is a tfrag register tile (attention's P): op(B)'s fragments from LDS, A's
// read in place.
//   IL = false: each k-step behind a sched_barrier(0) (hoisting every k-step's LDS reads to the top spills).
//   IL = true (interleave, codegen.py interleaved_pv): no fence; the basic block -- P's exp2, its conversion and
//     row sum in front of the k-steps (the emitter hoists the lazy rescale's branch before them) -- is ordered
//     by LLVM's MFMA/exp interleave (interleave_groups): the v_exp and VALU that feed later k-steps, and those
//     that feed nothing here (the row sum), issue between the MFMAs of the k-steps before them, while the
//     matrix core runs.
template<bool TB, bool IL, class T, int M, int K, class B, int N>
HK_DEV void mma_tfrag_regs(rt<float, M, N, tfrag>& dst, const rt<T, M, K, tfrag>& a, const B& b) {
  using D = rt<float, M, N, tfrag>;
  using X = rt<T, M, K, tfrag>;
  using Op = mfma_for<T, T, K>;
  constexpr int KV = Op::KV, KS = 4 * KV;
  for (int kbase = 0; kbase < K; kbase += KS) {
    if constexpr (!IL) __builtin_amdgcn_sched_barrier(0);   // LDS reads of one k-step at a time
#pragma unroll
    for (int nb = 0; nb < D::CB; ++nb) {
      const auto bf = b_frag_split<TB, KV>(b, 16 * nb, kbase);
#pragma unroll
      for (int s = 0; s < D::RBW; ++s) {
        frag<KV> af;
#pragma unroll
        for (int e = 0; e < KV; ++e) af.v[e] = bits16(a.data[(s * X::CB + kbase / 16 + e / 4) * 4 + e % 4]);
        float* d = &dst.data[(s * D::CB + nb) * 4];
        f32x4 c = {d[0], d[1], d[2], d[3]};
        c = Op::run(bf, af, c);
        d[0] = c[0]; d[1] = c[1]; d[2] = c[2]; d[3] = c[3];
      }
    }
  }
  if constexpr (IL) interleave_groups();
}
}  // namespace detail

// this wave's row blocks of `a` as the A fragments of the tfrag mmas that read it (K = its columns)
template<class T, int R, int C, class L> HK_DEV auto preload(const st<T, R, C, L>& a) {
  using S = st<T, R, C, L>;
  using X = detail::a_regs<S, detail::kv_for<T, C>()>;
  const detail::st_src<true, X::KV, S> src{a};
  X out;
#pragma unroll
  for (int s = 0; s < X::RBW; ++s)
#pragma unroll
    for (int t = 0; t < X::NK; ++t) out.f[s][t] = src.get(16 * detail::blk<X::RB>(s), t * X::KS);
  return out;
}

// dst = acc + op(a) @ op(b) into a tfrag accumulator; a: st, preloaded registers (hk::preload) or a tfrag rt
// (16-bit, not transposed); b: st. IL (an A in registers only): the k-steps are not fenced by sched_barriers
// but laid out by sched_group_barriers that interleave the VALU work in front of the mma (attention's exp2 of
// P, its conversion and row sum) with the MFMAs (detail::mma_tfrag_regs; codegen.py interleaved_pv).
template<bool TA, bool TB, bool IL = false, class A, class B, int M, int N>
HK_DEV void mma(rt<float, M, N, tfrag>& dst, const A& a, const B& b, const rt<float, M, N, tfrag>& acc) {
  using D = rt<float, M, N, tfrag>;
  using T = typename A::dtype;
  static_assert(is_st<B>::value, "a tfrag mma reads B from LDS (layouts.py)");
  static_assert(same<T, typename B::dtype>::value && (same<T, bf16>::value || same<T, f16>::value),
                "a tfrag mma takes bf16 or f16 operands of one dtype (layouts.py)");
  constexpr bool A_RT = !is_st<A>::value && !detail::is_a_regs<A>::value;
  constexpr int K = TA ? A::rows : A::cols;
  using Op = detail::mfma_for<T, T, K>;
  constexpr int KV = Op::KV, KS = 4 * KV;
  dst = acc;
  if constexpr (A_RT) {
    static_assert(same<A, rt<T, M, K, tfrag>>::value && !TA, "a register A of a tfrag mma is a tfrag tile, not transposed");
    detail::mma_tfrag_regs<TB, IL>(dst, a, b);
  } else {
    constexpr int RB = D::RB;
    const detail::st_src<TB, KV, B> bsrc{b};
    for (int kbase = 0; kbase < K; kbase += KS) {
      __builtin_amdgcn_sched_barrier(0);   // LDS reads of one k-step at a time: hoisted, all of K would spill
#pragma unroll
      for (int nb = 0; nb < D::CB; ++nb) {
        const auto bf = bsrc.get(16 * nb, kbase);
#pragma unroll
        for (int s = 0; s < D::RBW; ++s) {
          const auto af = [&]() {
            if constexpr (detail::is_a_regs<A>::value) {
              static_assert(A::KV == KV && !TA, "a preloaded A matches the mma's fragments");
              return a.f[s][kbase / KS];
            } else {
              const detail::st_src<!TA, KV, A> asrc{a};
              return asrc.get(16 * detail::blk<RB>(s), kbase);
            }
          }();
          float* d = &dst.data[(s * D::CB + nb) * 4];
          f32x4 c = {d[0], d[1], d[2], d[3]};
          c = Op::run(bf, af, c);
          d[0] = c[0]; d[1] = c[1]; d[2] = c[2]; d[3] = c[3];
        }
      }
    }
  }
}

// dst = acc * rows[:, None] + op(a) @ op(b) (codegen.py lazy_rescales): the multiply is skipped when every
// factor this wave holds is 1 (a wave-uniform ballot) -- x * 1 is x bit for bit, the tile holding results of
// arithmetic, never a signalling NaN. The multiply runs on the MFMA's 4-register accumulator groups, so LLVM
// keeps the scaled and the unscaled tile in the same registers (no copies on the path that skips it).
// dst = x * rows[:, None], skipped when every factor this wave holds is 1 (a wave-uniform ballot): the lazy
// rescale of codegen.py lazy_rescales -- x * 1 is x bit for bit, the tile holding results of arithmetic, never a
// signalling NaN. The multiply runs on the MFMA's 4-register accumulator groups, so LLVM keeps the scaled and the
// unscaled tile in the same registers (no copies on the path that skips it).
template<int M, int N>
HK_DEV void rescale_lazy(rt<float, M, N, tfrag>& dst, const rt<float, M, N, tfrag>& x, const rv<float, M, ROW, tfrag>& rows) {
  using D = rt<float, M, N, tfrag>;
  bool ones = true;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) ones = ones && rows.data[s] == 1.0f;
  dst = x;
  if (__builtin_amdgcn_ballot_w64(!ones) != 0) {
#pragma unroll
    for (int e = 0; e < D::NE; e += 4) {
      const float f = rows.data[e / (D::CB * 4)];
      f32x4 q = {dst.data[e], dst.data[e + 1], dst.data[e + 2], dst.data[e + 3]};
      q = q * f32x4{f, f, f, f};
      dst.data[e] = q[0];
      dst.data[e + 1] = q[1];
      dst.data[e + 2] = q[2];
      dst.data[e + 3] = q[3];
    }
  }
}

// The rows of an mma's result whose A row held a NaN made NaN (codegen.py nan_row_casts): `sums` are the row sums
// of the f32 tile A was converted from by cast_finite, values that are never below 0 (exp2's), so a row's sum is
// NaN exactly when the row holds a NaN (no inf - inf). A NaN in row i of A makes row i of the product NaN (NaN
// times anything is NaN); cast_finite did not keep it one, so the row is set here. One wave-uniform branch
// (a ballot of the lanes' sums) skips it when no row of the wave has a NaN.
template<int M, int N>
HK_DEV void nan_rows(rt<float, M, N, tfrag>& dst, const rv<float, M, ROW, tfrag>& sums) {
  using D = rt<float, M, N, tfrag>;
  bool nan = false;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) nan = nan || sums.data[s] != sums.data[s];
  if (__builtin_amdgcn_ballot_w64(nan) != 0) {
#pragma unroll
    for (int e = 0; e < D::NE; ++e) {
      const float r = sums.data[e / (D::CB * 4)];
      dst.data[e] = r != r ? r : dst.data[e];
    }
  }
}

// dst = acc * rows[:, None] + op(a) @ op(b) (codegen.py lazy_rescales), the rescale lazy (above). The emitter
// calls rescale_lazy and the mma apart when it interleaves the mma (codegen.py interleaved_pv): the rescale's
// branch then comes before the work the MFMAs are interleaved with, which must share their basic block.
template<bool TA, bool TB, class A, class B, int M, int N>
HK_DEV void mma_rescaled(rt<float, M, N, tfrag>& dst, const A& a, const B& b, const rt<float, M, N, tfrag>& acc,
                         const rv<float, M, ROW, tfrag>& rows) {
  rt<float, M, N, tfrag> scaled;
  rescale_lazy(scaled, acc, rows);
  mma<TA, TB>(dst, a, b, scaled);
}

}  // namespace hk
