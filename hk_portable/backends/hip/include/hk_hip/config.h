// hk_hip/config.h -- attributes, the prelude's parameters, the target, the LDS access macros.
#if defined(HK_EMULATOR)
// the emulator's prelude defines the attributes, the builtins and its checked LDS access macros
#elif !defined(__HIPCC_RTC__)
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#endif

#ifndef HK_NUM_WARPS
#error "the prelude defines HK_NUM_WARPS (waves per block) before this library"
#endif
#ifndef HK_NUM_THREADS
#define HK_NUM_THREADS (HK_NUM_WARPS * 64)
#endif
#ifndef HK_SCRATCH_BYTES
#define HK_SCRATCH_BYTES 16
#endif
#ifndef HK_BLOCK_REMAP
#define HK_BLOCK_REMAP 1
#endif

#if defined(__gfx950__)      // the emulator defines it too (-D__gfx950__)
#define HK_GFX950 1
#else
#define HK_GFX950 0
#endif

// Every LDS access of the library goes through these two macros so the emulator can check bounds
// and races; on the device they are plain accesses (the address space is inferred after inlining).
#ifndef HK_LDS_LOAD
#define HK_LDS_LOAD(T, ptr) (*(const T*)(ptr))
#endif
#ifndef HK_LDS_STORE
#define HK_LDS_STORE(T, ptr, val) (*(T*)(ptr) = (val))
#endif

#define HK_DEV __device__ inline __attribute__((always_inline))
#define HK_INF __builtin_inff()
#define HK_NAN __builtin_nanf("")
#define HK_CORE_FN HK_DEV   // the portable core's qualifier
