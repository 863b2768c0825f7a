"""The hip backend's tuning table: which of a kernel's legal candidates it tries first, per arch capability (an
archs.Arch field) and problem shape, with the figures each rule rests on (docs/perf-notes.md). Kernels offer legal
candidates only; HipBackend.choose_config then takes the first ranked candidate whose accumulators take wave grids,
and the autotuner's cache, where HK_AUTOTUNE filled it, overrides both. No AMD hardware measured any rule here: the
figures are the ISA analyser's (`hk analyze`, a static model of the compiled loop)."""
from __future__ import annotations

import torch

from ...interface.backend import table_ranking
from ...interface.tunables import tile_proposals
from .archs import ARCHS

# gemm where the 16-bit MFMA of K=32 runs at full rate (Arch.mfma_16bit_k32, CDNA4): HipKittens' 256x256 block of
# 8 waves with a k-step of 32, so every MFMA of the main loop is v_mfma_f32_16x16x32_{bf16,f16}; 3 stages for the
# ping-pong, 96 KiB of LDS. The kernel's order would take the 256x256x16 block first, on the 16x16x16 form, which
# does half the work in the same cycles on CDNA4: its loop reads bound 1.0 against the MFMAs chosen and 0.5 against
# the matrix peak. The 256x256x32 block reads 1.0 against both in all four operand layouts, with VALU <= 0.55 and
# LDS <= 0.63 of the MFMA time, nothing spilled, 2 waves per SIMD (`hk analyze`, clang 22.1.8, 2026-12-06).
# 256x256x64 (HipKittens' shape) reads 1.0 too, on 2 stages (128 KiB) only: the ping-pong needs 3 (192 KiB of
# LDS, over the 160 KiB a block may use), so it runs double-buffered; not ranked. A product of at most
# SKINNY_ROWS rows keeps the kernel's order (kernels/gemm.py SKINNY_ROWS: its 64x64 tiles first, K=64 steps,
# which take the K=32 form already).
GEMM_DEEP_K = {"BM": 256, "BN": 256, "BK": 32, "STAGES": 3, "num_warps": 8}
SKINNY_ROWS = 64


def gemm(consts: dict, args: tuple) -> list[dict] | None:
    rows = args[2].shape[0] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
    if rows is not None and rows <= SKINNY_ROWS:
        return None
    return [GEMM_DEEP_K, {}]            # the deep k-step first, then every candidate in the kernel's order


# Tile shapes offered to a kernel that declares tunable mma tiles (Backend.propose), per arch capability, fastest
# first: where the 16-bit MFMA of K=32 runs at full rate, gemm's GEMM_DEEP_K above (its `hk analyze` figures); else
# (CDNA3) HipKittens' 256x256 block of 8 waves with K steps of 16, 3 stages in 48 KiB (perf-notes 2026-12-02). Then
# a 128x128 block of 4 waves for what a 256x256 block does not fit (registers of a larger epilogue, LDS).
# HipBackend.choose_config takes the first whose accumulators take wave grids.
TILES = {
    "mfma_16bit_k32": (dict(m=256, n=256, k=32, stages=3, warps=8), dict(m=128, n=128, k=32, stages=2, warps=4)),
    None: (dict(m=256, n=256, k=16, stages=3, warps=8), dict(m=128, n=128, k=32, stages=2, warps=4)),
}


def propose(roles: tuple[str, ...], target) -> list[dict]:
    """TILES' row for the target's arch (its first capability that has one), each cut to the roles given."""
    return tile_proposals(TILES, ARCHS.get(target.arch), roles)


# (the arch capability the rule rests on, kernel name) -> rule(consts, args) -> ranked partial configs
TABLE = {
    ("mfma_16bit_k32", "gemm_kernel"): gemm,
}


def preferred(kernel: str, consts: dict, args: tuple, target) -> list[dict] | None:
    return table_ranking(TABLE, ARCHS.get(target.arch), kernel, consts, args)
