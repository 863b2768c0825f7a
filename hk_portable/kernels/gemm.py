"""C = A @ B with f32 accumulation: A [M, K], B [K, N] in bf16 or f16, C of any float dtype."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, ST, ArgumentError, f32
from hk_portable.interface.kernel import check_no_overlap


@hk.kernel(num_warps=4)
def gemm_kernel(a: GL[2], b: GL[2], c: GL[2], *, BM: hk.const = 64, BN: hk.const = 64, BK: hk.const = 32,
                STAGES: hk.const = 2):
    m, n = hk.block_idx(0), hk.block_idx(1)
    a_s = hk.shared(ST[a.dtype, BM, BK], stages=STAGES)
    b_s = hk.shared(ST[b.dtype, BK, BN], stages=STAGES)

    def load(k, s):
        hk.load(a_s[s], a, (m, k))       # rows/cols past the edge of A or B read 0
        hk.load(b_s[s], b, (k, n))

    def compute(k, s, acc):
        return hk.mma(a_s[s], b_s[s], acc)

    acc = hk.pipeline(hk.cdiv(a.shape[1], BK), load, compute, carry=hk.zeros(RT[f32, BM, BN]), stages=STAGES)
    hk.store(c, acc.to(c.dtype), (m, n))


DEFAULT_CONFIG = dict(BM=64, BN=64, BK=32, STAGES=2)
# Candidate configurations over DEFAULT_CONFIG, largest first; {} is that portable baseline, which every
# target takes. The backend picks per target (Backend.choose_config): cuda on sm_90a the first that runs
# on TMA + wgmma (the first, or the third); hip the first whose accumulator takes a wave grid within the
# arch's LDS: the second, HipKittens' 256x256 blocks of 8 waves, 3 stages for its ping-pong schedule in
# 48 KiB (BK=16: the ISA analyser's best on both archs, docs/perf-notes.md 2026-12-02).
CONFIGS = (
    dict(BM=128, BN=256, BK=64, STAGES=4, num_warps=8),
    dict(BM=256, BN=256, BK=16, STAGES=3, num_warps=8),
    dict(BM=128, BN=128, BK=64, STAGES=4, num_warps=8),
    {},
)


def candidates(consts: dict, args: tuple = ()) -> list[dict]:
    """The candidate configurations for a call with these consts and arguments (what `hk compile` and the
    wrapper pass to choose_config; a GEMM's do not depend on the shapes)."""
    return [{**DEFAULT_CONFIG, **consts, **c} for c in CONFIGS]


def example_args(device="cpu", M=256, N=256, K=256, dtype=torch.bfloat16):
    a = torch.randn(M, K, device=device, dtype=dtype)
    b = torch.randn(K, N, device=device, dtype=dtype)
    return (a, b, torch.empty(M, N, device=device, dtype=torch.float32)), DEFAULT_CONFIG


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *, out_dtype=None, backend=None,
         **config) -> torch.Tensor:
    """out = a @ b (f32 accumulation). a: [M, K], b: [K, N], both bf16 or both f16."""
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
    M, N = a.shape[0], b.shape[1]
    if out is None:
        out = torch.empty(M, N, device=a.device, dtype=out_dtype or a.dtype)
    elif tuple(out.shape) != (M, N):
        raise ArgumentError(f"gemm: 'out' must have shape {(M, N)}, got {tuple(out.shape)}")
    elif not out.is_floating_point() or out.dtype in (torch.float64,):
        raise ArgumentError(f"gemm: 'out' must be f32, bf16 or f16, got {out.dtype}")
    check_no_overlap("gemm", {"out": out}, {"a": a, "b": b})
    def launch(cfg):
        gemm_kernel(a, b, out, grid=(hk.cdiv(M, cfg["BM"]), hk.cdiv(N, cfg["BN"])), backend=backend, **cfg)

    if not config:          # tuned per shape bucket where HK_AUTOTUNE is on, else the backend's choice
        config = gemm_kernel.choose_config(lambda: candidates({}), a, b, out, backend=backend, launch=launch, key=(),
                                           bucket=hk.shape_bucket(M, N, a.shape[1]))
    launch({**DEFAULT_CONFIG, **config})
    return out
