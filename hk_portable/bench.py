"""`hk bench`: each library kernel against its vendor baseline, side by side in one process, on the same
inputs, with numbers that check themselves.

- Every case builds its own inputs when it runs (never a closure over a loop variable shared by cases),
  several input sets when one set would stay in L2, and rotates through them.
- Each figure is timed by two methods: the median of per-call device events (CUDA) and the mean of a batch
  of back-to-back calls on a host clock after a synchronize. They must agree within `AGREE` or the entry
  says so (`agree: false`), and the run's `ok` is false.
- hk and its baselines are timed side by side in `ROUNDS` interleaved rounds (each round: every function's
  per-call events in two halves around its batch, the functions' order rotating), each method's figure a median
  over the rounds (the rounds' batch means are in the JSON as `rounds_ms`, the per-call times' p10 / p50 / p90 as
  `per_call_p10_p50_p90_ms`): a GPU whose clock moves under load (the H200 read cuBLAS 4096^3 at 787 and 699
  TFLOP/s minutes apart, 2026-12-04) moves every function and both methods alike instead of whichever ran last.
  Each figure also says how long the host took to issue a call in the batches (`host_ms_per_call`): close to the
  batch time, the host sets the pace, and per-call events may then time host work too.
- Within a size sweep, a case with `SCALE_MIN_WORK`x the work of another or more must take at least the
  fourth root of that factor longer (a benchmark that times the same shape for every size fails this).
- Outputs are compared with the baseline's (relative Frobenius error) before timing.

Baselines are yardsticks only: torch.matmul (cuBLAS), scaled_dot_product_attention with the cuDNN and
flash backends, torch.compile for dropout+residual+layernorm, a device copy for bandwidth. On the CPU the
same harness runs at small sizes (events replaced by the host clock) so that its logic is tested in CI.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import statistics
import time
from pathlib import Path
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

AGREE = 0.10              # the two timing methods must agree within 10 %
ROUNDS = 5                # interleaved timing rounds per case (time_side_by_side)
SCALE_MIN_WORK = 1.9      # the scaling check compares cases whose work differs at least this much
ROTATE_BYTES = 256 << 20  # input sets rotated so that one cycle moves at least this much (H200 L2: 50 MB)
UNITS = {"TFLOP/s": 1e12, "GB/s": 1e9, "kcall/s": 1e3}     # a case's work per second in its unit


@dataclass
class Case:
    """One benchmark: `make(device)` builds fresh inputs and returns a Bound over them."""
    family: str
    name: str
    work: float                    # FLOPs or bytes
    unit: str                      # a key of UNITS
    make: Callable[[str], "Bound"]
    size: dict = field(default_factory=dict)
    sweep: tuple = ()              # cases with the same family and sweep differ only in size: they must scale
    by_batch: bool = False         # launch-bound (the host family): the figure is the batch mean, the host's time a
    # call; per-call events then time the host's gaps too, so the two methods are not held to agree


@dataclass
class Bound:
    """A case on its inputs: hk(i) and each baseline(i) run on input set i of n_sets; check() is the relative
    error of hk's output against float64 math."""
    hk: Callable[[int], object] | None          # None: a ceiling measurement (the device copy)
    baselines: dict[str, Callable[[int], object]]
    check: Callable[[], float]
    n_sets: int = 1
    profile: Callable[[], dict] | None = None   # where the time goes (the block family: a profiler table)


@dataclass
class Timing:
    ms: float                      # the events median (GPU) or the per-call host median (CPU)
    ms_batch: float                # batch mean on the host clock
    agree: bool
    rounds_ms: list[float] = field(default_factory=list)   # each round's batch mean: the drift over the case
    per_call_quantiles: list[float] = field(default_factory=list)   # p10, p50, p90 of every per-call time: a
    # bimodal function (a slow mode the median skips and the batch mean takes) shows as p90 far above p50
    host_ms: float = float("nan")  # the host's time to issue one call in the batches (median over the rounds): near
    # ms_batch, the host, not the device, sets the pace (on the CPU, where calls are synchronous, it always is)

    @property
    def spread(self) -> float:
        return abs(self.ms - self.ms_batch) / min(self.ms, self.ms_batch)


# ------------------------------------------------------------------------------------------- timing
def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_fn(fn: Callable[[int], object], n_sets: int, device: str, budget_s: float = 1.0) -> Timing:
    """Two independent timings of fn over rotating input sets (see the module docstring)."""
    return time_side_by_side({"fn": fn}, n_sets, device, budget_s)["fn"]


