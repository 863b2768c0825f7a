// hk_cuda_emu.h -- runs hk_cuda.cuh on the host for tests: one std::thread per CUDA thread of a block,
// block barriers, and warp collectives (shfl, ldmatrix, mma.sync m16n8k16) emulated from the PTX ISA's
// documented lane maps. It checks the library's layout logic, swizzles, bounds and pipelines without a
// GPU; numerics of the matrix unit (accumulation order) are only approximated (bounded tier).
#pragma once
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#define HK_EMULATOR 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct hk_dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local hk_dim3 threadIdx, blockIdx, gridDim;
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline float __uint_as_float(unsigned u) { return __builtin_bit_cast(float, u); }
inline unsigned __float_as_uint(float f) { return __builtin_bit_cast(unsigned, f); }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }

namespace hk_emu {

// A reusable barrier for n threads that aborts (instead of hanging) when not every thread arrives:
// on a GPU that is a deadlock or undefined behaviour (a collective called divergently).
class Barrier {
  public:
    explicit Barrier(int n) : n_(n) {}
    void wait(const char* what) {
        std::unique_lock<std::mutex> lk(m_);
        const unsigned long gen = gen_;
        if (++count_ == n_) {
            count_ = 0;
            ++gen_;
            cv_.notify_all();
            return;
        }
        if (!cv_.wait_for(lk, std::chrono::seconds(60), [&] { return gen_ != gen; })) {
            std::fprintf(stderr, "hk_cuda_emu: %s: only %d of %d threads arrived (divergent barrier/collective)\n",
                         what, count_, n_);
            std::abort();
        }
    }

  private:
    std::mutex m_;
    std::condition_variable cv_;
    int n_, count_ = 0;
    unsigned long gen_ = 0;
};

struct Block {
    int threads = 0;
    unsigned char* smem = nullptr;
    size_t smem_bytes = 0;
    Barrier* block_barrier = nullptr;
    std::vector<Barrier*> warp_barriers;
    std::vector<std::vector<uint64_t>> xch;     // per warp: 32 lanes x 8 words of exchange space
};
inline Block g_block;                             // blocks run one after another
inline thread_local int t_lane = 0, t_warp = 0;

inline void sync() { g_block.block_barrier->wait("__syncthreads"); }
inline unsigned char* smem_base() { return g_block.smem; }

inline void check_smem(const void* p, int bytes, const char* what) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    if (c < g_block.smem || c + bytes > g_block.smem + g_block.smem_bytes) {
        std::fprintf(stderr, "hk_cuda_emu: %s outside the shared arena (offset %lld, %d bytes, arena %zu)\n", what,
                     (long long)(c - g_block.smem), bytes, g_block.smem_bytes);
        std::abort();
    }
    if (((uintptr_t)c & 15) != 0 && bytes == 16) {
        std::fprintf(stderr, "hk_cuda_emu: %s at a shared address not 16-byte aligned\n", what);
        std::abort();
    }
}

inline void cp_async16(void* dst, const void* src, int src_bytes) {
    check_smem(dst, 16, "cp.async destination");
    if (((uintptr_t)src & 15) != 0) {
        std::fprintf(stderr, "hk_cuda_emu: cp.async source not 16-byte aligned\n");
        std::abort();
    }
    if (src_bytes < 0 || src_bytes > 16) std::abort();
    std::memset(dst, 0, 16);
    std::memcpy(dst, src, src_bytes);             // copies complete at once: commit/wait are no-ops
}
inline void async_commit() {}
inline void async_wait(int) {}

inline void warp_sync(const char* what) { g_block.warp_barriers[t_warp]->wait(what); }
inline uint64_t* xch(int lane) { return &g_block.xch[t_warp][lane * 8]; }

