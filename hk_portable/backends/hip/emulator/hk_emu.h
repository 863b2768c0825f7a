// hk_emu.h -- lets header-free HIP device code for gfx942 / gfx950 compile for the host (x86-64,
// clang++ -std=c++17) and run on the wave64 emulator. It is force-included (-include hk_emu.h) with
// -DHK_EMULATOR and -D__gfx942__ or -D__gfx950__; emulator.load() does this and also rewrites three
// spellings the host compiler cannot take (see README.md, "What load() does to the source").
//
// Every AMD builtin here keeps its real name and (as far as the host allows) its real parameter
// types, so code that compiles here also compiles for the device (tests check both). Wave-level
// builtins (MFMA, ds_bpermute, DPP, readfirstlane, ballot, permlane, direct-to-LDS loads, ...) call
// the runtime, which gathers all 64 lanes of the wave at the same call site and computes the
// instruction's result for the whole wave. Modeled semantics and their sources: README.md.
#ifndef HK_EMU_H
#define HK_EMU_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <type_traits>
#include <utility>

#include "hk_emu_common.h"

#ifndef HK_EMULATOR
#define HK_EMULATOR 1
#endif
#if !defined(__gfx942__) && !defined(__gfx950__)
#error "hk_emu.h: compile with -D__gfx942__ or -D__gfx950__"
#endif

// ---------------------------------------------------------------------------------------------
// Target macros a device compilation predefines
// ---------------------------------------------------------------------------------------------
#define __AMDGCN__ 1
#define __AMDGPU__ 1
#define __amdgcn__ 1
#define __HIP_DEVICE_COMPILE__ 1
#define __AMDGCN_WAVEFRONT_SIZE__ 64
#define __AMDGCN_WAVEFRONT_SIZE 64
#if defined(__gfx942__)
#define __GFX9__ 1
#define HK_EMU_ARCH 942
#else
#define __GFX9__ 1
#define HK_EMU_ARCH 950
#endif

// ---------------------------------------------------------------------------------------------
// Function and variable qualifiers
// ---------------------------------------------------------------------------------------------
// __global__ marks kernels; load() finds them in the preprocessed text through this annotation.
#define __global__ __attribute__((annotate("hk_emu_kernel")))
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// Static LDS: every __shared__ variable becomes a static variable in its own section "hk_lds.<n>".
// load() links one shared object per kernel with --gc-sections and a linker script that gathers the
// surviving hk_lds.* sections between hk_emu_lds_begin and hk_emu_lds_end: exactly the __shared__
// variables that kernel can reach. Each worker thread runs its blocks one at a time on its own copy of
// the object, so that range is the block's static LDS. Dynamic LDS (`extern __shared__ T name[];`) is
// rewritten by load() to alias hk_emu_dyn_lds.
#define HK_EMU_STR2(x) #x
#define HK_EMU_STR(x) HK_EMU_STR2(x)
#define __shared__ static __attribute__((section("hk_lds." HK_EMU_STR(__COUNTER__))))
#define HK_EMU_DYN_CAP (160 * 1024 + 4096)

// ---------------------------------------------------------------------------------------------
// Host spellings of the device vector types the builtins take
// ---------------------------------------------------------------------------------------------
typedef short hk_emu_s4 __attribute__((ext_vector_type(4)));
typedef float hk_emu_f2 __attribute__((ext_vector_type(2)));
typedef float hk_emu_f4 __attribute__((ext_vector_type(4)));
typedef float hk_emu_f16 __attribute__((ext_vector_type(16)));
typedef int hk_emu_i4 __attribute__((ext_vector_type(4)));
typedef int hk_emu_i8 __attribute__((ext_vector_type(8)));
typedef int hk_emu_i16 __attribute__((ext_vector_type(16)));
typedef unsigned hk_emu_u2 __attribute__((ext_vector_type(2)));
typedef unsigned hk_emu_u3 __attribute__((ext_vector_type(3)));
typedef unsigned hk_emu_u4 __attribute__((ext_vector_type(4)));
typedef _Float16 hk_emu_h4 __attribute__((ext_vector_type(4)));
typedef __fp16 hk_emu_hp4 __attribute__((ext_vector_type(4)));
typedef _Float16 hk_emu_h8 __attribute__((ext_vector_type(8)));
typedef __fp16 hk_emu_hp8 __attribute__((ext_vector_type(8)));
typedef __fp16 hk_emu_hp2 __attribute__((ext_vector_type(2)));
typedef __bf16 hk_emu_b4 __attribute__((ext_vector_type(4)));
typedef __bf16 hk_emu_b8 __attribute__((ext_vector_type(8)));

#define HK_EMU_LOC const char* hk_file_ = __builtin_FILE(), int hk_line_ = __builtin_LINE()
#define HK_EMU_AT hk_file_, hk_line_

namespace hk_emu {
static inline const hk_emu_lane_info* me() { return hk_emu_cur(); }
template <class T> static inline uint64_t bits64(T v) {
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T> static inline T from_bits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}
}  // namespace hk_emu

// ---------------------------------------------------------------------------------------------
// Work-item / workgroup ids and sizes
// ---------------------------------------------------------------------------------------------
static inline unsigned __builtin_amdgcn_workitem_id_x() { return hk_emu::me()->tid[0]; }
static inline unsigned __builtin_amdgcn_workitem_id_y() { return hk_emu::me()->tid[1]; }
static inline unsigned __builtin_amdgcn_workitem_id_z() { return hk_emu::me()->tid[2]; }
static inline unsigned __builtin_amdgcn_workgroup_id_x() { return hk_emu::me()->bid[0]; }
static inline unsigned __builtin_amdgcn_workgroup_id_y() { return hk_emu::me()->bid[1]; }
static inline unsigned __builtin_amdgcn_workgroup_id_z() { return hk_emu::me()->bid[2]; }
static inline unsigned short __builtin_amdgcn_workgroup_size_x() { return (unsigned short)hk_emu::me()->bdim[0]; }
static inline unsigned short __builtin_amdgcn_workgroup_size_y() { return (unsigned short)hk_emu::me()->bdim[1]; }
static inline unsigned short __builtin_amdgcn_workgroup_size_z() { return (unsigned short)hk_emu::me()->bdim[2]; }
// grid_size is in work-items (as in the HSA dispatch packet): blocks * workgroup size.
static inline unsigned __builtin_amdgcn_grid_size_x() { return hk_emu::me()->gdim[0] * hk_emu::me()->bdim[0]; }
static inline unsigned __builtin_amdgcn_grid_size_y() { return hk_emu::me()->gdim[1] * hk_emu::me()->bdim[1]; }
static inline unsigned __builtin_amdgcn_grid_size_z() { return hk_emu::me()->gdim[2] * hk_emu::me()->bdim[2]; }
static inline unsigned __builtin_amdgcn_wavefrontsize() { return 64; }
static inline unsigned __builtin_amdgcn_groupstaticsize() { return hk_emu::me()->static_lds; }
static inline const void* __builtin_amdgcn_dispatch_ptr() { return hk_emu::me()->dispatch; }
static inline const void* __builtin_amdgcn_implicitarg_ptr() { return hk_emu::me()->implicit; }
static inline unsigned __builtin_amdgcn_mbcnt_lo(unsigned mask, unsigned add) {
  unsigned l = hk_emu::me()->lane;
  unsigned below = l >= 32 ? mask : (mask & ((1u << l) - 1u));
  return (unsigned)__builtin_popcount(below) + add;
}
static inline unsigned __builtin_amdgcn_mbcnt_hi(unsigned mask, unsigned add) {
  unsigned l = hk_emu::me()->lane;
  unsigned below = l < 32 ? 0u : (mask & ((1u << (l - 32)) - 1u));
  return (unsigned)__builtin_popcount(below) + add;
}
static inline unsigned long __builtin_amdgcn_s_memtime() { return __builtin_readcyclecounter(); }
static inline unsigned long __builtin_amdgcn_s_memrealtime() { return __builtin_readcyclecounter(); }
static inline unsigned long __builtin_amdgcn_s_getpc() { return (unsigned long)__builtin_return_address(0); }