def time_side_by_side(fns: dict[str, Callable[[int], object]], n_sets: int, device: str,
                      budget_s: float = 1.0, rounds: int = ROUNDS) -> dict[str, Timing]:
    """Each function timed by both methods in `rounds` interleaved rounds, `budget_s` each: per function the
    median of all per-call times and the median of the rounds' batch means."""
    reps = {}
    for name, fn in fns.items():
        for i in range(n_sets):        # warm-up: compile, module load, autotune, handle creation
            fn(i)
        _sync(device)
        t0 = time.perf_counter()
        fn(0)
        _sync(device)
        once = max(time.perf_counter() - t0, 1e-6)
        reps[name] = int(min(200, max(5, budget_s / 2 / once))) // rounds + 1
    per_call = {name: [] for name in fns}
    batch = {name: [] for name in fns}
    host = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in rotated(names, r):
            # the batch sits between two halves of the per-call times, so that both methods sample the same
            # moment of a drifting clock (a batch that always followed its events ran on a hotter device: the
            # H200's GQA causal row read 10 % slower in it, 2026-12-04)
            n = reps[name]
            per_call[name] += _per_call_ms(fns[name], n_sets, device, (n + 1) // 2)
            batch_ms, host_ms = _batch_ms(fns[name], n_sets, device, n)
            batch[name].append(batch_ms)
            host[name].append(host_ms)
            per_call[name] += _per_call_ms(fns[name], n_sets, device, n // 2)
    out = {}
    for name in fns:
        t = Timing(statistics.median(per_call[name]), statistics.median(batch[name]), True, batch[name],
                   _quantiles(per_call[name]), statistics.median(host[name]))
        t.agree = t.spread <= AGREE
        out[name] = t
    return out


def _quantiles(xs: list[float]) -> list[float]:
    """p10, p50, p90 (nearest rank)."""
    xs = sorted(xs)
    return [xs[min(len(xs) - 1, int(q * len(xs)))] for q in (0.1, 0.5, 0.9)]


def rotated(names: list, r: int) -> list:
    """Round r's order of the functions timed side by side: each round starts one later, so none always runs first."""
    k = r % len(names)
    return names[k:] + names[:k]


def _per_call_ms(fn, n_sets: int, device: str, reps: int) -> list[float]:
    """Per-call times. On CUDA: a pair of events around each call, all enqueued back to back and read after
    one synchronize, so the device never idles waiting for the host between calls."""
    if device != "cuda":
        times = []
        for r in range(reps):
            t0 = time.perf_counter()
            fn(r % n_sets)
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    _head_start()
    for r, (s, e) in enumerate(events):
        s.record()
        fn(r % n_sets)
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


HEAD_START_CYCLES = 2_000_000      # ~1 ms at the H200's clock


def _head_start() -> None:
    """A spin kernel ahead of the timed calls, so the host enqueues them while the device is still busy: an event
    pair then times the call, not the host's work before its launch (with the device idle when the start event
    runs, that work counts). Where the host is slower than the calls, the queue still drains and the per-call
    times grow: then the batch, on the host clock, is the honest figure and the methods disagree, as they should."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(HEAD_START_CYCLES)


def _batch_ms(fn, n_sets: int, device: str, reps: int) -> tuple[float, float]:
    """(ms a call of `reps` back-to-back calls, ms a call the host took to issue them before the synchronize)."""
    _sync(device)
    t0 = time.perf_counter()
    for r in range(reps):
        fn(r % n_sets)
    issued = time.perf_counter()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3 / reps, (issued - t0) * 1e3 / reps


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))


def n_sets_for(bytes_per_set: int, device: str) -> int:
    """How many input sets make one rotation at least ROTATE_BYTES (1 on the CPU: nothing to defeat)."""
    if device != "cuda":
        return 1
    return max(2, min(8, math.ceil(ROTATE_BYTES / max(bytes_per_set, 1))))


# -------------------------------------------------------------------------------------------- cases
def _randn(shape, device, dtype):
    return torch.randn(*shape, device=device, dtype=dtype)


def _operand(rows: int, cols: int, transposed: bool, device) -> torch.Tensor:
    """[rows, cols] bf16, row-major or a transposed view of a row-major [cols, rows] (W.t(), x.t())."""
    return _randn((cols, rows), device, torch.bfloat16).t() if transposed else _randn((rows, cols), device, torch.bfloat16)


def gemm_case(M: int, N: int, K: int, layout: str = "nn", family: str = "gemm") -> Case:
    """c = a @ b with a [M, K] and b [K, N] as given ("n") or transposed views ("t"): "nt" is x @ W.t() (a Linear's
    forward), "tn" x.t() @ g (its weight gradient), "nn" g @ W (its input gradient)."""
    def make(device):
        from .kernels.gemm import gemm
        n = n_sets_for(2 * (M * K + K * N), device)
        sets = [(_operand(M, K, layout[0] == "t", device), _operand(K, N, layout[1] == "t", device))
                for _ in range(n)]
        outs = [torch.empty(M, N, device=device, dtype=torch.bfloat16) for _ in range(n)]

        def hk_fn(i):
            return gemm(*sets[i], out=outs[i])

        def check():
            a, b = sets[0]
            return rel_error(gemm(a, b, out=outs[0]), a.double() @ b.double())
        return Bound(hk_fn, {"torch.matmul (cuBLAS)": lambda i: torch.matmul(*sets[i])}, check, n)
    name = f"gemm bf16 {M}x{N}x{K}" + ("" if layout == "nn" else f" {layout}")
    if family == RANDOM_GEMMS:          # shapes of every aspect: no two form a size sweep the scaling check holds
        return Case(family, f"gemm random bf16 {M}x{N}x{K}", 2.0 * M * N * K, "TFLOP/s", make,
                    dict(M=M, N=N, K=K, layout=layout), sweep=(M, N, K))
    return Case(family, name, 2.0 * M * N * K, "TFLOP/s", make, dict(M=M, N=N, K=K, layout=layout), sweep=(layout,))


RANDOM_GEMMS = "gemm random"            # the family of random_gemm_shapes, summarised in the report (random_sweep)


def random_gemm_shapes(count: int = 100, seed: int = 39, mn=(128, 16384), k=(64, 16384)) -> list[tuple[int, int, int]]:
    """`count` GEMM shapes (M, N, K), log-uniform in the ranges (issue 39: M, N in 128..16384, K in 64..16384),
    none a multiple of 64, so ragged tiles, small K and tall-skinny shapes all occur; fixed by `seed`."""
    rng = random.Random(seed)

    def draw(lo: int, hi: int) -> int:
        while True:
            v = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
            if v % 64 and lo <= v <= hi:
                return v
    return [(draw(*mn), draw(*mn), draw(*k)) for _ in range(count)]


def random_sweep(entries: list[dict], worst: int = 5, at_least: float = 0.90) -> dict | None:
    """The random-shape GEMM family in one line: how many shapes reach `at_least` x the baseline, the median and
    the `worst` shapes by ratio (the acceptance of issue 39, item 4)."""
    rows = sorted((e["ratio_hk_over_baseline"], e["name"]) for e in entries
                  if e["family"] == RANDOM_GEMMS and "ratio_hk_over_baseline" in e)
    if not rows:
        return None
    ratios = [r for r, _ in rows]
    return {"shapes": len(rows), "at_least": at_least, "reaching": sum(r >= at_least for r in ratios),
            "median_ratio": statistics.median(ratios), "worst": [{"name": n, "ratio": r} for r, n in rows[:worst]],
            "errors": sum(e["family"] == RANDOM_GEMMS and "error" in e for e in entries)}


def attention_case(B: int, Hq: int, Hkv: int, N: int, D: int, causal: bool, dv: int | None = None) -> Case:
    """attention_fwd against SDPA's backends; dv: v's head dim where it differs from D (MLA's prefill)."""
    Dv = D if dv is None else dv

    def make(device):
        from .kernels.attention import attention_fwd
        F = torch.nn.functional
        per_set = 2 * B * N * (Hq * (D + Dv) + Hkv * (D + Dv))
        n = n_sets_for(per_set, device)
        sets = [(_randn((B, Hq, N, D), device, torch.bfloat16), _randn((B, Hkv, N, D), device, torch.bfloat16),
                 _randn((B, Hkv, N, Dv), device, torch.bfloat16)) for _ in range(n)]
        gqa = Hq != Hkv

        def sdpa(i, which=None):
            q, k, v = sets[i]
            if which is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            from torch.nn.attention import sdpa_kernel
            with sdpa_kernel(which):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        baselines = {"SDPA": sdpa}
        if device == "cuda":
            from torch.nn.attention import SDPBackend
            baselines = {"SDPA cuDNN": lambda i: sdpa(i, SDPBackend.CUDNN_ATTENTION),
                         "SDPA flash": lambda i: sdpa(i, SDPBackend.FLASH_ATTENTION)}

        def check():          # float64 on one batch and one GQA group: the full N x N in f64 is too large
            q, k, v = sets[0]
            g = Hq // Hkv
            ref = F.scaled_dot_product_attention(q[:1, :g].double(), k[:1, :1].double(), v[:1, :1].double(),
                                                 is_causal=causal, enable_gqa=gqa)
            return rel_error(attention_fwd(q, k, v, causal=causal)[0][:1, :g], ref)
        return Bound(lambda i: attention_fwd(*sets[i], causal=causal), baselines, check, n)
    flops = 2.0 * B * Hq * N * N * (D + Dv) / (2 if causal else 1)
    gqa = f" GQA {Hq}/{Hkv}" if Hq != Hkv else ""
    dims = f"D{D}" + (f" Dv{Dv}" if Dv != D else "")
    return Case("attention", f"attention_fwd B{B} H{Hq}{gqa} N{N} {dims}{' causal' if causal else ''}", flops,
                "TFLOP/s", make, dict(B=B, Hq=Hq, Hkv=Hkv, N=N, D=D, Dv=Dv, causal=causal), (Hq, Hkv, D, Dv, causal))


def gemm_fp8_case(M: int, N: int, K: int) -> Case:
    """e4m3 x e4m3 with per-tensor scales to bf16, B column-major (torch._scaled_mm's layout)."""
    def make(device):
        from .kernels.gemm_fp8 import gemm_fp8, reference
        n = n_sets_for(M * K + K * N, device)
        e4m3 = torch.float8_e4m3fn
        sets = [(_randn((M, K), device, torch.float32).to(e4m3), _randn((N, K), device, torch.float32).to(e4m3).t())
                for _ in range(n)]
        sa, sb = torch.tensor([0.5], device=device), torch.tensor([0.25], device=device)
        outs = [torch.empty(M, N, device=device, dtype=torch.bfloat16) for _ in range(n)]

        def check():
            a, b = sets[0]
            return rel_error(gemm_fp8(a, b, sa, sb, outs[0]), reference(a, b, sa, sb))
        if device == "cuda":
            baselines = {"torch._scaled_mm": lambda i: torch._scaled_mm(*sets[i], scale_a=sa, scale_b=sb,
                                                                         out_dtype=torch.bfloat16)}
        else:               # no fp8 matmul in torch on the CPU: the dequantised f32 product
            baselines = {"f32 matmul of the dequantised operands": lambda i: sets[i][0].float() @ sets[i][1].float()}
        return Bound(lambda i: gemm_fp8(*sets[i], sa, sb, outs[i]), baselines, check, n)
    return Case("gemm_fp8", f"gemm fp8 e4m3 {M}x{N}x{K}", 2.0 * M * N * K, "TFLOP/s", make, dict(M=M, N=N, K=K))


def attention_bwd_case(B: int, Hq: int, Hkv: int, N: int, D: int, causal: bool, deterministic: bool = False,
                       dv: int | None = None) -> Case:
    """dQ, dK, dV from dO (hk: attention_bwd given the forward's o and lse) against SDPA's backward on the
    graph its forward left (timed alone). FLOPs: 2.5x the forward's, the usual count. deterministic: hk's dQ
    without atomics (SDPA's backends as they run). dv: v's head dim where it differs from D."""
    Dv = D if dv is None else dv

    def make(device):
        from .kernels.attention import attention_fwd
        from .kernels.attention_bwd import attention_bwd, reference
        F = torch.nn.functional
        n = n_sets_for(2 * B * N * (D + Dv) * (Hq * 2 + Hkv), device)
        gqa = Hq != Hkv

        def inputs(b, n_, grad=False):
            return [_randn(s, device, torch.bfloat16).requires_grad_(grad)
                    for s in ((b, Hq, n_, D), (b, Hkv, n_, D), (b, Hkv, n_, Dv))]
        sets = []
        for _ in range(n):
            q, k, v = inputs(B, N)
            o, lse = attention_fwd(q, k, v, causal=causal)
            sets.append((q, k, v, o, lse, torch.randn_like(o)))

        def sdpa_graph(which):
            """SDPA forwards (one per input set) under one backend; the timed part is the backward."""
            from torch.nn.attention import sdpa_kernel
            graphs = []
            for q, k, v, _, _, do in sets:
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                with sdpa_kernel(which) if which is not None else contextlib.nullcontext():
                    graphs.append((F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=gqa),
                                   (qq, kk, vv), do))
            return lambda i: torch.autograd.grad(graphs[i][0], graphs[i][1], graphs[i][2], retain_graph=True)

        if device == "cuda":
            from torch.nn.attention import SDPBackend
            baselines = {"SDPA cuDNN backward": sdpa_graph(SDPBackend.CUDNN_ATTENTION),
                         "SDPA flash backward": sdpa_graph(SDPBackend.FLASH_ATTENTION)}
        else:
            baselines = {"SDPA backward": sdpa_graph(None)}

        def check():          # the same kernels at a small N, in full against float64 autograd
            q, k, v = (t.detach() for t in inputs(1, min(N, 256)))
            o, lse = attention_fwd(q, k, v, causal=causal)
            do = torch.randn_like(o)
            got = attention_bwd(q, k, v, o, lse, do, causal=causal, deterministic=deterministic)
            return max(rel_error(g, r) for g, r in zip(got, reference(q, k, v, do, causal=causal)))
        return Bound(lambda i: attention_bwd(*sets[i], causal=causal, deterministic=deterministic), baselines, check, n)
    flops = 2.5 * 2.0 * B * Hq * N * N * (D + Dv) / (2 if causal else 1)
    gqa = f" GQA {Hq}/{Hkv}" if Hq != Hkv else ""
    dims = f"D{D}" + (f" Dv{Dv}" if Dv != D else "")
    name = (f"attention_bwd B{B} H{Hq}{gqa} N{N} {dims}{' causal' if causal else ''}"
            f"{' deterministic' if deterministic else ''}")
    return Case("attention_bwd", name, flops, "TFLOP/s", make,
                dict(B=B, Hq=Hq, Hkv=Hkv, N=N, D=D, Dv=Dv, causal=causal, deterministic=deterministic),
                (Hq, Hkv, D, Dv, causal, deterministic))


def rotary_case(B: int, N: int, H: int, D: int) -> Case:
    """NeoX rotary of x [B, N, H, D] bf16 with f32 tables, out of place, against torch.compile of the same
    math (eager on the CPU)."""
    def make(device):
        from .kernels.rotary import reference, rotary, tables
        n = n_sets_for(2 * B * N * H * D * 2, device)
        sets = [_randn((B, N, H, D), device, torch.bfloat16) for _ in range(n)]
        outs = [torch.empty_like(x) for x in sets]
        cos, sin = tables(N, D, device=device)

        def eager(i):
            x = sets[i].float()
            x1, x2 = x[..., : D // 2], x[..., D // 2:]
            c, s = cos[None, :, None, :], sin[None, :, None, :]
            return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).to(torch.bfloat16)

        baselines = {"torch.compile": torch.compile(eager), "torch eager": eager} if device == "cuda" else \
            {"torch eager": eager}

        def check():
            return rel_error(rotary(sets[0], cos, sin, out=outs[0]), reference(sets[0], cos, sin))
        return Bound(lambda i: rotary(sets[i], cos, sin, out=outs[i]), baselines, check, n)
    nbytes = 2.0 * B * N * H * D * 2 + 2 * N * D // 2 * 4
    return Case("rotary", f"rotary neox B{B} N{N} H{H} D{D}", nbytes, "GB/s", make, dict(B=B, N=N, H=H, D=D),
                (H, D))


def layernorm_case(rows: int, d: int, p: float = 0.1) -> Case:
    def make(device):
        from .kernels.layernorm import dropout_residual_layernorm
        n = n_sets_for(4 * rows * d * 2, device)
        sets = [(_randn((rows, d), device, torch.bfloat16), _randn((rows, d), device, torch.bfloat16))
                for _ in range(n)]
        w, b = torch.randn(d, device=device), torch.randn(d, device=device)

        def eager(i):
            x, r = sets[i]
            h = torch.nn.functional.dropout(x, p) + r
            return torch.nn.functional.layer_norm(h.float(), (d,), w, b).to(x.dtype)

        baselines = {"torch eager": eager}
        if device == "cuda":
            baselines = {"torch.compile": torch.compile(eager), "torch eager": eager}

        def check():          # no dropout: the baseline's RNG differs from Philox, so compare at p=0
            x, r = sets[0]
            y = dropout_residual_layernorm(x, r, w, b, p=0.0)[0]
            ref = torch.nn.functional.layer_norm((x.double() + r.double()), (d,), w.double(), b.double())
            return rel_error(y, ref)
        return Bound(lambda i: dropout_residual_layernorm(*sets[i], w, b, p=p, seed=i), baselines, check, n)
    nbytes = 4.0 * rows * d * 2 + 2 * d * 4        # read x and residual, write y and h (bf16); w, b (f32)
    return Case("layernorm", f"dropout+residual+layernorm {rows}x{d} p={p}", nbytes, "GB/s", make,
                dict(rows=rows, d=d), (d, p))


def layernorm_bwd_case(rows: int, d: int, p: float = 0.1) -> Case:
    """The backward of dropout+residual+layernorm (dx, dresidual, dweight, dbias) against torch.compile of
    the same math, which reads the dropout mask torch's own dropout saves (hk regenerates it)."""
    def make(device):
        from .kernels.layernorm_bwd import dropout_residual_layernorm_bwd
        n = n_sets_for(4 * rows * d * 2, device)
        sets = [(_randn((rows, d), device, torch.bfloat16), _randn((rows, d), device, torch.bfloat16),
                 torch.rand(rows, d, device=device) >= p) for _ in range(n)]
        w, b = torch.randn(d, device=device), torch.randn(d, device=device)

        def eager(i, eps=1e-5):
            h, dy, keep = sets[i]
            hf = h.float()
            mean = hf.mean(-1, keepdim=True)
            centred = hf - mean
            rstd = torch.rsqrt((centred * centred).mean(-1, keepdim=True) + eps)
            xhat = centred * rstd
            g = dy.float() * w
            dh = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
            dx = torch.where(keep, dh / (1 - p), 0.0)
            return dx.to(h.dtype), dh.to(h.dtype), (dy.float() * xhat).sum(0), dy.float().sum(0)

        baselines = {"torch eager": eager}
        if device == "cuda":
            baselines = {"torch.compile": torch.compile(eager), "torch eager": eager}

        def check():          # p = 0: dresidual = dh against float64 autograd
            h, dy, _ = sets[0]
            dres = dropout_residual_layernorm_bwd(dy, h, w, b)[1]
            hd = h.double().requires_grad_()
            y = torch.nn.functional.layer_norm(hd, (d,), w.double(), b.double())
            return rel_error(dres, torch.autograd.grad(y, hd, dy.double())[0])
        return Bound(lambda i: dropout_residual_layernorm_bwd(sets[i][1], sets[i][0], w, b, p=p, seed=i),
                     baselines, check, n)
    nbytes = 4.0 * rows * d * 2 + 4 * d * 4       # read h and dy, write dx and dresidual (bf16); w, dw, db (f32)
    return Case("layernorm", f"layernorm backward {rows}x{d} p={p}", nbytes, "GB/s", make, dict(rows=rows, d=d),
                (d, p, "bwd"))


TUTORIAL = Path(__file__).resolve().parents[1] / "examples" / "gelu_linear.py"   # the README's tunable kernel


def tunable_case(M: int, N: int, K: int) -> Case:
    """The README's tunable kernel (examples/gelu_linear.py: gelu(x @ w^T + bias), its tiles declared tunable and
    chosen by the backend) against the same expression under torch.compile (first: the issue's bar) and eager."""
    def make(device):
        from .cli import _user_kernel
        if not TUTORIAL.is_file():
            raise FileNotFoundError(f"{TUTORIAL}: the tutorial kernel ships with the repository, not the wheel")
        module, _ = _user_kernel(f"{TUTORIAL}:gelu_linear")
        n = n_sets_for(2 * (M * K + N * K + M * N), device)
        sets = [(_randn((M, K), device, torch.bfloat16), _randn((N, K), device, torch.bfloat16) / K ** 0.5,
                 _randn((N,), device, torch.bfloat16)) for _ in range(n)]
        outs = [torch.empty(M, N, device=device, dtype=torch.bfloat16) for _ in range(n)]

        def expression(x, w, b):
            return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh")
        compiled = torch.compile(expression, dynamic=False)

        def check():
            return rel_error(module.linear_gelu(*sets[0], out=outs[0]), module.reference(*sets[0]))
        return Bound(lambda i: module.linear_gelu(*sets[i], out=outs[i]),
                     {"torch.compile": lambda i: compiled(*sets[i]), "torch eager": lambda i: expression(*sets[i])},
                     check, n)
    return Case("tunable", f"gelu_linear (tunable) {M}x{N}x{K}", 2.0 * M * N * K, "TFLOP/s", make,
                dict(M=M, N=N, K=K))


def copy_case(nbytes: int) -> Case:
    """The device's copy bandwidth (bytes read + bytes written): the memory-bound kernels' ceiling."""
    def make(device):
        n = max(1, nbytes // 4)
        src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
        return Bound(None, {"device copy": lambda i: dst.copy_(src)},
                     lambda: 0.0 if torch.equal(dst.copy_(src), src) else 1.0)
    return Case("copy", f"device copy {nbytes >> 20} MiB", 2.0 * nbytes, "GB/s", make, dict(bytes=nbytes))


def default_cases(device: str, quick: bool = False) -> list[Case]:
    """The kernels at the issue's shapes, then the model families (bench_model: a transformer block, ops' host
    time), on a GPU; small ones on the CPU (the harness check in CI)."""
    from .bench_model import model_cases
    return kernel_bench_cases(device, quick) + model_cases(device, quick)


def kernel_bench_cases(device: str, quick: bool = False) -> list[Case]:
    if device != "cuda":
        return [gemm_case(64, 64, 64), gemm_case(128, 128, 128), gemm_case(64, 64, 64, "nt"), gemm_case(128, 128, 128, "nt"),
                *[gemm_case(*g, family=RANDOM_GEMMS) for g in random_gemm_shapes(2, mn=(16, 160), k=(16, 160))],
                gemm_case(64, 64, 64, "tn"), gemm_case(128, 128, 128, "tt"), gemm_fp8_case(64, 64, 64),
                gemm_fp8_case(128, 128, 128), attention_case(1, 2, 2, 64, 64, False),
                attention_case(1, 2, 2, 128, 64, False), attention_bwd_case(1, 2, 2, 64, 64, False),
                attention_bwd_case(1, 2, 2, 128, 64, False), layernorm_case(64, 256), layernorm_case(256, 256),
                layernorm_bwd_case(64, 256), layernorm_bwd_case(256, 256), rotary_case(1, 64, 2, 64),
                rotary_case(1, 128, 2, 64), tunable_case(64, 64, 64), tunable_case(128, 128, 128)]
    gemms = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336), (16384, 14336, 4096), (4000, 4000, 4000)]
    attn = [(16384 // N, H, Hkv, N, D, c) for N in (1024, 4096, 16384) for D in (64, 128) for c in (False, True)
            for H, Hkv in ((16, 16),)] + [(4, 32, 8, 4096, 128, c) for c in (False, True)]
    if quick:
        gemms, attn = gemms[:2], [a for a in attn if a[3] == 4096 and a[4] == 128]
    # issue 36's shapes: D64 / D128, causal and not, N 1024 / 4096 / 16384, GQA 32/8 and the Llama block's 16/4,
    # and the deterministic form on two of them
    attn_bwd = ([(16, 16, 16, 1024, 64, c) for c in (False, True)] + [(4, 16, 16, 4096, 128, c) for c in (False, True)]
                + [(4, 16, 16, 4096, 64, True), (2, 16, 16, 8192, 128, True), (1, 16, 16, 16384, 128, True),
                   (4, 32, 8, 4096, 128, True), (2, 16, 4, 4096, 128, True), (4, 16, 16, 4096, 128, True, True),
                   (2, 16, 4, 4096, 128, True, True)])
    # every operand layout a Linear layer produces, at the shapes of a Llama block's products
    layouts = [gemm_case(*g, lay) for g in ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 5632, 2048),
                                            (16384, 4096, 14336)) for lay in ("nt", "tn", "tt")]
    layouts.insert(0, gemm_case(8192, 5632, 2048))
    if quick:
        layouts = layouts[:3]
    # issue 39's sweep: 100 shapes (`hk bench -k "gemm random"`), a few in a quick run
    randoms = [gemm_case(*g, family=RANDOM_GEMMS) for g in random_gemm_shapes(8 if quick else 100)]
    return ([copy_case(1 << 30)] + [gemm_case(*g) for g in gemms] + layouts + randoms
            + [gemm_fp8_case(*g) for g in gemms[:4]]
            + [attention_case(*a) for a in attn] + [attention_bwd_case(*a) for a in attn_bwd]
            # MLA's prefill head dims (q/k 192, v 128; issue 40), the tile of 256 with v's columns past 128 zero
            + [attention_case(4, 16, 16, 4096, 192, True, dv=128),
               attention_bwd_case(4, 16, 16, 4096, 192, True, dv=128)]
            + [layernorm_case(16384, 4096), layernorm_case(32768, 4096)]
            + [layernorm_bwd_case(16384, 4096), layernorm_bwd_case(32768, 4096)]
            + [rotary_case(4, 4096, 32, 128), rotary_case(8, 4096, 32, 128)]
            + [tunable_case(4096, 4096, 4096), tunable_case(8192, 5632, 2048)])     # issue 42's shapes


