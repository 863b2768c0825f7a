// hk_cuda/instructions.cuh -- raw instruction wrappers: thread and block ids, barriers, the dynamic shared
// memory base, cp.async, ldmatrix, mma.sync m16n8k16, warp shuffles (PTX; the emulator's lane-accurate
// versions under HK_EMULATOR).
#define HK_INF __uint_as_float(0x7F800000u)
#define HK_NAN __uint_as_float(0x7FC00000u)

namespace hk {

constexpr int NUM_WARPS = HK_NUM_WARPS;
constexpr int NUM_THREADS = HK_NUM_WARPS * 32;

HK_DEV int lane_id() { return threadIdx.x & 31; }
HK_DEV int warp_id() { return threadIdx.x >> 5; }

// x, through an identity the compiler cannot see through: addresses made from it inside a loop are computed where
// they are used, not hoisted out of the loop and held in registers (or spilled) across a pipeline's compute region.
template <class X> HK_DEV X unhoisted(X x) {
#ifdef HK_PTX
    if constexpr (sizeof(X) == 8) asm volatile("mov.b64 %0, %0;" : "+l"(x));
    else asm volatile("mov.b32 %0, %0;" : "+r"(x));
#endif
    return x;
}

// The block's tile indices: the grid's order is tile_order.cuh's (HK_BLOCK_GROUPED, HK_DISPATCH_AXIS).
template <int A> HK_DEV int block_idx() {
    if constexpr (HK_BLOCK_GROUPED && A < 2) {
        unsigned x, y;
        grouped_xy<unsigned>(blockIdx.x + gridDim.x * blockIdx.y, gridDim.x, plain_div<unsigned>(BLOCK_GROUP * gridDim.y),
                             plain_div<unsigned>(group_tail(gridDim.x)), x, y);
        return (int)(A == 0 ? x : y);
    }
    return dispatched_idx<A>(blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z);
}
template <int A> HK_DEV int num_blocks() { return A == 0 ? gridDim.x : (A == 1 ? gridDim.y : gridDim.z); }

#ifdef HK_PTX
#if HK_PRODUCER_WARPS
// A warp-specialised kernel (tma.cuh): the producer warpgroup has left by the time the Program's code
// synchronises, so its barriers name the consumer threads only (barrier 1; 0 is __syncthreads).
HK_DEV void sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(NUM_THREADS) : "memory"); }
#else
HK_DEV void sync() { __syncthreads(); }
#endif

HK_DEV u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
HK_DEV unsigned char* smem_base() {
    extern __shared__ __align__(1024) unsigned char hk_dynamic_smem[];
#if HK_ASYNC_TENSOR_CORE     // TMA, mbarrier rings, wgmma (archs.Arch.async_tensor_core)
    // wgmma's 128-byte swizzle repeats every 1024 bytes of shared address: the arena starts on such a
    // boundary whatever the window's own alignment (the launch reserves SMEM_BASE_SLACK for this)
    return hk_dynamic_smem + ((1024u - (smem_addr(hk_dynamic_smem) & 1023u)) & 1023u);
#else
    return hk_dynamic_smem;
#endif
}

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

template <class X> HK_DEV X shfl_xor(X v, int m) { return __shfl_xor_sync(0xFFFFFFFFu, v, m); }

}  // namespace hk
