// hk_cuda/pipelines.cuh -- schedules: hk::pipeline<S> (the cp.async ring; sm_90a's TMA schedule: tma.cuh).
namespace hk {

// ======================================================================================== pipeline
namespace detail {
// After a stage's copies landed: make them visible to every thread (and, on sm_90a, to the async proxy
// that wgmma reads shared memory through: staged mma ops take no barrier of their own).
HK_DEV void publish() {
#ifdef HK_WGMMA
    fence_proxy_async();
#endif
    sync();
}
// After compute(i): an async wgmma chain (schedule.py's MMA_ASYNC) must retire before the next load
// overwrites the stage it reads; this ring refills a stage one step after computing on it.
HK_DEV void retire() {
#ifdef HK_WGMMA
    if constexpr (NUM_WARPS % 4 == 0) wgmma_wait<0>();   // wgmma needs whole warpgroups (smaller blocks have none)
#endif
}
// sm_80+: a ring of S shared stages filled by cp.async, S-1 loads in flight ahead of the compute.
// The barrier at the top of each step both publishes stage i and retires compute(i-1), whose stage
// the next load overwrites.
template <int S> struct pipeline_cp_async {
    template <class L, class C> static HK_DEV void run(int n, L& load, C& compute) {
        publish();                                          // earlier readers of the stages; earlier writes
        if constexpr (S == 1) {
            for (int i = 0; i < n; ++i) {
                if (i) sync();
                load(i, 0);
                async_commit();
                async_wait<0>();
                publish();
                compute(i, 0);
                retire();
            }
        } else {
#pragma unroll
            for (int p = 0; p < S - 1; ++p) {
                if (p < n) load(p, p);
                async_commit();
            }
            for (int i = 0; i < n; ++i) {
                async_wait<S - 2>();
                publish();
                const int nx = i + S - 1;
                if (nx < n) load(nx, nx % S);
                async_commit();
                compute(i, i % S);
                retire();
            }
        }
        async_wait<0>();
        sync();                                             // later code may reuse the buffers
    }
};
#ifndef HK_SCHEDULE
template <int S> struct pipeline_schedule : pipeline_cp_async<S> {};
#endif
}  // namespace detail

template <int S, class L, class C>
HK_DEV void pipeline(int n, L&& load, C&& compute) {
    detail::pipeline_schedule<S>::run(n, load, compute);
}

}  // namespace hk