# ---------------------------------------------------------------------------------------------- run
def run_case(case: Case, device: str, budget_s: float) -> dict:
    entry = {"family": case.family, "name": case.name, "unit": case.unit, "work": case.work, **case.size,
             "sweep": list(case.sweep)}
    try:
        bound = case.make(device)
        entry["rel_error"] = bound.check()
        per_unit = UNITS[case.unit]
        entry["n_input_sets"] = bound.n_sets
        fns = {**({"hk": bound.hk} if bound.hk is not None else {}),
               **{f"baseline {name}": fn for name, fn in bound.baselines.items()}}
        timed = {name: _figure(t, case, per_unit)
                 for name, t in time_side_by_side(fns, bound.n_sets, device, budget_s).items()}
        if "hk" in timed:
            entry["hk"] = timed["hk"]
        entry["baselines"] = {name: timed[f"baseline {name}"] for name in bound.baselines}
        if entry["baselines"] and "hk" in entry:
            first = next(iter(entry["baselines"].values()))
            entry["ratio_hk_over_baseline"] = first["figure_ms"] / entry["hk"]["figure_ms"]
            entry["ratios_hk_over_each_baseline"] = {n: b["figure_ms"] / entry["hk"]["figure_ms"]
                                                     for n, b in entry["baselines"].items()}
        if bound.profile is not None:
            entry["profile"] = bound.profile()
    except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
        entry["error"] = f"{type(e).__name__}: {e}"
    return entry


