// hk_hip/pipelines.h -- schedules: hk::pipeline<S, SCHED, LOADS> (double buffering; the 8-wave ping-pong),
// with a step's loads in one piece or split around the compute step (waits by count).
namespace hk {

// ======================================================================================== pipelines
namespace sched {
struct double_buffer {};   // prefetch STAGES-1 tiles ahead, one barrier per step
struct pingpong {};        // 8 waves: two groups of 4 staggered by a barrier (HipKittens)
}  // namespace sched
#ifndef HK_PIPELINE_DEFAULT
#define HK_PIPELINE_DEFAULT double_buffer
#endif

// How the emitter calls a pipeline's load step (codegen.py, split_prefetch; the plan records the choice):
//   whole: load(i, s) does the step's loads at once (global -> registers -> LDS, the waits inside);
//   split<S...>: load(i, s, phase) -- every load of the step is a cursor load of one of the shared tiles
//     S...; phase::issue starts the global reads before the compute step, phase::commit writes the
//     staged registers to LDS after it. VM: the LDS-DMA instructions every wave still has in flight after
//     the issue of a whole step (global_shared.h, chunk_plan::DMA_MIN), which the waits count.
struct whole {
  static constexpr bool SPLIT = false;
  static constexpr int VM = 0;
};
template<class... S> struct split {
  static constexpr bool SPLIT = true;
  static constexpr int VM = (0 + ... + detail::chunk_plan<S>::DMA_MIN);
};

namespace detail {
template<class LD, class L> HK_DEV void load_all(L& load, int i, int s) {
  if constexpr (LD::SPLIT) load(i, s, phase::all{});
  else load(i, s);
}
// The tile of the oldest step in flight has landed: its LDS-DMA loads are complete when at most
// `younger` steps' worth (VM each) stay in flight -- a wait by count when all `younger` steps were issued
// (the last steps of the walk issue fewer: wait for everything). Register-staged loads need nothing here:
// their commit (a ds_write of the loaded registers) already waited for them, and the barrier's release
// fence waits for the ds_writes (lgkmcnt).
template<class LD, int younger> HK_DEV void wait_oldest(bool all_issued) {
  constexpr int N = LD::VM * younger;
  if constexpr (N > 0) {
    if (all_issued) wait_vmcnt<(N > 63 ? 63 : N)>();
    else async_wait_all();
  } else {
    async_wait_all();
  }
}

template<int S, class LD, class L, class Cm> HK_DEV void pipeline_db(int n, L& load, Cm& compute) {
  sync();                                     // earlier readers of the stages (e.g. a previous pipeline's)
  if constexpr (S == 1) {
    for (int i = 0; i < n; ++i) {
      sync();                                 // compute(i-1) is done with the only stage
      load_all<LD>(load, i, 0);
      async_wait_all();
      sync();
      compute(i, 0);
    }
  } else if constexpr (!LD::SPLIT) {
    constexpr int AHEAD = S - 1;
    for (int p = 0; p < AHEAD && p < n; ++p) load(p, p);
    for (int i = 0; i < n; ++i) {
      async_wait_all();
      sync();                                 // tile i visible; compute(i-1) done with stage (i-1)%S
      if (i + AHEAD < n) load(i + AHEAD, (i + AHEAD) % S);
      compute(i, i % S);
    }
  } else {
    // Step i: tile i has landed and is visible (the wait, the barrier); the reads of tile i+AHEAD are
    // issued, compute(i) runs while they are in flight, and the staged registers go to stage (i-1)%S,
    // which compute(i-1) finished with before the barrier. sched_barrier keeps the compiler from moving
    // the loads or the LDS writes into the compute step.
    constexpr int AHEAD = S - 1;
    for (int p = 0; p < AHEAD && p < n; ++p) load(p, p, phase::all{});
    for (int i = 0; i < n; ++i) {
      wait_oldest<LD, AHEAD - 1>(i + AHEAD - 1 < n);
      sync();
      const bool pre = i + AHEAD < n;
      if (pre) load(i + AHEAD, (i + AHEAD) % S, phase::issue{});
      __builtin_amdgcn_sched_barrier(0);
      compute(i, i % S);
      __builtin_amdgcn_sched_barrier(0);
      if (pre) load(i + AHEAD, (i + AHEAD) % S, phase::commit{});
    }
  }
  sync();                                     // later code (another pipeline) may refill the stages
}

// Group 1 (waves 4-7) runs one barrier behind group 0, so between two barriers one group loads
// while the other computes at raised priority. Stage i+AHEAD is written while the other group may
// still read stage i-1, hence AHEAD = S-2 (S >= 3); see README.md for the barrier-by-barrier proof.
// Split loads: a wave issues tile i+AHEAD's reads in its load phase and finishes them (commit, wait)
// after its own compute(i), before the barrier that ends its compute phase.
template<int S, class LD, class L, class Cm> HK_DEV void pipeline_pp(int n, L& load, Cm& compute) {
  static_assert(S >= 3, "ping-pong needs 3 or more stages");
  static_assert(NW == 8, "ping-pong runs 8 waves");
  constexpr int AHEAD = S - 2;
  const bool late = wave() >= 4;
  for (int p = 0; p < AHEAD && p < n; ++p) load_all<LD>(load, p, p);
  async_wait_all();
  sync();
  if (late) sync();
  for (int i = 0; i < n; ++i) {
    const bool pre = i + AHEAD < n;
    if constexpr (LD::SPLIT) {
      if (pre) load(i + AHEAD, (i + AHEAD) % S, phase::issue{});
    } else {
      if (pre) load(i + AHEAD, (i + AHEAD) % S);
      async_wait_all();
    }
    sync();
    __builtin_amdgcn_s_setprio(1);
    compute(i, i % S);
    __builtin_amdgcn_s_setprio(0);
    if constexpr (LD::SPLIT) {
      __builtin_amdgcn_sched_barrier(0);
      if (pre) load(i + AHEAD, (i + AHEAD) % S, phase::commit{});
      async_wait_all();                       // tile i+AHEAD's part of this wave has landed
    }
    sync();
  }
  if (!late) sync();
}
}  // namespace detail

template<int S, class SCHED = sched::HK_PIPELINE_DEFAULT, class LOADS = whole, class L, class Cm>
HK_DEV void pipeline(int n, L&& load, Cm&& compute) {
  if constexpr (same<SCHED, sched::pingpong>::value) detail::pipeline_pp<S, LOADS>(n, load, compute);
  else detail::pipeline_db<S, LOADS>(n, load, compute);
}

}  // namespace hk
