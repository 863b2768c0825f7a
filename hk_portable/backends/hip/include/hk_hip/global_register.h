// hk_hip/global_register.h -- global <-> registers: converting loads and stores of tiles and vectors, f32
// atomics; one writer per element.
namespace hk {

// ============================================================================ global <-> registers
// Pad elements of a tile (rows >= R, cols >= C) read like elements outside the tensor.
template<class T, int R, int C, class U, int RANK, class... I>
HK_DEV void load(rt<T, R, C>& dst, const gl<U, RANK>& g0, float fill, I... idx) {
  using D = rt<T, R, C>;
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  const T f = convert<T>(fill);
  detail::by_mode(sp, [&](auto mode, int ln) {
#pragma unroll
    for (int s = 0; s < D::RBW; ++s)
#pragma unroll
      for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int r = 16 * detail::blk<D::RB>(s) + detail::row_in_blk(k, ln), c = 16 * cb + detail::col_in_blk(ln);
          const bool pad = (R % 16 != 0 && r >= R) || (C % 16 != 0 && c >= C);
          const T v = detail::read_mode(mode, g.ptr, sp, pad ? 0 : r, pad ? 0 : c, f);
          dst.data[(s * D::CB + cb) * 4 + k] = pad ? f : v;
        }
  });
}

// wave-grid tiles (whole 16x16 blocks): each wave reads its own blocks, as the grid's store writes them;
// put(e, v) stores element e's value v
namespace detail {
template<class T, int R, int C, int WM, int WN, class U, int RANK, class Put, class... I>
HK_DEV void load_grid(const gl<U, RANK>& g0, float fill, Put put, I... idx) {
  using D = rt<T, R, C, grid<WM, WN>>;
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  const T f = convert<T>(fill);
  const int r0 = D::row0(), c0 = D::col0();
  detail::by_mode(sp, [&](auto mode, int ln) {
#pragma unroll
    for (int i = 0; i < D::RBW; ++i)
#pragma unroll
      for (int j = 0; j < D::CBW; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k)
          put((i * D::CBW + j) * 4 + k, detail::read_mode(mode, g.ptr, sp, r0 + 16 * i + detail::row_in_blk(k, ln),
                                                          c0 + 16 * j + detail::col_in_blk(ln), f));
  });
}
}  // namespace detail
template<class T, int R, int C, int WM, int WN, class U, int RANK, class... I>
HK_DEV void load(rt<T, R, C, grid<WM, WN>>& dst, const gl<U, RANK>& g0, float fill, I... idx) {
  detail::load_grid<T, R, C, WM, WN>(g0, fill, [&](int e, T v) { dst.data[e] = v; }, idx...);
}
// dst = F(x, loaded tile) (F(loaded tile, x) when LEFT), the load and the op fused per element (codegen.py,
// HipEmitter: a loaded grid tile whose one use is an elementwise op): inside each mode branch of the load,
// so the branches merge the results, not a second whole tile of loaded values (which, next to a 128-register
// accumulator, spills)
template<class F, bool LEFT, class D, class T, int R, int C, int WM, int WN, class U, int RANK, class... I>
HK_DEV void load_binary(D& dst, const rt<T, R, C, grid<WM, WN>>& x, const gl<U, RANK>& g0, float fill, I... idx) {
  detail::load_grid<T, R, C, WM, WN>(g0, fill, [&](int e, T v) {
    dst.data[e] = detail::put(uncalc<typename D::dtype>(LEFT ? F::apply(calc(v), calc(x.data[e]))
                                                             : F::apply(calc(x.data[e]), calc(v))));
  }, idx...);
}

