// hk_core/divider.h -- division by a divisor fixed before a loop, as one multiply-high, an add and a shift
// (Granlund and Montgomery's round-up method). A persistent block divides by the same runtime values (grid
// extents, a GQA group) at every tile; a hardware-less 32-bit division is some twenty instructions around a
// reciprocal, whose unit the softmax's exponentials keep busy. The divider is built once per block.
namespace hk {

// n / d for every 32-bit n, d >= 1: with s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1 (below 2^32),
// n / d = (mulhi(n, m) + n) >> s, the sum taken in 64 bits.
struct udivider {
    u32 d = 1, m = 1;
    int s = 0;
    udivider() = default;
    HK_CORE_FN explicit udivider(u32 divisor) : d(divisor ? divisor : 1) {
        while (s < 32 && (1ull << s) < d) ++s;
        m = (u32)(((((u64)1 << s) - d) << 32) / d + 1);
    }
    HK_CORE_FN u32 quot(u32 n) const { return (u32)(((((u64)n * m) >> 32) + n) >> s); }
    HK_CORE_FN u32 rem(u32 n) const { return n - quot(n) * d; }
};

// Python's floor division and modulo (scalar.h's floordiv / floormod) by an int fixed once: the divider where
// both operands are non-negative (a grid index by a positive extent), scalar.h's general rule otherwise.
struct divider {
    int b;
    udivider u;
    HK_CORE_FN explicit divider(int divisor) : b(divisor), u(divisor > 0 ? (u32)divisor : 1u) {}
    HK_CORE_FN int floordiv(int a) const { return (a >= 0 && b > 0) ? (int)u.quot((u32)a) : hk::floordiv(a, b); }
    HK_CORE_FN int floormod(int a) const { return (a >= 0 && b > 0) ? (int)u.rem((u32)a) : hk::floormod(a, b); }
};

}  // namespace hk
