// hk_cuda.cuh -- the cuda backend's device library: the API of hk_portable/codegen/DEVICE_API.md.
//
// Header-free (NVRTC, no #include): 16-bit and fp8 element types are storage structs with bit-exact
// conversions, everything else is CUDA builtins and inline PTX (sm_80 and newer).
//
// Layout (a function of the type only, so elementwise ops never convert):
//   rt<T,R,C>   R/16 row blocks of 16 rows are dealt to the warps round robin (warp w owns blocks
//               w, w+W, ...; "slots"). If R/16 < W, warps replicate blocks (warp w holds block w % (R/16))
//               and only the first R/16 warps ("primary") store. Inside a 16x8 block a lane holds the
//               mma.sync m16n8k16 accumulator fragment: rows g and g+8 (g = lane/4), columns 2t, 2t+1
//               (t = lane%4). Element e of (slot k, column block j): row +8*(e>>1), column +(e&1).
//               The same layout is the A-operand fragment of a bf16/f16 tile (two column blocks per k16).
//   rv<T,N,ROW> the rows a lane holds in rt<_,N,_>: two per slot (g, g+8).
//   rv<T,N,COL> the columns a lane holds in rt<_,_,N>: two per column block; replicated in all warps.
//   st<T,R,C>   row-major, 16-byte chunks XOR-swizzled inside each 128-byte line (row bytes <= 128:
//               line index; wider power-of-two rows: row index), so ldmatrix and cp.async are free
//               of bank conflicts and the swizzle never leaves the R*C*sizeof(T) footprint.
//
// Schedules: hk::pipeline<S> runs the sm_80 cp.async ring (pipeline_cp_async). A Hopper schedule
// (TMA producer warp + wgmma consumers, mbarriers) slots in as another specialisation of
// hk::detail::pipeline_schedule selected by HK_SCHEDULE, without changing the emitted code.

// HK_PTX: real device code (NVRTC/nvcc). HK_EMULATE: the same library on CPU threads, one per lane, with the
// PTX instructions replaced by lane-accurate emulations (hk_portable/backends/cuda/emulator.py; tests only).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define HK_PTX 1
#define HK_DEVICE_COMPILE 1
#elif defined(HK_EMULATE)
#define HK_DEVICE_COMPILE 1
#endif
#ifdef HK_DEVICE_COMPILE
#define HK_HD __host__ __device__ __forceinline__
#define HK_DEV __device__ __forceinline__
#else
#define HK_HD inline
#endif

#ifndef HK_NUM_WARPS
#define HK_NUM_WARPS 4
#endif
#ifndef HK_SCRATCH_OFFSET
#define HK_SCRATCH_OFFSET 0
#endif
#ifndef HK_SCRATCH_BYTES
#define HK_SCRATCH_BYTES 0
#endif

namespace hk {

typedef unsigned int u32;
typedef unsigned long long u64;

// ===================================================================================== element types
struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };
struct fp8e4m3 { unsigned char bits; };
struct fp8e5m2 { unsigned char bits; };

template <class A, class B> struct same { static constexpr bool value = false; };
template <class A> struct same<A, A> { static constexpr bool value = true; };

template <class T> struct is_float_type { static constexpr bool value = false; };
template <> struct is_float_type<float> { static constexpr bool value = true; };
template <> struct is_float_type<bf16> { static constexpr bool value = true; };
template <> struct is_float_type<f16> { static constexpr bool value = true; };
template <> struct is_float_type<fp8e4m3> { static constexpr bool value = true; };
template <> struct is_float_type<fp8e5m2> { static constexpr bool value = true; };

HK_HD u32 f2u(float x) {
#ifdef HK_PTX
    return __float_as_uint(x);
#else
    return __builtin_bit_cast(u32, x);
#endif
}
HK_HD float u2f(u32 x) {
#ifdef HK_PTX
    return __uint_as_float(x);
#else
    return __builtin_bit_cast(float, x);
#endif
}