// ---------------------------------------------------------------------------------------------
// Synchronisation and scheduling
// ---------------------------------------------------------------------------------------------
// s_barrier: all waves of the block (waves that ended are not waited for -- but a wave that ends
// while others wait at a barrier is reported, see README).
static inline void __builtin_amdgcn_s_barrier(HK_EMU_LOC) { hk_emu_point(HK_EMU_OP_BARRIER, HK_EMU_AT); }
// s_waitcnt, wave_barrier and fences are "soft" wave sync points: they order the lanes of one wave
// (so that lanes may exchange data through LDS across them); they never wait for other waves.
// s_waitcnt also completes direct-to-LDS loads: they are asynchronous (see README, missing waits).
static inline void __builtin_amdgcn_s_waitcnt(int imm, HK_EMU_LOC) { hk_emu_waitcnt(imm, HK_EMU_AT); }
static inline void __builtin_amdgcn_wave_barrier(HK_EMU_LOC) { hk_emu_point(HK_EMU_OP_SOFT, HK_EMU_AT); }
template <class... X>
static inline void __builtin_amdgcn_fence(unsigned, const char*, X...) { hk_emu_point(HK_EMU_OP_SOFT, "<__builtin_amdgcn_fence>", 0); }
// Pure scheduling hints: no-ops that keep program order.
static inline void __builtin_amdgcn_s_setprio(short) {}
static inline void __builtin_amdgcn_sched_barrier(int) {}
static inline void __builtin_amdgcn_sched_group_barrier(int, int, int) {}
static inline void __builtin_amdgcn_iglp_opt(int) {}
static inline void __builtin_amdgcn_s_sleep(int) {}
static inline void __builtin_amdgcn_s_incperflevel(int) {}
static inline void __builtin_amdgcn_s_decperflevel(int) {}
static inline void __builtin_amdgcn_s_dcache_inv() {}
static inline void __builtin_amdgcn_buffer_wbinvl1() {}
[[noreturn]] static inline void __builtin_amdgcn_endpgm() { hk_emu_exit_lane(); }

// ---------------------------------------------------------------------------------------------
// Cross-lane operations (wave-level: all live lanes of the wave at the same call site)
// ---------------------------------------------------------------------------------------------
namespace hk_emu {
template <class T>
static inline T xlane2(int op, T a, T b, const int32_t* imm, const char* f, int l) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- or 64-bit operand expected");
  unsigned char in[16];
  memcpy(in, &a, sizeof(T));
  memcpy(in + sizeof(T), &b, sizeof(T));
  T out;
  hk_emu_xlane(op, in, 2 * sizeof(T), &out, sizeof(T), imm, f, l);
  return out;
}
}  // namespace hk_emu

