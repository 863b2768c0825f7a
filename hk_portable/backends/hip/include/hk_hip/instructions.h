// hk_hip/instructions.h -- raw instruction wrappers: vector types, wave geometry, lane ids, cross-lane moves
// (ds_bpermute, DPP), the identity-DPP barriers to hoisting, block barriers and memory counters, MFMA.
namespace hk {

typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
typedef short i16x8 __attribute__((ext_vector_type(8)));
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 f16x8 __attribute__((ext_vector_type(8)));
typedef __bf16 bf16x8 __attribute__((ext_vector_type(8)));
typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));

constexpr int NW = HK_NUM_WARPS;            // waves per block
constexpr int NT = HK_NUM_THREADS;          // threads per block
static_assert(NT == NW * 64, "wave64: HK_NUM_THREADS must be 64 * HK_NUM_WARPS");
#if HK_GFX950
constexpr int LDS_BANK_BYTES = 256;         // 64 banks x 4 bytes
#else
constexpr int LDS_BANK_BYTES = 128;         // 32 banks x 4 bytes
#endif

// =========================================================================================== lanes
namespace detail {
HK_DEV int tid() { return (int)__builtin_amdgcn_workitem_id_x(); }
HK_DEV int lane() { return tid() & 63; }
// wave-uniform: readfirstlane keeps it in a scalar register
HK_DEV int wave() { return __builtin_amdgcn_readfirstlane(tid() >> 6); }

// cross-lane moves on 32-bit words
HK_DEV unsigned bperm(int src_lane, unsigned v) {
  return (unsigned)__builtin_amdgcn_ds_bpermute(src_lane << 2, (int)v);
}
template<int CTRL> HK_DEV unsigned dpp(unsigned v) {
  return (unsigned)__builtin_amdgcn_update_dpp(0, (int)v, CTRL, 0xF, 0xF, false);
}
constexpr int DPP_XOR1 = 0xB1;          // quad_perm [1,0,3,2]
constexpr int DPP_XOR2 = 0x4E;          // quad_perm [2,3,0,1]
constexpr int DPP_HALF_MIRROR = 0x141;  // lane i <-> 7-i within 8
constexpr int DPP_MIRROR = 0x140;       // lane i <-> 15-i within 16
}  // namespace detail

namespace detail {
// Tensor views, tile indices and mask parameters pass through an identity DPP move before each use:
// DPP is convergent and opaque to LLVM, so the address arithmetic built on them is neither hoisted out
// of loops nor kept in scalar registers (the values land in VGPRs, where there is room). Hoisted into
// SGPRs, the 64-bit invariants of every load and store site of a kernel spill. (readfirstlane does not
// do: LLVM folds it away on values it can prove uniform, such as kernel arguments.)
HK_DEV int uni(int x) { return __builtin_amdgcn_update_dpp(0, x, 0xE4, 0xF, 0xF, false); }
HK_DEV long long uni64(long long x) {
  const unsigned lo = (unsigned)uni((int)(unsigned)x), hi = (unsigned)uni((int)(x >> 32));
  return (long long)(((unsigned long long)hi << 32) | lo);
}
// A wave-uniform value in scalar registers, on purpose: the few invariants a pipeline cursor hoists out
// of its loop (global_shared.h), whose branch and address math must stay scalar.
HK_DEV int sgpr(int x) { return __builtin_amdgcn_readfirstlane(x); }
HK_DEV long long sgpr64(long long x) {
  const unsigned lo = (unsigned)sgpr((int)(unsigned)x), hi = (unsigned)sgpr((int)(x >> 32));
  return (long long)(((unsigned long long)hi << 32) | lo);
}
// The lane id through an identity DPP move: DPP is convergent, so LLVM never hoists it (or the lane
// masks computed from it) out of loops. Used on rarely taken paths (partial tiles), whose per-element
// compares would otherwise be hoisted out of pipeline loops and pin dozens of scalar registers.
HK_DEV int opaque_lane() { return __builtin_amdgcn_update_dpp(0, lane(), 0xE4, 0xF, 0xF, false); }
}  // namespace detail

// ========================================================================================= control
HK_DEV void sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// loads into LDS complete when this thread's memory counters drain (direct-to-LDS loads are async)
HK_DEV void async_wait_all() { __builtin_amdgcn_s_waitcnt(0); }
// s_waitcnt vmcnt(N) alone: at most N of the wave's vector memory instructions stay in flight, the older
// ones have landed (they complete in issue order on gfx9). gfx9 encoding: vmcnt bits 3:0 and 15:14,
// expcnt 6:4 and lgkmcnt 11:8 at their maxima (no wait).
template<int N> HK_DEV void wait_vmcnt() {
  static_assert(0 <= N && N <= 63, "vmcnt counts 0..63");
  __builtin_amdgcn_s_waitcnt((N & 15) | ((N >> 4) << 14) | (7 << 4) | (15 << 8));
}

