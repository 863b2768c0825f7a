// hk_hip.h -- the device library of the hk_portable HIP backend (AMD CDNA3 gfx942, CDNA4 gfx950).
//
// Implements hk_portable/codegen/DEVICE_API.md. Header-free (clang builtins only), so the same text
// compiles under hiprtc, under an offline clang for amdgcn and, with HK_EMULATOR, on the host against
// the wave64 emulator. The reference interpreter (backends/reference/interpreter.py) defines what
// every function computes; the conformance suite checks it.
//
// Layouts (all a function of the type only, see README.md in this folder):
//   rt<T,R,C>   rows in 16-row blocks spread over the waves (block b -> wave b % NW, slot b / NW; when
//               there are fewer blocks than waves the spare waves hold replicas and never write);
//               inside a 16x16 block the MFMA accumulator ("col") layout: element (i, j) in lane
//               j + 16*(i/4), register i%4 -- a lane holds 4 consecutive rows of one column.
//   rv<T,N,ROW> the rows of such a tile: lane l holds rows 4*(l/16)+k, k = 0..3, of each of its blocks.
//   rv<T,N,COL> the columns: lane l holds column 16*cb + l%16 of every 16-column block (all waves).
//   st<T,R,C>   row-major with 16-byte chunks XOR-swizzled by row, so MFMA operand reads of 16 rows
//               spread over the LDS banks (32 banks on gfx942, 64 on gfx950); within R*C*sizeof(T).

#if defined(HK_EMULATOR)
// the emulator's prelude defines the attributes, the builtins and its checked LDS access macros
#elif !defined(__HIPCC_RTC__)
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#endif

#ifndef HK_NUM_WARPS
#error "the prelude defines HK_NUM_WARPS (waves per block) before this library"
#endif
#ifndef HK_NUM_THREADS
#define HK_NUM_THREADS (HK_NUM_WARPS * 64)
#endif
#ifndef HK_SCRATCH_BYTES
#define HK_SCRATCH_BYTES 16
#endif
#ifndef HK_BLOCK_REMAP
#define HK_BLOCK_REMAP 1
#endif

#if defined(__gfx950__)      // the emulator defines it too (-D__gfx950__)
#define HK_GFX950 1
#else
#define HK_GFX950 0
#endif

// Every LDS access of the library goes through these two macros so the emulator can check bounds
// and races; on the device they are plain accesses (the address space is inferred after inlining).
#ifndef HK_LDS_LOAD
#define HK_LDS_LOAD(T, ptr) (*(const T*)(ptr))
#endif
#ifndef HK_LDS_STORE
#define HK_LDS_STORE(T, ptr, val) (*(T*)(ptr) = (val))
#endif

#define HK_DEV __device__ inline __attribute__((always_inline))
#define HK_INF __builtin_inff()
#define HK_NAN __builtin_nanf("")

namespace hk {

typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
typedef short i16x8 __attribute__((ext_vector_type(8)));
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 f16x8 __attribute__((ext_vector_type(8)));
typedef __bf16 bf16x8 __attribute__((ext_vector_type(8)));
typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));

struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };
struct fp8e4m3 { unsigned char bits; };
struct fp8e5m2 { unsigned char bits; };
struct ROW {};
struct COL {};

constexpr int NW = HK_NUM_WARPS;            // waves per block
constexpr int NT = HK_NUM_THREADS;          // threads per block
static_assert(NT == NW * 64, "wave64: HK_NUM_THREADS must be 64 * HK_NUM_WARPS");
#if HK_GFX950
constexpr int LDS_BANK_BYTES = 256;         // 64 banks x 4 bytes
#else
constexpr int LDS_BANK_BYTES = 128;         // 32 banks x 4 bytes
#endif

template<class A, class B> struct same_t { static constexpr bool value = false; };
template<class A> struct same_t<A, A> { static constexpr bool value = true; };