// ds_bpermute: lane i gets data from lane (addr[i] / 4) % 64 (addr is a byte address); from an
// inactive lane it gets 0.
static inline int __builtin_amdgcn_ds_bpermute(int addr, int data, HK_EMU_LOC) {
  return hk_emu::xlane2<int>(HK_EMU_OP_BPERMUTE, addr, data, nullptr, HK_EMU_AT);
}
// ds_permute: lane i's data goes to lane (addr[i] / 4) % 64; lanes nobody writes get 0; if several
// lanes write one lane, the highest-numbered writer wins.
static inline int __builtin_amdgcn_ds_permute(int addr, int data, HK_EMU_LOC) {
  return hk_emu::xlane2<int>(HK_EMU_OP_PERMUTE, addr, data, nullptr, HK_EMU_AT);
}
// ds_swizzle: offset[15]=1: quad permute (offset[7:0]); otherwise bit-mask mode within 32 lanes
// (and = offset[4:0], or = offset[9:5], xor = offset[14:10]).
static inline int __builtin_amdgcn_ds_swizzle(int data, int pattern, HK_EMU_LOC) {
  int32_t imm[8] = {pattern};
  return hk_emu::xlane2<int>(HK_EMU_OP_SWIZZLE, data, 0, imm, HK_EMU_AT);
}
// DPP (GFX9 controls): quad_perm 0x00-0xff, row_shl 0x101-0x10f, row_shr 0x111-0x11f,
// row_ror 0x121-0x12f, wave_shl 0x130, wave_rol 0x134, wave_shr 0x138, wave_ror 0x13c,
// row_mirror 0x140, row_half_mirror 0x141, row_bcast15 0x142, row_bcast31 0x143.
template <class T, class U>
static inline T __builtin_amdgcn_update_dpp(T old, U src, int dpp_ctrl, int row_mask, int bank_mask,
                                            bool bound_ctrl, HK_EMU_LOC) {
  int32_t imm[8] = {dpp_ctrl, row_mask, bank_mask, bound_ctrl ? 1 : 0, 0, (int)sizeof(T)};
  return hk_emu::xlane2<T>(HK_EMU_OP_DPP, old, (T)src, imm, HK_EMU_AT);
}
template <class T>
static inline T __builtin_amdgcn_mov_dpp(T src, int dpp_ctrl, int row_mask, int bank_mask,
                                         bool bound_ctrl, HK_EMU_LOC) {
  int32_t imm[8] = {dpp_ctrl, row_mask, bank_mask, bound_ctrl ? 1 : 0, 1, (int)sizeof(T)};
  return hk_emu::xlane2<T>(HK_EMU_OP_DPP, src, src, imm, HK_EMU_AT);
}
template <class T>
static inline T __builtin_amdgcn_readfirstlane(T v, HK_EMU_LOC) {
  return hk_emu::xlane2<T>(HK_EMU_OP_READFIRSTLANE, v, v, nullptr, HK_EMU_AT);
}
template <class T>
static inline T __builtin_amdgcn_readlane(T v, int lane, HK_EMU_LOC) {
  T l = hk_emu::from_bits<T>((uint64_t)(uint32_t)lane);
  return hk_emu::xlane2<T>(HK_EMU_OP_READLANE, v, l, nullptr, HK_EMU_AT);
}
template <class T, class U>
static inline T __builtin_amdgcn_writelane(T v, int lane, U old, HK_EMU_LOC) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- or 64-bit operand expected");
  unsigned char in[24];
  T o = (T)old;
  int64_t ln = lane;
  memcpy(in, &v, sizeof(T));
  memcpy(in + 8, &o, sizeof(T));
  memcpy(in + 16, &ln, 8);
  int32_t imm[8] = {(int)sizeof(T)};
  T out;
  hk_emu_xlane(HK_EMU_OP_WRITELANE, in, 24, &out, sizeof(T), imm, HK_EMU_AT);
  return out;
}
static inline unsigned long __builtin_amdgcn_ballot_w64(bool pred, HK_EMU_LOC) {
  int32_t p = pred ? 1 : 0;
  unsigned long out;
  hk_emu_xlane(HK_EMU_OP_BALLOT, &p, 4, &out, 8, nullptr, HK_EMU_AT);
  return out;
}
static inline unsigned long __builtin_amdgcn_read_exec(HK_EMU_LOC) {
  int32_t p = 1;
  unsigned long out;
  hk_emu_xlane(HK_EMU_OP_READ_EXEC, &p, 4, &out, 8, nullptr, HK_EMU_AT);
  return out;
}
static inline unsigned __builtin_amdgcn_read_exec_lo(HK_EMU_LOC) {
  return (unsigned)__builtin_amdgcn_read_exec(HK_EMU_AT);
}
static inline unsigned __builtin_amdgcn_read_exec_hi(HK_EMU_LOC) {
  return (unsigned)(__builtin_amdgcn_read_exec(HK_EMU_AT) >> 32);
}
namespace hk_emu {
template <class T> static inline bool icmp(T a, T b, int pred) {
  switch (pred) {  // LLVM ICmp predicates
    case 32: return a == b;
    case 33: return a != b;
    case 34: return (std::make_unsigned_t<T>)a > (std::make_unsigned_t<T>)b;
    case 35: return (std::make_unsigned_t<T>)a >= (std::make_unsigned_t<T>)b;
    case 36: return (std::make_unsigned_t<T>)a < (std::make_unsigned_t<T>)b;
    case 37: return (std::make_unsigned_t<T>)a <= (std::make_unsigned_t<T>)b;
    case 38: return (std::make_signed_t<T>)a > (std::make_signed_t<T>)b;
    case 39: return (std::make_signed_t<T>)a >= (std::make_signed_t<T>)b;
    case 40: return (std::make_signed_t<T>)a < (std::make_signed_t<T>)b;
    case 41: return (std::make_signed_t<T>)a <= (std::make_signed_t<T>)b;
  }
  hk_emu_fail("<icmp>", 0, "unsupported integer compare predicate %d", pred);
}
template <class T> static inline bool fcmp(T a, T b, int pred) {
  bool uno = a != a || b != b;
  switch (pred) {  // LLVM FCmp predicates
    case 0: return false;
    case 1: return !uno && a == b;
    case 2: return !uno && a > b;
    case 3: return !uno && a >= b;
    case 4: return !uno && a < b;
    case 5: return !uno && a <= b;
    case 6: return !uno && a != b;
    case 7: return !uno;
    case 8: return uno;
    case 9: return uno || a == b;
    case 10: return uno || a > b;
    case 11: return uno || a >= b;
    case 12: return uno || a < b;
    case 13: return uno || a <= b;
    case 14: return uno || a != b;
    case 15: return true;
  }
  hk_emu_fail("<fcmp>", 0, "unsupported float compare predicate %d", pred);
}
}  // namespace hk_emu
static inline unsigned long __builtin_amdgcn_uicmp(unsigned a, unsigned b, int pred, HK_EMU_LOC) {
  return __builtin_amdgcn_ballot_w64(hk_emu::icmp<unsigned>(a, b, pred), HK_EMU_AT);
}
static inline unsigned long __builtin_amdgcn_uicmpl(unsigned long a, unsigned long b, int pred, HK_EMU_LOC) {
  return __builtin_amdgcn_ballot_w64(hk_emu::icmp<unsigned long>(a, b, pred), HK_EMU_AT);
}
static inline unsigned long __builtin_amdgcn_sicmp(int a, int b, int pred, HK_EMU_LOC) {
  return __builtin_amdgcn_ballot_w64(hk_emu::icmp<int>(a, b, pred), HK_EMU_AT);
}
static inline unsigned long __builtin_amdgcn_sicmpl(long a, long b, int pred, HK_EMU_LOC) {
  return __builtin_amdgcn_ballot_w64(hk_emu::icmp<long>(a, b, pred), HK_EMU_AT);
}
static inline unsigned long __builtin_amdgcn_fcmpf(float a, float b, int pred, HK_EMU_LOC) {
  return __builtin_amdgcn_ballot_w64(hk_emu::fcmp<float>(a, b, pred), HK_EMU_AT);
}
static inline unsigned long __builtin_amdgcn_fcmp(double a, double b, int pred, HK_EMU_LOC) {
  return __builtin_amdgcn_ballot_w64(hk_emu::fcmp<double>(a, b, pred), HK_EMU_AT);
}
#if defined(__gfx950__)
// v_permlane16_swap_b32: odd rows (16 lanes) of the first operand swap with even rows of the
// second; returns {new first, new second}. v_permlane32_swap_b32: rows 2-3 of the first swap with
// rows 0-1 of the second.
static inline hk_emu_u2 __builtin_amdgcn_permlane16_swap(unsigned vdst_old, unsigned src0_old, bool fi,
                                                          bool bound_ctrl, HK_EMU_LOC) {
  (void)fi; (void)bound_ctrl;
  unsigned in[2] = {vdst_old, src0_old};
  hk_emu_u2 out;
  hk_emu_xlane(HK_EMU_OP_PERMLANE16_SWAP, in, 8, &out, 8, nullptr, HK_EMU_AT);
  return out;
}
static inline hk_emu_u2 __builtin_amdgcn_permlane32_swap(unsigned vdst_old, unsigned src0_old, bool fi,
                                                          bool bound_ctrl, HK_EMU_LOC) {
  (void)fi; (void)bound_ctrl;
  unsigned in[2] = {vdst_old, src0_old};
  hk_emu_u2 out;
  hk_emu_xlane(HK_EMU_OP_PERMLANE32_SWAP, in, 8, &out, 8, nullptr, HK_EMU_AT);
  return out;
}
#endif

