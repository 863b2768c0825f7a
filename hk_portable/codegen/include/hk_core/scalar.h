// hk_core/scalar.h -- scalar semantics shared by every vendor: int32 arithmetic wraps, floor division
// and modulo follow Python, f32 arithmetic is IEEE (hk::hw rounds each operation, no contraction), and
// the two min/max rules of interface/numerics.py ("min/max and NaN"), bit for bit.
namespace hk {

HK_CORE_FN int iadd(int a, int b) { return (int)((u32)a + (u32)b); }
HK_CORE_FN int isub(int a, int b) { return (int)((u32)a - (u32)b); }
HK_CORE_FN int imul(int a, int b) { return (int)((u32)a * (u32)b); }
// Python floor semantics in 32 bits (a 64-bit division is a software routine on GPUs, and every block that
// divides by a runtime value starts with it); b == -1 negates with wrap-around (INT_MIN // -1 wraps, the one
// quotient int32 division cannot hold); b == 0 gives 0 (the reference raises)
HK_CORE_FN int floordiv(int a, int b) {
    if (b == 0) return 0;
    if (b == -1) return (int)(0u - (u32)a);
    int q = a / b;
    const int r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) q -= 1;
    return q;
}
HK_CORE_FN int floormod(int a, int b) {
    if (b == 0 || b == -1) return 0;
    int r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}
HK_CORE_FN float fdiv(float a, float b) { return hw::fdiv(a, b); }

HK_CORE_FN bool is_nan(float x) { return x != x; }
HK_CORE_FN bool is_signaling_nan(float x) { return x != x && (f2u(x) & 0x00400000u) == 0; }
HK_CORE_FN float quiet(float x) { return u2f(f2u(x) | 0x00400000u); }   // x a NaN: set the quiet bit
HK_CORE_FN float canonical_nan() { return u2f(0x7FC00000u); }

// Scalar min/max (hk.min / hk.max; torch.minimum / torch.maximum): NaN propagates as the canonical NaN
// 0x7FC00000; equal operands (-0 and +0) give the first.
HK_CORE_FN float nan_propagating_min(float a, float b) {
    return (is_nan(a) || is_nan(b)) ? canonical_nan() : (b < a ? b : a);
}
HK_CORE_FN float nan_propagating_max(float a, float b) {
    return (is_nan(a) || is_nan(b)) ? canonical_nan() : (a < b ? b : a);
}
HK_CORE_FN float fminf_(float a, float b) { return nan_propagating_min(a, b); }   // the emitter's names
HK_CORE_FN float fmaxf_(float a, float b) { return nan_propagating_max(a, b); }

// Elementwise maximum/minimum (hk.maximum / hk.minimum; torch.fmax / torch.fmin): a quiet NaN is
// ignored, so one NaN operand gives the other operand unchanged; two NaNs give b, quieted; a signaling
// NaN operand gives itself, quieted, whatever the other is (unless the other is a NaN too: then b,
// quieted). Equal operands (-0 and +0) give a.
HK_CORE_FN float nan_operands_max(float a, float b) {   // a or b is a NaN
    if (is_nan(b)) return (is_nan(a) || is_signaling_nan(b)) ? quiet(b) : a;
    return is_signaling_nan(a) ? quiet(a) : b;
}
HK_CORE_FN float nan_ignoring_max(float a, float b) {
    if (__builtin_expect(is_nan(a) || is_nan(b), 0)) return nan_operands_max(a, b);
    return a < b ? b : a;
}
HK_CORE_FN float nan_ignoring_min(float a, float b) {
    if (__builtin_expect(is_nan(a) || is_nan(b), 0)) return nan_operands_max(a, b);   // the same NaN rule
    return b < a ? b : a;
}

}  // namespace hk