// =========================================================================================== lanes
namespace detail {
HK_DEV int tid() { return (int)__builtin_amdgcn_workitem_id_x(); }
HK_DEV int lane() { return tid() & 63; }
// wave-uniform: readfirstlane keeps it in a scalar register
HK_DEV int wave() { return __builtin_amdgcn_readfirstlane(tid() >> 6); }
HK_DEV float u2f(unsigned u) { return __builtin_bit_cast(float, u); }
HK_DEV unsigned f2u(float f) { return __builtin_bit_cast(unsigned, f); }

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

// ===================================================================================== conversions
namespace detail {
template<int EB, int MB, int BIAS, bool IEEE>
HK_DEV float fp8_decode(unsigned b) {
  const unsigned e = (b >> MB) & ((1u << EB) - 1), m = b & ((1u << MB) - 1);
  float v;
  if (IEEE && e == (1u << EB) - 1) v = m ? HK_NAN : HK_INF;
  else if (!IEEE && e == (1u << EB) - 1 && m == (1u << MB) - 1) v = HK_NAN;
  else if (e == 0) v = (float)m * u2f((unsigned)(127 + 1 - BIAS - MB) << 23);   // subnormal: m * 2^(1-bias-M)
  else v = u2f(((e - BIAS + 127) << 23) | (m << (23 - MB)));
  return (b & 0x80) ? -v : v;
}

// RNE, saturating to the finite max (the interface's clamp-then-round); NaN -> sign | 0x7F as torch.
template<int EB, int MB, int BIAS>
HK_DEV unsigned char fp8_encode(float x, float maxv) {
  const unsigned u = f2u(x), s = (u >> 24) & 0x80;
  if (x != x) return (unsigned char)(s | 0x7F);
  float a = u2f(u & 0x7FFFFFFF);
  a = a > maxv ? maxv : a;
  if (a < u2f((unsigned)(127 + 1 - BIAS) << 23)) {          // below the smallest normal: a multiple of 2^(1-bias-M)
    const float q = __builtin_rintf(a * u2f((unsigned)(127 + BIAS - 1 + MB) << 23));
    return (unsigned char)(s | (unsigned)q);                  // q == 2^M encodes the smallest normal
  }
  unsigned ua = f2u(a);
  ua += ((1u << (22 - MB)) - 1) + ((ua >> (23 - MB)) & 1);   // round to nearest even on the kept bits
  ua >>= (23 - MB);
  return (unsigned char)(s | (ua - ((127u - BIAS) << MB)));
}
}  // namespace detail

HK_DEV float to_float(float x) { return x; }
HK_DEV float to_float(int x) { return (float)x; }
HK_DEV float to_float(bf16 x) { return detail::u2f((unsigned)x.bits << 16); }
HK_DEV float to_float(f16 x) { return (float)__builtin_bit_cast(_Float16, x.bits); }
HK_DEV float to_float(fp8e4m3 x) { return detail::fp8_decode<4, 3, 7, false>(x.bits); }
HK_DEV float to_float(fp8e5m2 x) { return detail::fp8_decode<5, 2, 15, true>(x.bits); }

// float -> int32: truncate toward zero, saturate, NaN -> 0
HK_DEV int f32_to_i32(float x) {
  if (x != x) return 0;
  if (x >= 2147483648.0f) return 2147483647;
  if (x <= -2147483648.0f) return (int)(-2147483647 - 1);
  return (int)x;
}

template<class T> struct from_float_t;
template<> struct from_float_t<float> { HK_DEV static float f(float x) { return x; } };
template<> struct from_float_t<int> { HK_DEV static int f(float x) { return f32_to_i32(x); } };
template<> struct from_float_t<bf16> {
  HK_DEV static bf16 f(float x) {
#if HK_GFX950
    return bf16{__builtin_bit_cast(unsigned short, (__bf16)x)};      // v_cvt_pk_bf16_f32: RNE
#else
    unsigned u = detail::f2u(x);
    if ((u & 0x7FFFFFFF) > 0x7F800000) return bf16{(unsigned short)((u >> 16) | 0x40)};   // quiet NaN
    u += 0x7FFF + ((u >> 16) & 1);                                                        // RNE
    return bf16{(unsigned short)(u >> 16)};
#endif
  }
};
template<> struct from_float_t<f16> {
  HK_DEV static f16 f(float x) { return f16{__builtin_bit_cast(unsigned short, (_Float16)x)}; }   // RNE
};
template<> struct from_float_t<fp8e4m3> {
  HK_DEV static fp8e4m3 f(float x) { return fp8e4m3{detail::fp8_encode<4, 3, 7>(x, 448.0f)}; }
};
template<> struct from_float_t<fp8e5m2> {
  HK_DEV static fp8e5m2 f(float x) { return fp8e5m2{detail::fp8_encode<5, 2, 15>(x, 57344.0f)}; }
};
template<class T> HK_DEV T from_float(float x) { return from_float_t<T>::f(x); }

// The interface's cast: floats through f32 (exact for every narrower format) and RNE once;
// int -> float through f32 as torch does; float -> int truncating and saturating.
template<class To, class From> struct convert_t {
  HK_DEV static To f(From x) { return from_float<To>(to_float(x)); }
};
template<class T> struct convert_t<T, T> { HK_DEV static T f(T x) { return x; } };
template<> struct convert_t<bool, bool> { HK_DEV static bool f(bool x) { return x; } };
template<class To, class From> HK_DEV To convert(From x) { return convert_t<To, From>::f(x); }

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

// ========================================================================================= scalars
template<int AXIS> HK_DEV int num_blocks() {
  if (AXIS == 0) return (int)(__builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x());
  if (AXIS == 1) return (int)(__builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y());
  return (int)(__builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z());
}

namespace detail {
// Blocks are dispatched round-robin over the 8 XCDs (xcd = id % 8), each with its own L2. Renumber so
// that consecutive logical blocks run on one XCD: a bijection of [0, n) (XCD x takes a contiguous range).
HK_DEV unsigned xcd_remap(unsigned id, unsigned n) {
  const unsigned per = n / 8, extra = n % 8, xcd = id % 8;
  return xcd * per + (xcd < extra ? xcd : extra) + id / 8;
}
// Grouped ordering over (x, y): runs of GROUP x-rows sweep y, so neighbours share operand tiles in L2.
constexpr unsigned GROUP = 8;
HK_DEV void grouped(unsigned l, unsigned gx, unsigned gy, unsigned& x, unsigned& y) {
  const unsigned in_group = GROUP * gy, first = (l / in_group) * GROUP;
  const unsigned size = (gx - first) < GROUP ? (gx - first) : GROUP;
  const unsigned r = l % in_group;
  x = first + r % size;
  y = r / size;
}
template<int AXIS> HK_DEV int block_idx_remapped() {
  const unsigned gx = (unsigned)num_blocks<0>(), gy = (unsigned)num_blocks<1>(), gz = (unsigned)num_blocks<2>();
  const unsigned hw = __builtin_amdgcn_workgroup_id_x() + gx * (__builtin_amdgcn_workgroup_id_y() +
                                                               gy * __builtin_amdgcn_workgroup_id_z());
  const unsigned l = xcd_remap(hw, gx * gy * gz);
  const unsigned z = l / (gx * gy);
  unsigned x, y;
  grouped(l - z * gx * gy, gx, gy, x, y);
  return (int)(AXIS == 0 ? x : AXIS == 1 ? y : z);
}
}  // namespace detail

template<int AXIS> HK_DEV int block_idx() {
#if HK_BLOCK_REMAP
  return detail::block_idx_remapped<AXIS>();
#else
  if (AXIS == 0) return (int)__builtin_amdgcn_workgroup_id_x();
  if (AXIS == 1) return (int)__builtin_amdgcn_workgroup_id_y();
  return (int)__builtin_amdgcn_workgroup_id_z();
#endif
}

HK_DEV int iadd(int a, int b) { return (int)((unsigned)a + (unsigned)b); }
HK_DEV int isub(int a, int b) { return (int)((unsigned)a - (unsigned)b); }
HK_DEV int imul(int a, int b) { return (int)((unsigned)a * (unsigned)b); }
// Python floor division / modulo (int32 wrap of the exact result; x / 0 gives 0, the reference raises)
HK_DEV int floordiv(int a, int b) {
  if (b == 0) return 0;
  long long q = (long long)a / b;
  if ((long long)q * b != a && ((a < 0) != (b < 0))) --q;
  return (int)(unsigned)(unsigned long long)q;
}
HK_DEV int floormod(int a, int b) {
  if (b == 0) return 0;
  int r = (int)((long long)a % b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
HK_DEV float fdiv(float a, float b) { return a / b; }
// scalar min/max follow torch.minimum/maximum (the reference's scalar ops): NaN propagates
HK_DEV float fminf_(float a, float b) { return a != a ? a : b != b ? b : (b < a ? b : a); }
HK_DEV float fmaxf_(float a, float b) { return a != a ? a : b != b ? b : (a < b ? b : a); }

// ======================================================================================= math (f32)
namespace detail {
HK_DEV float exp2_(float x) { return __builtin_amdgcn_exp2f(x); }     // v_exp_f32
HK_DEV float log2_(float x) {                                          // v_log_f32 (flushes subnormal inputs)
  const bool sub = x < 1.17549435e-38f;
  const float r = __builtin_amdgcn_logf(sub ? x * 4294967296.0f : x);
  return sub ? r - 32.0f : r;
}
// e^x = 2^n * e^r with n = rint(x log2 e) and r = x - n ln2 reduced with fma: |r| <= ln2/2, so v_exp_f32
// of r*log2(e) keeps its ~1 ulp accuracy (the naive exp2(x*log2e) loses |x| * 2^-24 in the exponent).
HK_DEV float exp_(float x) {
  if (x != x) return x;
  x = x > 89.0f ? 89.0f : (x < -104.0f ? -104.0f : x);
  const float n = __builtin_rintf(x * 1.44269504f);
  float r = __builtin_fmaf(n, -0.693359375f, x);
  r = __builtin_fmaf(n, 2.12194440e-4f, r);
  return __builtin_ldexpf(exp2_(r * 1.44269504f), (int)n);
}
HK_DEV float log_(float x) {
  const float l = log2_(x);
  return __builtin_fmaf(l, 0.693145751953125f, l * 1.42860677e-06f);   // ln2 split hi + lo
}
// tanh: odd Taylor series near 0 (no cancellation), 1 - 2/(e^{2|x|}+1) elsewhere
HK_DEV float tanh_(float x) {
  const float a = __builtin_fabsf(x);
  if (a < 0.4f) {
    const float z = x * x;
    float p = 6404582.0f / 10854718875.0f;
    p = p * z - 929569.0f / 638512875.0f;
    p = p * z + 21844.0f / 6081075.0f;
    p = p * z - 1382.0f / 155925.0f;
    p = p * z + 62.0f / 2835.0f;
    p = p * z - 17.0f / 315.0f;
    p = p * z + 2.0f / 15.0f;
    p = p * z - 1.0f / 3.0f;
    return x + x * (p * z);
  }
  if (x != x) return x;
  const float t = 1.0f - 2.0f / (exp_(2.0f * a) + 1.0f);
  return x < 0 ? -t : t;
}
HK_DEV float sigmoid_(float x) { return 1.0f / (1.0f + exp_(-x)); }
}  // namespace detail

// ================================================================================ elementwise ops
#define HK_UNARY_F(NAME, EXPR) \
  struct NAME { HK_DEV static float apply(float x) { return EXPR; } };
HK_UNARY_F(op_exp, detail::exp_(x))
HK_UNARY_F(op_exp2, detail::exp2_(x))
HK_UNARY_F(op_log, detail::log_(x))
HK_UNARY_F(op_log2, detail::log2_(x))
HK_UNARY_F(op_sqrt, __builtin_sqrtf(x))
HK_UNARY_F(op_rsqrt, 1.0f / __builtin_sqrtf(x))
HK_UNARY_F(op_tanh, detail::tanh_(x))
HK_UNARY_F(op_sigmoid, detail::sigmoid_(x))
#undef HK_UNARY_F
struct op_neg {
  HK_DEV static float apply(float x) { return -x; }
  HK_DEV static int apply(int x) { return (int)(0u - (unsigned)x); }
};
struct op_abs {
  HK_DEV static float apply(float x) { return __builtin_fabsf(x); }
  HK_DEV static int apply(int x) { return x < 0 ? (int)(0u - (unsigned)x) : x; }
};
struct op_relu {
  HK_DEV static float apply(float x) { return x > 0.0f ? x : (x != x ? x : 0.0f); }
  HK_DEV static int apply(int x) { return x > 0 ? x : 0; }
};
struct op_not { HK_DEV static bool apply(bool x) { return !x; } };

#define HK_BINARY(NAME, FEXPR, IEXPR) struct NAME { \
  HK_DEV static float apply(float a, float b) { return FEXPR; } \
  HK_DEV static int apply(int a, int b) { return IEXPR; } };
HK_BINARY(op_add, a + b, (int)((unsigned)a + (unsigned)b))
HK_BINARY(op_sub, a - b, (int)((unsigned)a - (unsigned)b))
HK_BINARY(op_mul, a * b, (int)((unsigned)a * (unsigned)b))
HK_BINARY(op_div, a / b, b == 0 ? 0 : a / b)
HK_BINARY(op_maximum, __builtin_fmaxf(a, b), a > b ? a : b)      // NaN-ignoring (maxNum)
HK_BINARY(op_minimum, __builtin_fminf(a, b), a < b ? a : b)
#undef HK_BINARY
#define HK_CMP(NAME, OP) struct NAME { \
  HK_DEV static bool apply(float a, float b) { return a OP b; } \
  HK_DEV static bool apply(int a, int b) { return a OP b; } };
HK_CMP(op_lt, <) HK_CMP(op_le, <=) HK_CMP(op_gt, >) HK_CMP(op_ge, >=) HK_CMP(op_eq, ==) HK_CMP(op_ne, !=)
#undef HK_CMP
struct op_and { HK_DEV static bool apply(bool a, bool b) { return a && b; } };
struct op_or { HK_DEV static bool apply(bool a, bool b) { return a || b; } };

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
template<class T, int N, class AX> struct rv;
template<class T, int N> struct rv<T, N, ROW> {        // one value per row of an rt<_, N, _>
  using dtype = T;
  static constexpr int n = N, RB = (N + 15) / 16, RBW = (RB + NW - 1) / NW, NE = RBW * 4;
  typename storage<T>::type data[NE];
};
template<class T, int N> struct rv<T, N, COL> {        // one value per column of an rt<_, _, N>
  using dtype = T;
  static constexpr int n = N, CB = (N + 15) / 16, NE = CB;
  typename storage<T>::type data[NE];
};

namespace detail {
template<int RB> HK_DEV int blk(int slot) { return (wave() + slot * NW) % RB; }
template<int RB> HK_DEV bool owner(int slot) { return wave() + slot * NW < RB; }
HK_DEV int row_in_blk(int k, int ln) { return 4 * (ln >> 4) + k; }
HK_DEV int col_in_blk(int ln) { return ln & 15; }
HK_DEV int row_in_blk(int k) { return row_in_blk(k, lane()); }
HK_DEV int col_in_blk() { return col_in_blk(lane()); }
// The lane id through an identity DPP move: DPP is convergent, so LLVM never hoists it (or the lane
// masks computed from it) out of loops. Used on rarely taken paths (partial tiles), whose per-element
// compares would otherwise be hoisted out of pipeline loops and pin dozens of scalar registers.
HK_DEV int opaque_lane() { return __builtin_amdgcn_update_dpp(0, lane(), 0xE4, 0xF, 0xF, false); }
}  // namespace detail

// Shared tiles: a view of R*C elements in LDS, row-major with XOR-swizzled 16-byte chunks.
template<class T, int R, int C> struct st {
  using dtype = T;
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
template<class T, int R, int C, int S> struct sbuf {
  unsigned char* p;
  HK_DEV explicit sbuf(unsigned char* q) : p(q) {}
  HK_DEV st<T, R, C> stage(int s) const { return st<T, R, C>{p + s * (R * C * (int)sizeof(T))}; }
};

// LDS the library needs for exchanges between waves (column reductions, register operands of mma);
// the code generator sizes HK_SCRATCH_BYTES per kernel and each use static_asserts it fits.
namespace detail {
HK_DEV unsigned char* scratch() {
  __shared__ __attribute__((aligned(16))) unsigned char hk_scratch[HK_SCRATCH_BYTES];
  return hk_scratch;
}
}  // namespace detail

// ========================================================================================= control
HK_DEV void sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// loads into LDS complete when this thread's memory counters drain (direct-to-LDS loads are async)
HK_DEV void async_wait_all() { __builtin_amdgcn_s_waitcnt(0); }

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
template<class D, class M> HK_DEV void where(D& dst, const M& mask, const D& a, const D& b) {
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = mask.data[e] ? a.data[e] : b.data[e];
}
template<class D, class X> HK_DEV void cast(D& dst, const X& x) {
#pragma unroll
  for (int e = 0; e < D::NE; ++e) dst.data[e] = convert<typename D::dtype>(x.data[e]);
}

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
}  // namespace detail

// ROW: over the columns of each row; COL: over the rows of each column.
template<class F, class AX, class T, int N, class X> HK_DEV void reduce(rv<T, N, AX>& dst, const X& x) {
  using A = typename calc_t<typename X::dtype>::type;
  using Rd = detail::red<F, A>;
  constexpr int R = X::rows, C = X::cols, RB = X::RB, CB = X::CB, RBW = X::RBW;
  if constexpr (same_t<AX, ROW>::value) {
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

// =========================================================================== global memory: indexing
template<class T, int RANK> struct gl {
  T* ptr;
  int shape[RANK];
  long long stride[RANK];
};

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
HK_DEV int clampi(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }

template<class T> HK_DEV T gload(const T* p) { return *p; }
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

// ============================================================================ global <-> registers
// Pad elements of a tile (rows >= R, cols >= C) read like elements outside the tensor.
template<class T, int R, int C, class U, int RANK, class... I>
HK_DEV void load(rt<T, R, C>& dst, const gl<U, RANK>& g0, float fill, I... idx) {
  using D = rt<T, R, C>;
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  const T f = convert<T>(fill);
  detail::by_mode(sp, [&](auto mode, int ln) {
#pragma unroll
    for (int s = 0; s < D::RBW; ++s)
#pragma unroll
      for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int r = 16 * detail::blk<D::RB>(s) + detail::row_in_blk(k, ln), c = 16 * cb + detail::col_in_blk(ln);
          const bool pad = (R % 16 != 0 && r >= R) || (C % 16 != 0 && c >= C);
          const T v = detail::read_mode(mode, g.ptr, sp, pad ? 0 : r, pad ? 0 : c, f);
          dst.data[(s * D::CB + cb) * 4 + k] = pad ? f : v;
        }
  });
}

template<class T, int N, class U, int RANK, class... I>
HK_DEV void load(rv<T, N, ROW>& dst, const gl<U, RANK>& g0, float fill, I... idx) {
  using D = rv<T, N, ROW>;
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate1(g, ix, N);
  const T f = convert<T>(fill);
  detail::by_mode(sp, [&](auto mode, int ln) {
#pragma unroll
    for (int s = 0; s < D::RBW; ++s)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int n = 16 * detail::blk<D::RB>(s) + detail::row_in_blk(k, ln);
        const bool pad = N % 16 != 0 && n >= N;
        const T v = detail::read_mode(mode, g.ptr, sp, 0, pad ? 0 : n, f);
        dst.data[s * 4 + k] = pad ? f : v;
      }
  });
}

template<class T, int N, class U, int RANK, class... I>
HK_DEV void load(rv<T, N, COL>& dst, const gl<U, RANK>& g0, float fill, I... idx) {
  using D = rv<T, N, COL>;
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate1(g, ix, N);
  const T f = convert<T>(fill);
  detail::by_mode(sp, [&](auto mode, int ln) {
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb) {
      const int n = 16 * cb + detail::col_in_blk(ln);
      const bool pad = N % 16 != 0 && n >= N;
      const T v = detail::read_mode(mode, g.ptr, sp, 0, pad ? 0 : n, f);
      dst.data[cb] = pad ? f : v;
    }
  });
}