// ============================================================================================== MFMA
namespace detail {
typedef unsigned u32x2 __attribute__((ext_vector_type(2)));
// A lane's KV elements of an MFMA operand, as raw bits (E: unsigned short for bf16/f16, unsigned char for fp8)
template<int KV, class E = unsigned short> struct frag { E v[KV]; };
template<class T> using raw_bits_t = decltype(T::bits);
template<int BYTES> struct vec_bytes;                  // the vector one LDS read of a whole fragment takes
template<> struct vec_bytes<8> { using type = u32x2; };
template<> struct vec_bytes<16> { using type = u32x4; };

template<class T> HK_DEV unsigned short bits16(T x) { return x.bits; }

template<class T, int KV> struct mfma_t;
template<> struct mfma_t<bf16, 4> {            // v_mfma_f32_16x16x16_bf16 (gfx942, gfx950)
  HK_DEV static f32x4 run(const frag<4>& a, const frag<4>& b, f32x4 c) {
    return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(i16x4, a), __builtin_bit_cast(i16x4, b), c,
                                                     0, 0, 0);
  }
};
template<> struct mfma_t<f16, 4> {             // v_mfma_f32_16x16x16_f16
  HK_DEV static f32x4 run(const frag<4>& a, const frag<4>& b, f32x4 c) {
    return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(f16x4, a), __builtin_bit_cast(f16x4, b), c, 0, 0,
                                                 0);
  }
};
#if HK_GFX950
template<> struct mfma_t<bf16, 8> {            // v_mfma_f32_16x16x32_bf16 (gfx950)
  HK_DEV static f32x4 run(const frag<8>& a, const frag<8>& b, f32x4 c) {
    return __builtin_amdgcn_mfma_f32_16x16x32_bf16(__builtin_bit_cast(bf16x8, a), __builtin_bit_cast(bf16x8, b), c,
                                                   0, 0, 0);
  }
};
template<> struct mfma_t<f16, 8> {             // v_mfma_f32_16x16x32_f16 (gfx950)
  HK_DEV static f32x4 run(const frag<8>& a, const frag<8>& b, f32x4 c) {
    return __builtin_amdgcn_mfma_f32_16x16x32_f16(__builtin_bit_cast(f16x8, a), __builtin_bit_cast(f16x8, b), c, 0,
                                                  0, 0);
  }
};
#endif

// fp8 (OCP e4m3 / e5m2, any pair), 16x16x32: lane l holds k = 8 * (l / 16) + s, s < 8, like the 16-bit
// KV = 8 fragments. How each arch takes OCP codes (docs/fp8.md):
// - gfx950 reads OCP natively (v_mfma_f32_16x16x32_{fp8,bf8}_{fp8,bf8}).
// - gfx942 reads the FNUZ formats. An OCP e4m3 code read as FNUZ e4m3 is the same value halved, except the
//   special codes: -0 (0x80) becomes 0x00 and NaN (0x7F, 0xFF) becomes FNUZ's NaN 0x80 (fnuz_of_e4m3).
//   e4m3 x e4m3 therefore runs natively with the accumulator quartered around the whole mma (exact: powers of
//   two). OCP e5m2 has infinities that FNUZ cannot encode, so any e5m2 operand is widened to f16 instead
//   (exact: e5m2 is f16's top byte) for two 16x16x16 f16 steps over the lane's k halves (the same k split
//   for A and B, so the sum is unchanged).
typedef frag<8, unsigned char> frag8;
template<class TA_, class TB_> struct mfma8;
template<class TA_, class TB_> struct mfma_f8f6f4;      // gfx950 only
// OCP e4m3 codes -> the FNUZ codes of half their values, bytewise (SWAR over 32 or 64 bits): the magnitude
// 0x7F (NaN) becomes 0x80, magnitude 0 (+0, -0) becomes 0x00, every other code is unchanged. Nine full-rate
// VALU per dword (the selects are v_bfi_b32; a multiply by 0xFF would be a quarter-rate v_mul_lo_u32).
template<class U> HK_DEV U fnuz_of_e4m3(U x) {
  constexpr U LO7 = (U)0x7F7F7F7F7F7F7F7FULL, ONES = (U)0x0101010101010101ULL, HI = (U)0x8080808080808080ULL;
  const U m = x & LO7;                     // no byte's sum below carries into the next
  const U nan = (m + ONES) & HI;           // bit 7: magnitude 0x7F
  const U nonzero = m + LO7;               // bit 7: magnitude not 0
  const U special = (nonzero & nan) | (~nonzero & HI);      // bit 7: NaN, +0 or -0
  const U low = special - (special >> 7);                   // 0x7F in those bytes
  const U kept = ~low & x;                                  // their low bits cleared
  return (special & nan) | (~special & kept);               // their bit 7: NaN's
}
#if HK_GFX950
#define HK_MFMA8(TA_, TB_, NAME)                                                                          \
  template<> struct mfma8<TA_, TB_> {                                                                     \
    static constexpr float PRE = 1.0f, POST = 1.0f;                                                       \
    template<bool AF = false, bool BF = false>                                                            \
    HK_DEV static f32x4 run(const frag8& a, const frag8& b, f32x4 c) {                                    \
      static_assert(!AF && !BF, "gfx950 reads OCP codes: no tile is stored as FNUZ");                    \
      return NAME(__builtin_bit_cast(long, a), __builtin_bit_cast(long, b), c, 0, 0, 0);                  \
    }                                                                                                     \
  };