def _figure(t: Timing, case: Case, per_unit: float) -> dict:
    ms = t.ms_batch if case.by_batch else t.ms
    return {"ms": t.ms, "ms_batch": t.ms_batch, "figure_ms": ms, "agree": t.agree or case.by_batch,
            "spread": t.spread, "rate": case.work / (ms * 1e-3) / per_unit, "rounds_ms": t.rounds_ms,
            "per_call_p10_p50_p90_ms": t.per_call_quantiles, "host_ms_per_call": t.host_ms}


def scaling_problems(entries: list[dict]) -> list[str]:
    """Pairs of one size sweep (same family and sweep key) where SCALE_MIN_WORK x the work or more did not take
    at least factor ** 0.25 as long (2x -> 1.19x, 8x -> 1.68x): loose enough for a small size that leaves the
    device half idle, tight enough to catch a benchmark that times one shape for all."""
    problems = []
    ok = [e for e in entries if "baselines" in e]
    for who in ["hk"] + sorted({b for e in ok for b in e.get("baselines", {})}):
        rows = [((e["family"], tuple(e.get("sweep", ()))), e["work"], e["name"],
                 e.get("hk") if who == "hk" else e["baselines"].get(who)) for e in ok]
        rows = [r for r in rows if r[3] is not None]
        for sweep in {r[0] for r in rows}:
            sweep_rows = sorted((r for r in rows if r[0] == sweep), key=lambda r: r[1])
            for small in sweep_rows:
                for big in sweep_rows:
                    factor = big[1] / small[1]
                    if factor >= SCALE_MIN_WORK and big[3]["ms"] < small[3]["ms"] * factor ** 0.25:
                        problems.append(f"{who}: '{big[2]}' has {factor:.1f}x the work of '{small[2]}' but took "
                                        f"{big[3]['ms']:.3f} ms vs {small[3]['ms']:.3f} ms")
    return problems