// ldmatrix.m8n8.x{1,2,4}[.trans].b16: lane 8m+i gives the address of row i of matrix m
inline void ldmatrix(unsigned* r, int nmat, bool trans, const void* p) {
    xch(t_lane)[0] = (uint64_t)(uintptr_t)p;
    warp_sync("ldmatrix");
    const int g = t_lane >> 2, t = t_lane & 3;
    for (int m = 0; m < nmat; ++m) {
        unsigned short v[2];
        for (int h = 0; h < 2; ++h) {
            const int row = trans ? 2 * t + h : g, col = trans ? g : 2 * t + h;
            const unsigned char* rowp = (const unsigned char*)(uintptr_t)xch(8 * m + row)[0];
            check_smem(rowp, 16, "ldmatrix row");
            std::memcpy(&v[h], rowp + 2 * col, 2);
        }
        r[m] = (unsigned)v[0] | ((unsigned)v[1] << 16);
    }
    warp_sync("ldmatrix");
}

template <class X> X shfl_xor(X v, int mask) {
    std::memcpy(xch(t_lane), &v, sizeof(X));
    warp_sync("shfl");
    X out;
    std::memcpy(&out, xch(t_lane ^ mask), sizeof(X));
    warp_sync("shfl");
    return out;
}

inline float half_to_float(unsigned short h, bool is_f16);

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: fragments per the PTX ISA lane maps
inline void mma16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], bool is_f16) {
    uint64_t* x = xch(t_lane);
    for (int i = 0; i < 4; ++i) x[i] = a[i];
    x[4] = b[0];
    x[5] = b[1];
    warp_sync("mma");
    auto A = [&](int r, int k) {
        const int lane = (r % 8) * 4 + (k % 8) / 2, reg = (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        const unsigned w = (unsigned)xch(lane)[reg];
        return half_to_float((unsigned short)((k & 1) ? w >> 16 : w & 0xFFFF), is_f16);
    };
    auto B = [&](int k, int n) {
        const int lane = n * 4 + (k % 8) / 2, reg = k >= 8 ? 1 : 0;
        const unsigned w = (unsigned)xch(lane)[4 + reg];
        return half_to_float((unsigned short)((k & 1) ? w >> 16 : w & 0xFFFF), is_f16);
    };
    const int g = t_lane >> 2, t = t_lane & 3;
    float out[4];
    for (int e = 0; e < 4; ++e) {
        const int r = g + (e >> 1) * 8, n = 2 * t + (e & 1);
        double acc = 0;                            // exact products; one rounding of the k16 sum
        for (int k = 0; k < 16; ++k) acc += (double)A(r, k) * (double)B(k, n);
        out[e] = (float)((double)d[e] + acc);
    }
    warp_sync("mma");
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}

// Runs body() as every thread of every block of the grid (blocks in order, threads concurrently)
inline int run_grid(int gx, int gy, int gz, int threads, size_t smem_bytes, const std::function<void()>& body) {
    const int warps = (threads + 31) / 32;
    Barrier block_barrier(threads);
    std::vector<Barrier*> wb;
    for (int w = 0; w < warps; ++w) wb.push_back(new Barrier(32));
    unsigned char* smem = static_cast<unsigned char*>(std::aligned_alloc(128, ((smem_bytes + 127) / 128 + 1) * 128));
    for (int z = 0; z < gz; ++z)
        for (int y = 0; y < gy; ++y)
            for (int xb = 0; xb < gx; ++xb) {
                // poison shared memory: a read of something nothing wrote shows up as NaN / garbage
                std::memset(smem, 0xFF, smem_bytes);
                g_block.threads = threads;
                g_block.smem = smem;
                g_block.smem_bytes = smem_bytes;
                g_block.block_barrier = &block_barrier;
                g_block.warp_barriers = wb;
                g_block.xch.assign(warps, std::vector<uint64_t>(32 * 8, 0));
                std::vector<std::thread> ts;
                ts.reserve(threads);
                for (int t = 0; t < threads; ++t)
                    ts.emplace_back([&, t] {
                        threadIdx.x = t; threadIdx.y = 0; threadIdx.z = 0;
                        blockIdx.x = xb; blockIdx.y = y; blockIdx.z = z;
                        gridDim.x = gx; gridDim.y = gy; gridDim.z = gz;
                        t_lane = t & 31;
                        t_warp = t >> 5;
                        body();
                    });
                for (auto& th : ts) th.join();
            }
    std::free(smem);
    for (auto* b : wb) delete b;
    return 0;
}

}  // namespace hk_emu

template <class X> X __shfl_xor_sync(unsigned, X v, int mask) { return hk_emu::shfl_xor(v, mask); }
