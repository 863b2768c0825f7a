// hk_hip/block_order.h -- schedules: the order in which blocks take their tile indices (XCD remap,
// grouped ordering; HK_BLOCK_REMAP).
namespace hk {

template<int AXIS> HK_DEV int num_blocks() {
  if (AXIS == 0) return (int)(__builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x());
  if (AXIS == 1) return (int)(__builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y());
  return (int)(__builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z());
}

namespace detail {
// Blocks are dispatched round-robin over the 8 XCDs (xcd = id % 8), each with its own L2. Renumber so
// that consecutive logical blocks run on one XCD: a bijection of [0, n) (XCD x takes a contiguous range).
HK_DEV unsigned xcd_remap(unsigned id, unsigned n) {
  const unsigned per = n / 8, extra = n % 8, xcd = id % 8;
  return xcd * per + (xcd < extra ? xcd : extra) + id / 8;
}
// Grouped ordering over (x, y): runs of GROUP x-rows sweep y, so neighbours share operand tiles in L2.
constexpr unsigned GROUP = 8;
HK_DEV void grouped(unsigned l, unsigned gx, unsigned gy, unsigned& x, unsigned& y) {
  const unsigned in_group = GROUP * gy, first = (l / in_group) * GROUP;
  const unsigned size = (gx - first) < GROUP ? (gx - first) : GROUP;
  const unsigned r = l % in_group;
  x = first + r % size;
  y = r / size;
}
template<int AXIS> HK_DEV int block_idx_remapped() {
  const unsigned gx = (unsigned)num_blocks<0>(), gy = (unsigned)num_blocks<1>(), gz = (unsigned)num_blocks<2>();
  const unsigned hw = __builtin_amdgcn_workgroup_id_x() + gx * (__builtin_amdgcn_workgroup_id_y() +
                                                               gy * __builtin_amdgcn_workgroup_id_z());
  const unsigned l = xcd_remap(hw, gx * gy * gz);
  const unsigned z = l / (gx * gy);
  unsigned x, y;
  grouped(l - z * gx * gy, gx, gy, x, y);
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
