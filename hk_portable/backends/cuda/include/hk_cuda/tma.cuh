// hk_cuda/tma.cuh -- Hopper (sm_90a) bulk tensor copies: tensor maps passed as kernel parameters,
// mbarriers with transaction counts, and the TMA pipeline schedule (schedule.py decides which pipelines
// take it; the cp.async ring in pipelines.cuh stays the fallback compiled into the same kernel).
namespace hk {

#if HK_ASYNC_TENSOR_CORE     // TMA, mbarrier rings, wgmma (archs.Arch.async_tensor_core)
// CUtensorMap: 128 opaque bytes, 64-byte aligned, encoded on the host (tma.py) and passed by value as a
// __grid_constant__ kernel parameter, so its generic address is valid for cp.async.bulk.tensor.
struct alignas(64) tmap { unsigned long long opaque[16]; };

HK_DEV void mbar_init(u64* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
HK_DEV void mbar_inval(u64* bar) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// makes the initialised barriers visible to the async proxy (the TMA unit) before first use
HK_DEV void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// one arrival that also expects `bytes` of transactions in this phase
HK_DEV void mbar_expect_tx(u64* bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
// one plain arrival (a consumer warp releasing a stage)
HK_DEV void mbar_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
HK_DEV bool mbar_try_wait(u64* bar, int parity) {
    u32 done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    return done != 0;
}
HK_DEV void mbar_wait(u64* bar, int parity) {
    while (!mbar_try_wait(bar, parity)) {}
}

// One box (coordinates innermost first, in elements) into shared memory, completing on `bar`.
template <int RANK> HK_DEV void tma_box(void* dst, const tmap& tm, u64* bar, const int (&c)[RANK]) {
    const u32 d = smem_addr(dst), b = smem_addr(bar);
    const unsigned long long m = reinterpret_cast<unsigned long long>(&tm);
    if constexpr (RANK == 2)
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                     ::"r"(d), "l"(m), "r"(c[0]), "r"(c[1]), "r"(b) : "memory");
    else if constexpr (RANK == 3)
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                     ::"r"(d), "l"(m), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(b) : "memory");
    else
        asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                     ::"r"(d), "l"(m), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(b) : "memory");
}

// GL -> ST by TMA (one thread): the tile at tile index idx... (the indices of hk::load), one box per
// 128-byte column block of the st layout. Out-of-bounds elements, leading indices included, read 0:
// the tensor map's bounds do what origin's row_ok/col_ok do for cp.async.
template <class T, int R, int C, class... I>
HK_DEV void tma_load(const st<T, R, C>& dst, const tmap& tm, u64* bar, I... idx) {
    static_assert(st<T, R, C>::BLOCKED && sizeof(T) <= 2, "TMA loads fill 16-bit or fp8 tiles of the block layout");
    constexpr int RANK = sizeof...(I), BLOCK_COLS = 128 / (int)sizeof(T);
    const int ix[RANK] = {idx...};
    int c[RANK];
#pragma unroll
    for (int d = 0; d < RANK - 2; ++d) c[RANK - 1 - d] = ix[d];   // leading dims, outermost last
    c[1] = ix[RANK - 2] * R;
#pragma unroll
    for (int j = 0; j < C / BLOCK_COLS; ++j) {
        c[0] = ix[RANK - 1] * C + j * BLOCK_COLS;
        tma_box<RANK>(dst.ptr + j * R * 128, tm, bar, c);
    }
}

// A ring of S stages' barriers, initialised by the calling thread: full[s] takes one arrival (the thread
// that arms it with the stage's bytes), empty[s] one per consumer warp. The caller publishes them with a
// barrier before first use.
template <int S> HK_DEV void init_ring(u64* full, u64* empty) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
        mbar_init(&full[s], 1);
        mbar_init(&empty[s], NUM_WARPS);
    }
    fence_mbar_init();
}
// This warp is done with a stage: one arrival on its empty barrier.
HK_DEV void release_stage(u64* empty) {
    __syncwarp();
    if (lane_id() == 0) mbar_arrive(empty);
}

