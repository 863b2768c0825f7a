// hk_cuda/hw.cuh -- the primitives the portable core (hk_core/) builds on, for CUDA (the core's hooks,
// DEVICE_API.md): bit casts, correctly rounded f32 arithmetic that is never contracted (__f*_rn), the
// accurate CUDA math library (no fast math, no flush to zero) except exp2 and log2 (one MUFU each: see there),
// and PTX conversions where one instruction gives the core's bits.
namespace hk {
namespace hw {

HK_HD unsigned f2u(float x) {
#ifdef HK_PTX
    return __float_as_uint(x);
#else
    return __builtin_bit_cast(unsigned, x);
#endif
}
HK_HD float u2f(unsigned x) {
#ifdef HK_PTX
    return __uint_as_float(x);
#else
    return __builtin_bit_cast(float, x);
#endif
}
HK_HD float floor(float x) {
#ifdef HK_PTX
    return floorf(x);
#else
    return __builtin_floorf(x);
#endif
}

#ifdef HK_DEVICE_COMPILE
HK_DEV float fadd(float a, float b) { return __fadd_rn(a, b); }
HK_DEV float fsub(float a, float b) { return __fsub_rn(a, b); }
HK_DEV float fmul(float a, float b) { return __fmul_rn(a, b); }
HK_DEV float fabs(float x) { return fabsf(x); }
HK_DEV float sqrt(float x) { return __fsqrt_rn(x); }
HK_DEV float exp(float x) { return expf(x); }
#if defined(HK_PTX) && HK_FAST_EXP2
// One MUFU.EX2: exp2f's non-flushing form costs a compare and two predicated multiplies around it to
// produce subnormal results; flushing those (< 2^-126) stays within the interface's exp2 bound (2^-20
// relative, 2^-100 absolute: conformance/tolerances.py) and halves softmax's exp cost. The backend
// rebuilds a kernel that spills with HK_FAST_EXP2 0: the unflushed form can need fewer registers.
HK_DEV float exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#else
HK_DEV float exp2(float x) { return exp2f(x); }
#endif
HK_DEV float log(float x) { return logf(x); }
#ifdef HK_PTX
// One MUFU.LG2 (lg2.approx.f32, subnormals kept): log2f's software form runs some forty instructions, 3 % of the
// 64x64 attention block's stall samples in its LSE epilogue (ncu, H200, 2026-12-04). CUDA's bound for it (__log2f:
// 2^-22 absolute on [0.5, 2], 2 ulp elsewhere) is inside the interface's log2 bound (2^-20 relative, 2^-21
// absolute near 1: conformance/tolerances.py).
HK_DEV float log2(float x) {
    float y;
    asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#else
HK_DEV float log2(float x) { return log2f(x); }
#endif
HK_DEV float tanh(float x) { return tanhf(x); }
#endif
HK_HD float fdiv(float a, float b) {
#ifdef HK_DEVICE_COMPILE
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

#ifdef HK_PTX
// cvt.rn.f16.f32 rounds like the core; NaN -> sign | 0x7E00 as the core's software path
__device__ __forceinline__ unsigned short f16_bits_from_float(float f) {
    const unsigned w = f2u(f);
    if ((w & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)(((w >> 16) & 0x8000u) | 0x7E00u);
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float float_from_f16_bits(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// float -> int32: truncate toward zero, saturate, NaN -> 0 (cvt.rzi.s32.f32 does exactly this)
__device__ __forceinline__ int f32_to_i32(float x) {
    int r;
    asm("cvt.rzi.s32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
// cvt.rn.bf16.f32 (sm_80+) rounds like the core on every non-NaN input (NaN -> the canonical 0x7FFF, a
// payload the interface leaves open): one instruction where the core's integer RNE takes seven
__device__ __forceinline__ unsigned short bf16_bits_from_float(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#define HK_HW_F32_TO_BF16(x) hk::hw::bf16_bits_from_float(x)
#define HK_HW_F32_TO_F16(x) hk::hw::f16_bits_from_float(x)
#define HK_HW_F16_TO_F32(h) hk::hw::float_from_f16_bits(h)
#define HK_HW_F32_TO_I32(x) hk::hw::f32_to_i32(x)
#define HK_HW_MULHI(a, b) __umulhi(a, b)
#endif

}  // namespace hw
}  // namespace hk

#define HK_PHILOX_LOOP _Pragma("unroll")
