// hk_core/layout_tags.h -- the axis of a register vector and of a reduction: tag types, so a template
// parameter `class AX` says what it is (rv<T, N, ROW>, reduce<F, COL>).
namespace hk {
struct ROW {};   // one value per tile row (a row reduction's result)
struct COL {};   // one value per tile column
}  // namespace hk