// ------------------------------------------------------------------- conversions (bit-exact to torch)
// f32 -> bf16, round to nearest even; NaN -> 0x7FC0 (c10::BFloat16's rule).
HK_HD unsigned short bf16_bits_from_float(float f) {
    u32 u = f2u(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
HK_HD float float_from_bf16_bits(unsigned short b) { return u2f((u32)b << 16); }

// f32 -> f16 IEEE RNE (subnormals kept). NaN -> sign | 0x7E00 as c10::Half does.
HK_HD unsigned short f16_bits_from_float(float f) {
    u32 w = f2u(f);
#ifdef HK_PTX
    if ((w & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)(((w >> 16) & 0x8000u) | 0x7E00u);
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    // fp16_ieee_from_fp32_value (exact float arithmetic; valid without flush-to-zero)
    const float scale_to_inf = u2f(0x77800000u), scale_to_zero = u2f(0x08800000u);
    float ab = u2f(w & 0x7FFFFFFFu);
    float base = (ab * scale_to_inf) * scale_to_zero;
    u32 shl1_w = w + w, sign = w & 0x80000000u, bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = u2f((bias >> 1) + 0x07800000u) + base;
    u32 bits = f2u(base);
    u32 nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    return (unsigned short)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
#endif
}
HK_HD float float_from_f16_bits(unsigned short h) {
#ifdef HK_PTX
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    u32 sign = (u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F) return u2f(sign | 0x7F800000u | (m << 13));
    if (e == 0) return u2f(sign | f2u((float)m * u2f(0x33800000u)));   // m * 2^-24, exact
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
#endif
}

// f32 -> fp8 (OCP e4m3fn / e5m2): c10's algorithm (RNE, subnormals); the saturating forms clamp to
// the finite max first, which is the interface's conversion (NaN stays NaN).
HK_HD unsigned char e4m3_bits_raw(float f) {
    u32 fb = f2u(f);
    const u32 sign = fb & 0x80000000u;
    fb ^= sign;
    unsigned char r;
    if (fb >= (1087u << 20)) {
        r = fb > 0x7F800000u ? 0x7F : 0x7E;
    } else if (fb < (121u << 23)) {
        const u32 denorm_mask = 141u << 23;
        r = (unsigned char)(f2u(u2f(fb) + u2f(denorm_mask)) - denorm_mask);
    } else {
        u32 odd = (fb >> 20) & 1u;
        fb += ((u32)(7 - 127) << 23) + 0x7FFFFu;
        fb += odd;
        r = (unsigned char)(fb >> 20);
        if (r == 0x7F) r = 0x7E;
    }
    return (unsigned char)(r | (sign >> 24));
}
HK_HD unsigned char e5m2_bits_raw(float f) {
    u32 fb = f2u(f);
    const u32 sign = fb & 0x80000000u;
    fb ^= sign;
    unsigned char r;
    if (fb >= (143u << 23)) {
        r = fb > 0x7F800000u ? 0x7F : 0x7C;
    } else if (fb < (113u << 23)) {
        const u32 denorm_mask = 134u << 23;
        r = (unsigned char)(f2u(u2f(fb) + u2f(denorm_mask)) - denorm_mask);
    } else {
        u32 odd = (fb >> 21) & 1u;
        fb += ((u32)(15 - 127) << 23) + 0xFFFFFu;
        fb += odd;
        r = (unsigned char)(fb >> 21);
    }
    return (unsigned char)(r | (sign >> 24));
}
HK_HD float clampf_keep_nan(float x, float m) { return x > m ? m : (x < -m ? -m : x); }
HK_HD unsigned char e4m3_bits_sat(float f) { return e4m3_bits_raw(clampf_keep_nan(f, 448.0f)); }
HK_HD unsigned char e5m2_bits_sat(float f) { return e5m2_bits_raw(clampf_keep_nan(f, 57344.0f)); }

HK_HD float float_from_e4m3_bits(unsigned char b) {
    u32 sign = (u32)(b & 0x80u) << 24, e = (b >> 3) & 0xFu, m = b & 0x7u;
    if (e == 0xF && m == 0x7) return u2f(sign | 0x7FC00000u);
    if (e == 0) return u2f(sign | f2u((float)m * 0.001953125f));        // m * 2^-9, exact
    return u2f(sign | ((e + 120u) << 23) | (m << 20));
}
HK_HD float float_from_e5m2_bits(unsigned char b) { return float_from_f16_bits((unsigned short)((u32)b << 8)); }

// float -> int32: truncate toward zero, saturate, NaN -> 0 (cvt.rzi.s32.f32 does exactly this)
HK_HD int f32_to_i32(float x) {
#ifdef HK_PTX
    int r;
    asm("cvt.rzi.s32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
#else
    if (x != x) return 0;
    if (x >= 2147483648.0f) return 2147483647;
    if (x <= -2147483648.0f) return (int)0x80000000u;
    return (int)x;
#endif
}

// to_float / from_float: the element types' value in f32 and the interface's conversion back
HK_HD float to_float(float x) { return x; }
HK_HD float to_float(bf16 x) { return float_from_bf16_bits(x.bits); }
HK_HD float to_float(f16 x) { return float_from_f16_bits(x.bits); }
HK_HD float to_float(fp8e4m3 x) { return float_from_e4m3_bits(x.bits); }
HK_HD float to_float(fp8e5m2 x) { return float_from_e5m2_bits(x.bits); }
HK_HD float to_float(int x) { return (float)x; }          // round to nearest (torch's int -> float)

template <class T> struct from_float_t;
template <> struct from_float_t<float> { static HK_HD float f(float x) { return x; } };
template <> struct from_float_t<bf16> { static HK_HD bf16 f(float x) { bf16 r; r.bits = bf16_bits_from_float(x); return r; } };
template <> struct from_float_t<f16> { static HK_HD f16 f(float x) { f16 r; r.bits = f16_bits_from_float(x); return r; } };
template <> struct from_float_t<fp8e4m3> { static HK_HD fp8e4m3 f(float x) { fp8e4m3 r; r.bits = e4m3_bits_sat(x); return r; } };
template <> struct from_float_t<fp8e5m2> { static HK_HD fp8e5m2 f(float x) { fp8e5m2 r; r.bits = e5m2_bits_sat(x); return r; } };
template <> struct from_float_t<int> { static HK_HD int f(float x) { return f32_to_i32(x); } };
template <class T> HK_HD T from_float(float x) { return from_float_t<T>::f(x); }

// convert<To>(x): the interface's cast between any two element types (floats via f32)
template <class To, class From> struct convert_t {
    static HK_HD To f(From x) { return from_float<To>(to_float(x)); }
};
template <class T> struct convert_t<T, T> { static HK_HD T f(T x) { return x; } };
template <class To, class From> HK_HD To convert(From x) { return convert_t<To, From>::f(x); }

// raw bits of an element (for vector loads/stores) and back
HK_HD u32 to_bits(float x) { return f2u(x); }
HK_HD u32 to_bits(int x) { return (u32)x; }
HK_HD u32 to_bits(bf16 x) { return x.bits; }
HK_HD u32 to_bits(f16 x) { return x.bits; }
template <class T> struct from_bits_t;
template <> struct from_bits_t<float> { static HK_HD float f(u32 b) { return u2f(b); } };
template <> struct from_bits_t<int> { static HK_HD int f(u32 b) { return (int)b; } };
template <> struct from_bits_t<bf16> { static HK_HD bf16 f(u32 b) { bf16 r; r.bits = (unsigned short)b; return r; } };
template <> struct from_bits_t<f16> { static HK_HD f16 f(u32 b) { f16 r; r.bits = (unsigned short)b; return r; } };
template <class T> HK_HD T from_bits(u32 b) { return from_bits_t<T>::f(b); }

// ========================================================================================= scalars
HK_HD int iadd(int a, int b) { return (int)((u32)a + (u32)b); }
HK_HD int isub(int a, int b) { return (int)((u32)a - (u32)b); }
HK_HD int imul(int a, int b) { return (int)((u32)a * (u32)b); }
// Python floor semantics, computed in 64 bits then wrapped (INT_MIN // -1 wraps); b == 0 gives 0
HK_HD int floordiv(int a, int b) {
    if (b == 0) return 0;
    long long q = (long long)a / b, r = (long long)a % b;
    if (r != 0 && ((r < 0) != (b < 0))) q -= 1;
    return (int)(u32)(u64)q;
}
HK_HD int floormod(int a, int b) {
    if (b == 0) return 0;
    long long r = (long long)a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return (int)r;
}
// torch.minimum/maximum on scalars: NaN propagates
HK_HD float fminf_(float a, float b) { return (a != a || b != b) ? u2f(0x7FC00000u) : (a < b ? a : b); }
HK_HD float fmaxf_(float a, float b) { return (a != a || b != b) ? u2f(0x7FC00000u) : (a > b ? a : b); }

// ================================================================================ Philox4x32-10
HK_HD u32 mulhi32(u32 a, u32 b) {
#ifdef HK_PTX
    return __umulhi(a, b);
#else
    return (u32)(((u64)a * b) >> 32);
#endif
}
// word 0 of philox4x32_10(counter=(c0, c1, 0, 0), key=(k0, k1)), as interface/numerics.py
HK_HD u32 philox_word0(u32 c0, u32 c1, u32 k0, u32 k1) {
    u32 c2 = 0, c3 = 0;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        u32 hi0 = mulhi32(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        u32 hi1 = mulhi32(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    return c0;
}
// keep iff (x >> 8) >= floor(p * 2^24) (p > 0; otherwise 0): numerics.dropout_threshold
HK_HD double dropout_threshold(float p) {
    if (!(p > 0.0f)) return 0.0;
#ifdef HK_PTX
    return floor((double)p * 16777216.0);
#else
    return __builtin_floor((double)p * 16777216.0);
#endif
}
HK_HD bool dropout_keep(u64 g, u32 seed_lo, u32 seed_hi, double threshold) {
    u32 x = philox_word0((u32)g, (u32)(g >> 32), seed_lo, seed_hi);
    return (double)(x >> 8) >= threshold;
}

}  // namespace hk

#ifdef HK_DEVICE_COMPILE
// ================================================================================ device-only part
#define HK_INF __uint_as_float(0x7F800000u)
#define HK_NAN __uint_as_float(0x7FC00000u)

namespace hk {

constexpr int NUM_WARPS = HK_NUM_WARPS;
constexpr int NUM_THREADS = HK_NUM_WARPS * 32;
constexpr int ROW = 0, COL = 1;

HK_DEV int lane_id() { return threadIdx.x & 31; }
HK_DEV int warp_id() { return threadIdx.x >> 5; }

template <int A> HK_DEV int block_idx() { return A == 0 ? blockIdx.x : (A == 1 ? blockIdx.y : blockIdx.z); }
template <int A> HK_DEV int num_blocks() { return A == 0 ? gridDim.x : (A == 1 ? gridDim.y : gridDim.z); }
HK_DEV float fdiv(float a, float b) { return __fdiv_rn(a, b); }

#ifdef HK_PTX
HK_DEV void sync() { __syncthreads(); }

HK_DEV unsigned char* smem_base() {
    extern __shared__ __align__(128) unsigned char hk_dynamic_smem[];
    return hk_dynamic_smem;
}
HK_DEV u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// ------------------------------------------------------------------------------------ cp.async
HK_DEV void cp_async16(void* dst_smem, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst_smem)), "l"(src), "r"(src_bytes) : "memory");
}
HK_DEV void async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> HK_DEV void async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }
HK_DEV void async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
#else
HK_DEV void sync() { hk_emu::sync(); }
HK_DEV unsigned char* smem_base() { return hk_emu::smem_base(); }
HK_DEV void cp_async16(void* dst_smem, const void* src, int src_bytes) { hk_emu::cp_async16(dst_smem, src, src_bytes); }
HK_DEV void async_commit() { hk_emu::async_commit(); }
template <int N> HK_DEV void async_wait() { hk_emu::async_wait(N); }
HK_DEV void async_wait_all() { hk_emu::async_wait(0); }
#endif

// ---------------------------------------------------------------------------- ldmatrix / mma.sync
#ifdef HK_PTX
HK_DEV void ldsm_x4(u32 (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}
HK_DEV void ldsm_x4_t(u32 (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}
HK_DEV void ldsm_x2(u32 (&r)[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)) : "memory");
}
HK_DEV void ldsm_x2_t(u32 (&r)[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)) : "memory");
}

