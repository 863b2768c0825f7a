// hk_core/philox.h -- Philox4x32-10 and the dropout keep test of interface/numerics.py:
// keep element g iff (word0(philox(counter = (g_lo, g_hi, 0, 0), key = seed)) >> 8) >= floor(p * 2^24).
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

HK_CORE_FN u32 philox_word0(u32 c0, u32 c1, u32 k0, u32 k1) {
    u32 c2 = 0, c3 = 0;
    HK_PHILOX_LOOP
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        u32 hi0, lo0, hi1, lo1;
        mulhilo(0xD2511F53u, c0, hi0, lo0);
        mulhilo(0xCD9E8D57u, c2, hi1, lo1);
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    }
    return c0;
}
// floor(p * 2^24) for p > 0, else 0 (NaN too); exact in f32 (a power-of-two scaling, then floor)
HK_CORE_FN float dropout_threshold(float p) { return p > 0.0f ? hw::floor(p * 16777216.0f) : 0.0f; }
HK_CORE_FN bool dropout_keep(u64 g, u32 seed_lo, u32 seed_hi, float threshold) {
    const u32 x = philox_word0((u32)g, (u32)(g >> 32), seed_lo, seed_hi);
    return (float)(x >> 8) >= threshold;
}

}  // namespace hk