// ---------------------------------------------------------------------------------------------
// MFMA: A (M x K) and B (K x N) are spread over the 64 lanes, C/D (M x N) too; see README for the
// lane layouts. D = A*B + C accumulated in double, rounded once to f32 (README: numerics).
// ---------------------------------------------------------------------------------------------
namespace hk_emu {
template <class A, class C>
static inline C mfma(int variant, A a, A b, C c, int cbsz, int abid, int blgp, const char* f, int l) {
  unsigned char in[2 * sizeof(A) + sizeof(C)];
  memcpy(in, &a, sizeof(A));
  memcpy(in + sizeof(A), &b, sizeof(A));
  memcpy(in + 2 * sizeof(A), &c, sizeof(C));
  int32_t imm[8] = {variant, cbsz, abid, blgp, (int)sizeof(A), (int)sizeof(C)};
  C out;
  hk_emu_xlane(HK_EMU_OP_MFMA, in, sizeof(in), &out, sizeof(C), imm, f, l);
  return out;
}
}  // namespace hk_emu
#define HK_EMU_MFMA(NAME, VARIANT, AT, CT)                                                         \
  static inline CT NAME(AT a, AT b, CT c, int cbsz, int abid, int blgp, HK_EMU_LOC) {             \
    return hk_emu::mfma<AT, CT>(VARIANT, a, b, c, cbsz, abid, blgp, HK_EMU_AT);                  \
  }
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x16bf16_1k, HK_EMU_MFMA_F32_16X16X16_BF16, hk_emu_s4, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x8bf16_1k, HK_EMU_MFMA_F32_32X32X8_BF16, hk_emu_s4, hk_emu_f16)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x16f16, HK_EMU_MFMA_F32_16X16X16_F16, hk_emu_h4, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x16f16, HK_EMU_MFMA_F32_16X16X16_F16, hk_emu_hp4, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x8f16, HK_EMU_MFMA_F32_32X32X8_F16, hk_emu_h4, hk_emu_f16)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x8f16, HK_EMU_MFMA_F32_32X32X8_F16, hk_emu_hp4, hk_emu_f16)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x4f32, HK_EMU_MFMA_F32_16X16X4_F32, float, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x2f32, HK_EMU_MFMA_F32_32X32X2_F32, float, hk_emu_f16)
HK_EMU_MFMA(__builtin_amdgcn_mfma_i32_16x16x32_i8, HK_EMU_MFMA_I32_16X16X32_I8, long, hk_emu_i4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_i32_32x32x16_i8, HK_EMU_MFMA_I32_32X32X16_I8, long, hk_emu_i16)
// fp8 ("fp8" = e4m3, "bf8" = e5m2): FNUZ formats on gfx942, OCP formats on gfx950.
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8, HK_EMU_MFMA_F32_16X16X32_FP8_FP8, long, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x32_fp8_bf8, HK_EMU_MFMA_F32_16X16X32_FP8_BF8, long, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x32_bf8_fp8, HK_EMU_MFMA_F32_16X16X32_BF8_FP8, long, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x32_bf8_bf8, HK_EMU_MFMA_F32_16X16X32_BF8_BF8, long, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8, HK_EMU_MFMA_F32_32X32X16_FP8_FP8, long, hk_emu_f16)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x16_fp8_bf8, HK_EMU_MFMA_F32_32X32X16_FP8_BF8, long, hk_emu_f16)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x16_bf8_fp8, HK_EMU_MFMA_F32_32X32X16_BF8_FP8, long, hk_emu_f16)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x16_bf8_bf8, HK_EMU_MFMA_F32_32X32X16_BF8_BF8, long, hk_emu_f16)
#if defined(__gfx950__)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x32_bf16, HK_EMU_MFMA_F32_16X16X32_BF16, hk_emu_b8, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x16_bf16, HK_EMU_MFMA_F32_32X32X16_BF16, hk_emu_b8, hk_emu_f16)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x32_f16, HK_EMU_MFMA_F32_16X16X32_F16, hk_emu_h8, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_16x16x32_f16, HK_EMU_MFMA_F32_16X16X32_F16, hk_emu_hp8, hk_emu_f4)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x16_f16, HK_EMU_MFMA_F32_32X32X16_F16, hk_emu_h8, hk_emu_f16)
HK_EMU_MFMA(__builtin_amdgcn_mfma_f32_32x32x16_f16, HK_EMU_MFMA_F32_32X32X16_F16, hk_emu_hp8, hk_emu_f16)
// The f8f6f4 forms (32 bytes of A and B a lane; fmt_a / fmt_b, the cbsz / blgp fields: 0 e4m3, 1 e5m2, 2-4 FP6 /
// FP4) with E8M0 scales: opsel picks a byte of each lane's scale word, as the instruction does.
namespace hk_emu {
template <class C>
static inline C mfma_scale(int variant, hk_emu_i8 a, hk_emu_i8 b, C c, int fmt_a, int fmt_b, int opsel_a,
                           int scale_a, int opsel_b, int scale_b, const char* f, int l) {
  // A, B, C, then the two scale bytes: per-lane values (VGPRs on the device), so not immediates
  unsigned char in[2 * sizeof(hk_emu_i8) + sizeof(C) + 2];
  memcpy(in, &a, sizeof(a));
  memcpy(in + sizeof(a), &b, sizeof(b));
  memcpy(in + 2 * sizeof(a), &c, sizeof(C));
  in[2 * sizeof(a) + sizeof(C)] = (unsigned char)((unsigned)scale_a >> (8 * (opsel_a & 3)));
  in[2 * sizeof(a) + sizeof(C) + 1] = (unsigned char)((unsigned)scale_b >> (8 * (opsel_b & 3)));
  int32_t imm[8] = {variant, fmt_a, 0, fmt_b, (int)sizeof(a), (int)sizeof(C)};
  C out;
  hk_emu_xlane(HK_EMU_OP_MFMA, in, sizeof(in), &out, sizeof(C), imm, f, l);
  return out;
}
}  // namespace hk_emu
static inline hk_emu_f4 __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(hk_emu_i8 a, hk_emu_i8 b, hk_emu_f4 c,
                                                                          int fmt_a, int fmt_b, int opsel_a,
                                                                          int scale_a, int opsel_b, int scale_b,
                                                                          HK_EMU_LOC) {
  return hk_emu::mfma_scale(HK_EMU_MFMA_SCALE_F32_16X16X128_F8F6F4, a, b, c, fmt_a, fmt_b, opsel_a, scale_a,
                            opsel_b, scale_b, HK_EMU_AT);
}
static inline hk_emu_f16 __builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4(hk_emu_i8 a, hk_emu_i8 b, hk_emu_f16 c,
                                                                         int fmt_a, int fmt_b, int opsel_a,
                                                                         int scale_a, int opsel_b, int scale_b,
                                                                         HK_EMU_LOC) {
  return hk_emu::mfma_scale(HK_EMU_MFMA_SCALE_F32_32X32X64_F8F6F4, a, b, c, fmt_a, fmt_b, opsel_a, scale_a,
                            opsel_b, scale_b, HK_EMU_AT);
}
#endif
#undef HK_EMU_MFMA