#else
HK_DEV void ldsm_x4(u32 (&r)[4], const void* p) { hk_emu::ldmatrix(r, 4, false, p); }
HK_DEV void ldsm_x4_t(u32 (&r)[4], const void* p) { hk_emu::ldmatrix(r, 4, true, p); }
HK_DEV void ldsm_x2(u32 (&r)[2], const void* p) { hk_emu::ldmatrix(r, 2, false, p); }
HK_DEV void ldsm_x2_t(u32 (&r)[2], const void* p) { hk_emu::ldmatrix(r, 2, true, p); }
#endif

template <class T> struct mma_op;
#ifdef HK_PTX
template <> struct mma_op<bf16> {
    static HK_DEV void run(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct mma_op<f16> {
    static HK_DEV void run(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
#else
template <> struct mma_op<bf16> {
    static HK_DEV void run(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) { hk_emu::mma16816(d, a, b, false); }
};
template <> struct mma_op<f16> {
    static HK_DEV void run(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) { hk_emu::mma16816(d, a, b, true); }
};
#endif

// ======================================================================================== layouts
// Per-lane storage of a tile's elements; masks (bool) are packed 32 to a register.
template <class T, int SIZE> struct store_t {
    T v[SIZE];
    HK_DEV T& operator[](int i) { return v[i]; }
    HK_DEV const T& operator[](int i) const { return v[i]; }
};
template <int SIZE> struct store_t<bool, SIZE> {
    u32 w[(SIZE + 31) / 32];
    struct ref {
        u32& word;
        int bit;
        HK_DEV operator bool() const { return (word >> bit) & 1u; }
        HK_DEV ref& operator=(bool x) { word = (word & ~(1u << bit)) | ((u32)x << bit); return *this; }
        HK_DEV ref& operator=(const ref& o) { return *this = (bool)o; }
    };
    HK_DEV ref operator[](int i) { return ref{w[i >> 5], i & 31}; }
    HK_DEV bool operator[](int i) const { return (w[i >> 5] >> (i & 31)) & 1u; }
};

// Which 16-row blocks of an R-row tile this warp holds (see the top of the file).
template <int R> struct rows {
    static_assert(R % 16 == 0, "register tiles and row vectors need a multiple of 16 rows");
    static constexpr int RB = R / 16;
    static constexpr int SLOTS = RB >= NUM_WARPS ? (RB + NUM_WARPS - 1) / NUM_WARPS : 1;
    static constexpr bool ALL_VALID = RB < NUM_WARPS || RB % NUM_WARPS == 0;
    static constexpr int DISTINCT = RB < NUM_WARPS ? RB : NUM_WARPS;   // warps holding distinct rows
    static HK_DEV int block(int k) { return (RB < NUM_WARPS ? warp_id() % RB : warp_id()) + k * NUM_WARPS; }
    static HK_DEV bool valid(int k) { return ALL_VALID || block(k) < RB; }
    static HK_DEV bool primary() { return RB >= NUM_WARPS || warp_id() < RB; }
    // tile row of element e (0..3) of slot k: rows g and g + 8
    static HK_DEV int row(int k, int half) { return block(k) * 16 + (lane_id() >> 2) + half * 8; }
};

template <class T, int R, int C> struct rt {
    static_assert(C % 8 == 0, "register tiles need a multiple of 8 columns");
    typedef T dtype;
    typedef rows<R> L;
    static constexpr int ROWS = R, COLS = C, CB = C / 8, SLOTS = L::SLOTS, SIZE = SLOTS * CB * 4;
    store_t<T, SIZE> d;
    static HK_DEV constexpr int idx(int k, int j, int e) { return (k * CB + j) * 4 + e; }
    static HK_DEV int col(int j, int e) { return j * 8 + 2 * (lane_id() & 3) + (e & 1); }
};

template <class T, int N, int AX> struct rv;
template <class T, int N> struct rv<T, N, ROW> {
    typedef T dtype;
    typedef rows<N> L;
    static constexpr int LEN = N, SIZE = L::SLOTS * 2, AXIS = ROW;
    store_t<T, SIZE> d;
    static HK_DEV int pos(int i) { return L::row(i >> 1, i & 1); }
    static HK_DEV bool held(int i) { return L::valid(i >> 1); }
    // one thread per element stores: primary warps, lane t == 0
    static HK_DEV bool owner(int i) { return L::primary() && L::valid(i >> 1) && (lane_id() & 3) == 0; }
};
template <class T, int N> struct rv<T, N, COL> {
    static_assert(N % 8 == 0, "column vectors need a multiple of 8 elements");
    typedef T dtype;
    static constexpr int LEN = N, SIZE = (N / 8) * 2, AXIS = COL;
    store_t<T, SIZE> d;
    static HK_DEV int pos(int i) { return (i >> 1) * 8 + 2 * (lane_id() & 3) + (i & 1); }
    static HK_DEV bool held(int) { return true; }
    static HK_DEV bool owner(int) { return warp_id() == 0 && lane_id() < 4; }
};

// ------------------------------------------------------------------------------------- shared tiles
HK_HD constexpr bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

template <class T, int R, int C> struct st {
    typedef T dtype;
    static constexpr int ROWS = R, COLS = C;
    static constexpr int ROWB = C * (int)sizeof(T), BYTES = R * ROWB;
    // 1: XOR the 16-byte chunk with the 128-byte line index; 2: with the row (rows wider than 128 B)
    static constexpr int SWZ = (is_pow2(ROWB) && ROWB >= 16 && BYTES % 128 == 0) ? (ROWB <= 128 ? 1 : 2) : 0;
    static constexpr bool CHUNKED = ROWB % 16 == 0;      // rows made of whole 16-byte chunks
    unsigned char* ptr;
    static HK_DEV int offset(int r, int c) {
        int o = r * ROWB + c * (int)sizeof(T);
        if (SWZ == 1) o ^= ((o >> 7) & 7) << 4;
        if (SWZ == 2) o ^= (r & 7) << 4;
        return o;
    }
    HK_DEV T* at(int r, int c) const { return reinterpret_cast<T*>(ptr + offset(r, c)); }
};

template <class T, int R, int C, int S> struct sbuf {
    unsigned char* ptr;
    HK_DEV explicit sbuf(unsigned char* p) : ptr(p) {}
    HK_DEV st<T, R, C> stage(int s) const { return st<T, R, C>{ptr + s * st<T, R, C>::BYTES}; }
};

// -------------------------------------------------------------------------------------- global tiles
template <class T, int RANK> struct gl {
    T* ptr;
    int shape[RANK];
    long long stride[RANK];
};

// Where a tile of ND dims at tile index idx... sits in a tensor: element offset of its origin from the
// leading dims, its first row/column, and whether the leading indices are in range.
template <int ND, class T, int RANK> struct origin {
    long long base;
    long long row0, col0;
    bool lead_ok;
    int nrows, ncols;
    long long rstride, cstride;
    template <class... I>
    HK_DEV origin(const gl<T, RANK>& g, int tr, int tc, I... idx) {
        static_assert(sizeof...(I) == RANK, "one index per tensor dimension");
        const int ix[RANK] = {idx...};
        base = 0;
        lead_ok = true;
#pragma unroll
        for (int dd = 0; dd < RANK - ND; ++dd) {
            lead_ok = lead_ok && ix[dd] >= 0 && ix[dd] < g.shape[dd];
            base += (long long)ix[dd] * g.stride[dd];
        }
        if constexpr (ND == 2) {
            row0 = (long long)ix[RANK - 2] * tr;
            nrows = g.shape[RANK - 2];
            rstride = g.stride[RANK - 2];
        } else {
            row0 = 0;
            nrows = 1;
            rstride = 0;
        }
        col0 = (long long)ix[RANK - 1] * tc;
        ncols = g.shape[RANK - 1];
        cstride = g.stride[RANK - 1];
    }
    HK_DEV bool row_ok(int r) const { return lead_ok && row0 + r >= 0 && row0 + r < nrows; }
    HK_DEV bool col_ok(int c) const { return col0 + c >= 0 && col0 + c < ncols; }
    HK_DEV T* at(const gl<T, RANK>& g, int r, int c) const {
        return g.ptr + (base + (row0 + r) * rstride + (col0 + c) * cstride);
    }
};

HK_DEV bool aligned(const void* p, int bytes) { return ((unsigned long long)p & (bytes - 1)) == 0; }

// ========================================================================================= memory
// ---- GL -> ST: 16-byte cp.async where a chunk is in bounds and aligned, cp.async zero-fill for ragged
// chunks (fill bits == 0), plain element copies otherwise. Completes at async_wait + sync.
template <class T, int R, int C, int RANK, class... I>
HK_DEV void load(const st<T, R, C>& dst, const gl<T, RANK>& g, float fill, I... idx) {
    origin<2, T, RANK> o(g, R, C, idx...);
    const T fv = convert<T>(fill);
    const bool zero_fill = f2u(fill) == 0u;
    if constexpr (st<T, R, C>::CHUNKED) {
        constexpr int E = 16 / (int)sizeof(T), CPR = C / E, CHUNKS = R * CPR;
        const bool unit = o.cstride == 1;
        for (int q = threadIdx.x; q < CHUNKS; q += NUM_THREADS) {
            const int r = q / CPR, c = (q % CPR) * E;
            T* s = dst.at(r, c);
            const bool rok = o.row_ok(r);
            const long long left = o.ncols - (o.col0 + c);          // valid columns from c on
            if (!rok || left <= 0 || o.col0 + c < 0) {
                if (zero_fill) {
                    *reinterpret_cast<uint4*>(s) = make_uint4(0, 0, 0, 0);
                    continue;
                }
            } else if (unit) {
                const T* src = o.at(g, r, c);
                if (aligned(src, 16)) {
                    if (left >= E) { cp_async16(s, src, 16); continue; }
                    if (zero_fill) { cp_async16(s, src, (int)left * (int)sizeof(T)); continue; }
                }
            }
#pragma unroll
            for (int e = 0; e < E; ++e)
                s[e] = (rok && o.col_ok(c + e)) ? *o.at(g, r, c + e) : fv;
        }
    } else {
        for (int q = threadIdx.x; q < R * C; q += NUM_THREADS) {
            const int r = q / C, c = q % C;
            *dst.at(r, c) = (o.row_ok(r) && o.col_ok(c)) ? *o.at(g, r, c) : fv;
        }
    }
}

// ---- GL -> registers (converting to the tile's dtype). One 64-bit row pointer per row a lane holds;
// columns are immediate offsets from it (unit stride), pairs load as one access where aligned.
template <class U> struct pair_io {
    static constexpr bool VEC = sizeof(U) == 4 || sizeof(U) == 2;
    static HK_DEV void load(const U* p, U& a, U& b) {
        if constexpr (sizeof(U) == 4) {
            const uint2 v = *reinterpret_cast<const uint2*>(p);
            a = from_bits<U>(v.x);
            b = from_bits<U>(v.y);
        } else if constexpr (sizeof(U) == 2) {
            const u32 v = *reinterpret_cast<const u32*>(p);
            a = from_bits<U>(v & 0xFFFFu);
            b = from_bits<U>(v >> 16);
        }
    }
    static HK_DEV void store(U* p, U a, U b) {
        if constexpr (sizeof(U) == 4) *reinterpret_cast<uint2*>(p) = make_uint2(to_bits(a), to_bits(b));
        else if constexpr (sizeof(U) == 2) *reinterpret_cast<u32*>(p) = to_bits(a) | (to_bits(b) << 16);
    }
};

// The part of a 2-D tile origin a lane needs for its two columns per column block
template <class U, int RANK> struct lane_cols {
    long long climit;       // columns j*8 + e (relative to the lane's first) are valid iff < climit
    int lane_c;
    template <class O> HK_DEV lane_cols(const O& o) {
        lane_c = 2 * (lane_id() & 3);
        climit = o.col0 >= 0 ? o.ncols - o.col0 - lane_c : 0;   // a negative tile index: nothing valid
    }
};

template <bool UNIT, class T, class U, int R, int C, class O, class G>
HK_DEV void load_rows(rt<T, R, C>& dst, const G& g, const O& o, T fv) {
    typedef rt<T, R, C> RT_;
    const lane_cols<U, 0> lc(o);
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = RT_::L::row(k, h);
            const bool rok = o.row_ok(r);
            const U* rp = rok ? o.at(g, r, lc.lane_c) : g.ptr;
            const bool vec = UNIT && pair_io<U>::VEC && aligned(rp, 2 * (int)sizeof(U));
#pragma unroll
            for (int j = 0; j < RT_::CB; ++j) {
                T* out = &dst.d[RT_::idx(k, j, 2 * h)];
                const bool ok0 = rok && j * 8 < lc.climit, ok1 = rok && j * 8 + 1 < lc.climit;
                const long long c0 = UNIT ? j * 8 : (long long)(j * 8) * o.cstride;
                const long long c1 = UNIT ? j * 8 + 1 : (long long)(j * 8 + 1) * o.cstride;
                if (vec && ok1) {
                    U a, b;
                    pair_io<U>::load(rp + c0, a, b);
                    out[0] = convert<T>(a);
                    out[1] = convert<T>(b);
                } else {
                    out[0] = ok0 ? convert<T>(rp[c0]) : fv;
                    out[1] = ok1 ? convert<T>(rp[c1]) : fv;
                }
            }
        }
    }
}

template <class T, class U, int R, int C, int RANK, class... I>
HK_DEV void load(rt<T, R, C>& dst, const gl<U, RANK>& g, float fill, I... idx) {
    origin<2, U, RANK> o(g, R, C, idx...);
    const T fv = convert<T>(fill);                 // the fill is rounded to the tile's dtype
    if (o.cstride == 1) load_rows<true, T, U>(dst, g, o, fv);
    else load_rows<false, T, U>(dst, g, o, fv);
}

template <class T, class U, int N, int AX, int RANK, class... I>
HK_DEV void load(rv<T, N, AX>& dst, const gl<U, RANK>& g, float fill, I... idx) {
    typedef rv<T, N, AX> RV_;
    origin<1, U, RANK> o(g, 1, N, idx...);
    const T fv = convert<T>(fill);
#pragma unroll
    for (int i = 0; i < RV_::SIZE; ++i) {
        const int c = RV_::pos(i);
        dst.d[i] = (RV_::held(i) && o.row_ok(0) && o.col_ok(c)) ? convert<T>(*o.at(g, 0, c)) : fv;
    }
}

// ---- ST <-> registers
template <class T> struct is16 { static constexpr bool value = same<T, bf16>::value || same<T, f16>::value; };

template <class T> HK_DEV u32 pack2(T a, T b) { return (u32)a.bits | ((u32)b.bits << 16); }
template <class T> HK_DEV void unpack2(u32 v, T& a, T& b) {
    a.bits = (unsigned short)(v & 0xFFFFu);
    b.bits = (unsigned short)(v >> 16);
}

template <class T, class S, int R, int C>
HK_DEV void load(rt<T, R, C>& dst, const st<S, R, C>& src) {
    typedef rt<T, R, C> RT_;
    const int lane = lane_id();
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
        if constexpr (is16<T>::value && same<T, S>::value) {
            // ldmatrix: matrices (rows 0-7 | 8-15) x (column block j | j+1) -> elements (0,1) (2,3)
            const int r = RT_::L::block(k) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int j = 0; j + 1 < RT_::CB; j += 2) {
                u32 v[4];
                ldsm_x4(v, src.at(r, (j + (lane >> 4)) * 8));
                unpack2(v[0], dst.d[RT_::idx(k, j, 0)], dst.d[RT_::idx(k, j, 1)]);
                unpack2(v[1], dst.d[RT_::idx(k, j, 2)], dst.d[RT_::idx(k, j, 3)]);
                unpack2(v[2], dst.d[RT_::idx(k, j + 1, 0)], dst.d[RT_::idx(k, j + 1, 1)]);
                unpack2(v[3], dst.d[RT_::idx(k, j + 1, 2)], dst.d[RT_::idx(k, j + 1, 3)]);
            }
            if constexpr (RT_::CB % 2 == 1) {
                constexpr int j = RT_::CB - 1;
                u32 v[2];
                ldsm_x2(v, src.at(r, j * 8));
                unpack2(v[0], dst.d[RT_::idx(k, j, 0)], dst.d[RT_::idx(k, j, 1)]);
                unpack2(v[1], dst.d[RT_::idx(k, j, 2)], dst.d[RT_::idx(k, j, 3)]);
            }
        } else {
#pragma unroll
            for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dst.d[RT_::idx(k, j, e)] = convert<T>(*src.at(RT_::L::row(k, e >> 1), RT_::col(j, e)));
        }
    }
}

