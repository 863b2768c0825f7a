// hk_cuda/config.cuh -- what is being compiled, and the function qualifiers.
//
// HK_PTX: real device code (NVRTC/nvcc). HK_EMULATOR: the same library on CPU threads, one per lane,
// with the PTX instructions replaced by lane-accurate emulations (hk_cuda_emu.h, tests only). Neither:
// a host compiler including hk_cuda.cuh for the portable core alone (tests/test_cuda_numerics.py).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define HK_PTX 1
#define HK_DEVICE_COMPILE 1
#elif defined(HK_EMULATOR)
#define HK_DEVICE_COMPILE 1
#endif
#ifdef HK_DEVICE_COMPILE
#define HK_HD __host__ __device__ __forceinline__
#define HK_DEV __device__ __forceinline__
#else
#define HK_HD inline
#endif
#define HK_CORE_FN HK_HD   // the portable core's functions run on the host too (tests)

#ifndef HK_NUM_WARPS
#define HK_NUM_WARPS 4
#endif
#ifndef HK_PRODUCER_WARPS
#define HK_PRODUCER_WARPS 0         // warps beyond HK_NUM_WARPS: a specialised pipeline's producer warpgroup
#endif
#ifndef HK_SCRATCH_OFFSET
#define HK_SCRATCH_OFFSET 0
#endif
#ifndef HK_SCRATCH_BYTES
#define HK_SCRATCH_BYTES 0
#endif
#ifndef HK_ASYNC_TENSOR_CORE
#define HK_ASYNC_TENSOR_CORE 0      // 1: TMA, mbarrier rings and wgmma (the arch row's async_tensor_core)
#endif