// ---------------------------------------------------------------------------------------------
// LDS access contract: device code reads and writes LDS through these two macros so that the
// emulator can check bounds, alignment and races between barriers (README: "The contract").
// ---------------------------------------------------------------------------------------------
namespace hk_emu {
template <class T>
static inline T lds_load(const void* p, const char* f, int l) {
  hk_emu_lds_check(p, sizeof(T), alignof(T), 0, f, l);
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}
template <class T, class V>
static inline void lds_store(void* p, const V& v, const char* f, int l) {
  T t = v;
  hk_emu_lds_check(p, sizeof(T), alignof(T), 1, f, l);
  memcpy(p, &t, sizeof(T));
}
}  // namespace hk_emu
#define HK_LDS_LOAD(T, p) (::hk_emu::lds_load<T>((const void*)(p), __FILE__, __LINE__))
#define HK_LDS_STORE(T, p, v) (::hk_emu::lds_store<T>((void*)(p), (v), __FILE__, __LINE__))

static inline bool __builtin_amdgcn_is_shared(const void* p) { return hk_emu_is_lds(p) != 0; }
static inline bool __builtin_amdgcn_is_private(const void*) { return false; }

// ---------------------------------------------------------------------------------------------
// Buffer resources and buffer loads/stores (raw, stride 0). The range check follows the ISA:
// offset = voffset + imm offset is checked against num_records (bytes), dword by dword;
// soffset is added to the address but not checked. Out of range: loads give 0, stores drop.
// ---------------------------------------------------------------------------------------------
struct hk_emu_buffer_rsrc {
  const char* base;
  int64_t num_records;
  int32_t stride;
  int32_t flags;
};
typedef hk_emu_buffer_rsrc __amdgpu_buffer_rsrc_t;
static inline __amdgpu_buffer_rsrc_t __builtin_amdgcn_make_buffer_rsrc(const void* base, short stride,
                                                                       long long num_records, int flags) {
  __amdgpu_buffer_rsrc_t r;
  r.base = (const char*)base;
  r.num_records = (int64_t)(uint32_t)num_records;  // the descriptor field is 32 bits
  r.stride = stride & 0x3fff;
  r.flags = flags;
  return r;
}
namespace hk_emu {
static inline void buffer_io(const __amdgpu_buffer_rsrc_t& r, int voffset, int soffset, void* data,
                             unsigned n, bool store, const char* f, int l) {
  if (r.stride != 0)
    hk_emu_fail(f, l, "buffer access with a non-zero stride (%d) in the resource: only raw buffers "
                      "(stride 0) are emulated", r.stride);
  int64_t off = (int64_t)(uint32_t)voffset;
  const char* addr = r.base + (int64_t)(uint32_t)soffset + off;
  unsigned char* d = (unsigned char*)data;
  if (n < 4) {
    bool ok = off + n <= r.num_records;
    if (store) { if (ok) memcpy((void*)addr, d, n); }
    else { if (ok) memcpy(d, addr, n); else memset(d, 0, n); }
    return;
  }
  for (unsigned i = 0; i < n; i += 4) {
    bool ok = off + i + 4 <= r.num_records;
    if (store) { if (ok) memcpy((void*)(addr + i), d + i, 4); }
    else { if (ok) memcpy(d + i, addr + i, 4); else memset(d + i, 0, 4); }
  }
}
}  // namespace hk_emu
#define HK_EMU_BUFLOAD(NAME, T)                                                                     \
  static inline T NAME(__amdgpu_buffer_rsrc_t r, int voffset, int soffset, int aux, HK_EMU_LOC) {  \
    (void)aux; T v; hk_emu::buffer_io(r, voffset, soffset, &v, sizeof(T), false, HK_EMU_AT); return v; }
#define HK_EMU_BUFSTORE(NAME, T)                                                                    \
  static inline void NAME(T v, __amdgpu_buffer_rsrc_t r, int voffset, int soffset, int aux, HK_EMU_LOC) { \
    (void)aux; hk_emu::buffer_io(r, voffset, soffset, &v, sizeof(T), true, HK_EMU_AT); }
HK_EMU_BUFLOAD(__builtin_amdgcn_raw_buffer_load_b8, unsigned char)
HK_EMU_BUFLOAD(__builtin_amdgcn_raw_buffer_load_b16, unsigned short)
HK_EMU_BUFLOAD(__builtin_amdgcn_raw_buffer_load_b32, unsigned)
HK_EMU_BUFLOAD(__builtin_amdgcn_raw_buffer_load_b64, hk_emu_u2)
HK_EMU_BUFLOAD(__builtin_amdgcn_raw_buffer_load_b96, hk_emu_u3)
HK_EMU_BUFLOAD(__builtin_amdgcn_raw_buffer_load_b128, hk_emu_u4)
HK_EMU_BUFSTORE(__builtin_amdgcn_raw_buffer_store_b8, unsigned char)
HK_EMU_BUFSTORE(__builtin_amdgcn_raw_buffer_store_b16, unsigned short)
HK_EMU_BUFSTORE(__builtin_amdgcn_raw_buffer_store_b32, unsigned)
HK_EMU_BUFSTORE(__builtin_amdgcn_raw_buffer_store_b64, hk_emu_u2)
HK_EMU_BUFSTORE(__builtin_amdgcn_raw_buffer_store_b96, hk_emu_u3)
HK_EMU_BUFSTORE(__builtin_amdgcn_raw_buffer_store_b128, hk_emu_u4)
#undef HK_EMU_BUFLOAD
#undef HK_EMU_BUFSTORE

