// hk_hip/pipelines.h -- schedules: hk::pipeline<S, SCHED> (double buffering; the 8-wave ping-pong).
namespace hk {

// ======================================================================================== pipelines
namespace sched {
struct double_buffer {};   // prefetch STAGES-1 tiles ahead, one barrier per step
struct pingpong {};        // 8 waves: two groups of 4 staggered by a barrier (HipKittens)
}  // namespace sched
#ifndef HK_PIPELINE_DEFAULT
#define HK_PIPELINE_DEFAULT double_buffer
#endif

namespace detail {
template<int S, class L, class Cm> HK_DEV void pipeline_db(int n, L& load, Cm& compute) {
  sync();                                     // earlier readers of the stages (e.g. a previous pipeline's)
  if constexpr (S == 1) {
    for (int i = 0; i < n; ++i) {
      sync();                                 // compute(i-1) is done with the only stage
      load(i, 0);
      async_wait_all();
      sync();
      compute(i, 0);
    }
  } else {
    constexpr int AHEAD = S - 1;
    for (int p = 0; p < AHEAD && p < n; ++p) load(p, p);
    for (int i = 0; i < n; ++i) {
      async_wait_all();
      sync();                                 // tile i visible; compute(i-1) done with stage (i-1)%S
      if (i + AHEAD < n) load(i + AHEAD, (i + AHEAD) % S);
      compute(i, i % S);
    }
  }
  sync();                                     // later code (another pipeline) may refill the stages
}

// Group 1 (waves 4-7) runs one barrier behind group 0, so between two barriers one group loads
// while the other computes at raised priority. Stage i+AHEAD is written while the other group may
// still read stage i-1, hence AHEAD = S-2 (S >= 3); see README.md for the barrier-by-barrier proof.
template<int S, class L, class Cm> HK_DEV void pipeline_pp(int n, L& load, Cm& compute) {
  static_assert(S >= 3, "ping-pong needs 3 or more stages");
  static_assert(NW == 8, "ping-pong runs 8 waves");
  constexpr int AHEAD = S - 2;
  const bool late = wave() >= 4;
  for (int p = 0; p < AHEAD && p < n; ++p) load(p, p);
  async_wait_all();
  sync();
  if (late) sync();
  for (int i = 0; i < n; ++i) {
    if (i + AHEAD < n) load(i + AHEAD, (i + AHEAD) % S);
    async_wait_all();
    sync();
    __builtin_amdgcn_s_setprio(1);
    compute(i, i % S);
    __builtin_amdgcn_s_setprio(0);
    sync();
  }
  if (!late) sync();
}
}  // namespace detail

template<int S, class SCHED = sched::HK_PIPELINE_DEFAULT, class L, class Cm>
HK_DEV void pipeline(int n, L&& load, Cm&& compute) {
  if constexpr (same<SCHED, sched::pingpong>::value) detail::pipeline_pp<S>(n, load, compute);
  else detail::pipeline_db<S>(n, load, compute);
}

}  // namespace hk
