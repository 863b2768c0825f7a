// hk_cuda.cuh -- the cuda backend's device library: the API of hk_portable/codegen/DEVICE_API.md.
//
// This file lists the library's pieces in order; the cuda prelude inlines them (codegen/library.py),
// so the generated source stays header-free for NVRTC. A host compiler may include this file as it is.
// Element types, conversions, scalar semantics, Philox and the functors are the portable core
// (hk_portable/codegen/include/hk_core/), shared with the HIP library; everything else is CUDA builtins
// and inline PTX (sm_80 and newer).
//
// Layout (a function of the type only, so elementwise ops never convert):
//   rt<T,R,C>   R/16 row blocks of 16 rows are dealt to the warps round robin (warp w owns blocks
//               w, w+W, ...; "slots"). If R/16 < W, warps replicate blocks (warp w holds block w % (R/16))
//               and only the first R/16 warps ("primary") store. Inside a 16x8 block a lane holds the
//               mma.sync m16n8k16 accumulator fragment: rows g and g+8 (g = lane/4), columns 2t, 2t+1
//               (t = lane%4). Element e of (slot k, column block j): row +8*(e>>1), column +(e&1).
//               The same layout is the A-operand fragment of a bf16/f16 tile (two column blocks per k16).
//   rv<T,N,ROW> the rows a lane holds in rt<_,N,_>: two per slot (g, g+8).
//   rv<T,N,COL> the columns a lane holds in rt<_,_,N>: two per column block; replicated in all warps.
//   st<T,R,C>   rows of whole 128-byte lines: column blocks of R x 128 bytes with the 128-byte swizzle
//               (the SWIZZLE_128B layout of wgmma and TMA); other rows: row-major, 16-byte chunks
//               XOR-swizzled inside each 128-byte line. ldmatrix and cp.async are free of bank conflicts
//               and the swizzle never leaves the R*C*sizeof(T) footprint. Shared buffers are 1024-aligned.
//   mma         mma.sync m16n8k16 from fragments; on sm_90a, when both operands are shared tiles in the
//               swizzled block layout and the warps form whole warpgroups over 64-row slices of the
//               accumulator, wgmma m64nNk16 from shared-memory descriptors (wgmma.cuh). The rt layout
//               above is the wgmma accumulator layout, so nothing moves between the two.
//
// Schedules: hk::pipeline<S> runs the sm_80 cp.async ring (pipeline_cp_async). A Hopper schedule
// (TMA producer warp + wgmma consumers, mbarriers) slots in as another specialisation of
// hk::detail::pipeline_schedule selected by HK_SCHEDULE, without changing the emitted code.

#include "hk_cuda/config.cuh"
#include "hk_cuda/hw.cuh"

#include "../../../codegen/include/hk_core/types.h"
#include "../../../codegen/include/hk_core/layout_tags.h"
#include "../../../codegen/include/hk_core/conversions.h"
#include "../../../codegen/include/hk_core/scalar.h"
#include "../../../codegen/include/hk_core/divider.h"
#include "../../../codegen/include/hk_core/philox.h"
#include "../../../codegen/include/hk_core/block_order.h"
#include "hk_cuda/tile_order.cuh"

#ifdef HK_DEVICE_COMPILE
#include "../../../codegen/include/hk_core/functors.h"

// raw instruction wrappers
#include "hk_cuda/instructions.cuh"
// types, by memory space
#include "hk_cuda/register_tiles.cuh"
#include "hk_cuda/register_vectors.cuh"
#include "hk_cuda/shared_tiles.cuh"
#include "hk_cuda/global_views.cuh"
// ops, by data path
#include "hk_cuda/global_shared.cuh"
#include "hk_cuda/global_register.cuh"
#include "hk_cuda/shared_register.cuh"
#include "hk_cuda/elementwise.cuh"
#include "hk_cuda/reductions.cuh"
#include "hk_cuda/wgmma.cuh"
#include "hk_cuda/mma_fp8.cuh"
#include "hk_cuda/mma.cuh"
#include "hk_cuda/masks.cuh"
// schedules
#include "hk_cuda/pipelines.cuh"
#include "hk_cuda/tma.cuh"
#endif  // HK_DEVICE_COMPILE