// ---------------------------------------------------------------------------------------------
// Direct-to-LDS loads: each lane loads `size` bytes from its own global address (+ imm offset);
// the wave writes them to LDS at lds_base + imm offset + lane * (size <= 4 ? 4 : 16). lds_base
// must be wave-uniform. Sizes 1, 2, 4 on gfx942; also 12 and 16 on gfx950. Emulated synchronously
// (LLVM's non-async intrinsics: the compiler waits before the data is used).
// ---------------------------------------------------------------------------------------------
namespace hk_emu {
static inline void load_to_lds(const void* data_or_null, const void* lds_base, unsigned size, int offset,
                               const char* f, int l) {
  if (!(size == 1 || size == 2 || size == 4 || size == 12 || size == 16))
    hk_emu_fail(f, l, "direct-to-LDS load of %u bytes: sizes are 1, 2, 4 (and 12, 16 on gfx950)", size);
  if (HK_EMU_ARCH == 942 && size > 4)
    hk_emu_fail(f, l, "direct-to-LDS load of %u bytes per lane is gfx950-only (gfx942: 1, 2 or 4)", size);
  unsigned char in[40] = {0};
  uint64_t base = (uint64_t)(uintptr_t)lds_base;
  memcpy(in, &base, 8);
  if (data_or_null) memcpy(in + 8, data_or_null, size);
  int32_t imm[8] = {(int)size, offset};
  hk_emu_xlane(HK_EMU_OP_LOAD_LDS, in, 8 + 16, nullptr, 0, imm, f, l);
}
}  // namespace hk_emu
// The device compiler rejects other sizes at compile time ("invalid size value"); so does the emulator.
#if defined(__gfx942__)
#define HK_EMU_LDS_DMA_SIZE_CHECK(size) \
  __attribute__((diagnose_if(!((size) == 1 || (size) == 2 || (size) == 4), "invalid size value: size must be 1, 2, or 4 (gfx942)", "error")))
#else
#define HK_EMU_LDS_DMA_SIZE_CHECK(size) \
  __attribute__((diagnose_if(!((size) == 1 || (size) == 2 || (size) == 4 || (size) == 12 || (size) == 16), "invalid size value: size must be 1, 2, 4, 12 or 16 (gfx950)", "error")))
#endif
template <class G, class L>
static inline void __builtin_amdgcn_global_load_lds(G* src, L* lds, unsigned size, int offset, int aux,
                                                    HK_EMU_LOC) HK_EMU_LDS_DMA_SIZE_CHECK(size) {
  (void)aux;
  unsigned char data[16];
  if (size <= 16) memcpy(data, (const char*)(const void*)src + offset, size);
  hk_emu::load_to_lds(data, (const void*)lds, size, offset, HK_EMU_AT);
}
template <class G, class L>
static inline void __builtin_amdgcn_load_to_lds(G* src, L* lds, unsigned size, int offset, int aux,
                                                HK_EMU_LOC) HK_EMU_LDS_DMA_SIZE_CHECK(size) {
  __builtin_amdgcn_global_load_lds(src, lds, size, offset, aux, HK_EMU_AT);
}
template <class L>
static inline void __builtin_amdgcn_raw_ptr_buffer_load_lds(__amdgpu_buffer_rsrc_t r, L* lds, unsigned size,
                                                            int voffset, int soffset, int offset, int aux,
                                                            HK_EMU_LOC) HK_EMU_LDS_DMA_SIZE_CHECK(size) {
  (void)aux;
  unsigned char data[16] = {0};
  if (size <= 16) hk_emu::buffer_io(r, voffset + offset, soffset, data, size, false, HK_EMU_AT);
  hk_emu::load_to_lds(data, (const void*)lds, size, offset, HK_EMU_AT);
}

// ---------------------------------------------------------------------------------------------
// Inline assembly. load() recognises the device library's asm statements in the preprocessed source
// (source.py, rewrite_inline_asm: exact templates, operand constraints and clobbers; anything else is a
// build error naming the asm) and replaces each with calls of these functions on the asm's operands, so
// the emulator executes the instruction from the values the real asm binds: the VGPR offset, the
// resource, the soffset, and M0.
// ---------------------------------------------------------------------------------------------
namespace hk_emu {
namespace inline_asm {
// an operand bound to one 32-bit register ("v", "s", "{m0}"): the device compiler gives a wider type a
// register tuple, which the instruction's operand would not accept
template <class T> static inline uint32_t reg32(const T& v) {
  static_assert(sizeof(T) == 4 && std::is_trivially_copyable<T>::value,
                "inline asm: a 32-bit register operand (\"v\", \"s\", \"{m0}\") must bind a 32-bit value");
  uint32_t u; memcpy(&u, &v, 4); return u;
}
template <class T> static inline const __amdgpu_buffer_rsrc_t& srsrc(const T& r) {
  static_assert(std::is_same<T, __amdgpu_buffer_rsrc_t>::value,
                "inline asm: a buffer instruction's srsrc operand must bind an __amdgpu_buffer_rsrc_t");
  return r;
}
// buffer_load_<size> vaddr, srsrc, soffset offen [offset:N] lds (MUBUF, LDS = 1, raw buffer): lane l reads
// `size` bytes at base + soffset + vaddr + offset, range-checked like the buffer builtins (voffset + offset
// against num_records, dword by dword: out of range reads 0), and the wave writes them to LDS at
// M0 + offset + l * (size <= 4 ? 4 : 16). Asynchronous: counted on vmcnt like every LDS-DMA.
static inline void buffer_load_lds(unsigned size, uint32_t vaddr, const __amdgpu_buffer_rsrc_t& r, uint32_t soffset,
                                   int offset, uint32_t m0, const char* f, int l) {
  unsigned char in[40] = {0};
  memcpy(in, &m0, 4);
  buffer_io(r, (int)(vaddr + (uint32_t)offset), (int)soffset, in + 8, size, false, f, l);
  int32_t imm[8] = {(int)size, offset, 1};
  hk_emu_xlane(HK_EMU_OP_LOAD_LDS, in, 8 + 16, nullptr, 0, imm, f, l);
}
}  // namespace inline_asm
}  // namespace hk_emu

#if defined(__gfx950__)
// ds_read_b64_tr_b16: per block of 16 lanes, lane j reads 4 x 16-bit values R[j][0..3] at its
// address; lane i receives R[4e + i/4][i%4] for e = 0..3 (a 4x16 tile read row-wise comes back
// column-wise). README documents the source and the status of this model.
namespace hk_emu {
template <class R, class P>
static inline R ds_read_tr16(P* p, const char* f, int l) {
  uint64_t a = (uint64_t)(uintptr_t)(const void*)p;
  R out;
  hk_emu_xlane(HK_EMU_OP_DS_READ_TR16, &a, 8, &out, 8, nullptr, f, l);
  return out;
}
}  // namespace hk_emu
template <class P>
static inline hk_emu_s4 __builtin_amdgcn_ds_read_tr16_b64_v4i16(P* p, HK_EMU_LOC) {
  return hk_emu::ds_read_tr16<hk_emu_s4>(p, HK_EMU_AT);
}
template <class P>
static inline hk_emu_hp4 __builtin_amdgcn_ds_read_tr16_b64_v4f16(P* p, HK_EMU_LOC) {
  return hk_emu::ds_read_tr16<hk_emu_hp4>(p, HK_EMU_AT);
}
template <class P>
static inline hk_emu_b4 __builtin_amdgcn_ds_read_tr16_b64_v4bf16(P* p, HK_EMU_LOC) {
  return hk_emu::ds_read_tr16<hk_emu_b4>(p, HK_EMU_AT);
}
#endif

