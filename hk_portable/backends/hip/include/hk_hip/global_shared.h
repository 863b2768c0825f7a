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
template<class T, int R, int C, class L = rowmajor> constexpr bool chunked() {
  using S = st<T, R, C, L>;
  return C % (16 / (int)sizeof(T)) == 0 && (S::COL || S::ROWB % 16 == 0);
}
// A chunk of e4m3 codes as a tile stored as FNUZ keeps them (shared_tiles.h, fnuz<L>); other tiles: as it is.
template<class S> HK_DEV u32x4 fnuz_chunk(u32x4 v) {
  if constexpr (S::FNUZ) {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = fnuz_of_e4m3<unsigned>(v[k]);
  }
  return v;
}
// The 16-byte chunk of row r, columns c .. c+E-1 into LDS: one vector store in a row-major tile, its E
// elements down the stored columns of a column-major one (ds_write_b16 and its d16_hi form).
template<class S> HK_DEV void store_chunk(S dst, int r, int c, u32x4 v) {
  using T = typename S::dtype;
  if constexpr (S::COL) {
    const auto t = __builtin_bit_cast(chunk16<T>, v);
#pragma unroll
    for (int e = 0; e < 16 / (int)sizeof(T); ++e) dst.set(r, c + e, t.e[e]);   // (maps FNUZ storage itself)
  } else {
    HK_LDS_STORE(u32x4, dst.p + S::offset(r, c), fnuz_chunk<S>(v));
  }
}
}  // namespace detail

