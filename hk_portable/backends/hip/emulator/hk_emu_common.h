// hk_emu_common.h -- the ABI shared by the wave64 emulator's runtime (libhk_emu_rt) and the kernel
// modules compiled with hk_emu.h, plus the number formats both sides convert (bf16, f16, fp8).
//
// Everything here is plain C++17 for the host (x86-64, clang); nothing is AMD code.
#ifndef HK_EMU_COMMON_H
#define HK_EMU_COMMON_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#define HK_EMU_ABI 5

// ---------------------------------------------------------------------------------------------
// ABI structures (mirrored by ctypes in emulator/runtime_abi.py: keep field order and types)
// ---------------------------------------------------------------------------------------------
#if defined(__clang__)
// Wave-level entry points are convergent, as the device builtins they implement are: the host optimizer
// must not merge, sink or hoist them across divergent control flow (it would change which lanes meet).
#define HK_EMU_CONVERGENT __attribute__((convergent))
#else
#define HK_EMU_CONVERGENT
#endif

extern "C" {

// What a lane may ask about itself. Filled by the runtime per lane, read by the header's builtins.
struct hk_emu_lane_info {
  uint32_t tid[3];       // __builtin_amdgcn_workitem_id_{x,y,z}
  uint32_t bid[3];       // __builtin_amdgcn_workgroup_id_{x,y,z}
  uint32_t bdim[3];      // workgroup size (work-items)
  uint32_t gdim[3];      // grid size in workgroups
  uint32_t lane;         // lane in the wave, 0..63
  uint32_t wave;         // wave in the block
  uint32_t flat;         // flat work-item id in the block (x fastest)
  uint32_t arch;         // 942 or 950
  uint32_t static_lds;   // bytes of static __shared__ storage (groupstaticsize)
  uint32_t dyn_lds;      // bytes of dynamic LDS of this launch
  const void* dispatch;  // fake hsa_kernel_dispatch_packet_t (__builtin_amdgcn_dispatch_ptr)
  const void* implicit;  // fake code-object-v5 implicit kernel arguments (__builtin_amdgcn_implicitarg_ptr)
};

// One kernel parameter as the compiled module sees it (sizeof/alignof of the C++ type + its kind).
struct hk_emu_param {
  uint32_t size;
  uint32_t align;
  uint32_t kind;         // HK_EMU_P_*
};
enum {
  HK_EMU_P_OTHER = 0,    // struct / union / vector passed by value: the caller supplies raw bytes
  HK_EMU_P_SINT = 1,
  HK_EMU_P_UINT = 2,
  HK_EMU_P_FLOAT = 3,
  HK_EMU_P_POINTER = 4,
  HK_EMU_P_BOOL = 5,
};

// Per module copy: where its static __shared__ variables and its dynamic-LDS window live.
struct hk_emu_module_info {
  uint32_t abi;
  uint32_t pad;
  char* lds_lo;          // [lds_lo, lds_hi): the kernel's static __shared__ variables (hk_lds.* sections)
  char* lds_hi;
  char* dyn;             // the dynamic LDS window (extern __shared__ arrays alias it), page aligned
  uint64_t dyn_cap;      // bytes in the window, including one trailing guard page
  char* guard_lo;        // PROT_NONE page before the static LDS (0 if the object has none)
  char* guard_hi;        // PROT_NONE page right after the static LDS (which ends at or just before it)
};

// A tensor argument's guarded copy, for naming the target of a faulting access.
struct hk_emu_region {
  uint64_t lo, hi;       // the tensor bytes the kernel may touch
  uint64_t map_lo, map_hi;  // the whole mapping including the PROT_NONE guard pages
  const char* name;
};

struct hk_emu_launch {
  uint32_t abi;
  uint32_t nworkers;
  void* const* entries;                     // per worker: void (*)(void** params)
  const hk_emu_module_info* const* mods;    // per worker
  void** params;                            // kernel parameters (one pointer per parameter)
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t dyn_lds;
  uint32_t arch;                            // 942 / 950
  uint32_t lds_limit;                       // bytes of LDS per workgroup the arch has
  uint32_t flags;                           // HK_EMU_F_*
  const char* kernel;
  const hk_emu_region* regions;
  uint32_t nregions;
  uint32_t timeout_ms;                      // 0: none
  char* err;                                // report text on failure
  uint32_t errcap;
  uint32_t pad;
  uint64_t stats[8];                        // out: HK_EMU_S_*
};
enum {
  HK_EMU_F_NO_RACE_CHECK = 1,               // skip LDS race bookkeeping (bounds are still checked)
  HK_EMU_F_NO_POISON = 2,                   // do not fill LDS with 0xFF at block start
};
enum {
  HK_EMU_S_BLOCKS = 0,
  HK_EMU_S_XLANE = 1,                       // wave-level cross-lane operations resolved
  HK_EMU_S_BARRIERS = 2,                    // block barriers released
  HK_EMU_S_SWITCHES = 3,                    // fiber switches
  HK_EMU_S_LDS_ACCESSES = 4,                // checked LDS accesses (HK_LDS_* and LDS builtins)
  HK_EMU_S_NS = 5,                          // wall time of the launch, ns
};

// ---------------------------------------------------------------------------------------------
// Runtime entry points called by the kernel module (implemented in hk_emu_runtime.h)
// ---------------------------------------------------------------------------------------------
const hk_emu_lane_info* hk_emu_cur(void);
// A wave-level operation: every live lane of the wave calls it at the same call site; the lane's
// `in` bytes are deposited, the lane yields, the runtime computes all lanes' results and resumes.
HK_EMU_CONVERGENT void hk_emu_xlane(int op, const void* in, uint32_t in_bytes, void* out, uint32_t out_bytes,
                  const int32_t* imm, const char* file, int line);
// Sync points without data: block barrier (s_barrier), soft wave points (waitcnt, fence, wave_barrier).
HK_EMU_CONVERGENT void hk_emu_point(int op, const char* file, int line);
// s_waitcnt(imm): a soft wave point that also completes the wave's direct-to-LDS loads down to vmcnt.
HK_EMU_CONVERGENT void hk_emu_waitcnt(int imm, const char* file, int line);
// Check one LDS access of n bytes at p (bounds, alignment, races between barriers).
void hk_emu_lds_check(const void* p, uint32_t n, uint32_t align, int is_write, const char* file, int line);
// Report an error from device code and abort the launch.
void hk_emu_fail(const char* file, int line, const char* fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
// Whether p points into this block's LDS (__builtin_amdgcn_is_shared).
int hk_emu_is_lds(const void* p);
// The lane ends here (__builtin_amdgcn_endpgm).
void hk_emu_exit_lane(void) __attribute__((noreturn));

}  // extern "C"

// Cross-lane operations (hk_emu_xlane's op)
enum {
  HK_EMU_OP_BARRIER = 1,     // s_barrier (hk_emu_point)
  HK_EMU_OP_SOFT = 2,        // s_waitcnt / fence / wave_barrier (hk_emu_point)
  HK_EMU_OP_BPERMUTE = 3,
  HK_EMU_OP_PERMUTE = 4,
  HK_EMU_OP_SWIZZLE = 5,
  HK_EMU_OP_DPP = 6,
  HK_EMU_OP_READLANE = 7,
  HK_EMU_OP_READFIRSTLANE = 8,
  HK_EMU_OP_WRITELANE = 9,
  HK_EMU_OP_BALLOT = 10,
  HK_EMU_OP_READ_EXEC = 11,
  HK_EMU_OP_PERMLANE16_SWAP = 12,
  HK_EMU_OP_PERMLANE32_SWAP = 13,
  HK_EMU_OP_MFMA = 14,
  HK_EMU_OP_LOAD_LDS = 15,   // global_load_lds / buffer_load ... lds: lane payload -> LDS
  HK_EMU_OP_DS_READ_TR16 = 16,
  HK_EMU_OP_PERMLANE64 = 17,
  HK_EMU_OP__COUNT = 18,
};

// MFMA variants (imm[0] of HK_EMU_OP_MFMA)
enum {
  HK_EMU_MFMA_F32_16X16X16_BF16 = 0,   // gfx942+: mfma_f32_16x16x16bf16_1k
  HK_EMU_MFMA_F32_32X32X8_BF16 = 1,    // gfx942+: mfma_f32_32x32x8bf16_1k
  HK_EMU_MFMA_F32_16X16X16_F16 = 2,
  HK_EMU_MFMA_F32_32X32X8_F16 = 3,
  HK_EMU_MFMA_F32_16X16X32_BF16 = 4,   // gfx950
  HK_EMU_MFMA_F32_32X32X16_BF16 = 5,   // gfx950
  HK_EMU_MFMA_F32_16X16X32_F16 = 6,    // gfx950
  HK_EMU_MFMA_F32_32X32X16_F16 = 7,    // gfx950
  HK_EMU_MFMA_F32_16X16X32_FP8_FP8 = 8,
  HK_EMU_MFMA_F32_16X16X32_FP8_BF8 = 9,
  HK_EMU_MFMA_F32_16X16X32_BF8_FP8 = 10,
  HK_EMU_MFMA_F32_16X16X32_BF8_BF8 = 11,
  HK_EMU_MFMA_F32_32X32X16_FP8_FP8 = 12,
  HK_EMU_MFMA_F32_32X32X16_FP8_BF8 = 13,
  HK_EMU_MFMA_F32_32X32X16_BF8_FP8 = 14,
  HK_EMU_MFMA_F32_32X32X16_BF8_BF8 = 15,
  HK_EMU_MFMA_F32_16X16X4_F32 = 16,
  HK_EMU_MFMA_F32_32X32X2_F32 = 17,
  HK_EMU_MFMA_I32_16X16X32_I8 = 18,
  HK_EMU_MFMA_I32_32X32X16_I8 = 19,
  // gfx950: mfma_scale_f32_{16x16x128,32x32x64}_f8f6f4; imm[1] / imm[3] hold the A / B formats (cbsz, blgp),
  // the payload ends with the two E8M0 scale bytes opsel picked
  HK_EMU_MFMA_SCALE_F32_16X16X128_F8F6F4 = 20,
  HK_EMU_MFMA_SCALE_F32_32X32X64_F8F6F4 = 21,
  HK_EMU_MFMA__COUNT = 22,
};

// ---------------------------------------------------------------------------------------------
// Number formats
// ---------------------------------------------------------------------------------------------
namespace hk_emu_num {

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// bf16 <-> f32. f32 -> bf16 rounds to nearest even; NaN stays NaN (quiet, sign kept).
static inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }
static inline uint16_t f32_to_bf16_rne(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// IEEE binary16 <-> f32 (exact decode; encode rounds to nearest even).
static inline float f16_to_f32(uint16_t h) {
  uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return bits_f32(s | 0x7f800000u | (m << 13));
  if (e == 0) return (s ? -1.0f : 1.0f) * ldexpf((float)m, -24);
  return bits_f32(s | ((e + 112) << 23) | (m << 13));
}
static inline uint16_t f32_to_f16_rne(float f) {
  uint32_t u = f32_bits(f), s = (u >> 16) & 0x8000u;
  float a = fabsf(f);
  if (a != a) return (uint16_t)(s | 0x7e00u);
  if (a >= 65520.0f) return (uint16_t)(s | 0x7c00u);
  if (a < 6.103515625e-05f) {  // subnormal range: quantum 2^-24
    double q = nearbyint((double)a * 16777216.0);
    return (uint16_t)(s | (uint32_t)q);  // q == 1024 rolls into the smallest normal
  }
  int e; frexp(a, &e);                   // a = m * 2^e, m in [0.5, 1)
  double quantum = ldexp(1.0, e - 11);
  double r = nearbyint((double)a / quantum) * quantum;
  int re; double rm = frexp(r, &re);
  uint32_t exp_field = (uint32_t)(re - 1 + 15);
  uint32_t mant = (uint32_t)((rm * 2.0 - 1.0) * 1024.0);
  return (uint16_t)(s | (exp_field << 10) | mant);
}

// fp8 formats. gfx942 implements the FNUZ variants (no negative zero, 0x80 = NaN, no infinity);
// gfx950 implements OCP e4m3fn (no infinity, S.1111.111 = NaN) and OCP e5m2 (IEEE-like).
enum Fp8Fmt { E4M3_FNUZ = 0, E5M2_FNUZ = 1, E4M3_FN = 2, E5M2 = 3 };
struct Fp8Desc { int ebits, mbits, bias; bool fnuz, has_inf; double maxv; };
static inline Fp8Desc fp8_desc(Fp8Fmt f) {
  switch (f) {
    case E4M3_FNUZ: return {4, 3, 8, true, false, 240.0};
    case E5M2_FNUZ: return {5, 2, 16, true, false, 57344.0};
    case E4M3_FN: return {4, 3, 7, false, false, 448.0};
    default: return {5, 2, 15, false, true, 57344.0};
  }
}
static inline float fp8_to_f32(uint8_t v, Fp8Fmt f) {
  Fp8Desc d = fp8_desc(f);
  bool neg = v & 0x80;
  uint32_t e = (v >> d.mbits) & ((1u << d.ebits) - 1), m = v & ((1u << d.mbits) - 1);
  if (d.fnuz) {
    if (v == 0x80) return NAN;
  } else if (f == E4M3_FN) {
    if ((v & 0x7f) == 0x7f) return neg ? -NAN : NAN;
  } else {  // E5M2
    if (e == 31) return m ? (neg ? -NAN : NAN) : (neg ? -INFINITY : INFINITY);
  }
  double val = e == 0 ? ldexp((double)m, 1 - d.bias - d.mbits)
                      : ldexp(1.0 + (double)m / (1 << d.mbits), (int)e - d.bias);
  return (float)(neg ? -val : val);
}
// f32 -> fp8, round to nearest even, not saturating: a value that rounds above the largest finite
// becomes NaN (formats without infinity) or +-inf (OCP e5m2); NaN -> NaN; -0 -> 0 in FNUZ formats.
static inline uint8_t f32_to_fp8(float x, Fp8Fmt f, bool saturate = false) {
  Fp8Desc d = fp8_desc(f);
  uint8_t nan = d.fnuz ? 0x80 : (f == E4M3_FN ? 0x7f : 0x7f);
  uint8_t sign = signbit(x) ? 0x80 : 0;
  if (x != x) return d.fnuz ? nan : (uint8_t)(sign | nan);
  double a = fabs((double)x);
  auto max_code = [&]() -> uint8_t {
    if (f == E4M3_FN) return 0x7e;
    if (f == E5M2) return 0x7b;
    return 0x7f;
  };
  if (isinf(a)) {
    if (saturate) return (uint8_t)(sign | max_code());
    if (d.has_inf) return (uint8_t)(sign | 0x7c);
    return d.fnuz ? nan : (uint8_t)(sign | nan);
  }
  int min_exp = 1 - d.bias;  // exponent of the smallest normal
  int e;
  if (a == 0.0) return d.fnuz ? 0 : sign;
  frexp(a, &e); e -= 1;      // a = 1.x * 2^e
  double quantum = ldexp(1.0, (e < min_exp ? min_exp : e) - d.mbits);
  double r = nearbyint(a / quantum) * quantum;
  if (r > d.maxv) {
    if (saturate) return (uint8_t)(sign | max_code());
    if (d.has_inf) return (uint8_t)(sign | 0x7c);
    return d.fnuz ? nan : (uint8_t)(sign | nan);
  }
  if (r == 0.0) return d.fnuz ? 0 : sign;
  int re; frexp(r, &re); re -= 1;
  uint32_t code;
  if (re < min_exp) {
    code = (uint32_t)(r / ldexp(1.0, min_exp - d.mbits));
  } else {
    uint32_t mant = (uint32_t)(r / ldexp(1.0, re - d.mbits)) - (1u << d.mbits);
    code = ((uint32_t)(re + d.bias) << d.mbits) | mant;
  }
  return (uint8_t)(sign | code);
}

}  // namespace hk_emu_num

#endif  // HK_EMU_COMMON_H