template <class T, int R, int C>
HK_DEV void store(const st<T, R, C>& dst, const rt<T, R, C>& src) {
    typedef rt<T, R, C> RT_;
    if (!RT_::L::primary()) return;                 // replicas hold the same values: one writer
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
#pragma unroll
        for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                T* p = dst.at(RT_::L::row(k, h), RT_::col(j, 0));
                if constexpr (is16<T>::value) {
                    *reinterpret_cast<u32*>(p) = pack2(src.d[RT_::idx(k, j, 2 * h)], src.d[RT_::idx(k, j, 2 * h + 1)]);
                } else {
                    p[0] = src.d[RT_::idx(k, j, 2 * h)];
                    p[1] = src.d[RT_::idx(k, j, 2 * h + 1)];
                }
            }
    }
}

// ---- registers / ST -> GL (converting to the tensor dtype; out-of-bounds elements dropped)
template <bool UNIT, class U, class T, int R, int C, class O, class G>
HK_DEV void store_rows(const G& g, const O& o, const rt<T, R, C>& src) {
    typedef rt<T, R, C> RT_;
    const lane_cols<U, 0> lc(o);
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = RT_::L::row(k, h);
            if (!o.row_ok(r)) continue;
            U* rp = o.at(g, r, lc.lane_c);
            const bool vec = UNIT && pair_io<U>::VEC && aligned(rp, 2 * (int)sizeof(U));
#pragma unroll
            for (int j = 0; j < RT_::CB; ++j) {
                const U a = convert<U>(src.d[RT_::idx(k, j, 2 * h)]);
                const U b = convert<U>(src.d[RT_::idx(k, j, 2 * h + 1)]);
                const bool ok0 = j * 8 < lc.climit, ok1 = j * 8 + 1 < lc.climit;
                const long long c0 = UNIT ? j * 8 : (long long)(j * 8) * o.cstride;
                const long long c1 = UNIT ? j * 8 + 1 : (long long)(j * 8 + 1) * o.cstride;
                if (vec && ok1) {
                    pair_io<U>::store(rp + c0, a, b);
                } else {
                    if (ok0) rp[c0] = a;
                    if (ok1) rp[c1] = b;
                }
            }
        }
    }
}

