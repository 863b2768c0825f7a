// hk_core/philox.h -- Philox4x32-10 and the dropout keep test of interface/numerics.py:
// element g (64-bit) takes word (g mod 4) of philox(counter = (lo32(g/4), hi32(g/4), 0, 0), key = seed) and is
// kept iff (word >> 8) >= floor(p * 2^24). One call serves elements 4q..4q+3 (curand_uniform4's draw), so a
// thread reuses it across the elements of a group it holds (dropout_stream).
// HK_PHILOX_LOOP (a vendor hook) is the pragma in front of the 10 rounds: unrolled where the key schedule
// costs nothing, a real loop where it would become 20 loop invariants in scalar registers.
#ifndef HK_PHILOX_LOOP
#define HK_PHILOX_LOOP
#endif
namespace hk {

// the 64-bit product m * x in halves; HK_HW_MULHI (a vendor hook) is a high-half multiply instruction
HK_CORE_FN void mulhilo(u32 m, u32 x, u32& hi, u32& lo) {
#ifdef HK_HW_MULHI
    hi = HK_HW_MULHI(m, x);
    lo = m * x;
#else
    const u64 p = (u64)m * x;
    hi = (u32)(p >> 32);
    lo = (u32)p;
#endif
}

// the four output words of Philox4x32-10 at counter (c0, c1, 0, 0): the dropout counter's upper words are 0
struct philox4 { u32 w0, w1, w2, w3; };
HK_CORE_FN philox4 philox4x32_10(u32 c0, u32 c1, u32 k0, u32 k1) {
    u32 c2 = 0, c3 = 0;
    HK_PHILOX_LOOP
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        u32 hi0, lo0, hi1, lo1;
        mulhilo(0xD2511F53u, c0, hi0, lo0);
        mulhilo(0xCD9E8D57u, c2, hi1, lo1);
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    }
    return philox4{c0, c1, c2, c3};
}
// word i of x by selects, not an indexed array: a runtime index into registers would go to local memory
HK_CORE_FN u32 philox_word(const philox4& x, u32 i) {
    const u32 lo = (i & 1u) ? x.w1 : x.w0, hi = (i & 1u) ? x.w3 : x.w2;
    return (i & 2u) ? hi : lo;
}
// floor(p * 2^24) for p > 0, else 0 (NaN too); exact in f32 (a power-of-two scaling, then floor)
HK_CORE_FN float dropout_threshold(float p) { return p > 0.0f ? hw::floor(p * 16777216.0f) : 0.0f; }
// the 32 random bits of element g
HK_CORE_FN u32 dropout_bits(u64 g, u32 seed_lo, u32 seed_hi) {
    const u64 q = g >> 2;
    return philox_word(philox4x32_10((u32)q, (u32)(q >> 32), seed_lo, seed_hi), (u32)g & 3u);
}
HK_CORE_FN bool dropout_keep(u64 g, u32 seed_lo, u32 seed_hi, float threshold) {
    return (float)(dropout_bits(g, seed_lo, seed_hi) >> 8) >= threshold;
}

// The keep test over one thread's elements in any order, with the last call kept: consecutive elements
// of one group (a register pair (c, c+1) of an mma fragment, a row vector's run) share its Philox call.
// Which elements share a group depends on offset, row stride and the tile's origin at run time, so the
// reuse is a compare, not a compile-time plan; the bits are those of dropout_keep whatever the order.
struct dropout_stream {
    u32 seed_lo, seed_hi;
    float threshold;
    u64 q;            // the group of the call held; ~0 (no group: g / 4 < 2^62) before the first
    philox4 x;
    HK_CORE_FN dropout_stream(u32 s_lo, u32 s_hi, float thr)
        : seed_lo(s_lo), seed_hi(s_hi), threshold(thr), q(~0ull), x{0u, 0u, 0u, 0u} {}
    HK_CORE_FN bool keep(u64 g) {
        if ((g >> 2) != q) {
            q = g >> 2;
            x = philox4x32_10((u32)q, (u32)(q >> 32), seed_lo, seed_hi);
        }
        return (float)(philox_word(x, (u32)g & 3u) >> 8) >= threshold;
    }
};

}  // namespace hk