namespace detail {
// One writer per element: owner slots of rt rows; one lane per row value of ROW vectors; wave 0's
// first 16 lanes for COL vectors. fn(r, c, value) with r, c inside the tile's R x C.
template<class T, int R, int C, class Fn> HK_DEV void each_owned(const rt<T, R, C>& x, Fn fn, int ln = lane()) {
  using D = rt<T, R, C>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) {
    if (!owner<D::RB>(s)) continue;
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int r = 16 * blk<D::RB>(s) + row_in_blk(k, ln), c = 16 * cb + col_in_blk(ln);
        if ((R % 16 == 0 || r < R) && (C % 16 == 0 || c < C)) fn(r, c, x.data[(s * D::CB + cb) * 4 + k]);
      }
  }
}
template<class T, int N, class Fn> HK_DEV void each_owned(const rv<T, N, ROW>& x, Fn fn, int ln = lane()) {
  using D = rv<T, N, ROW>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) {
    if (!owner<D::RB>(s)) continue;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int n = 16 * blk<D::RB>(s) + row_in_blk(k, ln);
      if (col_in_blk(ln) == k && (N % 16 == 0 || n < N)) fn(0, n, x.data[s * 4 + k]);
    }
  }
}
template<class T, int N, class Fn> HK_DEV void each_owned(const rv<T, N, COL>& x, Fn fn, int ln = lane()) {
  using D = rv<T, N, COL>;
  if (wave() != 0) return;
#pragma unroll
  for (int cb = 0; cb < D::CB; ++cb) {
    const int n = 16 * cb + col_in_blk(ln);
    if (ln < 16 && (N % 16 == 0 || n < N)) fn(0, n, x.data[cb]);
  }
}
template<class T, int R, int C, class U, int RANK>
HK_DEV span locate(const rt<T, R, C>&, const gl<U, RANK>& g, const int* ix) { return locate2(g, ix, R, C); }
template<class T, int N, class AX, class U, int RANK>
HK_DEV span locate(const rv<T, N, AX>&, const gl<U, RANK>& g, const int* ix) { return locate1(g, ix, N); }