template <class U, class T, int R, int C, int RANK, class... I>
HK_DEV void store(const gl<U, RANK>& g, const rt<T, R, C>& src, I... idx) {
    if (!rt<T, R, C>::L::primary()) return;       // replicas hold the same values: one writer
    origin<2, U, RANK> o(g, R, C, idx...);
    if (o.cstride == 1) store_rows<true, U>(g, o, src);
    else store_rows<false, U>(g, o, src);
}

template <class U, class T, int N, int AX, int RANK, class... I>
HK_DEV void store(const gl<U, RANK>& g, const rv<T, N, AX>& src, I... idx) {
    typedef rv<T, N, AX> RV_;
    origin<1, U, RANK> o(g, 1, N, idx...);
#pragma unroll
    for (int i = 0; i < RV_::SIZE; ++i) {
        const int c = RV_::pos(i);
        if (RV_::owner(i) && o.row_ok(0) && o.col_ok(c)) *o.at(g, 0, c) = convert<U>(src.d[i]);
    }
}

template <class U, class T, int R, int C, int RANK, class... I>
HK_DEV void store(const gl<U, RANK>& g, const st<T, R, C>& src, I... idx) {
    origin<2, U, RANK> o(g, R, C, idx...);
    if constexpr (same<T, U>::value && st<T, R, C>::CHUNKED) {
        constexpr int E = 16 / (int)sizeof(T), CPR = C / E, CHUNKS = R * CPR;
        for (int q = threadIdx.x; q < CHUNKS; q += NUM_THREADS) {
            const int r = q / CPR, c = (q % CPR) * E;
            if (!o.row_ok(r)) continue;
            const T* s = src.at(r, c);
            if (o.cstride == 1 && o.col0 + c >= 0 && o.col0 + c + E <= o.ncols) {
                T* p = o.at(g, r, c);
                if (aligned(p, 16)) {
                    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(s);
                    continue;
                }
            }
#pragma unroll
            for (int e = 0; e < E; ++e)
                if (o.col_ok(c + e)) *o.at(g, r, c + e) = s[e];
        }
    } else {
        for (int q = threadIdx.x; q < R * C; q += NUM_THREADS) {
            const int r = q / C, c = q % C;
            if (o.row_ok(r) && o.col_ok(c)) *o.at(g, r, c) = convert<U>(*src.at(r, c));
        }
    }
}

