"""C = A @ B with f32 accumulation: A [M, K], B [K, N] in bf16 or f16, C of any float dtype.

Which dimension of each operand is unit-stride is part of the specialisation (consts A_KM, B_NK): a transposed
view is read as the contiguous tensor it views (`x.t()` as x [K, M], `W.t()` as W [N, K]), in whole tiles of
that tensor, and the mma takes the operand transposed (mma_AtB, mma_ABt, mma_AtBt). So `x @ W.t()` (every
Linear forward), `g @ W` (its input gradient) and `x.t() @ g` (its weight gradient) run the same pipeline as
`a @ b`, with loads a backend can issue as bulk copies (TMA on sm_90a) instead of element-wise ones."""
from __future__ import annotations

import math

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, ST, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap


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
    a_s = hk.shared(ST[a.dtype, BK, BM] if A_KM else ST[a.dtype, BM, BK], stages=STAGES)
    b_s = hk.shared(ST[b.dtype, BN, BK] if B_NK else ST[b.dtype, BK, BN], stages=STAGES)

    def load(k, s):
        hk.load(a_s[s], a, (k, m) if A_KM else (m, k))      # rows/cols past the edge of A or B read 0
        hk.load(b_s[s], b, (n, k) if B_NK else (k, n))

    def compute(k, s, acc):
        return hk.mma(a_s[s], b_s[s], acc, trans_a=A_KM, trans_b=B_NK)

    k_extent = a.shape[0] if A_KM else a.shape[1]
    acc = hk.pipeline(hk.cdiv(k_extent, BK), load, compute, carry=hk.zeros(RT[f32, BM, BN]), stages=STAGES)
    hk.store(c, acc.to(c.dtype), (m, n))


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
        gemm_kernel(a_in, b_in, out, grid=(hk.cdiv(M, cfg["BM"]), hk.cdiv(N, cfg["BN"])), backend=backend, **cfg)
        return out
    _launch(a, b, out, _plan(a, b, out, backend), backend)
    return out


def _launch(a, b, out, plan, backend) -> None:
    """The kernel on a, b as given, in the layout a plan chose (a transposed operand read as the tensor it views)."""
    a_km, b_nk, grid, cfg = plan
    gemm_kernel(a.t() if a_km else a, b.t() if b_nk else b, out, grid=grid, backend=backend, **cfg)


def _plan(a, b, out, backend) -> tuple:
    """(A_KM, B_NK, grid, config) for checked, non-empty operands: the layout and the configuration choice (tuned
    per shape bucket where HK_AUTOTUNE is on, else the backend's), decided once per call signature."""
    key = _PLANS.key(a.shape, a.stride(), b.shape, b.stride(), a.dtype, out.dtype, a.device, backend)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    M, K, N = a.shape[0], a.shape[1], b.shape[1]
    a_in, b_in, a_km, b_nk = layout_of(a, b)
    flags = dict(A_KM=a_km, B_NK=b_nk)

    def launch(cfg):
        gemm_kernel(a_in, b_in, out, grid=(hk.cdiv(M, cfg["BM"]), hk.cdiv(N, cfg["BN"])), backend=backend, **cfg)

    chosen = gemm_kernel.choose_config(lambda: candidates(flags, (a_in, b_in, out)), a_in, b_in, out,
                                       backend=backend, launch=launch, key=(a_km, b_nk, M <= SKINNY_ROWS),
                                       bucket=hk.shape_bucket(M, N, K))
    cfg = {**DEFAULT_CONFIG, **chosen, **flags}
    return _PLANS.put(key, (a_km, b_nk, (hk.cdiv(M, cfg["BM"]), hk.cdiv(N, cfg["BN"])), cfg))


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
