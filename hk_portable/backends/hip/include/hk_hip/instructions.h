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

// ============================================================================================== MFMA
namespace detail {
typedef unsigned u32x2 __attribute__((ext_vector_type(2)));
template<int KV> struct frag { unsigned short v[KV]; };
template<int KV> struct frag_vec;
template<> struct frag_vec<4> { using type = u32x2; };
template<> struct frag_vec<8> { using type = u32x4; };

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
}  // namespace detail

}  // namespace hk