// A TMA ring of S stages, each with a full barrier that thread 0 arms with the stage's byte count before issuing
// its copies (everyone waits on its phase) and an empty barrier on which each warp arrives once it is done with
// the stage. No block barrier inside the loop: only thread 0 waits for the slowest warp, the others run ahead on
// the stages in flight. The step count `it` may run across a run of pipelines on one ring (schedule.py
// _ring_runs: attention's leading edge, full blocks and diagonal): the barriers are set up once (ring_open) and
// torn down once (ring_close), ring_steps runs each pipeline's steps, and load(t, s, bar) takes the ring's step t,
// so each pipeline's first copies are issued while the one before computes. A pipeline on a ring of its own is the
// same with one ring_steps (pipeline_tma).
//
// Thread 0: step nx of `total` into its stage once every warp released the stage's previous step, nx - S.
template <int S, int TX, class L> HK_DEV void ring_refill(int nx, int total, u64* full, u64* empty, L& load) {
    if (threadIdx.x != 0 || nx >= total) return;
    const int t = nx % S;
    if (nx >= S) mbar_wait(&empty[t], ((nx - S) / S) & 1);
    mbar_expect_tx(&full[t], TX);
    load(nx, t, &full[t]);
}
template <int S, int TX, class L> HK_DEV void ring_open(u64* full, u64* empty, int total, L& load) {
    static_assert(S >= 2, "the TMA schedule prefetches S - 1 stages (schedule.py gives it 2 or more)");
    fence_proxy_async();                       // generic writes before the ring, then publish
    if (threadIdx.x == 0) init_ring<S>(full, empty);
    sync();
#pragma unroll
    for (int p = 0; p < S - 1; ++p) ring_refill<S, TX>(p, total, full, empty, load);
}
// n steps. When a step's mma waits for itself (not ASYNC) the warp is done with stage it % S when compute returns
// and releases it then, and thread 0 refills the stage of step it - 1 with step it + S - 1 before computing step
// it, so each copy has a whole step to land (refilled after the step instead, two stages leave every step waiting
// on its own copy: 17 % of the 64x64 attention block's stall samples at D64 causal N1024, ncu, H200, 2026-12-04).
// ASYNC (an accumulator chain left in flight): stage it - 1 is free only once compute's wait retired group it - 1,
// so its refill follows compute, and the last step is retired and released when the pipeline ends.
template <int S, int TX, bool ASYNC, class L, class C>
HK_DEV void ring_steps(u64* full, u64* empty, int& it, int total, int n, L& load, C& compute) {
    for (int i = 0; i < n; ++i, ++it) {
        const int s = it % S;
        if constexpr (!ASYNC) ring_refill<S, TX>(it + S - 1, total, full, empty, load);
        mbar_wait(&full[s], (it / S) & 1);
        compute(i, s);
        if constexpr (ASYNC) {
            wgmma_wait<1>();
            if (i > 0) release_stage(&empty[(it - 1) % S]);
            ring_refill<S, TX>(it + S - 1, total, full, empty, load);
        } else {
            release_stage(&empty[s]);
        }
    }
    if constexpr (ASYNC) {                     // the carry is read after the pipeline: retire its last product
        wgmma_wait<0>();
        if (n > 0) release_stage(&empty[(it - 1) % S]);
    }
}
template <int S> HK_DEV void ring_close(u64* full, u64* empty) {
    if constexpr (NUM_WARPS % 4 == 0) wgmma_wait<0>();   // whole warpgroups only (synccheck: a 1-warp
    sync();                                    // block may not execute it); every wait is done, buffers reusable
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < S; ++s) {
            mbar_inval(&full[s]);
            mbar_inval(&empty[s]);
        }
    }
}
// Copies issued before a run (cp.async into buffers the run does not stage: attention's Q) become visible to every
// thread, and to wgmma's async proxy, once the run's first copies are in flight too (schedule.py late_publish).
HK_DEV void publish_copies() {
    async_wait_all();
    fence_proxy_async();
    sync();
}

namespace detail {
// One pipeline on a ring of its own.
template <int S, int TX, bool ASYNC> struct pipeline_tma {
    template <class L, class C> static HK_DEV void run(int n, L& load, C& compute) {
        __shared__ u64 full[S], empty[S];
        ring_open<S, TX>(full, empty, n, load);
        int it = 0;
        ring_steps<S, TX, ASYNC>(full, empty, it, n, n, load, compute);
        ring_close<S>(full, empty);
    }
};
}  // namespace detail