// ---- atomics (f32): each element added once per block
template <int R, int C, int RANK, class... I>
HK_DEV void atomic_add(const gl<float, RANK>& g, const rt<float, R, C>& src, I... idx) {
    typedef rt<float, R, C> RT_;
    if (!RT_::L::primary()) return;
    origin<2, float, RANK> o(g, R, C, idx...);
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
#pragma unroll
        for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = RT_::L::row(k, e >> 1), c = RT_::col(j, e);
                if (o.row_ok(r) && o.col_ok(c)) atomicAdd(o.at(g, r, c), src.d[RT_::idx(k, j, e)]);
            }
    }
}
template <int N, int AX, int RANK, class... I>
HK_DEV void atomic_add(const gl<float, RANK>& g, const rv<float, N, AX>& src, I... idx) {
    typedef rv<float, N, AX> RV_;
    origin<1, float, RANK> o(g, 1, N, idx...);
#pragma unroll
    for (int i = 0; i < RV_::SIZE; ++i) {
        const int c = RV_::pos(i);
        if (RV_::owner(i) && o.row_ok(0) && o.col_ok(c)) atomicAdd(o.at(g, 0, c), src.d[i]);
    }
}

// ===================================================================================== elementwise
struct op_neg {
    static HK_DEV float f(float x) { return -x; }
    static HK_DEV int f(int x) { return (int)(0u - (u32)x); }
};
struct op_abs {
    static HK_DEV float f(float x) { return fabsf(x); }
    static HK_DEV int f(int x) { return x < 0 ? (int)(0u - (u32)x) : x; }
};
struct op_relu {
    static HK_DEV float f(float x) { return x < 0.0f ? 0.0f : x; }      // NaN stays NaN (torch.clamp_min)
    static HK_DEV int f(int x) { return x < 0 ? 0 : x; }
};
// transcendental ops: the accurate CUDA math library (no -use_fast_math, no flush to zero)
struct op_exp { static HK_DEV float f(float x) { return expf(x); } };
struct op_exp2 { static HK_DEV float f(float x) { return exp2f(x); } };
struct op_log { static HK_DEV float f(float x) { return logf(x); } };
struct op_log2 { static HK_DEV float f(float x) { return log2f(x); } };
struct op_sqrt { static HK_DEV float f(float x) { return __fsqrt_rn(x); } };
struct op_rsqrt { static HK_DEV float f(float x) { return __fdiv_rn(1.0f, __fsqrt_rn(x)); } };   // torch: 1/sqrt
struct op_tanh { static HK_DEV float f(float x) { return tanhf(x); } };
struct op_sigmoid { static HK_DEV float f(float x) { return __fdiv_rn(1.0f, 1.0f + expf(-x)); } };
struct op_not { static HK_DEV bool f(bool x) { return !x; } };

struct op_add {
    static HK_DEV float f(float a, float b) { return __fadd_rn(a, b); }
    static HK_DEV int f(int a, int b) { return iadd(a, b); }
};
struct op_sub {
    static HK_DEV float f(float a, float b) { return __fsub_rn(a, b); }
    static HK_DEV int f(int a, int b) { return isub(a, b); }
};
struct op_mul {
    static HK_DEV float f(float a, float b) { return __fmul_rn(a, b); }
    static HK_DEV int f(int a, int b) { return imul(a, b); }
};
struct op_div { static HK_DEV float f(float a, float b) { return __fdiv_rn(a, b); } };
struct op_maximum {      // fmax: NaN-ignoring
    static HK_DEV float f(float a, float b) { return fmaxf(a, b); }
    static HK_DEV int f(int a, int b) { return a > b ? a : b; }
};
struct op_minimum {
    static HK_DEV float f(float a, float b) { return fminf(a, b); }
    static HK_DEV int f(int a, int b) { return a < b ? a : b; }
};
struct op_and { static HK_DEV bool f(bool a, bool b) { return a && b; } };
struct op_or { static HK_DEV bool f(bool a, bool b) { return a || b; } };
struct op_lt {
    static HK_DEV bool f(float a, float b) { return a < b; }
    static HK_DEV bool f(int a, int b) { return a < b; }
};
struct op_le {
    static HK_DEV bool f(float a, float b) { return a <= b; }
    static HK_DEV bool f(int a, int b) { return a <= b; }
};
struct op_gt {
    static HK_DEV bool f(float a, float b) { return a > b; }
    static HK_DEV bool f(int a, int b) { return a > b; }
};
struct op_ge {
    static HK_DEV bool f(float a, float b) { return a >= b; }
    static HK_DEV bool f(int a, int b) { return a >= b; }
};
struct op_eq {
    static HK_DEV bool f(float a, float b) { return a == b; }
    static HK_DEV bool f(int a, int b) { return a == b; }
};
struct op_ne {
    static HK_DEV bool f(float a, float b) { return a != b; }
    static HK_DEV bool f(int a, int b) { return a != b; }
};

// The compute type of an element type: float for floats (16-bit/fp8 round once on the way back)
template <class T> struct compute_t { typedef float type; };
template <> struct compute_t<int> { typedef int type; };
template <> struct compute_t<bool> { typedef bool type; };

template <class T, class R> struct back_t { static HK_DEV T f(R x) { return convert<T>(x); } };
template <class T> struct back_t<T, bool> { static HK_DEV bool f(bool x) { return x; } };
template <> struct back_t<bool, bool> { static HK_DEV bool f(bool x) { return x; } };

template <class T> HK_DEV typename compute_t<T>::type up(T x) { return to_float(x); }
template <> HK_DEV int up<int>(int x) { return x; }
template <> HK_DEV bool up<bool>(bool x) { return x; }

template <class F, class D, class S>
HK_DEV void unary(D& dst, const S& x) {
    typedef typename S::dtype T;
#pragma unroll
    for (int i = 0; i < S::SIZE; ++i) {
        auto r = F::f(up<T>(x.d[i]));
        dst.d[i] = back_t<typename D::dtype, decltype(r)>::f(r);
    }
}

template <class F, class D, class S>
HK_DEV void binary(D& dst, const S& a, const S& b) {
    typedef typename S::dtype T;
#pragma unroll
    for (int i = 0; i < S::SIZE; ++i) {
        auto r = F::f(up<T>(a.d[i]), up<T>(b.d[i]));
        dst.d[i] = back_t<typename D::dtype, decltype(r)>::f(r);
    }
}

template <class D, class M, class S>
HK_DEV void where(D& dst, const M& mask, const S& a, const S& b) {
#pragma unroll
    for (int i = 0; i < S::SIZE; ++i) dst.d[i] = mask.d[i] ? a.d[i] : b.d[i];
}

template <class D, class S>
HK_DEV void cast(D& dst, const S& x) {
#pragma unroll
    for (int i = 0; i < S::SIZE; ++i) dst.d[i] = convert<typename D::dtype>(x.d[i]);
}

template <class D, class V>
HK_DEV void fill(D& dst, V v) {
    const typename D::dtype x = convert<typename D::dtype>(v);
#pragma unroll
    for (int i = 0; i < D::SIZE; ++i) dst.d[i] = x;
}

