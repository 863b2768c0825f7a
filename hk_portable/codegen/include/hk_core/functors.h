// hk_core/functors.h -- the elementwise functors the emitter names (hk::op_<name>): one static member
// `apply` per signature (float, int, bool). f32 arithmetic and the transcendental functions are the
// vendor's (hk::hw: correctly rounded + - * / and sqrt, never contracted; exp/log/tanh within the
// bounded tier); the selections and the NaN rules are written here once.
namespace hk {

struct op_neg {
    static HK_CORE_FN float apply(float x) { return -x; }
    static HK_CORE_FN int apply(int x) { return (int)(0u - (u32)x); }
};
struct op_abs {
    static HK_CORE_FN float apply(float x) { return hw::fabs(x); }
    static HK_CORE_FN int apply(int x) { return x < 0 ? (int)(0u - (u32)x) : x; }
};
struct op_relu {   // torch.clamp_min(x, 0): NaN stays NaN, -0 stays -0
    static HK_CORE_FN float apply(float x) { return x < 0.0f ? 0.0f : x; }
    static HK_CORE_FN int apply(int x) { return x < 0 ? 0 : x; }
};
struct op_exp { static HK_CORE_FN float apply(float x) { return hw::exp(x); } };
struct op_exp2 { static HK_CORE_FN float apply(float x) { return hw::exp2(x); } };
struct op_log { static HK_CORE_FN float apply(float x) { return hw::log(x); } };
struct op_log2 { static HK_CORE_FN float apply(float x) { return hw::log2(x); } };
struct op_sqrt { static HK_CORE_FN float apply(float x) { return hw::sqrt(x); } };
struct op_rsqrt { static HK_CORE_FN float apply(float x) { return hw::fdiv(1.0f, hw::sqrt(x)); } };   // torch: 1/sqrt
struct op_tanh { static HK_CORE_FN float apply(float x) { return hw::tanh(x); } };
struct op_sigmoid { static HK_CORE_FN float apply(float x) { return hw::fdiv(1.0f, 1.0f + hw::exp(-x)); } };
struct op_not { static HK_CORE_FN bool apply(bool x) { return !x; } };

struct op_add {
    static HK_CORE_FN float apply(float a, float b) { return hw::fadd(a, b); }
    static HK_CORE_FN int apply(int a, int b) { return iadd(a, b); }
};
struct op_sub {
    static HK_CORE_FN float apply(float a, float b) { return hw::fsub(a, b); }
    static HK_CORE_FN int apply(int a, int b) { return isub(a, b); }
};
struct op_mul {
    static HK_CORE_FN float apply(float a, float b) { return hw::fmul(a, b); }
    static HK_CORE_FN int apply(int a, int b) { return imul(a, b); }
};
struct op_div {
    static HK_CORE_FN float apply(float a, float b) { return hw::fdiv(a, b); }
    static HK_CORE_FN int apply(int a, int b) { return b == 0 ? 0 : a / b; }
};
struct op_maximum {   // torch.fmax, NaN payloads included (scalar.h)
    static HK_CORE_FN float apply(float a, float b) { return nan_ignoring_max(a, b); }
    static HK_CORE_FN int apply(int a, int b) { return a > b ? a : b; }
};
struct op_minimum {
    static HK_CORE_FN float apply(float a, float b) { return nan_ignoring_min(a, b); }
    static HK_CORE_FN int apply(int a, int b) { return a < b ? a : b; }
};
struct op_and { static HK_CORE_FN bool apply(bool a, bool b) { return a && b; } };
struct op_or { static HK_CORE_FN bool apply(bool a, bool b) { return a || b; } };

#define HK_CORE_CMP(NAME, OP)                                                    \
    struct NAME {                                                               \
        static HK_CORE_FN bool apply(float a, float b) { return a OP b; }       \
        static HK_CORE_FN bool apply(int a, int b) { return a OP b; }           \
    };
HK_CORE_CMP(op_lt, <)
HK_CORE_CMP(op_le, <=)
HK_CORE_CMP(op_gt, >)
HK_CORE_CMP(op_ge, >=)
HK_CORE_CMP(op_eq, ==)
HK_CORE_CMP(op_ne, !=)
#undef HK_CORE_CMP

}  // namespace hk
