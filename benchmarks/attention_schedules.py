"""The rings and schedules the cuda backend can give attention on sm_90a, side by side in one process.

Each variant is the same kernel and tile compiled with other compile options (CudaOptions: the schedule variant,
base or fa3, and its parameters); each is checked against float64 on the timed inputs, then
all are timed in interleaved rounds (A B C ... then B C ... A: each round starts one later; hk bench's
bench.time_side_by_side) so that clock and thermal drift and the position after the cuDNN timing fall on every
variant alike; a variant's time is the median of its per-call times over all rounds, and both timing methods must
agree. Ratios are to the first variant (the shared ring) and to SDPA (cuDNN).

    python benchmarks/attention_schedules.py --compile-only      # warm the compile cache (parallel-friendly)
    python benchmarks/attention_schedules.py --json attention_schedules.json
"""
from __future__ import annotations

import argparse
import time

import torch

from attention_configs import _parse as tile_config     # this folder is on sys.path when run as a script

FA3 = {"variant": "fa3"}
VARIANTS = {
    "shared": {"variant": "base"},                # the shared ring (warp-specialised where the Program allows)
    "auto": {},                                   # the backend's own choice (schedule.fa3_variant)
    "fa3+persistent": FA3,                        # FA3's schedule forced (what "auto" takes where it builds)
    "fa3-in-order": {**FA3, "longest_first": 0},       # its tiles dealt in block order, not longest first
    "fa3-longest-16": {**FA3, "longest_first": 16},    # longest first from 16 query blocks a head (call 2's rule)
    "fa3-one-q": {**FA3, "prologue_stages": 1},        # one copy of Q: the next tile's waits for this tile's end
    "fa3-plain-store": {**FA3, "tma_store": False},    # the epilogue stores O from registers (no TMA store)
    "fa3-plain-one-q": {**FA3, "tma_store": False, "prologue_stages": 1},   # the fifth/sixth sessions' kernel
    "min-blocks-5": {"min_blocks": 5},            # __launch_bounds__(threads, 5): registers for a fifth 64x64 block
    "no-fill": {"fill_sm": False},                # ptxas's own registers, even where they cost blocks an SM
    "plain-dispatch": {"heavy_first": False},     # a dispatched causal grid in hardware order (not heaviest first)
    "ring-each": {"one_ring": False},             # each pipeline of such a block on a ring of its own
    "ring-min5": {"min_blocks": 5},               # one ring, five 64x64 blocks an SM even where that build spills
    "no-fill-ring-each": {"fill_sm": False, "one_ring": False},   # against no-fill: the ring at equal occupancy
}
# (the parts of FA3 alone, its warpgroups meeting at each pipeline, chained pipelines and a ring refilled after each
# step were variants here until 2026-12-06: each measured no gain and lay on no default path, so the schedule pass
# dropped them; perf-notes keeps their figures, git their code)
CASES = [(4096, 128, False), (4096, 128, True), (4096, 64, False), (1024, 128, False), (1024, 128, True),
         (1024, 64, False)]
H = 16


def _inputs(n, d, causal, sets=2, device="cuda"):
    from hk_portable.kernels import attention
    b = 16384 // n
    out = []
    for _ in range(sets):
        q, k, v = (torch.randn(b, H, n, d, device=device, dtype=torch.bfloat16) for _ in range(3))
        o = torch.full_like(q, float("nan"))
        lse = torch.full((b, H, n), float("nan"), device=device)
        out.append((q, k, v, o, lse, attention.scale_value(None, d), 0, n if causal else 0, 0))
    return out