def _op_calls() -> dict:
    """How the hk:: ops' host path ran (runtime/opfast.py): replayed in C++ or Python, and the counts."""
    from .runtime import opfast
    return {"path": opfast.describe(), **opfast.stats()}


def run(cases: list[Case], device: str, backend: str | None = None, budget_s: float = 1.0,
        progress: bool = True) -> dict:
    import hk_portable as hk
    from contextlib import nullcontext
    entries = []
    ctx = hk.use_backend(backend) if backend else nullcontext()
    with ctx, _progress(progress, len(cases)) as advance:
        for case in cases:
            entries.append(run_case(case, device, budget_s))
            advance(case.name)
    problems = scaling_problems(entries)
    copies = [e["baselines"]["device copy"]["rate"] for e in entries if e["family"] == "copy" and "baselines" in e]
    for e in entries:
        if copies and e["unit"] == "GB/s" and "hk" in e:
            e["hk_fraction_of_copy_bandwidth"] = e["hk"]["rate"] / copies[0]
    disagree = [f"{e['name']}: {who} events {t['ms']:.3f} ms vs batch {t['ms_batch']:.3f} ms"
                for e in entries for who, t in [("hk", e.get("hk"))] + list(e.get("baselines", {}).items())
                if t and not t["agree"]]
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "hk_version": hk.__version__, "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "host": platform.node(), "backend": backend, "agree_within": AGREE, "results": entries,
            "op_calls": _op_calls(),
            "scaling_problems": problems, "timing_disagreements": disagree, "random_gemms": random_sweep(entries),
            "ok": not problems and not disagree and not any("error" in e for e in entries)}


