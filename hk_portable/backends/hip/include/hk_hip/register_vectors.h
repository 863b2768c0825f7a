// hk_hip/register_vectors.h -- register vectors rv<T, N, ROW> (the rows of a tile as its lanes hold them) and
// rv<T, N, COL> (its columns).
namespace hk {

template<class T, int N, class AX> struct rv;
template<class T, int N> struct rv<T, N, ROW> {        // one value per row of an rt<_, N, _>
  using dtype = T;
  static constexpr int n = N, RB = (N + 15) / 16, RBW = (RB + NW - 1) / NW, NE = RBW * 4;
  typename storage<T>::type data[NE];
};
template<class T, int N> struct rv<T, N, COL> {        // one value per column of an rt<_, _, N>
  using dtype = T;
  static constexpr int n = N, CB = (N + 15) / 16, NE = CB;
  typename storage<T>::type data[NE];
};

}  // namespace hk