// Warp-specialised kernels (schedule.py's _specialisable; the emitter's _specialised_body): the block runs
// one producer warpgroup after the Program's NUM_WARPS warps. Its first thread runs the Program's scalars
// and issues every pipeline's TMA copies into one ring of S stages, each as soon as the stage's empty
// barrier says all consumer warps are done with it; the warpgroup gives its registers back (setmaxnreg.dec
// to PREGS) and exits, so it never runs the Program's other code (the library's sync() is a named barrier
// of the consumer threads in such a kernel). The consumers take the registers (setmaxnreg.inc to CREGS)
// and only wait on full barriers. PREGS == 0: no register hand-over (the consumers already have all one
// block can give). The step counter `it` runs across the kernel's pipelines, which share the ring.
template <int PREGS> HK_DEV void setmaxnreg_dec() {
    if constexpr (PREGS > 0) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PREGS));
}
template <int CREGS> HK_DEV void setmaxnreg_inc() {
    if constexpr (CREGS > 0) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CREGS));
}
HK_DEV bool producer_thread() { return threadIdx.x >= NUM_THREADS; }
// A producer thread leaves the kernel: no barrier after this point counts it.
HK_DEV void exit_thread() {
    asm volatile("exit;\n");
    __builtin_unreachable();
}

// The barriers of a specialised ring, armed by the producer: every thread of the block, producer
// included, calls this.
template <int S> HK_DEV void ws_init(u64* full, u64* empty) {
    if (threadIdx.x == NUM_THREADS) init_ring<S>(full, empty);
    __syncthreads();
}
// The producer's n loads (one thread): step `it` of the ring fills stage it % S once its previous use,
// step it - S, has been released by every consumer warp.
template <int S, int TX, class L> HK_DEV void ws_produce(int n, int& it, u64* full, u64* empty, L& load) {
    for (int i = 0; i < n; ++i, ++it) {
        const int s = it % S;
        if (it >= S) mbar_wait(&empty[s], (it / S - 1) & 1);
        mbar_expect_tx(&full[s], TX);
        load(i, s, &full[s]);
    }
}
// A consumer warp's n steps. First the warp's own generic-proxy writes before the pipeline (a tile
// loaded into LDS for every step, like attention's Q) are fenced and published to the consumers: wgmma
// reads them through the async proxy. ASYNC (an accumulator chain): compute(i) leaves its wgmma group in
// flight and stage i - 1 is released once group i - 1 retired, the last after the final wait; else
// compute(i) is done with its stage when it returns.
template <int S, bool ASYNC, class C> HK_DEV void ws_consume(int n, int& it, u64* full, u64* empty, C& compute) {
    fence_proxy_async();
    sync();
    for (int i = 0; i < n; ++i, ++it) {
        const int s = it % S;
        mbar_wait(&full[s], (it / S) & 1);
        compute(i, s);
        if constexpr (ASYNC) {
            wgmma_wait<1>();
            if (i > 0) release_stage(&empty[(it - 1) % S]);
        } else {
            release_stage(&empty[s]);
        }
    }
    if constexpr (ASYNC) {
        wgmma_wait<0>();
        if (n > 0) release_stage(&empty[(it - 1) % S]);
    }
}