def _artifacts(be, target, n, d, causal, names, tile=None):
    from hk_portable.backends.cuda import preferences
    from hk_portable.kernels import attention
    from hk_portable.runtime import cache
    sets = _inputs(64, d, causal, sets=1, device="cpu")          # tracing needs dtypes and ranks only
    consts = {"D": d, "MASKED": causal}       # what the library launches at n queries (the tuning table's first)
    q_n = torch.empty(1, 1, n, d, device="meta")
    cfg = preferences.first_ranked(attention.candidates(consts), preferences.attention_fwd(consts, (q_n,)))
    if tile:                                                      # BMxBNsSwW, e.g. 64x64s2w4
        cfg = {**cfg, **tile_config(tile)}
    if causal:                          # as the library builds a causal call: no left edge (attention.attention_fwd)
        cfg = {**cfg, "LEFT_BOUND": False}
    program = attention.attention_fwd_kernel.trace(*sets[0], **cfg)
    return cfg, {v: cache.compile_cached(be, program, target, VARIANTS[v]) for v in names}


def main():
    import hk_portable as hk
    from hk_portable.bench import time_side_by_side, to_json
    from hk_portable.kernels import attention
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = hk.get_backend("cuda")
    target = be.target("sm_90a")
    names = args.variants or list(VARIANTS)
    rows, t0 = [], time.time()
    for n, d, causal in args.cases or CASES:
        cfg, arts = _artifacts(be, target, n, d, causal, names, args.tile)
        if args.compile_only:
            continue
        sets = _inputs(n, d, causal)
        grid = (-(-n // cfg["BM"]), H, 16384 // n)
        row = dict(N=n, D=d, causal=causal, tile=f"{cfg['BM']}x{cfg['BN']}s{cfg['STAGES']}w{cfg['num_warps']}")
        ref, _ = attention.reference(*(x[:1] for x in sets[0][:3]), causal=causal)     # float64, batch 0
        for v in names:                              # correctness first, on the timed inputs, output poisoned
            sets[0][3].fill_(float("nan"))
            be.launch(arts[v], sets[0], grid)
            torch.cuda.synchronize()
            o = sets[0][3]
            row[f"{v}_err"] = float((o[:1].double() - ref).abs().max() / ref.abs().max()) if not o.isnan().any() else "NaN"
        del ref
        fl = 4.0 * (16384 // n) * H * n * n * d / (2 if causal else 1)
        def cudnn(i):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(*sets[i][:3], is_causal=causal)
        fns = {**{v: (lambda i, v=v: be.launch(arts[v], sets[i], grid)) for v in names}, "cudnn": cudnn}
        # interleaved rounds, the order rotating (hk bench's method): no variant always follows cuDNN
        timed = time_side_by_side(fns, 2, "cuda", args.budget * args.rounds, rounds=args.rounds)
        ms = {v: t.ms for v, t in timed.items()}
        for v, t in timed.items():
            row[f"{v}_tflops"] = round(fl / ms[v] / 1e9, 1)
            row[f"{v}_vs_cudnn"] = round(ms["cudnn"] / ms[v], 3)
            row[f"{v}_vs_{names[0]}"] = round(ms[names[0]] / ms[v], 3)
            row[f"{v}_spread"] = round(t.spread, 3)      # events median against the rounds' batch means
            row[f"{v}_agree"] = t.agree
        rows.append(row)
        print({k: x for k, x in row.items() if k.endswith(("_vs_cudnn", "_err")) or k in ("N", "D", "causal", "tile")},
              flush=True)
    if not args.compile_only:
        to_json({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": torch.cuda.get_device_name(),
                 "seconds": round(time.time() - t0, 1), "rounds": args.rounds, "budget_s": args.budget,
                 "variants": {v: VARIANTS[v] for v in names}, "rows": rows}, args.json)


def attention_case(text: str) -> tuple[int, int, bool]:
    """"N,D[,causal]" (causal: 1, c, causal or true) as (N, D, causal); ncu_probe.py reads its cases the same way."""
    n, d, *causal = text.split(",")
    return int(n), int(d), bool(causal) and causal[0] in ("1", "c", "causal", "True", "true")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="attention_schedules.json")
    ap.add_argument("--budget", type=float, default=0.1, help="seconds per variant per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=None)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--tile", default=None, metavar="BMxBNsSwW",
                    help="this tile instead of the first (long-sequence) candidate, e.g. 64x64s2w4")
    ap.add_argument("--cases", nargs="+", type=attention_case, default=None, help="N,D[,causal] each (default: CASES)")
    args = ap.parse_args()
    main()