// ---------------------------------------------------------------------------------------------
// Transcendentals and other math instructions. The emulator returns the correctly rounded value of
// the modeled function (computed in double, rounded once to f32) with the hardware's denormal
// handling; the hardware is within 1 ulp of it (README: modeled error).
// ---------------------------------------------------------------------------------------------
namespace hk_emu {
static inline bool is_denorm(float x) { return x != 0.0f && fabsf(x) < 1.17549435e-38f; }
static inline float ftz(float x) { return is_denorm(x) ? copysignf(0.0f, x) : x; }
}  // namespace hk_emu
// v_exp_f32: 2^x; denormal results flush to +0.
static inline float __builtin_amdgcn_exp2f(float x) { return hk_emu::ftz((float)exp2((double)x)); }
// v_log_f32: log2(x) (not ln); denormal inputs are treated as 0 (-> -inf).
static inline float __builtin_amdgcn_logf(float x) { return (float)log2((double)hk_emu::ftz(x)); }
static inline float __builtin_amdgcn_log_clampf(float x) {
  float r = __builtin_amdgcn_logf(x);
  return isinf(r) ? copysignf(3.40282347e+38f, r) : r;
}
// v_rcp_f32 / v_rsq_f32 / v_sqrt_f32: denormal inputs and results flush to 0.
static inline float __builtin_amdgcn_rcpf(float x) { return hk_emu::ftz((float)(1.0 / (double)hk_emu::ftz(x))); }
static inline float __builtin_amdgcn_rsqf(float x) { return hk_emu::ftz((float)(1.0 / sqrt((double)hk_emu::ftz(x)))); }
static inline float __builtin_amdgcn_rsq_clampf(float x) {
  float r = __builtin_amdgcn_rsqf(x);
  return isinf(r) ? copysignf(3.40282347e+38f, r) : r;
}
static inline float __builtin_amdgcn_sqrtf(float x) { return hk_emu::ftz((float)sqrt((double)hk_emu::ftz(x))); }
static inline double __builtin_amdgcn_rcp(double x) { return 1.0 / x; }
static inline double __builtin_amdgcn_rsq(double x) { return 1.0 / sqrt(x); }
static inline double __builtin_amdgcn_sqrt(double x) { return sqrt(x); }
// v_sin_f32 / v_cos_f32 take the angle in revolutions: sin(2*pi*x).
static inline float __builtin_amdgcn_sinf(float x) { return (float)sin(2.0 * M_PI * (double)x); }
static inline float __builtin_amdgcn_cosf(float x) { return (float)cos(2.0 * M_PI * (double)x); }
static inline float __builtin_amdgcn_fractf(float x) {
  if (isinf(x) || x != x) return NAN;
  float r = x - floorf(x);
  return r < 0x1.fffffep-1f ? r : 0x1.fffffep-1f;
}
static inline double __builtin_amdgcn_fract(double x) {
  if (isinf(x) || x != x) return NAN;
  double r = x - floor(x);
  return r < 0x1.fffffffffffffp-1 ? r : 0x1.fffffffffffffp-1;
}
static inline float __builtin_amdgcn_ldexpf(float x, int e) { return ldexpf(x, e); }
static inline double __builtin_amdgcn_ldexp(double x, int e) { return ldexp(x, e); }
static inline float __builtin_amdgcn_frexp_mantf(float x) { int e; return (isinf(x) || x != x) ? x : frexpf(x, &e); }
static inline int __builtin_amdgcn_frexp_expf(float x) { int e = 0; if (!(isinf(x) || x != x)) frexpf(x, &e); return e; }
static inline double __builtin_amdgcn_frexp_mant(double x) { int e; return (isinf(x) || x != x) ? x : frexp(x, &e); }
static inline int __builtin_amdgcn_frexp_exp(double x) { int e = 0; if (!(isinf(x) || x != x)) frexp(x, &e); return e; }
static inline float __builtin_amdgcn_fmed3f(float a, float b, float c) {
  return fmaxf(fminf(a, b), fminf(fmaxf(a, b), c));
}
static inline bool __builtin_amdgcn_classf(float x, int mask) {
  int bit;
  uint32_t u = hk_emu_num::f32_bits(x);
  bool neg = u >> 31;
  if (x != x) bit = (u & 0x00400000u) ? 1 : 0;
  else if (isinf(x)) bit = neg ? 2 : 9;
  else if (x == 0.0f) bit = neg ? 5 : 6;
  else if (hk_emu::is_denorm(x)) bit = neg ? 4 : 7;
  else bit = neg ? 3 : 8;
  return (mask >> bit) & 1;
}
static inline unsigned __builtin_amdgcn_ubfe(unsigned src, unsigned offset, unsigned width) {
  offset &= 31; width &= 31;
  if (width == 0) return 0;
  return (src >> offset) & ((1u << width) - 1u);
}
static inline unsigned __builtin_amdgcn_sbfe(unsigned src, unsigned offset, unsigned width) {
  offset &= 31; width &= 31;
  if (width == 0) return 0;
  int64_t v = (int64_t)((src >> offset) & ((1u << width) - 1u));
  if (v & (int64_t(1) << (width - 1))) v -= int64_t(1) << width;
  return (unsigned)v;
}
static inline unsigned __builtin_amdgcn_alignbit(unsigned a, unsigned b, unsigned s) {
  return (unsigned)((((uint64_t)a << 32) | b) >> (s & 31));
}
static inline unsigned __builtin_amdgcn_alignbyte(unsigned a, unsigned b, unsigned s) {
  return (unsigned)((((uint64_t)a << 32) | b) >> (8 * (s & 3)));
}
// v_perm_b32: byte k of the result is selected by byte k of sel from {a (bytes 4-7), b (bytes 0-3)}.
static inline unsigned __builtin_amdgcn_perm(unsigned a, unsigned b, unsigned sel) {
  uint64_t src = ((uint64_t)a << 32) | b;
  unsigned r = 0;
  for (int k = 0; k < 4; ++k) {
    unsigned s = (sel >> (8 * k)) & 0xff, v;
    if (s < 8) v = (src >> (8 * s)) & 0xff;
    else if (s < 12) v = ((src >> (16 * (s - 8) + 15)) & 1) ? 0xff : 0x00;
    else if (s == 12) v = 0x00;
    else v = 0xff;
    r |= v << (8 * k);
  }
  return r;
}
// v_cvt_pkrtz_f16_f32: two f32 -> f16, rounding toward zero.
static inline hk_emu_hp2 __builtin_amdgcn_cvt_pkrtz(float a, float b) {
  auto rtz = [](float x) -> uint16_t {
    _Float16 h = (_Float16)x;  // round to nearest even, then step toward zero if it moved away
    float back = (float)h;
    uint16_t u;
    memcpy(&u, &h, 2);
    if (x == x && !isinf(x) && fabsf(back) > fabsf(x)) u = (uint16_t)(u - 1);
    return u;
  };
  uint16_t bits[2] = {rtz(a), rtz(b)};
  hk_emu_hp2 v;
  memcpy(&v, bits, 4);
  return v;
}