template <class T, int R, int C, int N>
HK_DEV void broadcast(rt<T, R, C>& dst, const rv<T, N, ROW>& v) {
    static_assert(N == R, "a row vector broadcasts over a tile with as many rows");
    typedef rt<T, R, C> RT_;
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k)
#pragma unroll
        for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) dst.d[RT_::idx(k, j, e)] = v.d[k * 2 + (e >> 1)];
}
template <class T, int R, int C, int N>
HK_DEV void broadcast(rt<T, R, C>& dst, const rv<T, N, COL>& v) {
    static_assert(N == C, "a column vector broadcasts over a tile with as many columns");
    typedef rt<T, R, C> RT_;
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k)
#pragma unroll
        for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) dst.d[RT_::idx(k, j, e)] = v.d[j * 2 + (e & 1)];
}

// ====================================================================================== reductions
template <class X> HK_DEV X shfl_xor(X v, int m) { return __shfl_xor_sync(0xFFFFFFFFu, v, m); }

// The scratch area past the kernel's shared buffers (the cuda emitter reserves HK_SCRATCH_BYTES)
template <int OFFSET, int BYTES> HK_DEV unsigned char* scratch() {
    static_assert(OFFSET + BYTES <= HK_SCRATCH_BYTES, "cuda emitter reserved too little scratch shared memory");
    return smem_base() + HK_SCRATCH_OFFSET + OFFSET;
}

// ROW: over the columns of each row; the row lives in one warp (4 lanes of a quad)
template <class F, int AX, class T, int R, int C>
HK_DEV void reduce(rv<T, R, ROW>& dst, const rt<T, R, C>& x) {
    static_assert(AX == ROW, "a row reduction gives a row vector");
    typedef rt<T, R, C> RT_;
    typedef typename compute_t<T>::type A;
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k) {
        if (!RT_::L::valid(k)) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            A v = up<T>(x.d[RT_::idx(k, 0, 2 * h)]);
            v = F::f(v, up<T>(x.d[RT_::idx(k, 0, 2 * h + 1)]));
#pragma unroll
            for (int j = 1; j < RT_::CB; ++j) {
                v = F::f(v, up<T>(x.d[RT_::idx(k, j, 2 * h)]));
                v = F::f(v, up<T>(x.d[RT_::idx(k, j, 2 * h + 1)]));
            }
            v = F::f(v, shfl_xor(v, 1));
            v = F::f(v, shfl_xor(v, 2));
            dst.d[k * 2 + h] = convert<T>(v);
        }
    }
}

// COL: over the rows of each column; rows are spread over warps, so partials meet in shared memory
template <class F, int AX, class T, int R, int C>
HK_DEV void reduce(rv<T, C, COL>& dst, const rt<T, R, C>& x) {
    static_assert(AX == COL, "a column reduction gives a column vector");
    typedef rt<T, R, C> RT_;
    typedef typename compute_t<T>::type A;
    A part[RT_::CB * 2];
#pragma unroll
    for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            A v = F::f(up<T>(x.d[RT_::idx(0, j, e)]), up<T>(x.d[RT_::idx(0, j, e + 2)]));
#pragma unroll
            for (int k = 1; k < RT_::SLOTS; ++k)
                if (RT_::L::valid(k))
                    v = F::f(v, F::f(up<T>(x.d[RT_::idx(k, j, e)]), up<T>(x.d[RT_::idx(k, j, e + 2)])));
            v = F::f(v, shfl_xor(v, 4));
            v = F::f(v, shfl_xor(v, 8));
            v = F::f(v, shfl_xor(v, 16));
            part[j * 2 + e] = v;
        }
    constexpr int DW = RT_::L::DISTINCT;
    if constexpr (DW > 1) {
        A* sh = reinterpret_cast<A*>(scratch<0, NUM_WARPS * C * 4>());
        sync();                                            // earlier users of the scratch are done
        if (warp_id() < DW && lane_id() < 4) {
#pragma unroll
            for (int i = 0; i < RT_::CB * 2; ++i) sh[warp_id() * C + rv<T, C, COL>::pos(i)] = part[i];
        }
        sync();
#pragma unroll
        for (int i = 0; i < RT_::CB * 2; ++i) {
            const int c = rv<T, C, COL>::pos(i);
            A v = sh[c];
            for (int w = 1; w < DW; ++w) v = F::f(v, sh[w * C + c]);       // fixed order: deterministic
            part[i] = v;
        }
    }
#pragma unroll
    for (int i = 0; i < RT_::CB * 2; ++i) dst.d[i] = convert<T>(part[i]);
}

// ============================================================================================= mma
// A fragment (16 rows x k16) for slot k, k-step kk, from a shared tile.
// TA = false: st is M x K (row-major A); TA = true: st is K x M (A transposed), read with .trans.
template <bool TA, class T, int SR, int SC>
HK_DEV void a_frag(u32 (&a)[4], const st<T, SR, SC>& s, int row_block, int kk) {
    const int lane = lane_id(), m = lane >> 3, i = lane & 7;
    if (!TA) {
        ldsm_x4(a, s.at(row_block * 16 + (m & 1) * 8 + i, kk * 16 + (m >> 1) * 8));
    } else {
        ldsm_x4_t(a, s.at(kk * 16 + (m >> 1) * 8 + i, row_block * 16 + (m & 1) * 8));
    }
}
// A fragment from registers (the tile's layout is the fragment layout: no data movement)
template <class T, int R, int C>
HK_DEV void a_frag_rt(u32 (&a)[4], const rt<T, R, C>& x, int k, int kk) {
    typedef rt<T, R, C> RT_;
    a[0] = pack2(x.d[RT_::idx(k, 2 * kk, 0)], x.d[RT_::idx(k, 2 * kk, 1)]);
    a[1] = pack2(x.d[RT_::idx(k, 2 * kk, 2)], x.d[RT_::idx(k, 2 * kk, 3)]);
    a[2] = pack2(x.d[RT_::idx(k, 2 * kk + 1, 0)], x.d[RT_::idx(k, 2 * kk + 1, 1)]);
    a[3] = pack2(x.d[RT_::idx(k, 2 * kk + 1, 2)], x.d[RT_::idx(k, 2 * kk + 1, 3)]);
}
// B fragments (k16 x n8) for all N/8 column blocks of k-step kk.
// TB = false: st is K x N (read with .trans); TB = true: st is N x K (B transposed, plain ldmatrix).
template <bool TB, int N, class T, int SR, int SC>
HK_DEV void b_frags(u32 (&b)[N / 8][2], const st<T, SR, SC>& s, int kk) {
    const int lane = lane_id(), m = lane >> 3, i = lane & 7;
#pragma unroll
    for (int j = 0; j + 1 < N / 8; j += 2) {
        u32 v[4];
        if (TB) ldsm_x4(v, s.at(j * 8 + (m >> 1) * 8 + i, kk * 16 + (m & 1) * 8));
        else ldsm_x4_t(v, s.at(kk * 16 + (m & 1) * 8 + i, j * 8 + (m >> 1) * 8));
        b[j][0] = v[0]; b[j][1] = v[1]; b[j + 1][0] = v[2]; b[j + 1][1] = v[3];
    }
    if constexpr ((N / 8) % 2 == 1) {
        constexpr int j = N / 8 - 1;
        u32 v[2];
        if (TB) ldsm_x2(v, s.at(j * 8 + i, kk * 16 + (m & 1) * 8));
        else ldsm_x2_t(v, s.at(kk * 16 + (m & 1) * 8 + i, j * 8));
        b[j][0] = v[0]; b[j][1] = v[1];
    }
}

