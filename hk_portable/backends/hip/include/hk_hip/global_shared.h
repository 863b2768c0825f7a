// hk_hip/global_shared.h -- global <-> LDS: 16-byte chunk copies, gfx950 direct-to-LDS loads, converting
// stores.
namespace hk {

// ================================================================================== global <-> LDS
namespace detail {
template<class T> struct chunk16 { T e[16 / sizeof(T)]; };

// Threads take 16-byte chunks of the tile in turn (consecutive threads, consecutive chunks of a row:
// coalesced). fn(r, c) for the chunk at row r, columns c .. c+E-1.
template<class T, int R, int C, class Fn> HK_DEV void each_chunk(Fn fn, int ln = lane()) {
  constexpr int E = 16 / (int)sizeof(T), CPR = C / E, NCH = R * CPR, IT = (NCH + NT - 1) / NT;
  const int t = wave() * 64 + ln;     // before the loop: lanes may leave it early
#pragma unroll
  for (int it = 0; it < IT; ++it) {
    const int ch = t + it * NT;
    if (NCH % NT != 0 && ch >= NCH) break;
    fn(ch / CPR, (ch % CPR) * E);
  }
}
template<class T, int R, int C, class Fn> HK_DEV void each_elem(Fn fn, int ln = lane()) {
  constexpr int IT = (R * C + NT - 1) / NT;
  const int t = wave() * 64 + ln;     // before the loop: lanes may leave it early
#pragma unroll
  for (int it = 0; it < IT; ++it) {
    const int e = t + it * NT;
    if ((R * C) % NT != 0 && e >= R * C) break;
    fn(e / C, e % C);
  }
}
template<class T, int R, int C> constexpr bool chunked() {
  return C % (16 / (int)sizeof(T)) == 0 && st<T, R, C>::ROWB % 16 == 0;
}
}  // namespace detail

#if HK_GFX950
namespace detail {
// gfx950 direct-to-LDS: global_load_lds_dwordx4 writes lane l's 16 bytes at lds + 16*l, so a wave fills
// 1 KiB of the tile's physical layout; each lane fetches the logical chunk that the swizzle puts at its
// physical slot (the XOR swizzle is its own inverse). Asynchronous: complete at s_waitcnt vmcnt(0)
// (async_wait_all). Only for whole, contiguous, aligned tiles of whole KiBs (no lane may sit out).
template<class T, int R, int C> HK_DEV void load_direct(st<T, R, C> dst, const T* ptr, const span& sp) {
  using S = st<T, R, C>;
  constexpr int E = 16 / (int)sizeof(T), NCH = S::ROWB / 16, WAVE_CHUNKS = S::BYTES / 1024;
  const int w = wave(), l = lane();
  for (int wc = w; wc < WAVE_CHUNKS; wc += NW) {     // wave-uniform trip count
    const int p = wc * 64 + l, r = p / NCH;
    int chunk = p % NCH;
    if constexpr (S::SWZ) chunk = (chunk ^ (r / S::RP)) & (NCH - 1);
    const T* src = ptr + at(sp, r, chunk * E);
    __builtin_amdgcn_global_load_lds((__attribute__((address_space(1))) void*)src,
                                     (__attribute__((address_space(3))) void*)(dst.p + wc * 1024), 16, 0, 0);
  }
}
}  // namespace detail
#endif

// GL -> ST: a raw copy (same dtype); complete and visible after async_wait_all() + sync() (the
// emitter adds them; hk::pipeline owns its own)
template<class T, int R, int C, int RANK, class... I>
HK_DEV void load(st<T, R, C> dst, const gl<T, RANK>& g0, float fill, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  const T f = convert<T>(fill);
  if constexpr (detail::chunked<T, R, C>()) {
    constexpr int E = 16 / (int)sizeof(T);
    if (detail::vec_ok(g.ptr, sp)) {
#if HK_GFX950
      if constexpr (st<T, R, C>::BYTES % 1024 == 0) {
        detail::load_direct(dst, g.ptr, sp);
        return;
      }
#endif
      detail::each_chunk<T, R, C>([&](int r, int c) {
        const u32x4 v = detail::gload((const u32x4*)(g.ptr + detail::at(sp, r, c)));
        unsigned char* to = dst.p + st<T, R, C>::offset(r, c);
        HK_LDS_STORE(u32x4, to, v);
      });
      return;
    }
    detail::by_mode(sp, [&](auto mode, int ln) {
      detail::each_chunk<T, R, C>([&](int r, int c) {
        detail::chunk16<T> t;
#pragma unroll
        for (int e = 0; e < E; ++e) t.e[e] = detail::read_mode(mode, g.ptr, sp, r, c + e, f);
        unsigned char* to = dst.p + st<T, R, C>::offset(r, c);
        HK_LDS_STORE(u32x4, to, __builtin_bit_cast(u32x4, t));
      }, ln);
    });
  } else {
    detail::by_mode(sp, [&](auto mode, int ln) {
      detail::each_elem<T, R, C>([&](int r, int c) { dst.set(r, c, detail::read_mode(mode, g.ptr, sp, r, c, f)); },
                                 ln);
    });
  }
}

// GL -> column-major ST: each lane reads its row chunks as for a row-major tile (16-byte loads when the tile
// is whole) and scatters the elements down the stored columns (ds_write_b16 and its d16_hi form).
template<class T, int R, int C, int RANK, class... I>
HK_DEV void load(st<T, R, C, colmajor> dst, const gl<T, RANK>& g0, float fill, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  const T f = convert<T>(fill);
  if constexpr (C % (16 / (int)sizeof(T)) == 0) {
    constexpr int E = 16 / (int)sizeof(T);
    if (detail::vec_ok(g.ptr, sp)) {
      detail::each_chunk<T, R, C>([&](int r, int c) {
        const auto t = __builtin_bit_cast(detail::chunk16<T>, detail::gload((const u32x4*)(g.ptr + detail::at(sp, r, c))));
#pragma unroll
        for (int e = 0; e < E; ++e) dst.set(r, c + e, t.e[e]);
      });
      return;
    }
    detail::by_mode(sp, [&](auto mode, int ln) {
      detail::each_chunk<T, R, C>([&](int r, int c) {
#pragma unroll
        for (int e = 0; e < E; ++e) dst.set(r, c + e, detail::read_mode(mode, g.ptr, sp, r, c + e, f));
      }, ln);
    });
  } else {
    detail::by_mode(sp, [&](auto mode, int ln) {
      detail::each_elem<T, R, C>([&](int r, int c) { dst.set(r, c, detail::read_mode(mode, g.ptr, sp, r, c, f)); },
                                 ln);
    });
  }
}

// ST -> GL, converting to the tensor dtype
template<class U, int RANK, class T, int R, int C, class... I>
HK_DEV void store(const gl<U, RANK>& g0, const st<T, R, C>& s, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  if (sp.empty) return;
  if constexpr (detail::chunked<T, R, C>() && same<T, U>::value) {
    if (detail::vec_ok(g.ptr, sp)) {
      detail::each_chunk<T, R, C>([&](int r, int c) {
        const unsigned char* from = s.p + st<T, R, C>::offset(r, c);
        const u32x4 v = HK_LDS_LOAD(u32x4, from);
        detail::gstore((u32x4*)(g.ptr + detail::at(sp, r, c)), v);
      });
      return;
    }
  }
  if (sp.full) {
    detail::each_elem<T, R, C>([&](int r, int c) { detail::gstore(g.ptr + detail::at(sp, r, c), convert<U>(s.get(r, c))); });
  } else {
    detail::each_elem<T, R, C>([&](int r, int c) {
      if (detail::inside(sp, r, c)) detail::gstore(g.ptr + detail::at(sp, r, c), convert<U>(s.get(r, c)));
    }, detail::opaque_lane());
  }
}

}  // namespace hk
