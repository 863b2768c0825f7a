"""C = A @ B with f32 accumulation: A [M, K], B [K, N] in bf16 or f16, C of any float dtype.

Which dimension of each operand is unit-stride is part of the specialisation (consts A_KM, B_NK): a transposed
view is read as the contiguous tensor it views (`x.t()` as x [K, M], `W.t()` as W [N, K]), in whole tiles of
that tensor, and the mma takes the operand transposed (mma_AtB, mma_ABt, mma_AtBt). So `x @ W.t()` (every
Linear forward), `g @ W` (its input gradient) and `x.t() @ g` (its weight gradient) run the same pipeline as
`a @ b`, with loads a backend can issue as bulk copies (TMA on sm_90a) instead of element-wise ones."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, ST, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

from .restage import Restage, restage_plan


# What is legal, not what is fast (that is each backend's, Backend.propose and its tuning table): tiles of whole
# 16x16 mma blocks, K steps of whole 16-deep blocks, a ring of 1 to 8 stages, and the block sizes the layouts deal
# tiles over. The roles let a backend's proposals (its arch table's tile shapes) reach these consts by meaning.
TUNABLE = dict(BM=hk.tunable(range(16, 513, 16), role="m"), BN=hk.tunable(range(16, 513, 16), role="n"),
               BK=hk.tunable(range(16, 257, 16), role="k"), STAGES=hk.tunable(range(1, 9), role="stages"),
               num_warps=hk.tunable(1, 2, 4, 8, 16, role="warps"))


@hk.kernel(num_warps=4, tunable=TUNABLE)
def gemm_kernel(a: GL[2], b: GL[2], c: GL[2], *, BM: hk.const = 64, BN: hk.const = 64, BK: hk.const = 32,
                STAGES: hk.const = 2, A_KM: hk.const = False, B_NK: hk.const = False):
    """c = A @ B; A_KM: `a` holds A as [K, M] (A's transpose, contiguous); B_NK: `b` holds B as [N, K]."""
    m, n = hk.block_idx(0), hk.block_idx(1)
    acc = _product(a, b, m, n, BM, BN, BK, STAGES, A_KM, B_NK)
    hk.store(c, acc.to(c.dtype), (m, n))


@hk.kernel(num_warps=4, tunable=TUNABLE)
def gemm_split_kernel(a: GL[2], b: GL[2], part: GL[3], *, BM: hk.const = 64, BN: hk.const = 64, BK: hk.const = 32,
                      STAGES: hk.const = 2, A_KM: hk.const = False, B_NK: hk.const = False):
    """Split-K: part[z] = A[:, Kz] @ B[Kz, :] in f32, Kz the z-th of part.shape[0] equal runs of K steps (the last
    may run past K: it reads zeros). For a grid of few output tiles over a long K; gemm_reduce_kernel sums them."""
    m, n, z = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
    acc = _product(a, b, m, n, BM, BN, BK, STAGES, A_KM, B_NK, split=(z, part.shape[0]))
    hk.store(part, acc, (z, m, n))


def _product(a, b, m, n, BM, BN, BK, STAGES, A_KM, B_NK, split=None):
    """The f32 [BM, BN] tile (m, n) of A @ B: over all of K, or with split = (z, splits) over the z-th of `splits`
    equal runs of its BK steps."""
    a_s = hk.shared(ST[a.dtype, BK, BM] if A_KM else ST[a.dtype, BM, BK], stages=STAGES)
    b_s = hk.shared(ST[b.dtype, BN, BK] if B_NK else ST[b.dtype, BK, BN], stages=STAGES)
    k_steps, k0 = hk.cdiv(a.shape[0] if A_KM else a.shape[1], BK), None
    if split is not None:
        k_steps = hk.cdiv(k_steps, split[1])
        k0 = split[0] * k_steps

    def load(k, s):
        k = k if k0 is None else k0 + k
        hk.load(a_s[s], a, (k, m) if A_KM else (m, k))      # rows/cols past the edge of A or B read 0
        hk.load(b_s[s], b, (n, k) if B_NK else (k, n))

    def compute(k, s, acc):
        return hk.mma(a_s[s], b_s[s], acc, trans_a=A_KM, trans_b=B_NK)

    return hk.pipeline(k_steps, load, compute, carry=hk.zeros(RT[f32, BM, BN]), stages=STAGES)


REDUCE_TUNABLE = dict(BM=hk.tunable(range(16, 257, 16)), BN=hk.tunable(range(16, 257, 16)),
                      num_warps=hk.tunable(1, 2, 4, 8))
REDUCE_CONFIG = dict(BM=64, BN=64)


@hk.kernel(num_warps=4, tunable=REDUCE_TUNABLE)
def gemm_reduce_kernel(part: GL[3], c: GL[2], *, BM: hk.const = 64, BN: hk.const = 64):
    """c = the sum over z of part[z] (split-K's partial products, f32), in c's dtype; the order of the sum is fixed:
    the same bits on every run."""
    m, n = hk.block_idx(0), hk.block_idx(1)

    def add(z, acc):
        return acc + hk.load(RT[f32, BM, BN], part, (z, m, n))
    hk.store(c, hk.fori_loop(0, part.shape[0], add, hk.zeros(RT[f32, BM, BN])).to(c.dtype), (m, n))


DEFAULT_CONFIG = dict(BM=64, BN=64, BK=32, STAGES=2)
# Candidate configurations over DEFAULT_CONFIG; {} is that portable baseline, which every target takes. The
# backend picks per target (Backend.choose_config, after its tuning table's ranking, Backend.preferred): cuda on
# sm_90a the first that runs on TMA + wgmma (the first, or the third); hip the first whose accumulator takes a
# wave grid within the arch's LDS: HipKittens' 256x256 blocks of 8 waves, 3 stages for its ping-pong schedule,
# in 48 KiB with BK=16 (docs/perf-notes.md 2026-12-02) or 96 KiB with BK=32 (the hip table ranks that one first
# where the arch's 16-bit MFMA of K=32 runs at full rate; 2026-12-06).
CONFIGS = (
    dict(BM=128, BN=256, BK=64, STAGES=4, num_warps=8),
    dict(BM=256, BN=256, BK=16, STAGES=3, num_warps=8),
    dict(BM=128, BN=128, BK=64, STAGES=4, num_warps=8),
    dict(BM=256, BN=256, BK=32, STAGES=3, num_warps=8),
    {},
)


# A product of at most SKINNY_ROWS rows (a decode step's tokens) fills few 128-row tiles: 64x64 tiles first there
# (M=64, N=2048: 32 blocks against 128x256's 8). TMA + wgmma on sm_90a (one warpgroup).
SKINNY_ROWS = 64
SKINNY = (dict(BM=64, BN=64, BK=64, STAGES=4, num_warps=4),)


def candidates(consts: dict, args: tuple = ()) -> list[dict]:
    """The candidate configurations for a call with these consts and arguments (a, b, out: what `hk compile`
    and the wrapper pass to choose_config): CONFIGS, with SKINNY first where out has at most SKINNY_ROWS rows."""
    skinny = SKINNY if args and args[2].shape[0] <= SKINNY_ROWS else ()
    return [{**DEFAULT_CONFIG, **consts, **c} for c in skinny + CONFIGS]


def example_args(device="cpu", M=256, N=256, K=256, dtype=torch.bfloat16, layout="nn"):
    """(a, b, c) as the kernel takes them and its consts. layout: nn, nt, tn or tt, A then B, t a transposed view
    (x.t(), W.t()), read as the tensor it views (`hk analyze gemm --arg layout=nt`)."""
    if layout not in ("nn", "nt", "tn", "tt"):
        raise ArgumentError(f"gemm: layout must be nn, nt, tn or tt, got {layout!r}")
    a_km, b_nk = layout[0] == "t", layout[1] == "t"
    a = torch.randn(*((K, M) if a_km else (M, K)), device=device, dtype=dtype)
    b = torch.randn(*((N, K) if b_nk else (K, N)), device=device, dtype=dtype)
    consts = DEFAULT_CONFIG if layout == "nn" else {**DEFAULT_CONFIG, "A_KM": a_km, "B_NK": b_nk}
    return (a, b, torch.empty(M, N, device=device, dtype=torch.float32)), consts


def example_args_gemm_split_kernel(device="cpu", M=200, N=136, K=1000, splits=3, dtype=torch.bfloat16):
    """(a, b, part) for split-K: a [M, K], b [K, N], part f32 [splits, M, N]."""
    (a, b, _), consts = example_args(device, M, N, K, dtype)
    return (a, b, torch.empty(splits, M, N, device=device)), consts


def example_args_gemm_reduce_kernel(device="cpu", M=200, N=136, splits=3, dtype=torch.bfloat16):
    """(part, c): part f32 [splits, M, N] summed into c [M, N]."""
    return (torch.randn(splits, M, N, device=device), torch.empty(M, N, device=device, dtype=dtype)), \
        dict(REDUCE_CONFIG)


def is_transposed_view(t: torch.Tensor) -> bool:
    """t [R, C] is the transpose of a row-major [C, R] (W.t(), x.t()): unit stride down its first dim, not along
    its rows."""
    return t.stride(1) != 1 and t.shape[1] > 1 and t.stride(0) == 1


def operand(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(the tensor the kernel reads, whether it holds the operand transposed): a transposed view is read as the
    tensor it views; any other layout as given."""
    return (t.t(), True) if is_transposed_view(t) else (t, False)


def layout_of(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool, bool]:
    """(a, b, A_KM, B_NK) as the kernel takes them."""
    a_in, a_km = operand(a)
    b_in, b_nk = operand(b)
    return a_in, b_in, a_km, b_nk


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *, out_dtype=None, backend=None,
         **config) -> torch.Tensor:
    """out = a @ b (f32 accumulation). a: [M, K], b: [K, N], both bf16 or both f16."""
    check_operands(a, b)
    M, N = a.shape[0], b.shape[1]
    if out is None:
        out = a.new_empty((M, N), dtype=out_dtype or a.dtype)
    else:
        if tuple(out.shape) != (M, N):
            raise ArgumentError(f"gemm: 'out' must have shape {(M, N)}, got {tuple(out.shape)}")
        if not out.is_floating_point() or out.dtype == torch.float64:
            raise ArgumentError(f"gemm: 'out' must be f32, bf16 or f16, got {out.dtype}")
        check_no_overlap("gemm", {"out": out}, {"a": a, "b": b})
    return gemm_into(a, b, out, backend, **config)


def check_operands(a, b) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ArgumentError(f"gemm: '{name}' must be a 2-D tensor, got "
                                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise ArgumentError(f"gemm: '{name}' must be bfloat16 or float16, got {t.dtype}")
    if a.dtype != b.dtype:
        raise ArgumentError(f"gemm: 'a' and 'b' must have one dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ArgumentError(f"gemm: 'a' is {tuple(a.shape)} and 'b' is {tuple(b.shape)}: a.shape[1] must equal "
                            "b.shape[0]")


def gemm_into(a, b, out, backend=None, **config):
    """out = a @ b for checked operands (check_operands) and an `out` [M, N] of a float dtype that overlaps
    neither (one the caller allocated): the launch alone. A call without `config` reuses what the last call with
    the same shapes, strides, dtypes, device and backend selection decided (`_plan`)."""
    M, K, N = a.shape[0], a.shape[1], b.shape[1]
    if K == 0:              # an empty sum: zeros, as torch gives
        return out.zero_()
    if M == 0 or N == 0:
        return out
    if config:
        a_in, b_in, a_km, b_nk = layout_of(a, b)
        cfg = {**DEFAULT_CONFIG, **config, "A_KM": a_km, "B_NK": b_nk}
        gemm_kernel(a_in, b_in, out, grid=_grid(M, N, cfg), backend=backend, **cfg)
        return out
    _launch(a, b, out, _plan(a, b, out, backend), backend)
    return out


@dataclass(frozen=True)
class GemmPlan:
    """How a call signature runs: the layout (A_KM, B_NK), the kernel's configuration and grid, how each operand
    is restaged where its rows miss the target's alignment (None: read as it is), and split-K's run count (1: one
    kernel)."""
    a_km: bool
    b_nk: bool
    config: dict
    grid: tuple
    restage_a: Restage | None = None
    restage_b: Restage | None = None
    splits: int = 1
    reduce: dict | None = None          # gemm_reduce_kernel's configuration where splits > 1


def _launch(a, b, out, plan: GemmPlan, backend) -> None:
    """The kernels of a plan on a, b as given: a transposed operand read as the tensor it views, restaged where its
    rows are not at the target's alignment; split-K's partial products into a fresh f32 [splits, M, N], summed."""
    a_in, b_in = a.t() if plan.a_km else a, b.t() if plan.b_nk else b
    if plan.restage_a is not None:
        a_in = plan.restage_a(a_in, backend)
    if plan.restage_b is not None:
        b_in = plan.restage_b(b_in, backend)
    if plan.splits == 1:
        gemm_kernel(a_in, b_in, out, grid=plan.grid, backend=backend, **plan.config)
        return
    part = torch.empty((plan.splits, *out.shape), dtype=torch.float32, device=out.device)
    gemm_split_kernel(a_in, b_in, part, grid=(*plan.grid, plan.splits), backend=backend, **plan.config)
    gemm_reduce_kernel(part, out, grid=_grid(*out.shape, plan.reduce), backend=backend, **plan.reduce)


# Split-K: where the output tiles fill under half the device's units and K is long, K is cut into runs of at least
# MIN_SPLIT_STEPS steps, as many as fill the units once (a 171 x 245 x 6788 product is 4 tiles of 128 x 128 for 132
# SMs). Its own candidates, 128 x 128 first: more tiles for the same units, fewer splits to sum.
MIN_SPLIT_STEPS = 4
MAX_SPLITS = 64
SPLIT_CONFIGS = (dict(BM=128, BN=128, BK=64, STAGES=4, num_warps=8), dict(BM=64, BN=64, BK=64, STAGES=4, num_warps=4),
                 {})


def split_count(tiles: int, k_steps: int, units: int) -> int:
    """How many runs of K steps a grid of `tiles` output tiles is split into on `units` compute units (1: none)."""
    if tiles * 2 > units:
        return 1
    splits = min(units // tiles, k_steps // MIN_SPLIT_STEPS, MAX_SPLITS)
    return splits if splits >= 2 else 1


def _plan(a, b, out, backend) -> GemmPlan:
    """The plan of checked, non-empty operands: the layout and the configuration (tuned per shape bucket where
    HK_AUTOTUNE is on, else the backend's), the target's row alignment and the split, decided once per call
    signature."""
    key = _PLANS.key(a.shape, a.stride(), b.shape, b.stride(), a.dtype, out.dtype, a.device, backend)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    M, K, N = a.shape[0], a.shape[1], b.shape[1]
    a_in, b_in, a_km, b_nk = layout_of(a, b)
    flags = dict(A_KM=a_km, B_NK=b_nk)
    align = gemm_kernel.target_of(a_in, b_in, out, backend=backend).row_alignment
    restage = restage_plan(a_in, align, backend), restage_plan(b_in, align, backend)
    staged: list = []       # the operands as the kernels read them, copied only if the autotuner launches

    def launch(cfg):
        if not staged:
            staged.extend(t if how is None else how(t, backend) for t, how in zip((a_in, b_in), restage))
        gemm_kernel(*staged, out, grid=_grid(M, N, cfg), backend=backend, **cfg)

    chosen = gemm_kernel.choose_config(lambda: candidates(flags, (a_in, b_in, out)), a_in, b_in, out,
                                       backend=backend, launch=launch, key=(a_km, b_nk, M <= SKINNY_ROWS),
                                       bucket=hk.shape_bucket(M, N, K))
    cfg = {**DEFAULT_CONFIG, **chosen, **flags}
    if split_count(math.prod(_grid(M, N, cfg)), hk.cdiv(K, cfg["BK"]), hk.compute_units(out.device)) > 1:
        split = _split_plan(a_in, b_in, out, flags, backend, a_km, b_nk, restage)
        if split is not None:
            return _PLANS.put(key, split)
    return _PLANS.put(key, GemmPlan(a_km, b_nk, cfg, _grid(M, N, cfg), *restage))


def _grid(M: int, N: int, cfg: dict) -> tuple[int, int]:
    """The output tiles of an M x N product in cfg's BM x BN blocks."""
    return hk.cdiv(M, cfg["BM"]), hk.cdiv(N, cfg["BN"])


def _split_plan(a_in, b_in, out, flags, backend, a_km, b_nk, restage) -> GemmPlan | None:
    """Split-K's plan with its own configuration, None where its tiles leave no split worth taking."""
    M, N = out.shape
    K = a_in.shape[0] if a_km else a_in.shape[1]
    probe = out.new_empty((2, M, N), dtype=torch.float32)      # a part's kind (f32, rank 3) for the choice
    cfg = {**DEFAULT_CONFIG, **gemm_split_kernel.choose_config(
        [{**DEFAULT_CONFIG, **c, **flags} for c in SPLIT_CONFIGS], a_in, b_in, probe, backend=backend,
        key=("split", a_km, b_nk)), **flags}
    splits = split_count(math.prod(_grid(M, N, cfg)), hk.cdiv(K, cfg["BK"]), hk.compute_units(out.device))
    if splits == 1:
        return None
    reduce = {**REDUCE_CONFIG, **gemm_reduce_kernel.choose_config([REDUCE_CONFIG], probe, out, backend=backend,
                                                                  key="reduce")}
    return GemmPlan(a_km, b_nk, cfg, _grid(M, N, cfg), *restage, splits, reduce)


def rows_of(a: torch.Tensor) -> torch.Tensor:
    """a [..., K] as the kernel's [M, K] (a view where the strides allow; reshape copies otherwise)."""
    if a.dim() == 2:
        return a
    if a.dim() < 1:
        raise ArgumentError("hk::gemm: 'a' must have 1 or more dims ([..., K]), got a 0-dim tensor")
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])       # not -1: [0, K] and [M, 0] are fine


def matmul_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    if b.dim() != 2:
        raise ArgumentError(f"hk::gemm: 'b' must be 2-D ([K, N]), got shape {tuple(b.shape)}")
    return (*a.shape[:-1], b.shape[1])


def matmul(a: torch.Tensor, b: torch.Tensor, out_dtype=None, backend=None) -> torch.Tensor:
    """hk::gemm: a [..., K] @ b [K, N] into a fresh [..., N] in out_dtype or a's. A repeat call with the same
    shapes, strides, dtypes, devices and backend selection is a new_empty, the views and the launch."""
    key = _PLANS.key(matmul, a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device,
                     out_dtype, backend)
    plan = _PLANS.get(key)
    if plan is not None:
        rows, shape, dtype, gemm_plan = plan
        out = a.new_empty(shape, dtype=dtype)
        c = out
        if rows is not None:
            a, c = a.view(rows), out.view(rows[0], shape[-1])
        _launch(a, b, c, gemm_plan, backend)
        return out
    rows, shape = rows_of(a), matmul_shape(a, b)
    check_operands(rows, b)
    out = a.new_empty(shape, dtype=out_dtype or a.dtype)
    c = out if out.dim() == 2 else out.view(rows.shape[0], b.shape[1])
    gemm_into(rows, b, c, backend)
    # a itself or a view of it (a copy is a fresh allocation, never at a live tensor's address; _base can't tell:
    # inference mode records no view base)
    viewed = rows is a or rows.data_ptr() == a.data_ptr()
    if viewed and rows.numel() and c.numel():       # not an empty product: gemm_into planned none
        _PLANS.put(key, (None if rows is a else tuple(rows.shape), shape, out.dtype, _plan(rows, b, c, backend)))
    return out


_PLANS = hk.CallPlans()     # _plan's decisions per call signature; matmul's per op signature