// strip tiles: a lane reads whole 8-element chunks; a whole, unit-stride, 16-byte aligned tile reads each
// chunk as 16-byte loads; any other tile reads clamped and selects, element by element.
template<class T, int R, int C, int WR, class U, int RANK, class... I>
HK_DEV void load(rt<T, R, C, strip<WR>>& dst, const gl<U, RANK>& g0, float fill, I... idx) {
  using D = rt<T, R, C, strip<WR>>;
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  const T f = convert<T>(fill);
  if constexpr (sizeof(U) == 2 || sizeof(U) == 4) {
    if (detail::vec_ok(g.ptr, sp)) {           // whole tile, unit stride, 16-byte aligned rows: 16-byte loads
      const int ln = detail::lane();
#pragma unroll
      for (int e0 = 0; e0 < D::NE; e0 += 8) {
        const U* p = g.ptr + sp.base + (long long)D::row_of(e0) * sp.sr + D::col_of(e0, ln);
#pragma unroll
        for (int q = 0; q < (int)sizeof(U) / 2; ++q) {
          const u32x4 v = *reinterpret_cast<const u32x4*>(p + q * (16 / (int)sizeof(U)));
#pragma unroll
          for (int i = 0; i < 16 / (int)sizeof(U); ++i) {
            const unsigned w = v[i * (int)sizeof(U) / 4];
            const unsigned b = sizeof(U) == 4 ? w : (w >> (16 * (i & 1))) & 0xFFFFu;
            dst.data[e0 + q * (16 / (int)sizeof(U)) + i] = convert<T>(from_bits<U>(b));
          }
        }
      }
      return;
    }
  }
  detail::by_mode(sp, [&](auto mode, int ln) {
#pragma unroll
    for (int e = 0; e < D::NE; ++e) dst.data[e] = detail::read_mode(mode, g.ptr, sp, D::row_of(e), D::col_of(e, ln), f);
  });
}
// Register vectors of every layout: element i sits at D::pos(i, lane); positions past N (pad of a frag vector
// whose length is not a multiple of 16) read the fill.
template<class T, int N, class AX, class L, class U, int RANK, class... I>
HK_DEV void load(rv<T, N, AX, L>& dst, const gl<U, RANK>& g0, float fill, I... idx) {
  using D = rv<T, N, AX, L>;
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate1(g, ix, N);
  const T f = convert<T>(fill);
  detail::by_mode(sp, [&](auto mode, int ln) {
#pragma unroll
    for (int i = 0; i < D::NE; ++i) {
      const int n = D::pos(i, ln);
      const bool pad = N % 16 != 0 && n >= N;
      const T v = detail::read_mode(mode, g.ptr, sp, 0, pad ? 0 : n, f);
      dst.data[i] = pad ? f : v;
    }
  });
}

namespace detail {
// strip tiles hold each element once; strip vectors name their writers (owner)
template<class T, int R, int C, int WR, class Fn>
HK_DEV void each_owned(const rt<T, R, C, strip<WR>>& x, Fn fn, int ln = lane()) {
  using D = rt<T, R, C, strip<WR>>;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) fn(D::row_of(e), D::col_of(e, ln), x.data[e]);
}
template<class T, int N, class AX, int WR, class Fn>
HK_DEV void each_owned(const rv<T, N, AX, strip<WR>>& x, Fn fn, int ln = lane()) {
  using D = rv<T, N, AX, strip<WR>>;
#pragma unroll
  for (int i = 0; i < D::NE; ++i) {
    const int pos = D::pos(i, ln);              // wave-level (readfirstlane) work outside the owner branch
    if (D::owner(i, ln)) fn(0, pos, x.data[i]);
  }
}
template<class T, int R, int C, int WR, class U, int RANK>
HK_DEV span locate(const rt<T, R, C, strip<WR>>&, const gl<U, RANK>& g, const int* ix) { return locate2(g, ix, R, C); }
template<class T, int N, class AX, int WR, class U, int RANK>
HK_DEV span locate(const rv<T, N, AX, strip<WR>>&, const gl<U, RANK>& g, const int* ix) { return locate1(g, ix, N); }
}  // namespace detail

