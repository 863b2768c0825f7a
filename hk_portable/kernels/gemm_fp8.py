"""C = (A @ B) * scale_a * scale_b with fp8 operands: A [M, K] and B [K, N] in OCP e4m3 or e5m2 (any pair),
exact products summed in f32, scales per tensor or per row of A / column of B, C in bf16, f16 or f32.

FP8 is a (format, target) pair. The formats are OCP e4m3fn and e5m2 (torch.float8_e4m3fn/_e5m2) on every
target; each backend states how its targets compute them (docs/fp8.md): natively (sm_89+, gfx950), by an
exact mapping onto the hardware's format (gfx942 e4m3 -> FNUZ), or by exact widening (sm_80; gfx942 e5m2).
FNUZ tensors (torch.float8_e4m3fnuz/_e5m2fnuz) are refused: no OCP code holds every FNUZ value.
"""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, ST, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FNUZ_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n))
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# Legal, not fast (the backends' tables say what is fast): whole 16x16 mma blocks, K steps of whole 32-deep fp8
# blocks (every target's fp8 mma has K = 32), 1-8 stages, the block sizes layouts deal over.
TUNABLE = dict(BM=hk.tunable(range(16, 513, 16), role="m"), BN=hk.tunable(range(16, 513, 16), role="n"),
               BK=hk.tunable(range(32, 257, 32), role="k"), STAGES=hk.tunable(range(1, 9), role="stages"),
               num_warps=hk.tunable(1, 2, 4, 8, 16, role="warps"))


@hk.kernel(num_warps=4, tunable=TUNABLE)
def gemm_fp8_kernel(a: GL[2], b: GL[2], c: GL[2], scale_a: GL[2], scale_b: GL[2], *, BM: hk.const = 64,
                    BN: hk.const = 64, BK: hk.const = 64, STAGES: hk.const = 2, B_NK: hk.const = True):
    """B_NK: b is given as [N, K] (B transposed, k-contiguous: what fp8 tensor cores read); else [K, N].
    scale_a and scale_b are [M, N] views of the scales with stride 0 along the dimension they do not vary
    over (per tensor: both), read like c's tile: an elementwise epilogue every accumulator layout takes."""
    m, n = hk.block_idx(0), hk.block_idx(1)
    a_s = hk.shared(ST[a.dtype, BM, BK], stages=STAGES)
    b_s = hk.shared(ST[b.dtype, BN, BK] if B_NK else ST[b.dtype, BK, BN], stages=STAGES)

    def load(k, s):
        hk.load(a_s[s], a, (m, k))       # rows/cols past the edge read 0
        hk.load(b_s[s], b, (n, k) if B_NK else (k, n))

    def compute(k, s, acc):
        return hk.mma(a_s[s], b_s[s], acc, trans_b=B_NK)

    acc = hk.pipeline(hk.cdiv(a.shape[1], BK), load, compute, carry=hk.zeros(RT[f32, BM, BN]), stages=STAGES)
    acc = acc * hk.load(RT[f32, BM, BN], scale_a, (m, n))     # one scale tile live at a time
    hk.store(c, (acc * hk.load(RT[f32, BM, BN], scale_b, (m, n))).to(c.dtype), (m, n))


DEFAULT_CONFIG = dict(BM=64, BN=64, BK=64, STAGES=2)
# {} is the portable baseline. cuda on sm_90a takes the first on TMA + wgmma (k-contiguous B): 128x128, since
# at 128x256 the epilogue's scale tile and the accumulator (128 f32 each per thread) spill;
# hip the first whose accumulator takes a wave grid within the arch's LDS (the 256x256 block, 3 stages in
# gfx950's 160 KiB, 2 in gfx942's 64 KiB; BK=64 halves gfx942's per-mma accumulator rescaling against BK=32;
# cuda refuses its 256 f32 accumulators per thread).
CONFIGS = (
    dict(BM=128, BN=128, BK=128, STAGES=4, num_warps=8),
    dict(BM=256, BN=256, BK=64, STAGES=3, num_warps=8),
    dict(BM=256, BN=256, BK=64, STAGES=2, num_warps=8),
    {},
)


def candidates(consts: dict, args: tuple = ()) -> list[dict]:
    return [{**DEFAULT_CONFIG, **consts, **c} for c in CONFIGS]


def example_args(device="cpu", M=256, N=256, K=256):
    a = torch.randn(M, K, device=device).to(torch.float8_e4m3fn)
    bt = torch.randn(N, K, device=device).to(torch.float8_e4m3fn)
    one = torch.ones(1, device=device)
    return (a, bt, torch.empty(M, N, device=device, dtype=torch.bfloat16), one.expand(M, N), one.expand(M, N)), \
        DEFAULT_CONFIG


