// hk_hip.h -- the device library of the hk_portable HIP backend (AMD CDNA3 gfx942, CDNA4 gfx950).
//
// Implements hk_portable/codegen/DEVICE_API.md. Header-free (clang builtins only), so the same text
// compiles under hiprtc, under an offline clang for amdgcn and, with HK_EMULATOR, on the host against
// the wave64 emulator. The reference interpreter (backends/reference/interpreter.py) defines what
// every function computes; the conformance suite checks it.
//
// Layouts (all a function of the type only, see README.md in this folder):
//   rt<T,R,C>   rows in 16-row blocks spread over the waves (block b -> wave b % NW, slot b / NW; when
//               there are fewer blocks than waves the spare waves hold replicas and never write);
//               inside a 16x16 block the MFMA accumulator ("col") layout: element (i, j) in lane
//               j + 16*(i/4), register i%4 -- a lane holds 4 consecutive rows of one column.
//   rv<T,N,ROW> the rows of such a tile: lane l holds rows 4*(l/16)+k, k = 0..3, of each of its blocks.
//   rv<T,N,COL> the columns: lane l holds column 16*cb + l%16 of every 16-column block (all waves).
//   rt<T,R,C,tfrag> the same blocks holding the transpose's MFMA layout: element (i, j) in lane i + 16*(j/4),
//               register j%4 (an mma into it swaps its operands; as an mma's A it is read in place).
//   st<T,R,C>   row-major with 16-byte chunks XOR-swizzled by row, so MFMA operand reads of 16 rows
//               spread over the LDS banks (32 banks on gfx942, 64 on gfx950); within R*C*sizeof(T).
//
// This file lists the library's pieces in order; the hip prelude inlines them (codegen/library.py), so the
// generated source stays header-free. Element types, conversions, scalar semantics, Philox and the functors
// are the portable core (hk_portable/codegen/include/hk_core/), shared with the CUDA library.

#include "hk_hip/config.h"
#include "hk_hip/hw.h"

#include "../../../codegen/include/hk_core/types.h"
#include "../../../codegen/include/hk_core/layout_tags.h"
#include "../../../codegen/include/hk_core/conversions.h"
#include "../../../codegen/include/hk_core/scalar.h"
#include "../../../codegen/include/hk_core/divider.h"
#include "../../../codegen/include/hk_core/philox.h"
#include "../../../codegen/include/hk_core/block_order.h"
#include "../../../codegen/include/hk_core/functors.h"

// raw instruction wrappers
#include "hk_hip/instructions.h"
// types, by memory space
#include "hk_hip/register_tiles.h"
#include "hk_hip/register_vectors.h"
#include "hk_hip/shared_tiles.h"
#include "hk_hip/global_views.h"
// ops, by data path
#include "hk_hip/elementwise.h"
#include "hk_hip/reductions.h"
#include "hk_hip/global_register.h"
#include "hk_hip/global_shared.h"
#include "hk_hip/shared_register.h"
#include "hk_hip/masks.h"
#include "hk_hip/mma.h"
// schedules
#include "hk_hip/block_order.h"
#include "hk_hip/pipelines.h"