HK_MFMA8(fp8e4m3, fp8e4m3, __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8)
HK_MFMA8(fp8e4m3, fp8e5m2, __builtin_amdgcn_mfma_f32_16x16x32_fp8_bf8)
HK_MFMA8(fp8e5m2, fp8e4m3, __builtin_amdgcn_mfma_f32_16x16x32_bf8_fp8)
HK_MFMA8(fp8e5m2, fp8e5m2, __builtin_amdgcn_mfma_f32_16x16x32_bf8_bf8)
#undef HK_MFMA8
// v_mfma_scale_f32_16x16x128_f8f6f4 on fp8 operands (32 a lane, two runs of 16 k: mma.h st_src): 4x the work of
// 16x16x32 in 2x its cycles (archs.py). Formats by cbsz / blgp (0 e4m3, 1 e5m2); unit E8M0 scales (127 = 1.0):
// clang emits the unscaled v_mfma_f32_16x16x128_f8f6f4 only for scale operands 0, whose meaning as a scale no
// source here states
typedef frag<32, unsigned char> frag32;
typedef int i32x8 __attribute__((ext_vector_type(8)));
template<class T> constexpr int f8f6f4_format() { return same<T, fp8e5m2>::value ? 1 : 0; }
template<class TA_, class TB_> struct mfma_f8f6f4 {
  static constexpr float PRE = 1.0f, POST = 1.0f;
  template<bool AF = false, bool BF = false> HK_DEV static f32x4 run(const frag32& a, const frag32& b, f32x4 c) {
    static_assert(!AF && !BF, "gfx950 reads OCP codes: no tile is stored as FNUZ");
    return __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(__builtin_bit_cast(i32x8, a), __builtin_bit_cast(i32x8, b),
                                                           c, f8f6f4_format<TA_>(), f8f6f4_format<TB_>(), 0, 127, 0, 127);
  }
};
#else
template<> struct mfma8<fp8e4m3, fp8e4m3> {
  static constexpr float PRE = 0.25f, POST = 4.0f;         // (a/2)(b/2) = ab/4
  // AF / BF: the operand's fragments were read from a tile stored as FNUZ (shared_tiles.h, fnuz<L>):
  // mapped once on the way into LDS, not here
  template<bool AF = false, bool BF = false> HK_DEV static f32x4 run(const frag8& a, const frag8& b, f32x4 c) {
    const unsigned long long x = __builtin_bit_cast(unsigned long long, a), y = __builtin_bit_cast(unsigned long long, b);
    return __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8((long)(AF ? x : fnuz_of_e4m3(x)), (long)(BF ? y : fnuz_of_e4m3(y)),
                                                      c, 0, 0, 0);
  }
};
// f16 bits of four fp8 codes of a fragment (half h)
template<class T> HK_DEV frag<4> widen_f16(const frag8& x, int h) {
  frag<4> r;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    T e;
    e.bits = x.v[4 * h + s];
    if constexpr (same<T, fp8e5m2>::value) r.v[s] = (unsigned short)(e.bits << 8);   // f16's top byte
    else r.v[s] = from_float<f16>(to_float(e)).bits;
  }
  return r;
}
template<class TA_, class TB_> struct mfma8 {
  static constexpr float PRE = 1.0f, POST = 1.0f;
  template<bool AF = false, bool BF = false> HK_DEV static f32x4 run(const frag8& a, const frag8& b, f32x4 c) {
    static_assert(!AF && !BF, "a widened fp8 operand is read as OCP: no tile of an e5m2 mma is stored as FNUZ");
    c = mfma_t<f16, 4>::run(widen_f16<TA_>(a, 0), widen_f16<TB_>(b, 0), c);
    return mfma_t<f16, 4>::run(widen_f16<TA_>(a, 1), widen_f16<TB_>(b, 1), c);
  }
};
#endif
}  // namespace detail

}  // namespace hk