HK_DEV void gatomic_add(float* p, float v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

// writes fn's elements that fall inside the tensor; no predicate per element when the tile is whole
template<class X, class U, class W> HK_DEV void write_owned(const X& x, const span& sp, W write) {
  if (sp.empty) return;
  if (sp.full) each_owned(x, [&](int r, int c, typename X::dtype v) { write(at(sp, r, c), v); });
  else each_owned(x, [&](int r, int c, typename X::dtype v) { if (inside(sp, r, c)) write(at(sp, r, c), v); },
                  opaque_lane());
}
}  // namespace detail

// registers -> global, converting to the tensor dtype; elements outside the tensor are dropped
template<class U, int RANK, class X, class... I> HK_DEV void store(const gl<U, RANK>& g0, const X& x, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate(x, g, ix);
  detail::write_owned<X, U>(x, sp, [&](long long off, typename X::dtype v) {
    detail::gstore(g.ptr + off, convert<U>(v));
  });
}

// each element added once per block (replicas and duplicate lanes never add)
template<int RANK, class X, class... I> HK_DEV void atomic_add(const gl<float, RANK>& g0, const X& x, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate(x, g, ix);
  detail::write_owned<X, float>(x, sp, [&](long long off, float v) { detail::gatomic_add(g.ptr + off, v); });
}