// A split ring (schedule.py RingGroup): G groups of S stages, group g's barriers at full/empty + g*S, each
// filled and released on its own (attention: K once QKᵀ retired, V once PV did). The step counter `it` is the
// ring index; every group's phase at step it is (it / S) & 1. The producer acquires a group's stage before
// its copies (waiting for step it - S's release), a consumer waits before the group's reader and releases after.
template <int S> HK_DEV u64* ring_acquire(u64* full, u64* empty, int it, int tx) {
    const int s = it % S;
    if (it >= S) mbar_wait(&empty[s], (it / S - 1) & 1);
    mbar_expect_tx(&full[s], tx);
    return &full[s];
}
template <int S> HK_DEV void ring_wait(u64* full, int it) { mbar_wait(&full[it % S], (it / S) & 1); }
template <int S> HK_DEV void ring_release(u64* empty, int it) { release_stage(&empty[it % S]); }
// The producer's n steps of a split ring: load(i, s) acquires each group itself.
template <int S, class L> HK_DEV void ws_produce_split(int n, int& it, L& load) {
    for (int i = 0; i < n; ++i, ++it) load(i, it % S);
}
// Ping-pong (FA3): the W consumer warpgroups take turns issuing their step's wgmma, so one warpgroup's
// softmax runs while the next one's products are on the tensor cores. Named barrier 2 + w is warpgroup w's
// turn: w waits on it (128 threads) and warpgroup w - 1 arrives on it (128 more) after issuing. Warpgroup W - 1
// hands the first turn to warpgroup 0 (turns_begin) and warpgroup 0 takes the last hand-over back
// (turns_end), so every barrier's arrivals balance within one pipeline. Barrier 1 is sync()'s.
HK_DEV int warpgroup_id() { return threadIdx.x / 128; }
template <int W> HK_DEV void turn_wait() {
    if constexpr (W > 1) asm volatile("bar.sync %0, 256;\n" ::"r"(2 + warpgroup_id()) : "memory");
}
template <int W> HK_DEV void turn_pass() {
    if constexpr (W > 1) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 + (warpgroup_id() + 1) % W) : "memory");
}
template <int W> HK_DEV void turns_begin() {
    if constexpr (W > 1) if (warpgroup_id() == W - 1) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
}
template <int W> HK_DEV void turns_end() {
    if constexpr (W > 1) if (warpgroup_id() == 0) asm volatile("bar.sync 2, 256;\n" ::: "memory");
}
// A consumer warp's n steps of a software-pipelined compute on a split ring: first, step and last wait,
// release and take their turns themselves (the emitter's _overlap_step); PINGPONG brackets the pipeline with
// the turns (false: no ping-pong, or turns that run on across pipelines and tiles, bracketed by the emitter
// around the consumers' whole code). PUBLISH: the consumers' own shared-memory writes before the pipeline
// are fenced and published first (false: every buffer it reads came by TMA, so the warpgroups need not meet).
template <int S, bool PINGPONG, bool PUBLISH = true, class F, class C, class T>
HK_DEV void ws_consume_overlap_split(int n, int& it, F& first, C& step, T& last) {
    if constexpr (PUBLISH) {
        fence_proxy_async();
        sync();
    }
    if constexpr (PINGPONG) turns_begin<NUM_WARPS / 4>();
    if (n > 0) {
        first(0, it % S);
        for (int i = 1; i < n; ++i) {
            const int prev = it % S;
            ++it;
            step(i, it % S, prev);
        }
        last(it % S);
        ++it;
    }
    if constexpr (PINGPONG) turns_end<NUM_WARPS / 4>();
}

// ---- Registers -> GL through shared memory and TMA (schedule.py Plan.tma_stores: a specialised kernel's
// epilogue). Each consumer warpgroup writes its own 64 rows of the tile (warp w holds rows 16w..16w+15, the
// wgmma accumulator's layout) one 64-column chunk (a 128-byte column block) at a time into one of its two chunk
// buffers, then one of its threads stores the chunk with a bulk tensor copy and the warpgroup goes on to the
// next chunk: the copy reads shared memory while the warpgroup writes the other buffer or starts its next tile,
// and the tensor map drops what lies outside the tensor (ragged edges). Before writing a buffer again the
// warpgroup waits until the copy that last read it has (each chunk is its own bulk group, so that is all but the
// newest group; at a tile's first chunk, every group: the last tile's copies are long done, and a store of another
// shape may have used the buffers); store_tma_drain, at the end, until every copy has. BUFS (1 or 2) 8 KiB buffers
// a warpgroup whatever the tile's width, the same for every store of a kernel (schedule.tma_store_buffers): a
// 128x256 GEMM tile fits beside a 4-stage ring. Named barrier 8 + w is warpgroup w's own (1: sync(), 2 + w: the ping-pong's turns).
// A box of shared memory written into a tensor by TMA, one function per operation: HEAD names it, TAIL its completion
// (and, for a reduce, its operator): the same three ranks for the store (epilogues) and the reduce-add (dQ).
#define HK_TMA_WRITE_BOX(NAME, HEAD, TAIL)                                                                       \
    template <int RANK> HK_DEV void NAME(const void* src, const tmap& tm, const int (&c)[RANK]) {                \
        const u32 s = smem_addr(src);                                                                          \
        const unsigned long long m = reinterpret_cast<unsigned long long>(&tm);                                \
        if constexpr (RANK == 2)                                                                               \
            asm volatile(HEAD ".2d.global.shared::cta" TAIL " [%0, {%1, %2}], [%3];\n"                         \
                         ::"l"(m), "r"(c[0]), "r"(c[1]), "r"(s) : "memory");                                   \
        else if constexpr (RANK == 3)                                                                          \
            asm volatile(HEAD ".3d.global.shared::cta" TAIL " [%0, {%1, %2, %3}], [%4];\n"                     \
                         ::"l"(m), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(s) : "memory");                        \
        else                                                                                                   \
            asm volatile(HEAD ".4d.global.shared::cta" TAIL " [%0, {%1, %2, %3, %4}], [%5];\n"                 \
                         ::"l"(m), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(s) : "memory");             \
    }
