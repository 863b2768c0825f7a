// hk_core/conversions.h -- the interface's conversions, bit-exact to torch on every finite input:
// f32 -> bf16/f16 round to nearest even (subnormals kept), f32 -> fp8 saturating to the finite max
// (NaN stays NaN), float -> int32 truncating and saturating (NaN -> 0), narrower floats -> f32 exact.
// A vendor may replace a conversion by its instruction through an optional hook macro
// (HK_HW_F32_TO_BF16, HK_HW_F32_TO_F16, HK_HW_F16_TO_F32, HK_HW_F32_TO_I32; DEVICE_API.md) that must
// give the same bits on every non-NaN input. NaN payloads through a narrowing cast are not specified.
namespace hk {

namespace soft {
// f32 -> bf16, RNE; a NaN keeps its sign and top payload bits, quieted
HK_CORE_FN unsigned short bf16_bits_from_float(float f) {
    const u32 u = f2u(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
// f32 -> f16, IEEE RNE (fp16_ieee_from_fp32_value: exact float arithmetic, valid without flush to zero);
// NaN -> sign | 0x7E00
HK_CORE_FN unsigned short f16_bits_from_float(float f) {
    const u32 w = f2u(f);
    const float scale_to_inf = u2f(0x77800000u), scale_to_zero = u2f(0x08800000u);
    float base = (u2f(w & 0x7FFFFFFFu) * scale_to_inf) * scale_to_zero;
    const u32 shl1_w = w + w, sign = w & 0x80000000u;
    u32 bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = u2f((bias >> 1) + 0x07800000u) + base;
    const u32 bits = f2u(base);
    const u32 nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    return (unsigned short)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
HK_CORE_FN float float_from_f16_bits(unsigned short h) {
    const u32 sign = (u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F) return u2f(sign | 0x7F800000u | (m << 13));
    if (e == 0) return u2f(sign | f2u((float)m * u2f(0x33800000u)));   // m * 2^-24, exact
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}
HK_CORE_FN int f32_to_i32(float x) {
    if (x != x) return 0;
    if (x >= 2147483648.0f) return 2147483647;
    if (x <= -2147483648.0f) return (int)0x80000000u;
    return (int)x;
}
}  // namespace soft

HK_CORE_FN unsigned short bf16_bits_from_float(float f) {
#ifdef HK_HW_F32_TO_BF16
    return HK_HW_F32_TO_BF16(f);
#else
    return soft::bf16_bits_from_float(f);
#endif
}
HK_CORE_FN float float_from_bf16_bits(unsigned short b) { return u2f((u32)b << 16); }
HK_CORE_FN unsigned short f16_bits_from_float(float f) {
#ifdef HK_HW_F32_TO_F16
    return HK_HW_F32_TO_F16(f);
#else
    return soft::f16_bits_from_float(f);
#endif
}
HK_CORE_FN float float_from_f16_bits(unsigned short h) {
#ifdef HK_HW_F16_TO_F32
    return HK_HW_F16_TO_F32(h);
#else
    return soft::float_from_f16_bits(h);
#endif
}

// f32 -> fp8 (OCP e4m3fn / e5m2): c10's algorithm (RNE, subnormals); the saturating forms clamp to the
// finite max first, which is the interface's conversion (NaN -> sign | 0x7F).
HK_CORE_FN unsigned char e4m3_bits_raw(float f) {
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
        const u32 odd = (fb >> 20) & 1u;
        fb += ((u32)(7 - 127) << 23) + 0x7FFFFu;
        fb += odd;
        r = (unsigned char)(fb >> 20);
        if (r == 0x7F) r = 0x7E;
    }
    return (unsigned char)(r | (sign >> 24));
}
HK_CORE_FN unsigned char e5m2_bits_raw(float f) {
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
        const u32 odd = (fb >> 21) & 1u;
        fb += ((u32)(15 - 127) << 23) + 0xFFFFFu;
        fb += odd;
        r = (unsigned char)(fb >> 21);
    }
    return (unsigned char)(r | (sign >> 24));
}
HK_CORE_FN float clampf_keep_nan(float x, float m) { return x > m ? m : (x < -m ? -m : x); }
HK_CORE_FN unsigned char e4m3_bits_sat(float f) { return e4m3_bits_raw(clampf_keep_nan(f, 448.0f)); }
HK_CORE_FN unsigned char e5m2_bits_sat(float f) { return e5m2_bits_raw(clampf_keep_nan(f, 57344.0f)); }

HK_CORE_FN float float_from_e4m3_bits(unsigned char b) {
    const u32 sign = (u32)(b & 0x80u) << 24, e = (b >> 3) & 0xFu, m = b & 0x7u;
    if (e == 0xF && m == 0x7) return u2f(sign | 0x7FC00000u);
    if (e == 0) return u2f(sign | f2u((float)m * 0.001953125f));        // m * 2^-9, exact
    return u2f(sign | ((e + 120u) << 23) | (m << 20));
}
HK_CORE_FN float float_from_e5m2_bits(unsigned char b) { return float_from_f16_bits((unsigned short)((u32)b << 8)); }

// float -> int32: truncate toward zero, saturate, NaN -> 0
HK_CORE_FN int f32_to_i32(float x) {
#ifdef HK_HW_F32_TO_I32
    return HK_HW_F32_TO_I32(x);
#else
    return soft::f32_to_i32(x);
#endif
}

// to_float / from_float: an element's value in f32 and the interface's conversion back
HK_CORE_FN float to_float(float x) { return x; }
HK_CORE_FN float to_float(bf16 x) { return float_from_bf16_bits(x.bits); }
HK_CORE_FN float to_float(f16 x) { return float_from_f16_bits(x.bits); }
HK_CORE_FN float to_float(fp8e4m3 x) { return float_from_e4m3_bits(x.bits); }
HK_CORE_FN float to_float(fp8e5m2 x) { return float_from_e5m2_bits(x.bits); }
HK_CORE_FN float to_float(int x) { return (float)x; }          // round to nearest (torch's int -> float)

template <class T> struct from_float_t;
template <> struct from_float_t<float> { static HK_CORE_FN float apply(float x) { return x; } };
template <> struct from_float_t<int> { static HK_CORE_FN int apply(float x) { return f32_to_i32(x); } };
template <> struct from_float_t<bf16> {
    static HK_CORE_FN bf16 apply(float x) { bf16 r; r.bits = bf16_bits_from_float(x); return r; }
};
template <> struct from_float_t<f16> {
    static HK_CORE_FN f16 apply(float x) { f16 r; r.bits = f16_bits_from_float(x); return r; }
};
template <> struct from_float_t<fp8e4m3> {
    static HK_CORE_FN fp8e4m3 apply(float x) { fp8e4m3 r; r.bits = e4m3_bits_sat(x); return r; }
};
template <> struct from_float_t<fp8e5m2> {
    static HK_CORE_FN fp8e5m2 apply(float x) { fp8e5m2 r; r.bits = e5m2_bits_sat(x); return r; }
};
template <class T> HK_CORE_FN T from_float(float x) { return from_float_t<T>::apply(x); }

// convert<To>(x): the interface's cast between any two element types (floats through f32, which is
// exact for every narrower format, then rounded once)
template <class To, class From> struct convert_t {
    static HK_CORE_FN To apply(From x) { return from_float<To>(to_float(x)); }
};
template <class T> struct convert_t<T, T> { static HK_CORE_FN T apply(T x) { return x; } };
template <class To, class From> HK_CORE_FN To convert(From x) { return convert_t<To, From>::apply(x); }

// raw bits of a 32- or 16-bit element (vector loads/stores) and back
HK_CORE_FN u32 to_bits(float x) { return f2u(x); }
HK_CORE_FN u32 to_bits(int x) { return (u32)x; }
HK_CORE_FN u32 to_bits(bf16 x) { return x.bits; }
HK_CORE_FN u32 to_bits(f16 x) { return x.bits; }
template <class T> struct from_bits_t;
template <> struct from_bits_t<float> { static HK_CORE_FN float apply(u32 b) { return u2f(b); } };
template <> struct from_bits_t<int> { static HK_CORE_FN int apply(u32 b) { return (int)b; } };
template <> struct from_bits_t<bf16> {
    static HK_CORE_FN bf16 apply(u32 b) { bf16 r; r.bits = (unsigned short)b; return r; }
};
template <> struct from_bits_t<f16> {
    static HK_CORE_FN f16 apply(u32 b) { f16 r; r.bits = (unsigned short)b; return r; }
};
template <class T> HK_CORE_FN T from_bits(u32 b) { return from_bits_t<T>::apply(b); }

}  // namespace hk