namespace detail {
// One writer per element: owner slots of rt rows; one lane per row value of ROW vectors; wave 0's
// first 16 lanes for COL vectors. fn(r, c, value) with r, c inside the tile's R x C.
template<class T, int R, int C, class Fn> HK_DEV void each_owned(const rt<T, R, C>& x, Fn fn, int ln = lane()) {
  using D = rt<T, R, C>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) {
    if (!owner<D::RB>(s)) continue;
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int r = 16 * blk<D::RB>(s) + row_in_blk(k, ln), c = 16 * cb + col_in_blk(ln);
        if ((R % 16 == 0 || r < R) && (C % 16 == 0 || c < C)) fn(r, c, x.data[(s * D::CB + cb) * 4 + k]);
      }
  }
}
template<class T, int N, class Fn> HK_DEV void each_owned(const rv<T, N, ROW>& x, Fn fn, int ln = lane()) {
  using D = rv<T, N, ROW>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) {
    if (!owner<D::RB>(s)) continue;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int n = 16 * blk<D::RB>(s) + row_in_blk(k, ln);
      if (col_in_blk(ln) == k && (N % 16 == 0 || n < N)) fn(0, n, x.data[s * 4 + k]);
    }
  }
}
template<class T, int N, class Fn> HK_DEV void each_owned(const rv<T, N, COL>& x, Fn fn, int ln = lane()) {
  using D = rv<T, N, COL>;
  if (wave() != 0) return;
#pragma unroll
  for (int cb = 0; cb < D::CB; ++cb) {
    const int n = 16 * cb + col_in_blk(ln);
    if (ln < 16 && (N % 16 == 0 || n < N)) fn(0, n, x.data[cb]);
  }
}
// tfrag tiles: owner slots, as frag; tfrag row vectors: the first lane group of owner slots
template<class T, int R, int C, class Fn> HK_DEV void each_owned(const rt<T, R, C, tfrag>& x, Fn fn, int ln = lane()) {
  using D = rt<T, R, C, tfrag>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) {
    if (!owner<D::RB>(s)) continue;
#pragma unroll
    for (int cb = 0; cb < D::CB; ++cb)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        fn(16 * blk<D::RB>(s) + trow_in_blk(ln), 16 * cb + tcol_in_blk(k, ln), x.data[(s * D::CB + cb) * 4 + k]);
  }
}
template<class T, int N, class Fn> HK_DEV void each_owned(const rv<T, N, ROW, tfrag>& x, Fn fn, int ln = lane()) {
  using D = rv<T, N, ROW, tfrag>;
#pragma unroll
  for (int s = 0; s < D::RBW; ++s) {
    const int n = D::pos(s, ln);
    if (owner<D::RB>(s) && ln < 16) fn(0, n, x.data[s]);
  }
}
// tfrag column vectors: every wave holds every column, each lane group's 16 lanes the same four a block: wave 0's
// first lane of each group writes
template<class T, int N, class Fn> HK_DEV void each_owned(const rv<T, N, COL, tfrag>& x, Fn fn, int ln = lane()) {
  using D = rv<T, N, COL, tfrag>;
  if (wave() != 0 || (ln & 15) != 0) return;
#pragma unroll
  for (int e = 0; e < D::NE; ++e) fn(0, D::pos(e, ln), x.data[e]);
}
template<class T, int R, int C, class U, int RANK>
HK_DEV span locate(const rt<T, R, C, tfrag>&, const gl<U, RANK>& g, const int* ix) { return locate2(g, ix, R, C); }
template<class T, int N, class AX, class U, int RANK>
HK_DEV span locate(const rv<T, N, AX, tfrag>&, const gl<U, RANK>& g, const int* ix) { return locate1(g, ix, N); }