// ================================================================================== global <-> LDS
namespace detail {
template<class T> struct chunk16 { T e[16 / sizeof(T)]; };

// Threads take 16-byte chunks of the tile in turn (consecutive threads, consecutive chunks of a row:
// coalesced). fn(r, c) for the chunk at row r, columns c .. c+E-1.
template<class T, int R, int C, class Fn> HK_DEV void each_chunk(Fn fn, int ln = lane()) {
  constexpr int E = 16 / (int)sizeof(T), CPR = C / E, NCH = R * CPR, IT = (NCH + NT - 1) / NT;
  const int t = wave() * 64 + ln;     // before the loop: lanes may leave it early
#pragma unroll
  for (int it = 0; it < IT; ++it) {
    const int ch = t + it * NT;
    if (NCH % NT != 0 && ch >= NCH) break;
    fn(ch / CPR, (ch % CPR) * E);
  }
}
template<class T, int R, int C, class Fn> HK_DEV void each_elem(Fn fn, int ln = lane()) {
  constexpr int IT = (R * C + NT - 1) / NT;
  const int t = wave() * 64 + ln;     // before the loop: lanes may leave it early
#pragma unroll
  for (int it = 0; it < IT; ++it) {
    const int e = t + it * NT;
    if ((R * C) % NT != 0 && e >= R * C) break;
    fn(e / C, e % C);
  }
}
template<class T, int R, int C> constexpr bool chunked() {
  return C % (16 / (int)sizeof(T)) == 0 && st<T, R, C>::ROWB % 16 == 0;
}
// whole tile inside, rows contiguous and every chunk 16-byte aligned: one 16-byte access per chunk
template<class T> HK_DEV bool vec_ok(const T* ptr, const span& sp) {
  return sp.full && sp.sc == 1 && ((unsigned long long)(ptr + sp.base) & 15) == 0 &&
         ((unsigned long long)sp.sr * sizeof(T)) % 16 == 0;
}
}  // namespace detail