HK_TMA_WRITE_BOX(tma_store_box, "cp.async.bulk.tensor", ".bulk_group")
HK_TMA_WRITE_BOX(tma_reduce_box, "cp.reduce.async.bulk.tensor", ".add.tile.bulk_group")
#undef HK_TMA_WRITE_BOX
HK_DEV bool store_leader() { return threadIdx.x % 128 == 0; }     // the thread that issues its warpgroup's copies
HK_DEV void warpgroup_sync() { asm volatile("bar.sync %0, 128;\n" ::"r"(8 + warpgroup_id()) : "memory"); }

template <int BUFS, class T, int R, int C, class... I>
HK_DEV void store_tma(unsigned char* stage, const tmap& tm, const rt<T, R, C>& src, I... idx) {
    typedef rt<T, R, C> RT_;
    constexpr int RANK = sizeof...(I), CHUNKS = C / 64;
    static_assert(is16<T>::value && R == 16 * NUM_WARPS && NUM_WARPS % 4 == 0 && C % 64 == 0
                  && (BUFS == 2 || (BUFS == 1 && CHUNKS == 1)),
                  "a TMA-stored tile: 16-bit, one 16-row block per warp, whole 128-byte column blocks");
    typedef st<T, 64, 64> chunk_t;
    unsigned char* mine = stage + warpgroup_id() * BUFS * chunk_t::BYTES;
    const int r0 = (warp_id() % 4) * 16 + (lane_id() >> 2);
    const int ix[RANK] = {idx...};
    int c[RANK];
#pragma unroll
    for (int d = 0; d < RANK - 2; ++d) c[RANK - 1 - d] = ix[d];   // leading dims, outermost last
    c[1] = ix[RANK - 2] * R + warpgroup_id() * 64;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
        const chunk_t buf{mine + (k % BUFS) * chunk_t::BYTES};
        if (store_leader()) {                          // the copy that last read this buffer is done
            if (k == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            else asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
        }
        warpgroup_sync();
#pragma unroll
        for (int j = 8 * k; j < 8 * k + 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<u32*>(buf.at(r0 + h * 8, RT_::col(j, 0) - 64 * k)) =
                    pack2(src.d[RT_::idx(0, j, 2 * h)], src.d[RT_::idx(0, j, 2 * h + 1)]);
        fence_proxy_async();                           // the writes, visible to the copy (async proxy)
        warpgroup_sync();
        if (store_leader()) {
            c[0] = ix[RANK - 1] * C + k * 64;
            tma_store_box<RANK>(buf.ptr, tm, c);
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
    }
}
// ---- Registers += into an f32 GL through shared memory and TMA reduce-add (Plan.tma_reduces: attention_bwd's dQ).
// The chunk buffers are store_tma's (8 KiB: 64 rows of 32 floats, one 128-byte column block), two a warpgroup.
// reduce_tma: the GL is a transposed view and the map describes the tensor it views, so each chunk holds 32 of the
// warpgroup's rows as its columns and the tile's C = 64 columns as its rows; warps 2k and 2k+1 of the warpgroup write
// chunk k (their rows), both at once. reduce_viewed: as viewed, the warpgroup's 64 rows, 32 columns a chunk, as
// store_tma, added by TMA (tm) or, where the launch encoded no map (tm null), by every thread from shared memory.
// The TMA unit adds each chunk into global memory (atomically per element, in L2); out-of-bounds elements are dropped.
template <int BUFS, int R, int C, class... I>
HK_DEV void reduce_tma(unsigned char* stage, const tmap& tm, const rt<float, R, C>& src, I... idx) {
    typedef rt<float, R, C> RT_;
    constexpr int RANK = sizeof...(I);
    static_assert(R == 16 * NUM_WARPS && NUM_WARPS % 4 == 0 && BUFS == 2 && C == 64,
                  "a TMA-added transposed tile: f32, one 16-row block per warp, 64 columns");
    typedef st<float, 64, 32> chunk_t;
    static_assert(chunk_t::BYTES == 64 * 64 * 2, "a reduce chunk is a store chunk's size");
    unsigned char* mine = stage + warpgroup_id() * BUFS * chunk_t::BYTES;
    const int r0 = (warp_id() % 4) * 16 + (lane_id() >> 2);      // this lane's first row within the warpgroup's 64
    if (store_leader()) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    warpgroup_sync();
    const int k = (warp_id() % 4) / 2;                 // this warp's chunk: its 16 rows are among rows 32k..32k+31
    const chunk_t buf{mine + k * chunk_t::BYTES};
#pragma unroll
    for (int j = 0; j < C / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                *buf.at(RT_::col(j, 0) + e, r0 + h * 8 - 32 * k) = src.d[RT_::idx(0, j, 2 * h + e)];
    fence_proxy_async();
    warpgroup_sync();
    if (store_leader()) {
        const int ix[RANK] = {idx...};
        int c[RANK];
#pragma unroll
        for (int d = 0; d < RANK - 2; ++d) c[RANK - 1 - d] = ix[d];   // leading dims, outermost last
        c[1] = ix[RANK - 1] * C;                       // the view's columns: the tensor's rows
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            c[0] = ix[RANK - 2] * R + warpgroup_id() * 64 + 32 * q;    // the view's rows: the tensor's inner dimension
            tma_reduce_box<RANK>(mine + q * chunk_t::BYTES, tm, c);
        }
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    }
}

// reduce_viewed without a map (the launch could encode neither: a view TMA cannot describe): the chunks added into
// global memory from shared memory by the warpgroup's 128 threads, one atomicAdd per element (consecutive threads,
// consecutive columns), out-of-bounds elements skipped. Staged through the chunk buffers rather than added from
// registers, so that the kernel holds registers for two code paths, not three.
template <int BUFS, int R, int C, int RANK, class... I>
HK_DEV void reduce_viewed(unsigned char* stage, const tmap* tm, const gl<float, RANK>& g, const rt<float, R, C>& src,
                          I... idx) {
    typedef rt<float, R, C> RT_;
    static_assert(R == 16 * NUM_WARPS && NUM_WARPS % 4 == 0 && BUFS == 2 && C % 32 == 0,
                  "a staged add: f32, one 16-row block per warp, 32-column chunks");
    typedef st<float, 64, 32> chunk_t;
    unsigned char* mine = stage + warpgroup_id() * BUFS * chunk_t::BYTES;
    const int r0 = (warp_id() % 4) * 16 + (lane_id() >> 2);
#pragma unroll
    for (int k = 0; k < C / 32; ++k) {
        const chunk_t buf{mine + (k % BUFS) * chunk_t::BYTES};
        if (store_leader()) {                          // the copy that last read this buffer is done
            if (k == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            else asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
        }
        warpgroup_sync();                              // and every thread's reads of it
#pragma unroll
        for (int j = 4 * k; j < 4 * k + 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(buf.at(r0 + h * 8, RT_::col(j, 0) - 32 * k)) =
                    make_float2(src.d[RT_::idx(0, j, 2 * h)], src.d[RT_::idx(0, j, 2 * h + 1)]);
        if (tm != nullptr) {                           // the TMA form: one thread adds the chunk
            fence_proxy_async();
            warpgroup_sync();
            if (store_leader()) {
                const int ix[RANK] = {idx...};
                int c[RANK];
#pragma unroll
                for (int d = 0; d < RANK - 2; ++d) c[RANK - 1 - d] = ix[d];
                c[1] = ix[RANK - 2] * R + warpgroup_id() * 64;
                c[0] = ix[RANK - 1] * C + k * 32;
                tma_reduce_box<RANK>(buf.ptr, *tm, c);
                asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
            }
            continue;
        }
        warpgroup_sync();
        const origin<2, float, RANK> o(g, R, C, idx...);    // built here: nothing of it is held across the loop
        const int wr = warpgroup_id() * 64, t = threadIdx.x % 128;
#pragma unroll 1
        for (int e = t; e < 64 * 32; e += 128) {
            const int r = e / 32, c = e % 32;
            if (o.row_ok(wr + r) && o.col_ok(32 * k + c)) atomicAdd(o.at(g, wr + r, 32 * k + c), *buf.at(r, c));
        }
    }
}

// Before the block's shared memory goes: every TMA store has read it.
HK_DEV void store_tma_drain() {
    if (store_leader()) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Run on TMA when the launch encoded every tensor map (use_tma), else on the cp.async ring.
template <int S, int TX, bool ASYNC, class L, class LT, class C>
HK_DEV void pipeline_tma(int n, bool use_tma, L&& load, LT&& load_tma, C&& compute) {
    if (use_tma) detail::pipeline_tma<S, TX, ASYNC>::run(n, load_tma, compute);
    else pipeline<S>(n, load, compute);
}
#endif  // HK_ASYNC_TENSOR_CORE

}  // namespace hk
