"""The cuda backend's tuning table: which of a kernel's legal candidates it tries first, per arch capability and
problem shape, with the measurement each rule rests on (docs/perf-notes.md has the runs). Kernels offer legal
candidates only (kernels/ holds no device numbers); the backend's choose_config then takes the first ranked
candidate on a fast path, and the autotuner's cache, where HK_AUTOTUNE filled it, overrides both."""
from __future__ import annotations

import torch

from ...interface.backend import ranked, table_ranking
from ...interface.tunables import tile_proposals
from . import archs

# attention_fwd at D=64 (H200, benchmarks/attention_configs.py, warp-specialised blocks, masks on edge blocks only):
# without a mask FA3's 192-row block on three consumer warpgroups from LONG_BAND queries on (1.12 / 1.07 of cuDNN at
# N=4096 / 16384, 2026-12-04), below it the 128x128 block on two (0.78 against 0.73 at N=1024); with a mask, from
# LONG_BAND queries the 128x128 block on FA3's schedule, longest tiles first (0.83 / 0.92 of cuDNN at N=4096 / 16384
# against the baseline's 0.74 / 0.78), from MASKED_WIDE_BAND the 192-row block before it (1.03 of cuDNN at N=16384
# against 0.97; 0.82 against 0.91 at N=4096), below LONG_BAND the baseline (0.70 against 0.69 at N=1024; 0.86 once
# its ring refilled ahead). D=128 keeps the kernel's order: 128x128 tiles first, with a mask too (415 TFLOP/s causal
# against 128x64's 379, 2026-12-03).
LONG_BAND = 2048
MASKED_WIDE_BAND = 16384
FA3_192 = dict(BM=192, BN=128, num_warps=12)
WIDE_128 = dict(BM=128, BN=128, num_warps=8)


def attention_fwd(consts: dict, args: tuple) -> list[dict] | None:
    if consts.get("D", 0) > 64:
        return None
    # without arguments (hk compile's examples) the long-sequence rules, where a choice matters most
    n = args[0].shape[2] if args and isinstance(args[0], torch.Tensor) else LONG_BAND
    if not consts.get("MASKED", False):
        return [FA3_192] if n >= LONG_BAND else [WIDE_128]
    return ([FA3_192] if n >= MASKED_WIDE_BAND else []) + ([WIDE_128] if n >= LONG_BAND else [])


# (the arch capability the rule was measured on, kernel name) -> rule(consts, args) -> ranked partial configs
TABLE = {
    ("async_tensor_core", "attention_fwd_kernel"): attention_fwd,
}


# Tile shapes offered to a kernel that declares tunable mma tiles (Backend.propose; kernels map the roles onto their
# consts and drop what they do not allow), per arch capability, fastest first. On the async path (TMA + wgmma):
# issue 42's fused gelu(a @ w^T + bias) on the H100 (2026-12-06) ran 511 TFLOP/s at 128x256x64 on 8 warps, 448 at
# 128x128x64, 122 at 64x64x32 on 4 (4096^3); gemm's CONFIGS rest on the same shapes (perf-notes 2026-12-06); the
# 64x64 block on one warpgroup is for products too small to fill the SMs with 128-row tiles. Without it (mma.sync and
# the cp.async ring): 128x128x32 on 8 warps in 3 stages (48 KiB, within every sm_8x's shared memory), then 64x64x32;
# not measured: the autotuner (HK_AUTOTUNE=1) times them where a device exists.
TILES = {
    "async_tensor_core": (dict(m=128, n=256, k=64, stages=4, warps=8), dict(m=128, n=128, k=64, stages=4, warps=8),
                          dict(m=64, n=64, k=64, stages=4, warps=4)),
    None: (dict(m=128, n=128, k=32, stages=3, warps=8), dict(m=64, n=64, k=32, stages=3, warps=4)),
}


def propose(roles: tuple[str, ...], target) -> list[dict]:
    """TILES' row for the target's arch (its first capability that has one), each cut to the roles given."""
    return tile_proposals(TILES, archs.of(target), roles)


def first_ranked(configs: list[dict], prefs: list[dict] | None) -> dict:
    """The config a ranking puts first (benchmarks and tests that build what the library launches)."""
    return configs[0] if prefs is None else ranked(configs, prefs)[0]


def preferred(kernel: str, consts: dict, args: tuple, target) -> list[dict] | None:
    return table_ranking(TABLE, archs.of(target), kernel, consts, args)