// ---------------------------------------------------------------------------------------------
// fp8 conversions (v_cvt_pk_fp8_f32 etc.): gfx942 FNUZ, gfx950 OCP; round to nearest even,
// not saturating (a value above the largest finite becomes NaN, or inf for OCP e5m2).
// ---------------------------------------------------------------------------------------------
#if defined(__gfx942__)
#define HK_EMU_FP8 hk_emu_num::E4M3_FNUZ
#define HK_EMU_BF8 hk_emu_num::E5M2_FNUZ
#else
#define HK_EMU_FP8 hk_emu_num::E4M3_FN
#define HK_EMU_BF8 hk_emu_num::E5M2
#endif
namespace hk_emu {
static inline int cvt_pk_8(float a, float b, int old, bool word_sel, hk_emu_num::Fp8Fmt fmt) {
  uint32_t lo = hk_emu_num::f32_to_fp8(a, fmt), hi = hk_emu_num::f32_to_fp8(b, fmt);
  uint32_t w = lo | (hi << 8), o = (uint32_t)old;
  return (int)(word_sel ? ((o & 0x0000ffffu) | (w << 16)) : ((o & 0xffff0000u) | w));
}
}  // namespace hk_emu
static inline int __builtin_amdgcn_cvt_pk_fp8_f32(float a, float b, int old, bool word_sel) {
  return hk_emu::cvt_pk_8(a, b, old, word_sel, HK_EMU_FP8);
}
static inline int __builtin_amdgcn_cvt_pk_bf8_f32(float a, float b, int old, bool word_sel) {
  return hk_emu::cvt_pk_8(a, b, old, word_sel, HK_EMU_BF8);
}
static inline float __builtin_amdgcn_cvt_f32_fp8(int src, int byte_sel) {
  return hk_emu_num::fp8_to_f32((uint8_t)((unsigned)src >> (8 * (byte_sel & 3))), HK_EMU_FP8);
}
static inline float __builtin_amdgcn_cvt_f32_bf8(int src, int byte_sel) {
  return hk_emu_num::fp8_to_f32((uint8_t)((unsigned)src >> (8 * (byte_sel & 3))), HK_EMU_BF8);
}
static inline hk_emu_f2 __builtin_amdgcn_cvt_pk_f32_fp8(int src, bool word_sel) {
  unsigned w = (unsigned)src >> (word_sel ? 16 : 0);
  hk_emu_f2 r = {hk_emu_num::fp8_to_f32((uint8_t)w, HK_EMU_FP8), hk_emu_num::fp8_to_f32((uint8_t)(w >> 8), HK_EMU_FP8)};
  return r;
}
static inline hk_emu_f2 __builtin_amdgcn_cvt_pk_f32_bf8(int src, bool word_sel) {
  unsigned w = (unsigned)src >> (word_sel ? 16 : 0);
  hk_emu_f2 r = {hk_emu_num::fp8_to_f32((uint8_t)w, HK_EMU_BF8), hk_emu_num::fp8_to_f32((uint8_t)(w >> 8), HK_EMU_BF8)};
  return r;
}

// ---------------------------------------------------------------------------------------------
// Module glue: LDS ranges, and per-kernel entry/descriptor templates used by the export block that
// load() appends (hk_emu_entry_<kernel>, hk_emu_params_<kernel>).
// ---------------------------------------------------------------------------------------------
extern "C" char hk_emu_lds_begin[] __attribute__((weak, visibility("hidden")));
extern "C" char hk_emu_lds_end[] __attribute__((weak, visibility("hidden")));
extern "C" char hk_emu_lds_guard_lo[] __attribute__((weak, visibility("hidden")));
extern "C" char hk_emu_lds_guard_hi[] __attribute__((weak, visibility("hidden")));
extern "C" {
__attribute__((visibility("hidden"), aligned(4096))) char hk_emu_dyn_lds[HK_EMU_DYN_CAP];
__attribute__((visibility("default"))) void hk_emu_module_info_get(hk_emu_module_info* o) {
  o->abi = HK_EMU_ABI;
  o->pad = HK_EMU_ARCH;
  o->lds_lo = hk_emu_lds_begin;
  o->lds_hi = hk_emu_lds_end;
  o->dyn = hk_emu_dyn_lds;
  o->dyn_cap = HK_EMU_DYN_CAP;
  // the pages around the static LDS become PROT_NONE (the linker script reserves them for nothing else)
  o->guard_lo = hk_emu_lds_guard_lo;
  o->guard_hi = hk_emu_lds_guard_hi;
  if (o->guard_lo) mprotect(o->guard_lo, 4096, PROT_NONE);
  if (o->guard_hi) mprotect(o->guard_hi, 4096, PROT_NONE);
}
}
namespace hk_emu {
template <class T>
constexpr hk_emu_param describe_one() {
  using U = std::remove_cv_t<T>;
  uint32_t kind = std::is_pointer<U>::value ? HK_EMU_P_POINTER
                : std::is_same<U, bool>::value ? HK_EMU_P_BOOL
                : std::is_floating_point<U>::value ? HK_EMU_P_FLOAT
                : (std::is_integral<U>::value || std::is_enum<U>::value)
                    ? (std::is_signed<U>::value ? HK_EMU_P_SINT : HK_EMU_P_UINT)
                    : HK_EMU_P_OTHER;
  return hk_emu_param{(uint32_t)sizeof(U), (uint32_t)alignof(U), kind};
}
template <class... A>
static int describe(void (*)(A...), hk_emu_param* out, int cap) {
  hk_emu_param d[sizeof...(A) + 1] = {describe_one<A>()..., hk_emu_param{0, 0, 0}};
  for (int i = 0; i < (int)sizeof...(A) && i < cap; ++i) out[i] = d[i];
  return (int)sizeof...(A);
}
template <class... A, size_t... I>
static void call_impl(void (*k)(A...), void** p, std::index_sequence<I...>) {
  k(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(p[I])...);
}
template <class... A>
static void call(void (*k)(A...), void** p) {
  call_impl(k, p, std::index_sequence_for<A...>{});
}
}  // namespace hk_emu

#endif  // HK_EMU_H