def _check_operand(name: str, t) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ArgumentError(f"gemm_fp8: '{name}' must be a 2-D tensor, got "
                            f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if t.dtype in FNUZ_DTYPES:
        raise ArgumentError(f"gemm_fp8: '{name}' is {t.dtype}; hk_portable's fp8 formats are OCP "
                            "(torch.float8_e4m3fn, torch.float8_e5m2) on every target, gfx942 included (its "
                            "backend maps them onto the hardware's FNUZ formats exactly). No OCP code holds every "
                            "FNUZ value, so convert the data where it is produced")
    if t.dtype not in FP8_DTYPES:
        raise ArgumentError(f"gemm_fp8: '{name}' must be torch.float8_e4m3fn or torch.float8_e5m2, got {t.dtype}")


def _scale_view(name: str, s, n: int, what: str, device) -> torch.Tensor:
    """A scale as n f32 entries: one per tensor (a stride-0 view) or one per `what`; the kernel reads an
    [M, N] stride-0 view of it."""
    if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
        raise ArgumentError(f"gemm_fp8: '{name}' must be a float32 tensor, got "
                            f"{s.dtype if isinstance(s, torch.Tensor) else type(s).__name__}")
    if s.device != device:
        raise ArgumentError(f"gemm_fp8: '{name}' is on {s.device}, the operands on {device}")
    if s.numel() == 1:
        return s.reshape(1).expand(n)
    if s.numel() == n and (s.dim() == 1 or sum(d != 1 for d in s.shape) <= 1):
        return s.reshape(n)
    raise ArgumentError(f"gemm_fp8: '{name}' must have 1 element (per tensor) or {n} (one per {what}), got shape "
                        f"{tuple(s.shape)}")


def gemm_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
             out: torch.Tensor | None = None, *, out_dtype=torch.bfloat16, backend=None, **config) -> torch.Tensor:
    """out = (a @ b) * scale_a * scale_b, f32 accumulation. a: [M, K], b: [K, N], fp8 (e4m3fn or e5m2, any pair).
    scale_a: 1 or M float32 (per row), scale_b: 1 or N (per column). b column-major (b = bt.t() for a
    contiguous bt [N, K], as torch._scaled_mm takes it) is the layout fp8 tensor cores read directly; a
    row-major b works too, slower on targets whose fp8 instructions read K-contiguous operands only."""
    _check_operand("a", a)
    _check_operand("b", b)
    if a.shape[1] != b.shape[0]:
        raise ArgumentError(f"gemm_fp8: 'a' is {tuple(a.shape)} and 'b' is {tuple(b.shape)}: a.shape[1] must equal "
                            "b.shape[0]")
    if b.device != a.device:
        raise ArgumentError(f"gemm_fp8: 'b' is on {b.device}, 'a' on {a.device}")
    M, N = a.shape[0], b.shape[1]
    sa = _scale_view("scale_a", scale_a, M, "row of a", a.device).reshape(M, 1).expand(M, N)
    sb = _scale_view("scale_b", scale_b, N, "column of b", a.device).reshape(1, N).expand(M, N)
    if out is None:
        if out_dtype not in OUT_DTYPES:
            raise ArgumentError(f"gemm_fp8: 'out_dtype' must be bfloat16, float16 or float32, got {out_dtype}")
        out = torch.empty(M, N, device=a.device, dtype=out_dtype)
    elif tuple(out.shape) != (M, N) or out.dtype not in OUT_DTYPES:
        raise ArgumentError(f"gemm_fp8: 'out' must be a ({M}, {N}) bfloat16, float16 or float32 tensor, got "
                            f"{tuple(out.shape)} {out.dtype}")
    check_no_overlap("gemm_fp8", {"out": out}, {"a": a, "b": b, "scale_a": scale_a, "scale_b": scale_b})
    b_nk = (b.stride(0) == 1 and b.stride(1) != 1) or N == 1     # column-major (or one column): pass b.t()
    bk = b.t() if b_nk else b

    def launch(cfg):
        gemm_fp8_kernel(a, bk, out, sa, sb, grid=(hk.cdiv(M, cfg["BM"]), hk.cdiv(N, cfg["BN"])), backend=backend,
                        **cfg)

    if not config:
        config = gemm_fp8_kernel.choose_config(lambda: candidates({"B_NK": b_nk}), a, bk, out, sa, sb,
                                               backend=backend, launch=launch, key=(b_nk,),
                                               bucket=hk.shape_bucket(M, N, a.shape[1]))
    launch({**DEFAULT_CONFIG, "B_NK": b_nk, **config})
    return out


def reference(a, b, scale_a, scale_b) -> torch.Tensor:
    """float64 math of gemm_fp8 (the oracle of the tests and conformance cases)."""
    sa = scale_a.double().reshape(-1, 1) if scale_a.numel() > 1 else scale_a.double().reshape(1, 1)
    sb = scale_b.double().reshape(1, -1) if scale_b.numel() > 1 else scale_b.double().reshape(1, 1)
    return (a.double() @ b.double()) * sa * sb
