// hk_hip/hw.h -- the primitives the portable core (hk_core/) builds on, for CDNA3/CDNA4 (the core's hooks,
// DEVICE_API.md): bit casts, f32 arithmetic (the device build never contracts: -ffp-contract=off), the
// library's own exp/log/tanh on v_exp_f32/v_log_f32, and conversion instructions that give the core's bits.
namespace hk {
namespace hw {

HK_DEV unsigned f2u(float f) { return __builtin_bit_cast(unsigned, f); }
HK_DEV float u2f(unsigned u) { return __builtin_bit_cast(float, u); }
HK_DEV float floor(float x) { return __builtin_floorf(x); }
HK_DEV float fadd(float a, float b) { return a + b; }
HK_DEV float fsub(float a, float b) { return a - b; }
HK_DEV float fmul(float a, float b) { return a * b; }
HK_DEV float fdiv(float a, float b) { return a / b; }
HK_DEV float fabs(float x) { return __builtin_fabsf(x); }
HK_DEV float sqrt(float x) { return __builtin_sqrtf(x); }

// ============================================================================== math (f32, bounded tier)
HK_DEV float exp2(float x) { return __builtin_amdgcn_exp2f(x); }     // v_exp_f32
HK_DEV float log2(float x) {                                          // v_log_f32 (flushes subnormal inputs)
  const bool sub = x < 1.17549435e-38f;
  const float r = __builtin_amdgcn_logf(sub ? x * 4294967296.0f : x);
  return sub ? r - 32.0f : r;
}
// e^x = 2^n * e^r with n = rint(x log2 e) and r = x - n ln2 reduced with fma: |r| <= ln2/2, so v_exp_f32
// of r*log2(e) keeps its ~1 ulp accuracy (the naive exp2(x*log2e) loses |x| * 2^-24 in the exponent).
HK_DEV float exp(float x) {
  if (x != x) return x;
  x = x > 89.0f ? 89.0f : (x < -104.0f ? -104.0f : x);
  const float n = __builtin_rintf(x * 1.44269504f);
  float r = __builtin_fmaf(n, -0.693359375f, x);
  r = __builtin_fmaf(n, 2.12194440e-4f, r);
  return __builtin_ldexpf(exp2(r * 1.44269504f), (int)n);
}
HK_DEV float log(float x) {
  const float l = log2(x);
  return __builtin_fmaf(l, 0.693145751953125f, l * 1.42860677e-06f);   // ln2 split hi + lo
}
// tanh: odd Taylor series near 0 (no cancellation), 1 - 2/(e^{2|x|}+1) elsewhere
HK_DEV float tanh(float x) {
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
  const float t = 1.0f - 2.0f / (exp(2.0f * a) + 1.0f);
  return x < 0 ? -t : t;
}

// =============================================================================== conversion instructions
// v_cvt_f16_f32 / v_cvt_f32_f16 round like the core (RNE, subnormals kept)
HK_DEV unsigned short f16_bits_from_float(float x) { return __builtin_bit_cast(unsigned short, (_Float16)x); }
HK_DEV float float_from_f16_bits(unsigned short h) { return (float)__builtin_bit_cast(_Float16, h); }
#if HK_GFX950
HK_DEV unsigned short bf16_bits_from_float(float x) { return __builtin_bit_cast(unsigned short, (__bf16)x); }   // v_cvt_pk_bf16_f32: RNE
#define HK_HW_F32_TO_BF16(x) hk::hw::bf16_bits_from_float(x)
#endif
#define HK_HW_F32_TO_F16(x) hk::hw::f16_bits_from_float(x)
#define HK_HW_F16_TO_F32(h) hk::hw::float_from_f16_bits(h)

}  // namespace hw
}  // namespace hk

// a real loop: unrolled, the key schedule seed + r*W becomes 20 loop invariants in scalar registers
#define HK_PHILOX_LOOP _Pragma("unroll 1")
