// hk_cuda/wgmma.cuh -- Hopper (sm_90a) warpgroup mma from shared memory: matrix descriptors of the st
// block layout (SWIZZLE_128B), the fences and the group wait. The instruction itself, one per
// accumulator width N and dtype, is rendered by the cuda codegen for the widths a kernel uses
// (backends/cuda/wgmma.py: `wgmma_op<T, N>::run<TRANS_A, TRANS_B>(d, desc_a, desc_b)`).
namespace hk {

#if HK_ASYNC_TENSOR_CORE     // TMA, mbarrier rings, wgmma (archs.Arch.async_tensor_core)
#define HK_WGMMA 1
typedef unsigned long long u64;

template <class T, int N> struct wgmma_op;     // rendered per (dtype, N) by the codegen: A from shared
template <class T, int N> struct wgmma_op_rs;  // A from registers
template <class TA_, class TB_, int N> struct wgmma_op8;   // fp8 (any two formats): both K-major in shared

HK_DEV void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
HK_DEV void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> HK_DEV void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// orders this thread's generic-proxy shared writes (cp.async, st.shared) before async-proxy reads (wgmma)
HK_DEV void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// After the wait that retires a wgmma group: its accumulator's registers are read from here on. The
// empty asm is ordered after the (volatile) wait and every later read depends on its outputs, so the
// compiler cannot move a read of the accumulator above the wait.
template <int M, int N, class L> HK_DEV void fence_operand(rt<float, M, N, L>& t) {
#pragma unroll
    for (int i = 0; i < rt<float, M, N, L>::SIZE; ++i) asm volatile("" : "+f"(t.d.v[i])::"memory");
}

// A matrix descriptor (PTX ISA, "matrix descriptor format"): start address, leading and stride byte
// offsets (all >> 4) and the swizzle mode (1: 128B). The start may sit inside a swizzle atom (a k-step
// 32 bytes into a 128-byte line); the tile base is 1024-aligned, so the base-offset field stays 0.
HK_DEV u64 gmma_desc(const unsigned char* p, int lbo, int sbo) {
    return (u64)((smem_addr(p) & 0x3FFFFu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) | (1ull << 62);
}
// K-major operand (tile rows: M or N; columns: K): rows from row0, k-step kk (32 bytes: 16 bf16/f16 or
// 32 fp8 elements). 8-row groups are 1024 bytes apart (SBO); the leading offset is unused with this swizzle.
template <class T, int R, int C> HK_DEV u64 desc_k_major(const st<T, R, C>& s, int row0, int kk) {
    const int kb = kk * 32;
    return gmma_desc(s.ptr + ((kb >> 7) * R + row0) * 128 + (kb & 127), 16, 1024);
}
// MN-major operand (tile rows: K; columns: M or N): columns from col0, k-step kk (16 rows of 128 bytes).
// 64-element column blocks are R*128 bytes apart (LBO), 8-row groups of K 1024 bytes (SBO).
template <class T, int R, int C> HK_DEV u64 desc_mn_major(const st<T, R, C>& s, int col0, int kk) {
    return gmma_desc(s.ptr + (((col0 * (int)sizeof(T)) >> 7) * R + kk * 16) * 128, R * 128, 1024);
}

// Whether mma(dst, a, b) runs as wgmma: shared operands in the block layout, whole warpgroups, each
// accumulator slot a 64-row slice held by the four warps of one warpgroup (rt's layout gives that when
// M % 64 == 0), N a wgmma width, and an MN-major B spanning whole 64-column blocks.
template <bool TA, bool TB, int M, int N, class AOp, class BOp> struct wgmma_fits {
    static constexpr bool value = false;
};
// fp8 operands: wgmma reads them K-major only (A as M x K, B as N x K: !TA and TB), any two formats.
template <bool TA, bool TB, int M, int N, class TA_, int AR, int AC, class TB_, int BR, int BC>
struct wgmma_fits<TA, TB, M, N, st<TA_, AR, AC>, st<TB_, BR, BC>> {
    static constexpr bool types = is_fp8<TA_>::value ? (is_fp8<TB_>::value && !TA && TB) : same<TA_, TB_>::value;
    static constexpr bool value = types && NUM_WARPS % 4 == 0 && M % 64 == 0 && N % 8 == 0 && N <= 256 &&
                                  st<TA_, AR, AC>::BLOCKED && st<TB_, BR, BC>::BLOCKED;
};

// Register A (not transposed): the rt's fragments are mma.sync's A layout per warp, which is what wgmma
// takes from registers; B a shared tile in the block layout.
template <bool TA, bool TB, int M, int N, class T, int AR, int AC, int BR, int BC>
struct wgmma_fits<TA, TB, M, N, rt<T, AR, AC>, st<T, BR, BC>> {
    static constexpr bool value = !TA && !is_fp8<T>::value && NUM_WARPS % 4 == 0 && M % 64 == 0 &&
                                  N % 8 == 0 && N <= 256 && st<T, BR, BC>::BLOCKED;
};

template <class X> struct a_in_registers { static constexpr bool value = false; };
template <class T, int R, int C> struct a_in_registers<rt<T, R, C>> { static constexpr bool value = true; };

// B's descriptor for k-step kk (B is always a shared tile)
template <bool TB, class T, int R, int C> HK_DEV u64 desc_b(const st<T, R, C>& b, int kk) {
    return TB ? desc_k_major(b, 0, kk) : desc_mn_major(b, 0, kk);
}

// One k-step of slot k, A from a descriptor (shared). A from registers: mma_wgmma packs the rt's fragments
// (a_frag_rt, mma.cuh, found at instantiation by ADL; TA is false there, wgmma_fits).
template <bool TA, bool TB, int N, class TA_, int AR, int AC, class TB_, int BR, int BC>
HK_DEV void wgmma_step(float* d, const st<TA_, AR, AC>& a, const st<TB_, BR, BC>& b, int k, int row0, int kk) {
    const u64 da = TA ? desc_mn_major(a, row0, kk) : desc_k_major(a, row0, kk);
    const u64 db = desc_b<TB>(b, kk);
    if constexpr (is_fp8<TA_>::value) wgmma_op8<TA_, TB_, N>::run(d, da, db);
    else wgmma_op<TA_, N>::template run<TA ? 1 : 0, TB ? 0 : 1>(d, da, db);
}

// A shared operand's descriptors computed where the wgmma is issued: of a buffer loaded once before a loop (the
// attention backward's K and V) they are the same in every iteration, and hoisted out of it they held a register
// each per k-step across the loop (about 20 at D = 128), which spilled next to dK's and dV's accumulators.
template <class T, int R, int C> HK_DEV st<T, R, C> issued_here(const st<T, R, C>& s) {
    return st<T, R, C>{unhoisted(s.ptr)};
}
template <class X> HK_DEV const X& issued_here(const X& x) { return x; }

// dst += op(a) op(b) in k-steps of 32 bytes: each warpgroup issues one m64nNk16 (k32 for fp8) per k-step
// and slot.
// MODE 0: shared operands may have just been written by any thread (generic proxy): fence and barrier
// first. MODE 1/2: a pipeline published them. MODE 2 leaves the group in flight (the pipeline retires it).
template <bool TA, bool TB, int K, int MODE, int M, int N, class AOp, class BOp>
HK_DEV void mma_wgmma(rt<float, M, N>& dst, const AOp& a_in, const BOp& b_in) {
    const auto& a = issued_here(a_in);
    const auto& b = issued_here(b_in);
    typedef rt<float, M, N> ACC;
    typedef typename BOp::dtype T;
    if constexpr (MODE == 0) {
        fence_proxy_async();
        sync();
    }
    constexpr int KS = K * (int)sizeof(T) / 32;          // k-steps
    constexpr bool REG_A = a_in_registers<AOp>::value;
    // A from registers: its fragments are packed before the fence. A register written between the fence and the
    // wgmma reading it makes ptxas add a warpgroup.arrive there, and NVRTC 13.5 serialises every wgmma of the
    // kernel when that lands on a divergent path (C7520: attention's P·V on FA3's schedule).
    u32 af[REG_A ? ACC::SLOTS : 1][REG_A ? KS : 1][4];
    if constexpr (REG_A) {
#pragma unroll
        for (int k = 0; k < ACC::SLOTS; ++k)
#pragma unroll
            for (int kk = 0; kk < KS; ++kk)
                if (ACC::L::valid(k)) a_frag_rt(af[k][kk], a, k, kk);
    }
    wgmma_fence();                                       // the accumulator (and A) registers were just written
#pragma unroll
    for (int k = 0; k < ACC::SLOTS; ++k) {
        if (!ACC::L::valid(k)) continue;                 // uniform per warpgroup (M % 64 == 0)
        const int row0 = (ACC::L::block(k) >> 2) * 64;
        float* d = &dst.d[ACC::idx(k, 0, 0)];
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            if constexpr (REG_A) wgmma_op_rs<T, N>::template run<TB ? 0 : 1>(d, af[k][kk], desc_b<TB>(b, kk));
            else wgmma_step<TA, TB, N>(d, a, b, k, row0, kk);
        }
    }
    wgmma_commit();
    if constexpr (MODE != 2) wgmma_wait<0>();
}
#endif  // HK_ASYNC_TENSOR_CORE

}  // namespace hk