// Register operands that the fragments cannot read in place (a transposed A, any B) go through a
// scratch shared tile: written by the primary warps, then read like any shared operand.
template <int OFFSET, class T, int R, int C>
HK_DEV st<T, R, C> to_scratch(const rt<T, R, C>& x) {
    st<T, R, C> s{scratch<OFFSET, R * C * (int)sizeof(T)>()};
    store(s, x);
    return s;
}
HK_HD constexpr int round128(int x) { return (x + 127) / 128 * 128; }

template <class X> struct operand;
template <class T, int R, int C> struct operand<st<T, R, C>> {
    typedef T dtype; static constexpr bool reg = false; static constexpr int ROWS = R, COLS = C;
};
template <class T, int R, int C> struct operand<rt<T, R, C>> {
    typedef T dtype; static constexpr bool reg = true; static constexpr int ROWS = R, COLS = C;
};

template <bool TA, bool TB, class T, int M, int N, class AOp, class BOp>
HK_DEV void mma_core(rt<float, M, N>& dst, const AOp& a, const BOp& b, int K) {
    typedef rt<float, M, N> ACC;
    for (int kk = 0; kk < K / 16; ++kk) {
        u32 bf[N / 8][2];
        b_frags<TB, N>(bf, b, kk);
#pragma unroll
        for (int k = 0; k < ACC::SLOTS; ++k) {
            if (!ACC::L::valid(k)) continue;
            u32 af[4];
            if constexpr (operand<AOp>::reg) a_frag_rt(af, a, k, kk);
            else a_frag<TA>(af, a, ACC::L::block(k), kk);
#pragma unroll
            for (int j = 0; j < N / 8; ++j) mma_op<T>::run(*reinterpret_cast<float(*)[4]>(&dst.d[ACC::idx(k, j, 0)]), af, bf[j]);
        }
    }
}

// dst = acc + op(a) op(b): f32 accumulation with mma.sync m16n8k16 (bf16 or f16 operands)
template <bool TA, bool TB, int M, int N, class AOp, class BOp>
HK_DEV void mma(rt<float, M, N>& dst, const AOp& a, const BOp& b, const rt<float, M, N>& acc) {
    typedef operand<AOp> OA;
    typedef operand<BOp> OB;
    typedef typename OA::dtype T;
    static_assert(is16<T>::value && same<T, typename OB::dtype>::value, "mma operands are bf16 or f16, one dtype");
    constexpr int K = TA ? OA::ROWS : OA::COLS;
    static_assert(K % 16 == 0, "mma needs K to be a multiple of 16");
    static_assert((TA ? OA::COLS : OA::ROWS) == M && (TB ? OB::ROWS : OB::COLS) == N, "mma shapes");
    constexpr bool A_SCR = OA::reg && TA, B_SCR = OB::reg;
    constexpr int A_BYTES = A_SCR ? round128(OA::ROWS * OA::COLS * 2) : 0;
    dst = acc;
    if constexpr (A_SCR || B_SCR) sync();               // earlier readers of the scratch are done
    if constexpr (A_SCR && B_SCR) {
        const auto as = to_scratch<0>(a);
        const auto bs = to_scratch<A_BYTES>(b);
        sync();
        mma_core<TA, TB, T>(dst, as, bs, K);
    } else if constexpr (A_SCR) {
        const auto as = to_scratch<0>(a);
        sync();
        mma_core<TA, TB, T>(dst, as, b, K);
    } else if constexpr (B_SCR) {
        const auto bs = to_scratch<A_BYTES>(b);
        sync();
        mma_core<TA, TB, T>(dst, a, bs, K);
    } else {
        mma_core<TA, TB, T>(dst, a, b, K);
    }
}

// =========================================================================================== masks
template <int R, int C>
HK_DEV void causal_mask(rt<bool, R, C>& dst, int row_off, int col_off) {
    typedef rt<bool, R, C> RT_;
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k)
#pragma unroll
        for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                dst.d[RT_::idx(k, j, e)] = (long long)row_off + RT_::L::row(k, e >> 1) >=
                                           (long long)col_off + RT_::col(j, e);
}

template <int R, int C>
HK_DEV void bounds_mask(rt<bool, R, C>& dst, int row_off, int col_off, int n_rows, int n_cols) {
    typedef rt<bool, R, C> RT_;
#pragma unroll
    for (int k = 0; k < RT_::SLOTS; ++k)
#pragma unroll
        for (int j = 0; j < RT_::CB; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const long long r = (long long)row_off + RT_::L::row(k, e >> 1);
                const long long c = (long long)col_off + RT_::col(j, e);
                dst.d[RT_::idx(k, j, e)] = r >= 0 && r < n_rows && c >= 0 && c < n_cols;
            }
}

// g = offset + (row_off + r) * row_stride + (col_off + c) in 64-bit two's complement.
// Philox is ~40 dependent integer ops per element: the loop over elements is only partly unrolled so
// the mask costs a few registers, not one Philox state per element in flight.
template <int R, int C>
HK_DEV void dropout_mask(rt<bool, R, C>& dst, float p, int seed_lo, int seed_hi, int off_lo, int off_hi,
                         int row_off, int col_off, int row_stride) {
    typedef rt<bool, R, C> RT_;
    const double thr = dropout_threshold(p);
    const u64 offset = (u64)(u32)off_lo | ((u64)(u32)off_hi << 32);
    constexpr int WORDS = (RT_::SIZE + 31) / 32;
#pragma unroll
    for (int wi = 0; wi < WORDS; ++wi) {
        u32 word = 0;
        constexpr int NB = RT_::SIZE < 32 ? RT_::SIZE : 32;
#pragma unroll 4
        for (int b = 0; b < NB; ++b) {
            const int i = wi * 32 + b;                      // element index: (slot, column block, e)
            const int k = i / (RT_::CB * 4), j = (i / 4) % RT_::CB, e = i % 4;
            const u64 row = (u64)((long long)row_off + RT_::L::row(k, e >> 1));
            const u64 col = (u64)((long long)col_off + RT_::col(j, e));
            const u64 g = offset + row * (u64)(long long)row_stride + col;
            word |= (u32)dropout_keep(g, (u32)seed_lo, (u32)seed_hi, thr) << b;
        }
        dst.d.w[wi] = word;
    }
}

// ======================================================================================== pipeline
namespace detail {
// sm_80+: a ring of S shared stages filled by cp.async, S-1 loads in flight ahead of the compute.
// The barrier at the top of each step both publishes stage i and retires compute(i-1), whose stage
// the next load overwrites.
template <int S> struct pipeline_cp_async {
    template <class L, class C> static HK_DEV void run(int n, L& load, C& compute) {
        sync();                                             // earlier readers of the stage buffers
        if constexpr (S == 1) {
            for (int i = 0; i < n; ++i) {
                if (i) sync();
                load(i, 0);
                async_commit();
                async_wait<0>();
                sync();
                compute(i, 0);
            }
        } else {
#pragma unroll
            for (int p = 0; p < S - 1; ++p) {
                if (p < n) load(p, p);
                async_commit();
            }
            for (int i = 0; i < n; ++i) {
                async_wait<S - 2>();
                sync();
                const int nx = i + S - 1;
                if (nx < n) load(nx, nx % S);
                async_commit();
                compute(i, i % S);
            }
        }
        async_wait<0>();
        sync();                                             // later code may reuse the buffers
    }
};
#ifndef HK_SCHEDULE
template <int S> struct pipeline_schedule : pipeline_cp_async<S> {};
#endif
}  // namespace detail

template <int S, class L, class C>
HK_DEV void pipeline(int n, L&& load, C&& compute) {
    detail::pipeline_schedule<S>::run(n, load, compute);
}

}  // namespace hk
#endif  // HK_DEVICE_COMPILE