// wave-grid tiles hold each element once
template<class T, int R, int C, int WM, int WN, class Fn>
HK_DEV void each_owned(const rt<T, R, C, grid<WM, WN>>& x, Fn fn, int ln = lane()) {
  using D = rt<T, R, C, grid<WM, WN>>;
  const int r0 = D::row0(), c0 = D::col0();
#pragma unroll
  for (int i = 0; i < D::RBW; ++i)
#pragma unroll
    for (int j = 0; j < D::CBW; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        fn(r0 + 16 * i + row_in_blk(k, ln), c0 + 16 * j + col_in_blk(ln), x.data[(i * D::CBW + j) * 4 + k]);
}
template<class T, int R, int C, int WM, int WN, class U, int RANK>
HK_DEV span locate(const rt<T, R, C, grid<WM, WN>>&, const gl<U, RANK>& g, const int* ix) { return locate2(g, ix, R, C); }
template<class T, int R, int C, class U, int RANK>
HK_DEV span locate(const rt<T, R, C>&, const gl<U, RANK>& g, const int* ix) { return locate2(g, ix, R, C); }
template<class T, int N, class AX, class U, int RANK>
HK_DEV span locate(const rv<T, N, AX>&, const gl<U, RANK>& g, const int* ix) { return locate1(g, ix, N); }

HK_DEV void gatomic_add(float* p, float v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

// writes fn's elements that fall inside the tensor; no predicate per element when the tile is whole
template<class X, class U, class W> HK_DEV void write_owned(const X& x, const span& sp, W write) {
  if (sp.empty) return;
  if (sp.full) each_owned(x, [&](int r, int c, typename X::dtype v) { write(at(sp, r, c), v); });
  else each_owned(x, [&](int r, int c, typename X::dtype v) { if (inside(sp, r, c)) write(at(sp, r, c), v); },
                  opaque_lane());
}
}  // namespace detail

// registers -> global, converting to the tensor dtype; elements outside the tensor are dropped
template<class U, int RANK, class T, int R, int C, int WR, class... I>
HK_DEV void store(const gl<U, RANK>& g0, const rt<T, R, C, strip<WR>>& x, I... idx) {
  using D = rt<T, R, C, strip<WR>>;
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  if constexpr (sizeof(U) == 2 || sizeof(U) == 4) {
    if (detail::vec_ok(g.ptr, sp)) {           // whole tile, unit stride, 16-byte aligned rows: 16-byte stores
      const int ln = detail::lane();
#pragma unroll
      for (int e0 = 0; e0 < D::NE; e0 += 8) {
        U* p = g.ptr + sp.base + (long long)D::row_of(e0) * sp.sr + D::col_of(e0, ln);
#pragma unroll
        for (int q = 0; q < (int)sizeof(U) / 2; ++q) {
          u32x4 v = {0u, 0u, 0u, 0u};
#pragma unroll
          for (int i = 0; i < 16 / (int)sizeof(U); ++i) {
            const unsigned b = to_bits(convert<U>(x.data[e0 + q * (16 / (int)sizeof(U)) + i]));
            if constexpr (sizeof(U) == 4) v[i] = b;
            else v[i >> 1] |= b << (16 * (i & 1));
          }
          *reinterpret_cast<u32x4*>(p + q * (16 / (int)sizeof(U))) = v;
        }
      }
      return;
    }
  }
  if (sp.empty) return;
  // a partial tile: one block-uniform branch per row slot, a column test per element
  const int ln = detail::opaque_lane();
#pragma unroll
  for (int k = 0; k < D::RS; ++k) {
    const int r = D::row(k);
    if (r < sp.rlo || r >= sp.rhi) continue;
#pragma unroll
    for (int i = 0; i < D::CS * 8; ++i) {
      const int c = D::col_of(k * D::CS * 8 + i, ln);
      if (c >= sp.clo && c < sp.chi) detail::gstore(g.ptr + detail::at(sp, r, c), convert<U>(x.data[k * D::CS * 8 + i]));
    }
  }
}

template<class U, int RANK, class X, class... I> HK_DEV void store(const gl<U, RANK>& g0, const X& x, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate(x, g, ix);
  detail::write_owned<X, U>(x, sp, [&](long long off, typename X::dtype v) {
    detail::gstore(g.ptr + off, convert<U>(v));
  });
}

// An elementwise epilogue of a wave-grid tile fused into its store (codegen.py HipEmitter, patterns.py
// fused_epilogues: gemm's scale tiles, a bias broadcast, a GELU, the cast to the output's dtype): fn(mode, e, r, c)
// computes element e, at (r, c) of the tile, from the registers and the readers below, and it is stored as it is
// made -- no whole tile of intermediate or converted values next to the accumulator (which, at 128 registers a
// lane, spilled: gemm_fp8's 256x256 block on gfx942, 2026-12-07). `fast`: every tile the epilogue reads lies
// wholly inside its tensor; with the stored tile's own span full, mode 0 runs without predicates, else mode 1
// (clamped reads, a bounds test per stored element). Elements outside the tensor are neither computed nor stored.
template<class D, class U, int RANK, class Fn, class... I>
HK_DEV void store_each(const gl<U, RANK>& g0, bool fast, Fn fn, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, D::rows, D::cols);
  if (sp.empty) return;
  const int r0 = D::row0(), c0 = D::col0();
  auto each = [&](auto mode, int ln) {
#pragma unroll
    for (int i = 0; i < D::RBW; ++i)
#pragma unroll
      for (int j = 0; j < D::CBW; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int e = (i * D::CBW + j) * 4 + k;
          const int r = r0 + 16 * i + detail::row_in_blk(k, ln), c = c0 + 16 * j + detail::col_in_blk(ln);
          if constexpr (decltype(mode)::value == 0) detail::gstore(g.ptr + detail::at(sp, r, c), convert<U>(fn(mode, e, r, c)));
          else if (detail::inside(sp, r, c)) detail::gstore(g.ptr + detail::at(sp, r, c), convert<U>(fn(mode, e, r, c)));
        }
  };
  if (sp.full && fast) each(detail::mode_t<0>{}, detail::lane());
  else each(detail::mode_t<1>{}, detail::opaque_lane());
}
// A wave-grid tile's load from global memory, read element by element inside store_each: get(mode, r, c) is what
// load(rt<T, R, C, grid>) puts at (r, c) (the fill past the tensor's edges); mode 0 only where full().
template<class D, class U, int RANK> struct grid_reader {
  using T = typename D::dtype;
  const U* ptr;
  detail::span sp;
  T fill;
  template<class... I> HK_DEV grid_reader(const gl<U, RANK>& g0, float f, I... idx) {
    const auto g = detail::uniform(g0);
    const int ix[RANK] = {detail::uni(idx)...};
    ptr = g.ptr;
    sp = detail::locate2(g, ix, D::rows, D::cols);
    fill = convert<T>(f);
  }
  HK_DEV bool full() const { return sp.full; }
  template<class M> HK_DEV T get(M, int r, int c) const {
    if constexpr (M::value == 0) return convert<T>(detail::gload(ptr + detail::at(sp, r, c)));
    else return sp.empty ? fill : detail::read_or(ptr, sp, r, c, fill);
  }
};
template<class D, class U, int RANK, class... I>
HK_DEV grid_reader<D, U, RANK> read_grid(const gl<U, RANK>& g, float fill, I... idx) {
  return grid_reader<D, U, RANK>(g, fill, idx...);
}

// each element added once per block (replicas and duplicate lanes never add)
template<int RANK, class X, class... I> HK_DEV void atomic_add(const gl<float, RANK>& g0, const X& x, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate(x, g, ix);
  detail::write_owned<X, float>(x, sp, [&](long long off, float v) { detail::gatomic_add(g.ptr + off, v); });
}

}  // namespace hk