#if HK_GFX950
namespace detail {
// gfx950 direct-to-LDS: global_load_lds_dwordx4 writes lane l's 16 bytes at lds + 16*l, so a wave fills
// 1 KiB of the tile's physical layout; each lane fetches the logical chunk that the swizzle puts at its
// physical slot (the XOR swizzle is its own inverse). Asynchronous: complete at s_waitcnt vmcnt(0)
// (async_wait_all). Only for whole, contiguous, aligned tiles of whole KiBs (no lane may sit out).
template<class T, int R, int C> HK_DEV void load_direct(st<T, R, C> dst, const T* ptr, const span& sp) {
  using S = st<T, R, C>;
  constexpr int E = 16 / (int)sizeof(T), NCH = S::ROWB / 16, WAVE_CHUNKS = S::BYTES / 1024;
  const int w = wave(), l = lane();
  for (int wc = w; wc < WAVE_CHUNKS; wc += NW) {     // wave-uniform trip count
    const int p = wc * 64 + l, r = p / NCH;
    int chunk = p % NCH;
    if constexpr (S::SWZ) chunk = (chunk ^ (r / S::RP)) & (NCH - 1);
    const T* src = ptr + at(sp, r, chunk * E);
    __builtin_amdgcn_global_load_lds((__attribute__((address_space(1))) void*)src,
                                     (__attribute__((address_space(3))) void*)(dst.p + wc * 1024), 16, 0, 0);
  }
}
}  // namespace detail
#endif

// GL -> ST: a raw copy (same dtype); complete and visible after async_wait_all() + sync() (the
// emitter adds them; hk::pipeline owns its own)
template<class T, int R, int C, int RANK, class... I>
HK_DEV void load(st<T, R, C> dst, const gl<T, RANK>& g0, float fill, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  const T f = convert<T>(fill);
  if constexpr (detail::chunked<T, R, C>()) {
    constexpr int E = 16 / (int)sizeof(T);
    if (detail::vec_ok(g.ptr, sp)) {
#if HK_GFX950
      if constexpr (st<T, R, C>::BYTES % 1024 == 0) {
        detail::load_direct(dst, g.ptr, sp);
        return;
      }
#endif
      detail::each_chunk<T, R, C>([&](int r, int c) {
        const u32x4 v = detail::gload((const u32x4*)(g.ptr + detail::at(sp, r, c)));
        unsigned char* to = dst.p + st<T, R, C>::offset(r, c);
        HK_LDS_STORE(u32x4, to, v);
      });
      return;
    }
    detail::by_mode(sp, [&](auto mode, int ln) {
      detail::each_chunk<T, R, C>([&](int r, int c) {
        detail::chunk16<T> t;
#pragma unroll
        for (int e = 0; e < E; ++e) t.e[e] = detail::read_mode(mode, g.ptr, sp, r, c + e, f);
        unsigned char* to = dst.p + st<T, R, C>::offset(r, c);
        HK_LDS_STORE(u32x4, to, __builtin_bit_cast(u32x4, t));
      }, ln);
    });
  } else {
    detail::by_mode(sp, [&](auto mode, int ln) {
      detail::each_elem<T, R, C>([&](int r, int c) { dst.set(r, c, detail::read_mode(mode, g.ptr, sp, r, c, f)); },
                                 ln);
    });
  }
}

// ST -> GL, converting to the tensor dtype
template<class U, int RANK, class T, int R, int C, class... I>
HK_DEV void store(const gl<U, RANK>& g0, const st<T, R, C>& s, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  if (sp.empty) return;
  if constexpr (detail::chunked<T, R, C>() && same_t<T, U>::value) {
    if (detail::vec_ok(g.ptr, sp)) {
      detail::each_chunk<T, R, C>([&](int r, int c) {
        const unsigned char* from = s.p + st<T, R, C>::offset(r, c);
        const u32x4 v = HK_LDS_LOAD(u32x4, from);
        detail::gstore((u32x4*)(g.ptr + detail::at(sp, r, c)), v);
      });
      return;
    }
  }
  if (sp.full) {
    detail::each_elem<T, R, C>([&](int r, int c) { detail::gstore(g.ptr + detail::at(sp, r, c), convert<U>(s.get(r, c))); });
  } else {
    detail::each_elem<T, R, C>([&](int r, int c) {
      if (detail::inside(sp, r, c)) detail::gstore(g.ptr + detail::at(sp, r, c), convert<U>(s.get(r, c)));
    }, detail::opaque_lane());
  }
}

