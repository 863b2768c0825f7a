// hk_hip/block_order.h -- schedules: the order in which blocks take their tile indices (HK_BLOCK_REMAP: the XCD
// remap and grouped ordering of hk_core/block_order.h).
namespace hk {

template<int AXIS> HK_DEV int num_blocks() {
  if (AXIS == 0) return (int)(__builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x());
  if (AXIS == 1) return (int)(__builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y());
  return (int)(__builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z());
}

namespace detail {
// Blocks are dispatched round-robin over the XCDs, each with its own L2: hk_core's chiplet_remap numbers them so
// that consecutive logical blocks run on one XCD, then hk_core's grouped order walks the x-y plane. HK_XCDS: the
// arch table's die count (archs.Arch.xcds), defined by the generated prelude.
#ifndef HK_XCDS
#define HK_XCDS 8
#endif
template<int AXIS> HK_DEV int block_idx_remapped() {
  const unsigned gx = (unsigned)num_blocks<0>(), gy = (unsigned)num_blocks<1>(), gz = (unsigned)num_blocks<2>();
  const unsigned hw = __builtin_amdgcn_workgroup_id_x() + gx * (__builtin_amdgcn_workgroup_id_y() +
                                                               gy * __builtin_amdgcn_workgroup_id_z());
  const unsigned l = chiplet_remap(hw, gx * gy * gz, HK_XCDS);
  const unsigned z = l / (gx * gy);
  unsigned x, y;
  grouped_xy<unsigned>(l - z * gx * gy, gx, gy, x, y);
  return (int)(AXIS == 0 ? x : AXIS == 1 ? y : z);
}
}  // namespace detail

template<int AXIS> HK_DEV int block_idx() {
#if HK_BLOCK_REMAP
  return detail::block_idx_remapped<AXIS>();
#else
  if (AXIS == 0) return (int)__builtin_amdgcn_workgroup_id_x();
  if (AXIS == 1) return (int)__builtin_amdgcn_workgroup_id_y();
  return (int)__builtin_amdgcn_workgroup_id_z();
#endif
}

}  // namespace hk