namespace detail {
// Any tile, element by element (clamped reads and the fill outside the tensor): the general path of
// the loads into LDS, and a cursor's path for the steps that are not whole.
template<class T, int R, int C, class L, int RANK>
HK_DEV void load_elements(st<T, R, C, L> dst, const gl<T, RANK>& g, const span& sp, T f) {
  if constexpr (chunked<T, R, C, L>()) {
    constexpr int E = 16 / (int)sizeof(T);
    by_mode(sp, [&](auto mode, int ln) {
      each_chunk<T, R, C>([&](int r, int c) {
        chunk16<T> t;
#pragma unroll
        for (int e = 0; e < E; ++e) t.e[e] = read_mode(mode, g.ptr, sp, r, c + e, f);
        store_chunk(dst, r, c, __builtin_bit_cast(u32x4, t));
      }, ln);
    });
  } else {
    by_mode(sp, [&](auto mode, int ln) {
      each_elem<T, R, C>([&](int r, int c) { dst.set(r, c, read_mode(mode, g.ptr, sp, r, c, f)); }, ln);
    });
  }
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
// emitter adds them; hk::pipeline owns its own). A whole, aligned tile reads 16-byte chunks (gfx950: a
// row-major tile of whole KiBs straight into LDS); a column-major tile takes each chunk down its columns.
template<class T, int R, int C, class L, int RANK, class... I>
HK_DEV void load(st<T, R, C, L> dst, const gl<T, RANK>& g0, float fill, I... idx) {
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, R, C);
  const T f = convert<T>(fill);
  if constexpr (detail::chunked<T, R, C, L>()) {
    if (detail::vec_ok(g.ptr, sp)) {
#if HK_GFX950
      if constexpr (!st<T, R, C, L>::COL && !st<T, R, C, L>::FNUZ && st<T, R, C, L>::BYTES % 1024 == 0) {
        detail::load_direct(dst, g.ptr, sp);
        return;
      }
#endif
      detail::each_chunk<T, R, C>([&](int r, int c) {
        detail::store_chunk(dst, r, c, detail::gload((const u32x4*)(g.ptr + detail::at(sp, r, c))));
      });
      return;
    }
  }
  detail::load_elements(dst, g, sp, f);
}

// ============================================================================ pipeline load cursors
// A pipeline's load of one tile per step, walking one index: step i reads the tile at ix0 with index D
// advanced by i (the emitter finds such loads: codegen.py, cursor_loads). What does not change with i
// is computed once before the loop: the steps that load by buffer loads, step 0's tile address and one
// step's stride, and each lane's 32-bit byte offsets (into the tile in global memory; and into LDS). A step
// then builds a buffer resource from scalars (its tile's origin, the bytes its rows span inside the
// tensor) and issues one buffer load per chunk at the lane's fixed offset: no VALU for addresses and no
// per-step bounds math (issue 10, item 2). Rows past the tensor's end read 0 by the resource's range
// check, so with a zero fill a block whose rows run past the end (gemm's A in the last row block) takes the
// same path when its walk goes along the columns (or a leading index). Any other step -- the ragged last
// step of a walk (along the columns: gemm's A; down the rows: gemm's B, attention's K and V), columns past
// the end, a nonzero fill, a tile spanning 4 GiB or more (32-bit offsets) -- loads element
// by element (the peeled path; decided once, in make_cursor).
//
// A step's load runs in one piece (phase::all) or in two (codegen.py, split_prefetch; pipelines.h):
// phase::issue starts the global reads -- into the cursor's registers (register staging, gfx942 and
// column-major tiles), or as LDS-DMA loads on gfx950 -- and phase::commit, after the pipeline's compute
// step, writes the registers to LDS. Between them the loads are in flight while the MFMAs run; the waits
// are the compiler's (a vmcnt by count before each ds_write of a loaded register) and the pipeline's
// (vmcnt by count for LDS-DMA).
namespace phase {
struct all {};
struct issue {};
struct commit {};
}  // namespace phase

namespace detail {
// RG for a column-major tile S: a run of RG consecutive stored lines starting at a multiple of RG lies inside one
// chunk rotation (STORED::RP lines, aligned, share the XOR of their chunks), so at any stored column their offsets
// differ by whole lines (STORED::ROWB bytes each). A power of two dividing e: RP capped at e when the storage is
// swizzled, e when it is not. Row-major tiles: 1.
template<class S> constexpr int lines_per_offset(int e) {
  if constexpr (!S::COL) {
    return 1;
  } else {
    using ST = typename S::STORED;
    int rg = ST::SWZ ? ST::RP : e;
    while (rg > 1 && (e % rg != 0 || rg > e)) rg /= 2;
    return rg < 1 ? 1 : rg;
  }
}

template<class S> struct chunk_plan {
  using T = typename S::dtype;
  static constexpr int E = 16 / (int)sizeof(T), CPR = S::cols / E, NCH = S::rows * CPR;
  static constexpr int IT = (NCH + NT - 1) / NT;
  // A column-major tile's chunk goes to E stored lines (S::offset(r, c + e)). Lines of one pass over the banks
  // (STORED::RP of them, aligned) share their chunk rotation, so within such a run the offsets differ by e
  // stored lines: RG lines per lane offset, the rest an immediate of the ds_write. LW: offsets per chunk.
  static constexpr int RG = lines_per_offset<S>(E);
  static constexpr int LW = S::COL ? E / RG : 1;       // LDS offsets per chunk: one vector, or E/RG scattered
#if HK_GFX950
  static constexpr bool DMA = !S::COL && !S::FNUZ && S::BYTES % 1024 == 0;   // direct-to-LDS (load_direct)
#else
  static constexpr bool DMA = false;
#endif
  static constexpr int WAVE_CHUNKS = S::BYTES / 1024, DJ = DMA ? (WAVE_CHUNKS + NW - 1) / NW : 1;
  static constexpr int NV = DMA ? DJ : IT;             // buffer loads a lane issues per step
  // LDS-DMA instructions every wave issues for a whole step (the fewest, when the waves' shares differ):
  // what a pipeline's wait by count may leave in flight per younger step
  static constexpr int DMA_MIN = DMA ? WAVE_CHUNKS / NW : 0;
};

#if HK_GFX950
// One lane's 16 bytes at byte offset off of the resource r into LDS at lds + 16*lane (buffer_load_dwordx4
// ... lds; lds wave-uniform, the M0 register; out of range: 0). On the device this is inline assembly,
// hidden from the compiler on purpose: for the builtin, LLVM waits vmcnt(0) before every later LDS access
// and at every workgroup fence while such a load is in flight (it cannot tell which LDS bytes the load
// writes), so no load would overlap the MFMAs' fragment reads. The pipelines wait for these loads
// themselves, by count (pipelines.h). The emulator executes this asm from its operands (emulator
// README, "Inline assembly": M0 as the LDS address, the offset, the range check, completion on vmcnt) and
// reports a read before the wait.
HK_DEV void dma16(__amdgpu_buffer_rsrc_t r, unsigned off, unsigned char* lds) {
  const unsigned m0 = (unsigned)(unsigned long long)(__attribute__((address_space(3))) void*)lds;
  // s_nop: one wait state between the write of M0 and the LDS-DMA that reads it (the hazard recognizer
  // does not look inside inline assembly)
  asm volatile("s_nop 0\n\tbuffer_load_dwordx4 %0, %1, 0 offen lds" : : "v"(off), "s"(r), "{m0}"(m0) : "memory");
}
#endif

// v's bits are all zero (the range check's fill)
template<class T> HK_DEV bool zero_bits(T v) { return __builtin_bit_cast(typename bits_of<T>::type, v) == 0; }
}  // namespace detail

template<class S, class T, int RANK> struct cursor {
  using P = detail::chunk_plan<S>;
  const T* origin;                   // step 0's tile
  long long step;                    // elements from one step's tile to the next
  int whole;                         // steps [0, whole) load by buffer loads
  unsigned lim;                      // bytes of a step's rows inside the tensor (the same every step)
  unsigned voff[P::NV];              // each lane's byte offsets from the step's tile origin
  int wave;                          // detail::wave(), read once before the loop
  int loff[P::DMA ? 1 : P::IT][P::LW];
  u32x4 staged[P::DMA ? 1 : P::IT];  // register staging between phase::issue and phase::commit

  // the resource of step i < whole, from scalars: its tile's origin and the bytes of its rows inside the
  // tensor. (A per-step limit, for a walk down the rows whose last step is ragged, was tried: the select
  // and the descriptor it rebuilds cost gfx942's causal attention 3 spilled SGPRs; that step is peeled.)
  HK_DEV __amdgpu_buffer_rsrc_t rsrc(int i) const { return detail::rsrc(origin + (long long)i * step, lim); }
};

namespace detail {
// Lane l's byte offsets from a step's tile origin (row stride sr elements): LDS-DMA writes lane l's 16 bytes
// at the wave's next KiB of the tile's physical layout, so the lane fetches the logical chunk the swizzle
// puts there (the XOR swizzle is its own inverse); register staging takes chunks in turn, as each_chunk.
template<class S, class C> HK_DEV void lane_offsets(C& c, long long sr, int w, int l) {
  using P = chunk_plan<S>;
  using T = typename S::dtype;
#pragma unroll
  for (int j = 0; j < P::NV; ++j) {
    int r, col;
    if constexpr (P::DMA) {
      const int pc = (w + j * NW) * 64 + l;
      r = pc / S::NCH;
      int ch = pc % S::NCH;
      if constexpr (S::SWZ) ch = (ch ^ (r / S::RP)) & (S::NCH - 1);
      col = ch * P::E;
    } else {
      const int ch = w * 64 + l + j * NT;
      r = ch / P::CPR;
      col = (ch % P::CPR) * P::E;
#pragma unroll
      for (int g = 0; g < P::LW; ++g) c.loff[j][g] = S::offset(r, col + g * P::RG);
    }
    c.voff[j] = (unsigned)(((unsigned long long)r * sr + col) * sizeof(T));
  }
}
}  // namespace detail

template<class S, int D, class T, int RANK, class... I>
HK_DEV cursor<S, T, RANK> make_cursor(const gl<T, RANK>& g0, float fill, I... idx) {
  static_assert(detail::chunked<T, S::rows, S::cols, typename S::layout>(), "cursors walk tiles of whole 16-byte chunks");
  const auto g = detail::uniform(g0);
  const int ix[RANK] = {detail::uni(idx)...};
  const detail::span sp = detail::locate2(g, ix, S::rows, S::cols);
  constexpr int EXT = D == RANK - 1 ? S::cols : (D == RANK - 2 ? S::rows : 1);   // the walked index's extent
  const long long sd = g.stride[D];
  cursor<S, T, RANK> c;
  // the walk's scalars live in SGPRs: its branch and its resources are uniform
  c.origin = (const T*)(unsigned long long)detail::sgpr64((long long)(unsigned long long)(g.ptr + sp.base));
  c.step = detail::sgpr64(EXT * sd);
  // 32-bit offsets: the tile must span less than 4 GiB. Rows past the end read 0 by the range check when
  // 0 is the fill and each row's bytes end before the next row's begin (the limit is whole rows' bytes).
  const bool fits = sp.sr >= 0 && (unsigned long long)S::rows * (unsigned long long)sp.sr * sizeof(T) < (1ull << 32);
  const bool ranged = detail::zero_bits(convert<T>(fill)) && sp.sr >= S::cols;
  // every other index whole (but the rows, when ranged, may run past the end); the walked one from ix[D]
  // on until the tensor's end
  bool others = ix[D] >= 0;
#pragma unroll
  for (int d = 0; d < RANK; ++d) {
    if (d == D) continue;
    const long long ext = d == RANK - 1 ? S::cols : (d == RANK - 2 ? S::rows : 1);
    const long long lo = (long long)ix[d] * ext;
    others = others && lo >= 0 && (lo + ext <= g.shape[d] || (d == RANK - 2 && ranged));
  }
  const bool aligned = sp.sc == 1 && ((unsigned long long)(g.ptr + sp.base) & 15) == 0 &&
                       ((unsigned long long)sp.sr * sizeof(T)) % 16 == 0 && ((unsigned long long)c.step * sizeof(T)) % 16 == 0;
  const long long left = (long long)g.shape[RANK - 2] - (long long)ix[RANK - 2] * S::rows;
  const long long extent = (long long)g.shape[D] - (long long)ix[D] * EXT;
  const long long steps = extent / EXT;
  c.whole = detail::sgpr(others && aligned && fits ? (int)(steps < 0 ? 0 : (steps > 0x7FFFFFFF ? 0x7FFFFFFF : steps)) : 0);
  const long long rows = left < 0 ? 0 : (left > S::rows ? S::rows : left);   // a walk down the rows: all R
  c.lim = (unsigned)detail::sgpr((int)(rows * sp.sr * (long long)sizeof(T)));
  c.wave = detail::wave();
  detail::lane_offsets<S>(c, sp.sr, c.wave, detail::lane());
  return c;
}

// Step i of a cursor's walk into dst, or one phase of it (idx...: the same tile's indices, for the
// general path). A step past c.whole loads element by element, all of it in phase::issue (or all),
// where the unsplit schedule loaded it (so the commit of a buffer-loaded step is the only LDS write after
// the compute step), and then drains the wave's counters: on the device the compiler's wait for those loads
// does so (they are the youngest), and saying it in the source lets the emulator see it too.
template<class Ph, class S, class T, int RANK, class... I>
HK_DEV void load_step(Ph, S dst, cursor<S, T, RANK>& c, int i, const gl<T, RANK>& g, float fill, I... idx) {
  using P = detail::chunk_plan<S>;
  constexpr bool ISSUE = !same<Ph, phase::commit>::value, COMMIT = !same<Ph, phase::issue>::value;
  if (i >= c.whole) {                          // the peeled steps: element by element
    if constexpr (ISSUE) {
      const auto gu = detail::uniform(g);
      const int ix[RANK] = {detail::uni(idx)...};
      detail::load_elements(dst, gu, detail::locate2(gu, ix, S::rows, S::cols), convert<T>(fill));
      async_wait_all();
    }
    return;
  }
#if HK_GFX950
  if constexpr (P::DMA) {
    if constexpr (ISSUE) {
      const auto r = c.rsrc(i);
#pragma unroll
      for (int j = 0; j < P::DJ; ++j) {
        const int wc = c.wave + j * NW;
        if (P::WAVE_CHUNKS % NW != 0 && wc >= P::WAVE_CHUNKS) break;
        detail::dma16(r, c.voff[j], dst.p + wc * 1024);
      }
    }
    return;
  }
#endif
  if constexpr (!P::DMA) {
    const int t = detail::wave() * 64 + detail::lane();
    if constexpr (ISSUE) {
      const auto r = c.rsrc(i);
#pragma unroll
      for (int it = 0; it < P::IT; ++it) {
        if (P::NCH % NT != 0 && t + it * NT >= P::NCH) break;
        c.staged[it] = detail::bload16(r, c.voff[it]);
      }
    }
    if constexpr (COMMIT) {
#pragma unroll
      for (int it = 0; it < P::IT; ++it) {
        if (P::NCH % NT != 0 && t + it * NT >= P::NCH) break;
        const u32x4 v = detail::fnuz_chunk<S>(c.staged[it]);
        if constexpr (S::COL) {
          const auto e8 = __builtin_bit_cast(detail::chunk16<T>, v);
#pragma unroll
          for (int e = 0; e < P::E; ++e)
            HK_LDS_STORE(T, dst.p + c.loff[it][e / P::RG] + (e % P::RG) * S::ROWB, e8.e[e]);
        } else {
          HK_LDS_STORE(u32x4, dst.p + c.loff[it][0], v);
        }
      }
    }
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