// ================================================================================ LDS <-> registers
template<class T, int R, int C> HK_DEV void load(rt<T, R, C>& dst, const st<T, R, C>& s) {
  using D = rt<T, R, C>;
#pragma unroll
  for (int sl = 0; sl < D::RBW; ++sl)
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int r = 16 * detail::blk<D::RB>(sl) + detail::row_in_blk(k), c = 16 * cb + detail::col_in_blk();
        const bool in = (R % 16 == 0 || r < R) && (C % 16 == 0 || c < C);
        dst.data[(sl * D::CB + cb) * 4 + k] = in ? s.get(r, c) : T{};
      }
}
template<class T, int R, int C> HK_DEV void store(st<T, R, C> dst, const rt<T, R, C>& x) {
  detail::each_owned(x, [&](int r, int c, T v) {
    if ((R % 16 == 0 || r < R) && (C % 16 == 0 || c < C)) dst.set(r, c, v);
  });
}

// ============================================================================================ masks
namespace detail {
template<int R, int C, class Fn> HK_DEV void each_pos(rt<bool, R, C>& dst, Fn fn) {
  using D = rt<bool, R, C>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s)
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        dst.data[(s * D::CB + cb) * 4 + k] = put(fn(16 * blk<D::RB>(s) + row_in_blk(k), 16 * cb + col_in_blk()));
}

// Philox4x32-10 (interface/numerics.py): returns word 0
HK_DEV unsigned philox_x0(unsigned c0, unsigned c1, unsigned k0, unsigned k1) {
  unsigned c2 = 0, c3 = 0;
  // a real loop: unrolled, the key schedule seed + r*W becomes 20 loop invariants in scalar registers
#pragma unroll 1
  for (int r = 0; r < 10; ++r) {
    if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    const unsigned long long p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;
    const unsigned hi0 = (unsigned)(p0 >> 32), lo0 = (unsigned)p0, hi1 = (unsigned)(p1 >> 32), lo1 = (unsigned)p1;
    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
  }
  return c0;
}
}  // namespace detail

template<int R, int C> HK_DEV void causal_mask(rt<bool, R, C>& dst, int ro, int co) {
  ro = detail::uni(ro);
  co = detail::uni(co);
  detail::each_pos(dst, [&](int r, int c) { return (long long)ro + r >= (long long)co + c; });
}
template<int R, int C> HK_DEV void bounds_mask(rt<bool, R, C>& dst, int ro, int co, int nr, int nc) {
  ro = detail::uni(ro);
  co = detail::uni(co);
  nr = detail::uni(nr);
  nc = detail::uni(nc);
  detail::each_pos(dst, [&](int r, int c) {
    const long long rr = (long long)ro + r, cc = (long long)co + c;
    return rr >= 0 && rr < nr && cc >= 0 && cc < nc;
  });
}
// keep iff (philox(g)[0] >> 8) >= floor(p * 2^24), g = offset + (ro + r) * stride + (co + c) mod 2^64
template<int R, int C>
HK_DEV void dropout_mask(rt<bool, R, C>& dst, float p, int seed_lo, int seed_hi, int off_lo, int off_hi, int ro,
                         int co, int stride) {
  // scalars through uni(): the hoisted Philox key schedule alone would take 20 scalar registers
  seed_lo = detail::uni(seed_lo);
  seed_hi = detail::uni(seed_hi);
  ro = detail::uni(ro);
  co = detail::uni(co);
  stride = detail::uni(stride);
  off_lo = detail::uni(off_lo);
  off_hi = detail::uni(off_hi);
  const float thr = p > 0.0f ? __builtin_floorf(p * 16777216.0f) : 0.0f;
  const unsigned long long off = (unsigned long long)(unsigned)off_lo | ((unsigned long long)(unsigned)off_hi << 32);
  detail::each_pos(dst, [&](int r, int c) {
    const unsigned long long g = off + (unsigned long long)(((long long)ro + r) * (long long)stride) +
                                 (unsigned long long)((long long)co + c);
    const unsigned x = detail::philox_x0((unsigned)g, (unsigned)(g >> 32), (unsigned)seed_lo, (unsigned)seed_hi);
    return (float)(x >> 8) >= thr;
  });
}

// ============================================================================================== mma
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

// An operand fragment of a 16 x KS step: lane l holds element (m0 + l%16, kbase + KV*(l/16) + s),
// s < KV, of a matrix viewed as [m][k] -- A as op(a), B as op(b) transposed. KC: the shared tile
// stores [m][k] (k contiguous: one vector read) rather than [k][m] (KV scalar reads).
// Elements outside the tile read 0, so ragged K never mixes in stale LDS.
template<bool KC, int KV, class T, int SR, int SC> struct st_src {
  st<T, SR, SC> s;
  static constexpr int MM = KC ? SR : SC, KK = KC ? SC : SR;
  HK_DEV frag<KV> get(int m0, int kbase) const {
    const int m = m0 + col_in_blk(), k0 = kbase + KV * (lane() >> 4);
    frag<KV> f;
    if constexpr (KC && st<T, SR, SC>::ROWB % (2 * KV) == 0) {
      if ((MM % 16 == 0 && KK % (4 * KV) == 0) || (m < MM && k0 + KV <= KK)) {
        using V = typename frag_vec<KV>::type;
        const unsigned char* at = s.p + st<T, SR, SC>::offset(m, k0);
        return __builtin_bit_cast(frag<KV>, HK_LDS_LOAD(V, at));
      }
    }
#pragma unroll
    for (int e = 0; e < KV; ++e) {
      const int k = k0 + e;
      const bool in = (MM % 16 == 0 || m < MM) && (KK % (4 * KV) == 0 || k < KK);
      f.v[e] = in ? bits16(KC ? s.get(m, k) : s.get(k, m)) : (unsigned short)0;
    }
    return f;
  }
};