class _progress:
    """A rich progress bar when asked for and available, else nothing."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total, self.bar = enabled, total, None

    def __enter__(self):
        if self.enabled:
            try:
                from rich.progress import Progress
                self.bar = Progress(transient=True)
                self.bar.__enter__()
                self.task = self.bar.add_task("bench", total=self.total)
            except Exception:  # noqa: BLE001 - progress is cosmetic
                self.bar = None
        return self.advance

    def advance(self, name: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=name)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)


def table(report: dict) -> str:
    lines = [f"{'case':58} {'hk':>10} {'baseline':>10} {'ratio':>6}  {'rel err':>8}  baseline"]
    for e in report["results"]:
        if "error" in e:
            lines.append(f"{e['name']:58} ERROR {e['error'][:80]}")
            continue
        base = next(iter(e.get("baselines", {}).items()), (None, None))
        hk_rate = e["hk"]["rate"] if "hk" in e else float("nan")
        lines.append(f"{e['name']:58} {hk_rate:10.4g} "
                     f"{(base[1]['rate'] if base[1] else float('nan')):10.4g} "
                     f"{e.get('ratio_hk_over_baseline', float('nan')):6.2f}  {e['rel_error']:8.1e}  "
                     f"{base[0] or '-'} ({e['unit']})")
    sweep = report.get("random_gemms")
    if sweep:
        lines.append(f"random GEMM shapes: {sweep['reaching']}/{sweep['shapes']} at >= {sweep['at_least']:.2f}x the "
                     f"baseline, median {sweep['median_ratio']:.2f}x, {sweep['errors']} errors; worst: "
                     + ", ".join(f"{w['name'].split()[-1]} {w['ratio']:.2f}x" for w in sweep["worst"]))
    for p in report["scaling_problems"] + report["timing_disagreements"]:
        lines.append("CHECK FAILED: " + p)
    return "\n".join(lines)


def plot(report: dict, prefix: str) -> list[str]:
    """One PNG per family: hk and baseline rates side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = []
    for fam in sorted({e["family"] for e in report["results"] if "hk" in e}):
        rows = [e for e in report["results"] if e["family"] == fam and "hk" in e]
        names = sorted({b for e in rows for b in e["baselines"]})
        fig, ax = plt.subplots(figsize=(10, 0.6 + 0.5 * len(rows) * (1 + len(names)) / 2))
        y = list(range(len(rows)))
        h = 0.8 / (1 + len(names))
        ax.barh([v - 0.4 + h / 2 for v in y], [e["hk"]["rate"] for e in rows], h, label="hk_portable")
        for k, n in enumerate(names, 1):
            ax.barh([v - 0.4 + h / 2 + k * h for v in y], [e["baselines"].get(n, {}).get("rate", 0) for e in rows],
                    h, label=n)
        ax.set_yticks(y, [e["name"] for e in rows], fontsize=7)
        ax.set_xlabel(rows[0]["unit"])
        ax.set_title(f"{fam}: hk_portable ({report['backend'] or 'backend by device'}) on {report['device']} ({report['date']})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = f"{prefix}-{fam}.png"
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)      # --plot may name a folder not made yet
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def to_json(report: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))


# ---------------------------------------------------------------------------------------------- CLI
def main(args) -> int:
    """`hk bench`: exit 0 when every case ran and both self-checks passed."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        from .interface.errors import ArgumentError
        raise ArgumentError("--device cuda: torch sees no CUDA GPU here (no driver, no device, or a CPU build of "
                            "torch); use --device cpu")
    if device == "cuda":
        from .runtime import opfast
        opfast.load()               # built now: the timed calls are the steady state's (replayed), not the first
    cases = [c for c in default_cases(device, args.quick) if not args.pattern or args.pattern in c.name]
    report = run(cases, device, args.backend, args.budget)
    print(table(report))
    if args.json:
        to_json(report, args.json)
    if args.plot:
        for path in plot(report, args.plot):
            print("wrote", path)
    return 0 if report["ok"] else 1