// A (not transposed) straight from registers: the rt's rows are the output's rows, so each lane
// gathers its fragment from the col layout with ds_bpermute (pairs of 16-bit values per word).
template<int KV, class T, int M, int K> struct rt_a_src {
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

template<class T, int KV, int M, int N, class ASrc, class BSrc>
HK_DEV void mma_core(rt<float, M, N>& d, const ASrc& a, const BSrc& b, int K) {
  using D = rt<float, M, N>;
  constexpr int KS = 4 * KV;
  for (int kbase = 0; kbase < K; kbase += KS) {
    frag<KV> bf[D::CB];
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb) bf[cb] = b.get(16 * cb, kbase);
#pragma unroll
    for (int s = 0; s < D::RBW; ++s) {
      const frag<KV> af = a.get_slot(s, kbase);
#pragma unroll
      for (int cb = 0; cb < D::CB; ++cb) {
        float* acc = &d.data[(s * D::CB + cb) * 4];
        f32x4 c = {acc[0], acc[1], acc[2], acc[3]};
        c = mfma_t<T, KV>::run(af, bf[cb], c);
        acc[0] = c[0]; acc[1] = c[1]; acc[2] = c[2]; acc[3] = c[3];
      }
    }
  }
}

// A from LDS: the fragment rows of slot s are its row block's
template<class Src, int RB> struct a_rows {
  Src src;
  HK_DEV auto get_slot(int s, int kbase) const { return src.get(16 * blk<RB>(s), kbase); }
};

template<class T, int K> constexpr int kv_for() { return (HK_GFX950 && K % 32 == 0) ? 8 : 4; }
}  // namespace detail

// dst = acc + op(a) @ op(b) in f32; a, b: st or rt of bf16/f16 (op = transpose when TA / TB)
template<bool TA, bool TB, class A, class B, int M, int N>
HK_DEV void mma(rt<float, M, N>& dst, const A& a, const B& b, const rt<float, M, N>& acc) {
  using T = typename A::dtype;
  static_assert(same_t<T, typename B::dtype>::value, "mma: a and b must have one dtype");
  static_assert(same_t<T, bf16>::value || same_t<T, f16>::value, "mma: operands are bf16 or f16");
  constexpr int K = TA ? A::rows : A::cols;
  constexpr int KV = detail::kv_for<T, K>();
  constexpr int RB = rt<float, M, N>::RB;
  constexpr bool A_RT = !same_t<A, st<T, A::rows, A::cols>>::value;
  constexpr bool B_RT = !same_t<B, st<T, B::rows, B::cols>>::value;
  constexpr bool A_STAGE = A_RT && TA, B_STAGE = B_RT;
  constexpr int A_BYTES = A_STAGE ? detail::align16(A::rows * A::cols * (int)sizeof(T)) : 0;
  dst = acc;
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
  const detail::st_src<TB, KV, T, B::rows, B::cols> bsrc{b_st};
  if constexpr (A_RT && !TA) {
    const detail::rt_a_src<KV, T, A::rows, A::cols> asrc{a};
    detail::mma_core<T, KV>(dst, asrc, bsrc, K);
  } else {
    const detail::a_rows<detail::st_src<!TA, KV, T, A::rows, A::cols>, RB> asrc{{a_st}};
    detail::mma_core<T, KV>(dst, asrc, bsrc, K);
  }
  if constexpr (A_STAGE || B_STAGE) sync();   // the scratch is free again
}

// ======================================================================================== pipelines
namespace sched {
struct double_buffer {};   // prefetch STAGES-1 tiles ahead, one barrier per step
struct pingpong {};        // 8 waves: two groups of 4 staggered by a barrier (HipKittens)
}  // namespace sched
#ifndef HK_PIPELINE_DEFAULT
#define HK_PIPELINE_DEFAULT double_buffer
#endif

namespace detail {
template<int S, class L, class Cm> HK_DEV void pipeline_db(int n, L& load, Cm& compute) {
  if constexpr (S == 1) {
    for (int i = 0; i < n; ++i) {
      sync();                                 // compute(i-1) is done with the only stage
      load(i, 0);
      async_wait_all();
      sync();
      compute(i, 0);
    }
  } else {
    constexpr int AHEAD = S - 1;
    for (int p = 0; p < AHEAD && p < n; ++p) load(p, p);
    for (int i = 0; i < n; ++i) {
      async_wait_all();
      sync();                                 // tile i visible; compute(i-1) done with stage (i-1)%S
      if (i + AHEAD < n) load(i + AHEAD, (i + AHEAD) % S);
      compute(i, i % S);
    }
  }
}

// Group 1 (waves 4-7) runs one barrier behind group 0, so between two barriers one group loads
// while the other computes at raised priority. Stage i+AHEAD is written while the other group may
// still read stage i-1, hence AHEAD = S-2 (S >= 3); see README.md for the barrier-by-barrier proof.
template<int S, class L, class Cm> HK_DEV void pipeline_pp(int n, L& load, Cm& compute) {
  static_assert(S >= 3, "ping-pong needs 3 or more stages");
  static_assert(NW == 8, "ping-pong runs 8 waves");
  constexpr int AHEAD = S - 2;
  const bool late = wave() >= 4;
  for (int p = 0; p < AHEAD && p < n; ++p) load(p, p);
  async_wait_all();
  sync();
  if (late) sync();
  for (int i = 0; i < n; ++i) {
    if (i + AHEAD < n) load(i + AHEAD, (i + AHEAD) % S);
    async_wait_all();
    sync();
    __builtin_amdgcn_s_setprio(1);
    compute(i, i % S);
    __builtin_amdgcn_s_setprio(0);
    sync();
  }
  if (!late) sync();
}
}  // namespace detail

template<int S, class SCHED = sched::HK_PIPELINE_DEFAULT, class L, class Cm>
HK_DEV void pipeline(int n, L&& load, Cm&& compute) {
  if constexpr (same_t<SCHED, sched::pingpong>::value) detail::pipeline_pp<S>(n, load, compute);
  else detail::pipeline_db<S>(n, load, compute);
}

}  // namespace hk
